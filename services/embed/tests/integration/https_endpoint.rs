//! The OpenAI-compatible client over https: an in-test TLS server (rustls, a throwaway
//! CA made with rcgen) that speaks the embeddings wire format. The client trusts it only
//! through `ca_file`; without it the handshake is refused, so the test proves TLS is real.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use kg_embed::{EmbedError, Embedder, EmbeddingConfig, OpenAiEmbedder, OpenAiOptions, Provider};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A TCP listener that completes a TLS handshake before axum sees the connection.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            // A client that rejects our certificate fails here; keep serving others.
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A 3-dimensional "embedding" that depends on the text, so order is checkable.
fn vector_of(text: &str) -> Vec<f32> {
    vec![text.len() as f32, 1.0, 0.0]
}

async fn embeddings(Json(body): Json<Value>) -> Json<Value> {
    let input: Vec<String> = body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let data: Vec<Value> = input
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": vector_of(t)}))
        .collect();
    Json(
        json!({"object": "list", "data": data, "model": body["model"],
                "usage": {"prompt_tokens": 3, "total_tokens": 3}}),
    )
}

/// Starts the https server; returns its base URL and the CA's PEM.
async fn https_server() -> (String, String) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
        )
        .unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let listener = TlsListener {
        tcp,
        acceptor: TlsAcceptor::from(Arc::new(config)),
    };
    let app = Router::new().route("/v1/embeddings", post(embeddings));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("https://localhost:{port}/v1"), ca.pem())
}

fn options(endpoint: &str, ca_file: Option<&std::path::Path>) -> OpenAiOptions {
    let mut options = OpenAiOptions::new(endpoint, "tls-test-model");
    options.ca_file = ca_file.map(std::path::Path::to_path_buf);
    options.max_retries = 0;
    options.timeout = Duration::from_secs(10);
    options
}

#[tokio::test]
async fn the_embedder_reaches_an_https_endpoint_through_a_configured_ca() {
    let (endpoint, ca_pem) = https_server().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();

    // Trusted through ca_file: dims probed over TLS, then a batch in order.
    let embedder = OpenAiEmbedder::connect(options(&endpoint, Some(&ca_file)))
        .await
        .unwrap();
    assert_eq!(embedder.dims(), 3);
    assert!(embedder.url().starts_with("https://"));
    let vectors = embedder
        .embed(vec!["a".to_owned(), "three".to_owned()])
        .await
        .unwrap();
    assert_eq!(vectors.len(), 2);
    assert!(vectors[1][0] > vectors[0][0], "order kept: {vectors:?}");

    // The same through the `[embedding]` section.
    let config = EmbeddingConfig {
        provider: Provider::Openai,
        endpoint: Some(endpoint.clone()),
        model: Some("tls-test-model".to_owned()),
        ca_file: Some(ca_file.clone()),
        max_retries: 0,
        ..Default::default()
    };
    let built = kg_embed::build(&config).await.unwrap().unwrap();
    assert_eq!(built.dims(), 3);

    // Without the CA the server is unknown: the handshake fails, nothing is embedded.
    let error = OpenAiEmbedder::connect(options(&endpoint, None))
        .await
        .unwrap_err();
    assert!(matches!(error, EmbedError::Unavailable(_)), "{error}");

    // A ca_file that is not PEM is a configuration error naming the file.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let error = OpenAiEmbedder::connect(options(&endpoint, Some(&junk)))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, EmbedError::Config(m) if m.contains("junk.pem")),
        "{error}"
    );
}
