//! Logging and tracing: `tracing` to stderr (text or JSON), optionally
//! exported over OTLP when an endpoint is configured. Never to stdout: the
//! stdio MCP server's stdout carries JSON-RPC frames only. Every line passes
//! through [`crate::redact`] on its way out, whichever crate logged it.

use serde::Deserialize;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Telemetry settings shared by every binary.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct TelemetryConfig {
    /// Log filter in `RUST_LOG` syntax; default `info`.
    #[serde(default)]
    pub log_filter: Option<String>,
    /// JSON log lines instead of text.
    #[serde(default)]
    pub log_json: bool,
    /// OTLP/gRPC collector endpoint (e.g. `http://127.0.0.1:4317`); off when unset.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

/// Keeps the tracer provider alive; flushes spans on drop.
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("invalid log filter: {0}")]
    Filter(String),
    /// The OTLP exporter could not be built.
    #[error("cannot build the OTLP exporter for {endpoint}: {reason}")]
    Otlp {
        /// The configured endpoint.
        endpoint: String,
        /// The exporter's complaint.
        reason: String,
    },
}

/// Checks a log filter in `RUST_LOG` syntax without installing anything.
pub fn validate_filter(filter: &str) -> Result<(), TelemetryError> {
    EnvFilter::try_new(filter)
        .map(drop)
        .map_err(|e| TelemetryError::Filter(e.to_string()))
}

/// The log filter when neither the config nor `RUST_LOG` sets one. rmcp logs every session
/// and initialize at info, which is request noise. qdrant-edge warns on every shard it opens
/// that its feature flags are not initialized, and once per process that its multi-mmap
/// check did not run: only the Qdrant server's startup sets either, the crate exports no
/// setter, and the defaults it falls back to (default flags, multi-mmap on) are ours.
pub const DEFAULT_LOG_FILTER: &str =
    "info,rmcp=warn,qdrant_edge::common::flags=error,qdrant_edge::common::mmap::ops=error";

/// Installs the global subscriber for `service_name`. Call once per process.
pub fn init(
    service_name: &str,
    config: &TelemetryConfig,
) -> Result<TelemetryGuard, TelemetryError> {
    let directive = config
        .log_filter
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| DEFAULT_LOG_FILTER.to_owned());
    let filter =
        EnvFilter::try_new(&directive).map_err(|e| TelemetryError::Filter(e.to_string()))?;

    let (otel_layer, provider) = match &config.otlp_endpoint {
        Some(endpoint) => {
            use opentelemetry::trace::TracerProvider as _;
            use opentelemetry_otlp::WithExportConfig as _;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| TelemetryError::Otlp {
                    endpoint: endpoint.clone(),
                    reason: e.to_string(),
                })?;
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(service_name.to_owned())
                        .build(),
                )
                .build();
            let tracer = provider.tracer("kgmesh");
            (
                Some(tracing_opentelemetry::layer().with_tracer(tracer)),
                Some(provider),
            )
        }
        None => (None, None),
    };

    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let writer = Redacting(std::io::stderr);
    let result = if config.log_json {
        registry
            .with(tracing_subscriber::fmt::layer().json().with_writer(writer))
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(writer),
            )
            .try_init()
    };
    // A second init in one process (tests) keeps the first subscriber.
    drop(result);
    Ok(TelemetryGuard { provider })
}

/// A log writer that masks credentials in each formatted event before it is written: the
/// formatter hands over one whole event per write, so a secret is never split across calls.
#[derive(Clone, Copy)]
pub struct Redacting<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Redacting<M> {
    type Writer = RedactingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter(self.0.make_writer())
    }
}

/// What [`Redacting`] makes.
pub struct RedactingWriter<W>(W);

impl<W: std::io::Write> std::io::Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(crate::redact::redact(text).as_bytes())?,
            Err(_) => self
                .0
                .write_all(crate::redact::redact(&String::from_utf8_lossy(buf)).as_bytes())?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_default_filter_keeps_warnings_but_not_known_noise() {
        validate_filter(DEFAULT_LOG_FILTER).unwrap();
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(DEFAULT_LOG_FILTER))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "qdrant_edge::common::flags", "Feature flags not initialized!");
            tracing::warn!(target: "qdrant_edge::common::mmap::ops", "MULTI_MMAP_SUPPORT_CHECK_RESULT should be initialized");
            tracing::info!(target: "rmcp::service", "session opened");
            tracing::warn!(target: "kg_retrieval::bm25", "recount failed");
            tracing::info!(target: "kg_indexer::worker", "indexed");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("Feature flags"), "{text}");
        assert!(!text.contains("MULTI_MMAP"), "{text}");
        assert!(!text.contains("session opened"), "{text}");
        assert!(text.contains("recount failed"), "{text}");
        assert!(text.contains("indexed"), "{text}");
    }

    #[test]
    fn credentials_never_reach_a_log_line() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(Redacting(move || writer.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let err = "pool timed out connecting to postgres://kgmesh:Pw-4c1d9e@db:5432/kg";
            tracing::error!(error = %err, "store unavailable");
            tracing::warn!(url = "https://llm.example/v1?api_key=sk-9f8e7d", "retrying");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("Pw-4c1d9e"), "{text}");
        assert!(!text.contains("sk-9f8e7d"), "{text}");
        assert!(text.contains("postgres://kgmesh:***@db:5432/kg"), "{text}");
        assert!(text.contains("store unavailable"), "{text}");
    }
}
