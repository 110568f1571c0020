//! The gateway's own metrics (audit delivery), exposed on `/metrics` after the
//! process-wide families of `kg_common::metrics`.

use std::sync::OnceLock;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Counters of the audit pipeline.
pub(crate) struct GatewayMetrics {
    registry: Registry,
    /// Audit events dropped because the queue to auth was full.
    pub(crate) audit_dropped: Counter,
    /// Audit events auth refused or could not be reached for.
    pub(crate) audit_failed: Counter,
}

/// The process-wide gateway metrics.
pub(crate) fn gateway_metrics() -> &'static GatewayMetrics {
    static METRICS: OnceLock<GatewayMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("kgmesh");
        let audit_dropped = Counter::default();
        let audit_failed = Counter::default();
        registry.register(
            "audit_dropped",
            "audit events dropped because the audit queue was full",
            audit_dropped.clone(),
        );
        registry.register(
            "audit_failed",
            "audit events auth refused or could not be reached for",
            audit_failed.clone(),
        );
        GatewayMetrics {
            registry,
            audit_dropped,
            audit_failed,
        }
    })
}

/// One OpenMetrics exposition: the shared families, then the gateway's, one EOF.
pub(crate) fn encode_text() -> String {
    let shared = kg_common::metrics::encode_text();
    let mut out = shared.strip_suffix("# EOF\n").unwrap_or(&shared).to_owned();
    if encode_registry(&mut out, &gateway_metrics().registry).is_err() {
        tracing::error!("could not encode the gateway metrics");
    }
    // Writing to a String cannot fail.
    let _ = encode_eof(&mut out);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_both_registries_and_one_eof() {
        gateway_metrics().audit_dropped.inc();
        let text = encode_text();
        assert!(text.contains("kgmesh_audit_dropped_total"), "{text}");
        assert!(text.contains("kgmesh_audit_failed_total"), "{text}");
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
    }
}
