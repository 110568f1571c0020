//! [`OpenAiEmbedder`]: any OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, TEI,
//! Ollama, vLLM). Batches, bounded concurrency, retries with exponential backoff on
//! 429, 5xx, timeouts and refused connections. Query texts go out on their own
//! requests under a separate small limit, never behind ingest batches. The API key
//! is read from an environment variable named in the configuration and never
//! appears in an error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::{EmbedError, Embedder, l2_normalize};

/// Longest backoff between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How much of an error body is kept in an error message.
const DETAIL_CHARS: usize = 300;

/// How to reach the endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiOptions {
    /// Base URL such as `http://localhost:8081/v1`; `/embeddings` is appended unless
    /// the URL already ends with it.
    pub endpoint: String,
    /// The `model` field of each request.
    pub model: String,
    /// Name of the environment variable that holds the API key, if the endpoint wants one.
    pub api_key_env: Option<String>,
    /// The key itself, for callers that hold it already; wins over `api_key_env`.
    pub api_key: Option<String>,
    /// Vector length; asked from the endpoint with a one-text request when unset.
    pub dims: Option<usize>,
    /// Texts per request.
    pub batch_size: usize,
    /// Ingest requests at once.
    pub concurrency: usize,
    /// Query requests at once, on top of `concurrency`: a search never waits for an
    /// ingest batch to finish.
    pub query_concurrency: usize,
    /// Timeout of one request.
    pub timeout: Duration,
    /// Retries after the first try.
    pub max_retries: u32,
    /// First backoff; doubles each retry, capped at 10 s.
    pub retry_base: Duration,
    /// A PEM bundle of extra CAs trusted for https, next to the OS trust store.
    pub ca_file: Option<PathBuf>,
}

impl OpenAiOptions {
    /// Options with the usual defaults for `endpoint` and `model`.
    pub fn new(endpoint: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            model: model.into(),
            api_key_env: None,
            api_key: None,
            dims: None,
            batch_size: 64,
            concurrency: 2,
            query_concurrency: 2,
            timeout: Duration::from_secs(60),
            max_retries: 4,
            retry_base: Duration::from_millis(500),
            ca_file: None,
        }
    }
}

/// An HTTP client for OpenAI-compatible endpoints: rustls with the OS trust store, plus
/// the CAs of `ca_file` when set (a private CA in front of TEI or vLLM).
pub fn http_client(
    timeout: Duration,
    ca_file: Option<&Path>,
) -> Result<reqwest::Client, EmbedError> {
    let mut builder = reqwest::Client::builder().timeout(timeout);
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| EmbedError::Config(format!("ca_file `{}`: {e}", path.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            EmbedError::Config(format!(
                "ca_file `{}`: not a PEM bundle: {e}",
                path.display()
            ))
        })?;
        if certs.is_empty() {
            return Err(EmbedError::Config(format!(
                "ca_file `{}` holds no certificate",
                path.display()
            )));
        }
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .map_err(|e| EmbedError::Config(format!("HTTP client: {e}")))
}

/// An API key that never prints.
#[derive(Clone)]
struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// Client of an OpenAI-compatible embeddings endpoint; cheap to clone.
#[derive(Debug, Clone)]
pub struct OpenAiEmbedder {
    client: reqwest::Client,
    url: String,
    model: String,
    key: Option<ApiKey>,
    dims: usize,
    batch_size: usize,
    max_retries: u32,
    retry_base: Duration,
    permits: Arc<Semaphore>,
    query_permits: Arc<Semaphore>,
}

#[derive(Serialize)]
struct Request<'a> {
    model: &'a str,
    input: &'a [String],
    encoding_format: &'static str,
}

#[derive(Deserialize)]
struct Response {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    embedding: Vec<f32>,
    index: usize,
}

/// What one try produced.
enum Try {
    Done(Vec<Vec<f32>>),
    /// Worth another try, after at least this long.
    Again(EmbedError, Option<Duration>),
    Fail(EmbedError),
}

impl OpenAiEmbedder {
    /// Checks the options, reads the key, and asks the endpoint for the vector
    /// length when `dims` is not configured.
    pub async fn connect(options: OpenAiOptions) -> Result<Self, EmbedError> {
        let endpoint = options.endpoint.trim_end_matches('/');
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(EmbedError::Config(format!(
                "endpoint `{endpoint}` must start with http:// or https://"
            )));
        }
        if options.model.is_empty() {
            return Err(EmbedError::Config(
                "model must be set for provider openai".to_owned(),
            ));
        }
        if options.batch_size == 0 || options.concurrency == 0 || options.query_concurrency == 0 {
            return Err(EmbedError::Config(
                "batch_size, concurrency and query_concurrency must be at least 1".to_owned(),
            ));
        }
        let key = match (&options.api_key, &options.api_key_env) {
            (Some(key), _) if !key.trim().is_empty() => Some(ApiKey(key.trim().to_owned())),
            (Some(_), _) => {
                return Err(EmbedError::Config("the API key is empty".to_owned()));
            }
            (None, Some(var)) => match std::env::var(var) {
                Ok(value) if !value.trim().is_empty() => Some(ApiKey(value.trim().to_owned())),
                _ => {
                    return Err(EmbedError::Config(format!(
                        "api_key_env names `{var}`, but that environment variable is unset or empty"
                    )));
                }
            },
            (None, None) => None,
        };
        let url = if endpoint.ends_with("/embeddings") {
            endpoint.to_owned()
        } else {
            format!("{endpoint}/embeddings")
        };
        let client = http_client(options.timeout, options.ca_file.as_deref())?;
        let mut embedder = OpenAiEmbedder {
            client,
            url,
            model: options.model,
            key,
            dims: options.dims.unwrap_or(0),
            batch_size: options.batch_size,
            max_retries: options.max_retries,
            retry_base: options.retry_base,
            permits: Arc::new(Semaphore::new(options.concurrency)),
            query_permits: Arc::new(Semaphore::new(options.query_concurrency)),
        };
        if options.dims.is_none() {
            let probe = embedder.request(&["dimension probe".to_owned()]).await?;
            embedder.dims = probe.first().map(Vec::len).unwrap_or(0);
            if embedder.dims == 0 {
                return Err(EmbedError::InvalidResponse(
                    "the probe returned an empty vector".to_owned(),
                ));
            }
        }
        Ok(embedder)
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Masks the key in text that came back from the server.
    fn mask(&self, text: &str) -> String {
        let short: String = text.chars().take(DETAIL_CHARS).collect();
        match &self.key {
            Some(ApiKey(key)) if !key.is_empty() => short.replace(key.as_str(), "***"),
            _ => short,
        }
    }

    /// One batch, with retries.
    async fn request(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut attempt = 0u32;
        loop {
            let error = match self.try_once(texts).await {
                Try::Done(vectors) => return Ok(vectors),
                Try::Fail(error) => return Err(error),
                Try::Again(error, _) if attempt >= self.max_retries => return Err(error),
                Try::Again(error, after) => {
                    let backoff = self
                        .retry_base
                        .saturating_mul(2u32.saturating_pow(attempt))
                        .min(MAX_BACKOFF);
                    let wait = after.map_or(backoff, |a| a.min(MAX_BACKOFF).max(backoff));
                    tokio::time::sleep(wait).await;
                    error
                }
            };
            attempt += 1;
            tracing::warn!(url = %self.url, attempt, error = %error, "embedding request will be retried");
        }
    }

    async fn try_once(&self, texts: &[String]) -> Try {
        let mut request = self.client.post(&self.url).json(&Request {
            model: &self.model,
            input: texts,
            encoding_format: "float",
        });
        if let Some(ApiKey(key)) = &self.key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            // reqwest's text names the URL, never the headers.
            Err(err) => {
                return Try::Again(EmbedError::Unavailable(self.mask(&err.to_string())), None);
            }
        };
        let status = response.status();
        if !status.is_success() {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = response.text().await.unwrap_or_default();
            let error = EmbedError::Status {
                status: status.as_u16(),
                detail: self.mask(body.trim()),
            };
            return if error.retryable() {
                Try::Again(error, retry_after)
            } else {
                Try::Fail(error)
            };
        }
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(err) => {
                return Try::Again(EmbedError::Unavailable(self.mask(&err.to_string())), None);
            }
        };
        match self.parse(&body, texts.len()) {
            Ok(vectors) => Try::Done(vectors),
            Err(error) => Try::Fail(error),
        }
    }

    fn parse(&self, body: &[u8], expected: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let response: Response = serde_json::from_slice(body)
            .map_err(|e| EmbedError::InvalidResponse(format!("not an embeddings response: {e}")))?;
        if response.data.len() != expected {
            return Err(EmbedError::InvalidResponse(format!(
                "{} embeddings for {expected} inputs",
                response.data.len()
            )));
        }
        let mut out: Vec<Option<Vec<f32>>> = vec![None; expected];
        for item in response.data {
            let slot = out.get_mut(item.index).ok_or_else(|| {
                EmbedError::InvalidResponse(format!("index {} out of range", item.index))
            })?;
            if slot.is_some() {
                return Err(EmbedError::InvalidResponse(format!(
                    "index {} appears twice",
                    item.index
                )));
            }
            if self.dims != 0 && item.embedding.len() != self.dims {
                return Err(EmbedError::InvalidResponse(format!(
                    "a vector of {} dimensions, expected {}",
                    item.embedding.len(),
                    self.dims
                )));
            }
            if item.embedding.iter().any(|x| !x.is_finite()) {
                return Err(EmbedError::InvalidResponse(
                    "a vector with NaN or infinity".to_owned(),
                ));
            }
            let mut v = item.embedding;
            l2_normalize(&mut v);
            *slot = Some(v);
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| EmbedError::InvalidResponse("missing index".to_owned())))
            .collect()
    }
}

#[async_trait::async_trait]
impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.model
    }

    fn dims(&self) -> usize {
        self.dims
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_under(&self.permits, texts).await
    }

    async fn embed_query(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_under(&self.query_permits, texts).await
    }
}

impl OpenAiEmbedder {
    /// Sends `texts` in batches, each holding one of `permits` for its request.
    async fn embed_under(
        &self,
        permits: &Semaphore,
        texts: Vec<String>,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(self.batch_size) {
            let _permit = permits
                .acquire()
                .await
                .map_err(|_| EmbedError::Unavailable("the embedder is shutting down".to_owned()))?;
            out.extend(self.request(batch).await?);
        }
        Ok(out)
    }
}
