//! Prometheus metrics shared by every binary, and a tower layer that counts gRPC calls.

use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of one gRPC method outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcLabels {
    /// Service label (e.g. `kg.v1.Graph`).
    pub service: String,
    /// Full method path.
    pub method: String,
    /// gRPC status code number as text ("0" is OK).
    pub code: String,
}

/// Labels of one MCP tool outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// Tool name.
    pub tool: String,
    /// "ok" or the stable error code.
    pub outcome: String,
}

/// Labels of an indexing outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IndexedLabels {
    /// "indexed", "stored" (kept, not indexable) or "failed".
    pub outcome: String,
}

/// Labels of LLM token counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// "prompt" or "completion".
    pub kind: String,
}

/// Labels of a TLS certificate in use.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// "cluster" (`[cluster.tls]`, between services) or "http" (`[http_tls]`, the gateway).
    pub certificate: String,
}

/// Labels of one durable JetStream consumer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabels {
    /// The durable's name (`indexer`, `indexer-removals`, `indexer-flags`, `indexer-branch`).
    pub consumer: String,
}

/// Every metric family kgmesh exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// gRPC requests served.
    pub grpc_requests: Family<GrpcLabels, Counter>,
    /// gRPC request latency.
    pub grpc_latency: Family<GrpcLabels, Histogram>,
    /// MCP tool calls.
    pub tool_calls: Family<ToolLabels, Counter>,
    /// MCP tool latency.
    pub tool_latency: Family<ToolLabels, Histogram>,
    /// Files indexed, by outcome.
    pub files_indexed: Family<IndexedLabels, Counter>,
    /// LLM extractor requests that returned an answer.
    pub llm_requests: Counter,
    /// LLM tokens the endpoint reported, by kind (prompt, completion).
    pub llm_tokens: Family<TokenLabels, Counter>,
    /// LLM batches whose request failed or whose answer was unusable.
    pub llm_failed_batches: Counter,
    /// Items an LLM answer held that were dropped as ungrounded.
    pub llm_dropped: Counter,
    /// Chunks not sent to the LLM because their file's token budget was spent.
    pub llm_skipped_chunks: Counter,
    /// When each TLS certificate in use expires (Unix seconds), for an alert on a renewal that
    /// did not happen.
    pub tls_certificate_expiry: Family<CertificateLabels, Gauge>,
    /// TLS handshakes refused or timed out on a served port (a peer without the CA's client
    /// certificate, plaintext on a TLS port, a scanner), by the certificate served.
    pub tls_handshakes_failed: Family<CertificateLabels, Counter>,
    /// Events a durable consumer of the indexer has not settled (queued or running), as
    /// JetStream counts them for every replica together.
    pub indexer_pending_events: Family<ConsumerLabels, Gauge>,
    /// Blobs the files service's sweeps removed (no version needed them).
    pub blobs_swept: Counter,
    /// Their bytes.
    pub blob_bytes_swept: Counter,
    /// When a sweep of the blob store last completed (Unix seconds), for an alert on a sweep
    /// that keeps failing.
    pub blob_sweep_completed: Gauge,
    /// Version rows the sweeps removed from the registry because no file, branch or release
    /// named the version any more.
    pub registry_versions_pruned: Counter,
    /// The links of such versions the sweeps removed.
    pub registry_version_links_pruned: Counter,
    /// Namespace purges the indexer completed and reported (a namespace was deleted).
    pub namespaces_purged: Counter,
    /// Change events the indexer dropped because their namespace was deleted after they were
    /// made (a backlog of a deleted namespace draining).
    pub purged_events_dropped: Counter,
    /// Change events the indexer removed from `KG_FILES` once the consumer of their subject
    /// had acknowledged them.
    pub change_events_compacted: Counter,
    /// Audit events deleted because they were older than the audit retention.
    pub audit_events_pruned: Counter,
    /// When the indexer last trimmed `KG_FILES` (Unix seconds), for an alert on a trim that
    /// keeps failing.
    pub change_events_compaction_completed: Gauge,
    /// Chunk texts the indexer sent to the embedder.
    pub chunks_embedded: Counter,
    /// Chunks the indexer gave a vector its file already held for the same text and embedder,
    /// instead of embedding them again (edits, reindexes).
    pub chunk_vectors_reused: Counter,
}

impl Metrics {
    /// Counts the tokens of one LLM answer.
    pub fn record_llm_tokens(&self, prompt: u64, completion: u64) {
        for (kind, tokens) in [("prompt", prompt), ("completion", completion)] {
            self.llm_tokens
                .get_or_create(&TokenLabels {
                    kind: kind.to_owned(),
                })
                .inc_by(tokens);
        }
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("kgmesh");
        let grpc_requests = Family::<GrpcLabels, Counter>::default();
        let grpc_latency = Family::<GrpcLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let tool_calls = Family::<ToolLabels, Counter>::default();
        let tool_latency = Family::<ToolLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let files_indexed = Family::<IndexedLabels, Counter>::default();
        let llm_requests = Counter::default();
        let llm_tokens = Family::<TokenLabels, Counter>::default();
        // Both kinds exported from the start, so a dashboard sees 0 rather than no series.
        for kind in ["prompt", "completion"] {
            drop(llm_tokens.get_or_create(&TokenLabels {
                kind: kind.to_owned(),
            }));
        }
        let llm_failed_batches = Counter::default();
        let llm_dropped = Counter::default();
        let llm_skipped_chunks = Counter::default();
        let tls_certificate_expiry = Family::<CertificateLabels, Gauge>::default();
        let tls_handshakes_failed = Family::<CertificateLabels, Counter>::default();
        let indexer_pending_events = Family::<ConsumerLabels, Gauge>::default();
        let blobs_swept = Counter::default();
        let blob_bytes_swept = Counter::default();
        let blob_sweep_completed = Gauge::default();
        let registry_versions_pruned = Counter::default();
        let registry_version_links_pruned = Counter::default();
        let namespaces_purged = Counter::default();
        let purged_events_dropped = Counter::default();
        let change_events_compacted = Counter::default();
        let audit_events_pruned = Counter::default();
        let change_events_compaction_completed = Gauge::default();
        let chunks_embedded = Counter::default();
        let chunk_vectors_reused = Counter::default();
        registry.register(
            "grpc_requests",
            "gRPC requests served",
            grpc_requests.clone(),
        );
        registry.register(
            "grpc_request_seconds",
            "gRPC request latency",
            grpc_latency.clone(),
        );
        registry.register("mcp_tool_calls", "MCP tool calls", tool_calls.clone());
        registry.register(
            "mcp_tool_seconds",
            "MCP tool call latency",
            tool_latency.clone(),
        );
        registry.register(
            "files_indexed",
            "files indexed by outcome",
            files_indexed.clone(),
        );
        registry.register(
            "llm_requests",
            "LLM extractor requests that returned an answer",
            llm_requests.clone(),
        );
        registry.register(
            "llm_tokens",
            "LLM tokens reported by the endpoint, by kind",
            llm_tokens.clone(),
        );
        registry.register(
            "llm_failed_batches",
            "LLM batches whose request failed or whose answer was unusable",
            llm_failed_batches.clone(),
        );
        registry.register(
            "llm_dropped",
            "items of LLM answers dropped as ungrounded",
            llm_dropped.clone(),
        );
        registry.register(
            "llm_skipped_chunks",
            "chunks not sent to the LLM because the file's token budget was spent",
            llm_skipped_chunks.clone(),
        );
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "when the TLS certificate in use expires, in Unix seconds",
            tls_certificate_expiry.clone(),
        );
        registry.register(
            "tls_handshakes_failed",
            "TLS handshakes refused or timed out on a served port, by the certificate served",
            tls_handshakes_failed.clone(),
        );
        registry.register(
            "indexer_pending_events",
            "events a durable consumer of the indexer has not settled yet (queued or running)",
            indexer_pending_events.clone(),
        );
        registry.register(
            "blobs_swept",
            "blobs the files service removed because no version needed them",
            blobs_swept.clone(),
        );
        registry.register(
            "blob_bytes_swept",
            "bytes of the blobs the files service removed because no version needed them",
            blob_bytes_swept.clone(),
        );
        registry.register(
            "blob_sweep_completed_timestamp_seconds",
            "when a sweep of the blob store last completed, in Unix seconds",
            blob_sweep_completed.clone(),
        );
        registry.register(
            "registry_versions_pruned",
            "version rows the files service removed because no file, branch or release named them",
            registry_versions_pruned.clone(),
        );
        registry.register(
            "registry_version_links_pruned",
            "links of versions no file, branch or release named that the files service removed",
            registry_version_links_pruned.clone(),
        );
        registry.register(
            "namespaces_purged",
            "namespace purges the indexer completed: graph, vectors and flags removed and reported",
            namespaces_purged.clone(),
        );
        registry.register(
            "purged_events_dropped",
            "change events the indexer dropped because their namespace was deleted after them",
            purged_events_dropped.clone(),
        );
        registry.register(
            "change_events_compacted",
            "change events the indexer removed from KG_FILES once their consumer acknowledged them",
            change_events_compacted.clone(),
        );
        registry.register(
            "audit_events_pruned",
            "audit events deleted because they were older than [audit] retention_days",
            audit_events_pruned.clone(),
        );
        registry.register(
            "change_events_compaction_completed_timestamp_seconds",
            "when the indexer last trimmed KG_FILES of acknowledged change events, in Unix seconds",
            change_events_compaction_completed.clone(),
        );
        registry.register(
            "chunks_embedded",
            "chunk texts the indexer sent to the embedder",
            chunks_embedded.clone(),
        );
        registry.register(
            "chunk_vectors_reused",
            "chunks given the vector their file already held for the same text and embedder",
            chunk_vectors_reused.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            grpc_requests,
            grpc_latency,
            tool_calls,
            tool_latency,
            files_indexed,
            llm_requests,
            llm_tokens,
            llm_failed_batches,
            llm_dropped,
            llm_skipped_chunks,
            tls_certificate_expiry,
            tls_handshakes_failed,
            indexer_pending_events,
            blobs_swept,
            blob_bytes_swept,
            blob_sweep_completed,
            registry_versions_pruned,
            registry_version_links_pruned,
            namespaces_purged,
            purged_events_dropped,
            change_events_compacted,
            audit_events_pruned,
            change_events_compaction_completed,
            chunks_embedded,
            chunk_vectors_reused,
        }
    })
}

/// The Prometheus text exposition of every metric.
pub fn encode_text() -> String {
    let mut out = String::new();
    let registry = match metrics().registry.lock() {
        Ok(r) => r,
        Err(poisoned) => poisoned.into_inner(),
    };
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

/// The `method` label of a request to `path`: the path of a method kgmesh serves, else
/// `unknown`, so a client sending made-up paths (refused before routing or not) cannot grow
/// the series without bound.
fn method_label(path: &str) -> &str {
    const HEALTH: [&str; 2] = [
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
    ];
    if kg_proto::v1::METHOD_PATHS.binary_search(&path).is_ok() || HEALTH.contains(&path) {
        path
    } else {
        "unknown"
    }
}

/// Counts and times every gRPC request by method and status.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    service: Arc<str>,
}

impl GrpcMetricsLayer {
    /// A layer labelling its metrics with `service`.
    pub fn new(service: String) -> Self {
        Self {
            service: service.into(),
        }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            service: self.service.clone(),
        }
    }
}

/// See [`GrpcMetricsLayer`].
#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    service: Arc<str>,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let method = method_label(request.uri().path()).to_owned();
        let service = self.service.to_string();
        let started = Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            // Errors inside a streaming body carry their status in trailers; the
            // header status covers every unary RPC, which is all kgmesh serves.
            let code = match &result {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("0")
                    .to_owned(),
                Err(_) => "transport".to_owned(),
            };
            let labels = GrpcLabels {
                service,
                method,
                code,
            };
            metrics().grpc_requests.get_or_create(&labels).inc();
            metrics()
                .grpc_latency
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The value of the sample line that starts with `series` (name and labels).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    #[test]
    fn only_served_methods_name_their_own_series() {
        assert_eq!(
            method_label("/kg.v1.Auth/Authorize"),
            "/kg.v1.Auth/Authorize"
        );
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "/grpc.health.v1.Health/Check"
        );
        for made_up in [
            "/x/r123",
            "/kg.v1.Auth/Nope",
            "/kg.v1.Auth/Authorize/",
            "",
            "/",
        ] {
            assert_eq!(method_label(made_up), "unknown", "{made_up:?}");
        }
        // The list is sorted, as the binary search needs.
        assert!(kg_proto::v1::METHOD_PATHS.is_sorted());
        assert!(kg_proto::v1::METHOD_PATHS.len() > 20);
    }

    #[test]
    fn llm_counters_are_exported_under_the_kgmesh_prefix() {
        let before = encode_text();
        assert!(
            before.contains("# TYPE kgmesh_llm_tokens counter"),
            "{before}"
        );
        let prompt = r#"kgmesh_llm_tokens_total{kind="prompt"}"#;
        let completion = r#"kgmesh_llm_tokens_total{kind="completion"}"#;
        let (p0, c0) = (
            sample(&before, prompt).unwrap(),
            sample(&before, completion).unwrap(),
        );
        let r0 = sample(&before, "kgmesh_llm_requests_total").unwrap();
        let d0 = sample(&before, "kgmesh_llm_dropped_total").unwrap();

        metrics().record_llm_tokens(412, 96);
        metrics().llm_requests.inc();
        metrics().llm_dropped.inc_by(2);

        let after = encode_text();
        assert_eq!(sample(&after, prompt).unwrap() - p0, 412.0);
        assert_eq!(sample(&after, completion).unwrap() - c0, 96.0);
        assert_eq!(
            sample(&after, "kgmesh_llm_requests_total").unwrap() - r0,
            1.0
        );
        assert_eq!(
            sample(&after, "kgmesh_llm_dropped_total").unwrap() - d0,
            2.0
        );
        for name in [
            "kgmesh_llm_failed_batches_total",
            "kgmesh_llm_skipped_chunks_total",
        ] {
            assert!(sample(&after, name).is_some(), "{name} missing:\n{after}");
        }
    }
}
