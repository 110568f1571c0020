//! Logging and tracing: `tracing` to stderr (text or JSON), optionally
//! exported over OTLP when an endpoint is configured. Never to stdout: the
//! stdio MCP server's stdout carries JSON-RPC frames only.

use serde::Deserialize;
use tracing_subscriber::EnvFilter;
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

/// Installs the global subscriber for `service_name`. Call once per process.
pub fn init(
    service_name: &str,
    config: &TelemetryConfig,
) -> Result<TelemetryGuard, TelemetryError> {
    let directive = config
        .log_filter
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        // rmcp logs every session and initialize at info; that is request noise.
        .unwrap_or_else(|| "info,rmcp=warn".to_owned());
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
    let result = if config.log_json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
    // A second init in one process (tests) keeps the first subscriber.
    drop(result);
    Ok(TelemetryGuard { provider })
}
