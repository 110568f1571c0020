//! Logging and tracing: `tracing` to stderr (text or JSON), optionally
//! exported over OTLP when an endpoint is configured. Never to stdout: the
//! stdio MCP server's stdout carries JSON-RPC frames only. Every line passes
//! through [`crate::redact`] on its way out, whichever crate logged it, and so does
//! every span exported over OTLP.

use std::borrow::Cow;
use std::time::Duration;

use opentelemetry::{Array, KeyValue, StringValue, Value};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
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
            let provider = tracer_provider(service_name, exporter);
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

/// The tracer provider `init` exports through: batches of spans, masked by
/// [`RedactingExporter`] before `exporter` sees them.
fn tracer_provider<E: SpanExporter + 'static>(
    service_name: &str,
    exporter: E,
) -> opentelemetry_sdk::trace::SdkTracerProvider {
    opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(RedactingExporter(exporter))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build()
}

/// A span exporter that masks credentials in what leaves the process, as the log writer
/// does for lines: span and event names, attribute values (whole values under a credential's
/// name, see [`crate::redact::is_secret_name`]), link attributes and error descriptions.
/// A span carries the same fields a log line does, and a collector is one more reader.
#[derive(Debug)]
struct RedactingExporter<E>(E);

impl<E: SpanExporter> SpanExporter for RedactingExporter<E> {
    fn export(
        &self,
        mut batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        for span in &mut batch {
            redact_span(span);
        }
        self.0.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn shutdown(&self) -> OTelSdkResult {
        self.0.shutdown()
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

fn redact_span(span: &mut SpanData) {
    redact_name(&mut span.name);
    redact_attributes(&mut span.attributes);
    for event in &mut span.events.events {
        redact_name(&mut event.name);
        redact_attributes(&mut event.attributes);
    }
    for link in &mut span.links.links {
        redact_attributes(&mut link.attributes);
    }
    if let opentelemetry::trace::Status::Error { description } = &mut span.status {
        redact_name(description);
    }
}

fn redact_name(text: &mut Cow<'static, str>) {
    if let Cow::Owned(masked) = crate::redact::redact(text) {
        *text = Cow::Owned(masked);
    }
}

fn redact_attributes(attributes: &mut [KeyValue]) {
    for attribute in attributes {
        if crate::redact::is_secret_name(attribute.key.as_str()) {
            attribute.value = Value::from(crate::redact::MASK);
            continue;
        }
        match &mut attribute.value {
            Value::String(text) => redact_string(text),
            Value::Array(Array::String(texts)) => texts.iter_mut().for_each(redact_string),
            _ => {}
        }
    }
}

fn redact_string(text: &mut StringValue) {
    if let Cow::Owned(masked) = crate::redact::redact(text.as_str()) {
        *text = StringValue::from(masked);
    }
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

    /// Keeps what the provider exports, as a collector would receive it.
    #[derive(Debug, Clone, Default)]
    struct Collector(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collector {
        fn export(
            &self,
            batch: Vec<SpanData>,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            self.0.lock().unwrap().extend(batch);
            std::future::ready(Ok(()))
        }
    }

    #[test]
    fn credentials_never_reach_the_otlp_collector() {
        use opentelemetry::trace::TracerProvider as _;
        let collector = Collector::default();
        let provider = tracer_provider("kg-test", collector.clone());
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("kgmesh")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "connect postgres://kgmesh:Pw-span-name@db/kg",
                store = "postgres://kgmesh:Pw-4c1d9e@db:5432/kg",
                password = "hunter2-field",
                token_budget = 400,
                namespace = "docs",
            );
            let _entered = span.enter();
            tracing::warn!(
                api_key = "sk-event-field",
                url = "https://llm.example/v1?key=AIza-query",
                "embedder rejected Bearer eyJhbGciOiJIUzI1NiJ9.event-name"
            );
            tracing::error!(error = "bad kg_pat_Abc123secret", "caller refused");
        });
        provider.force_flush().unwrap();
        let spans = collector.0.lock().unwrap().clone();
        assert_eq!(spans.len(), 1, "{spans:?}");
        let exported = format!("{spans:?}");
        for secret in [
            "Pw-span-name",
            "Pw-4c1d9e",
            "hunter2-field",
            "sk-event-field",
            "AIza-query",
            "event-name",
            "Abc123secret",
        ] {
            assert!(!exported.contains(secret), "{secret} exported: {exported}");
        }
        // What is not a credential arrives as it was.
        assert!(
            exported.contains("postgres://kgmesh:***@db:5432/kg"),
            "{exported}"
        );
        assert!(exported.contains("docs"), "{exported}");
        assert!(exported.contains("caller refused"), "{exported}");
        let attribute = |name: &str| {
            spans[0]
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == name)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(
            attribute("password"),
            Some(Value::from(crate::redact::MASK))
        );
        assert_eq!(attribute("token_budget"), Some(Value::I64(400)));
        let _ = provider.shutdown();
    }
}
