//! The gateway's own metrics (audit delivery, tool calls run ahead of auth's answer, session
//! tool calls answered without rmcp's session worker), exposed on `/metrics` after the
//! process-wide families of `kg_common::metrics`.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Counters of the gateway's own paths.
pub(crate) struct GatewayMetrics {
    registry: Registry,
    /// Audit events dropped because the queue to auth was full.
    pub(crate) audit_dropped: Counter,
    /// Audit events auth refused or could not be reached for.
    pub(crate) audit_failed: Counter,
    /// Tool calls run ahead of auth's answer whose result was released (same access).
    pub(crate) run_ahead_released: Counter,
    /// Tool calls run ahead whose access had changed, so they ran again.
    pub(crate) run_ahead_rerun: Counter,
    /// Tool calls run ahead that auth then refused (their result never left).
    pub(crate) run_ahead_refused: Counter,
    /// Session tool calls answered on the HTTP task, not through rmcp's session worker.
    pub(crate) session_calls_direct: Counter,
    /// Sessionless (2026-07-28) tool calls answered on the HTTP task, not through rmcp.
    pub(crate) sessionless_calls_direct: Counter,
    /// Requests refused with 401, by why: a leaked token tried after its revocation, or a
    /// guessing client, shows here (no audit event: there is no principal to record).
    pub(crate) bearer_refused: Family<RefusedLabels, Counter>,
}

/// Why a bearer was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusedLabels {
    /// `missing` (no bearer), `malformed` (not a kgmesh PAT) or `refused` (auth did not
    /// accept it: unknown, revoked, expired, another deployment's).
    pub(crate) reason: &'static str,
}

/// The process-wide gateway metrics.
pub(crate) fn gateway_metrics() -> &'static GatewayMetrics {
    static METRICS: OnceLock<GatewayMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("kgmesh");
        let audit_dropped = Counter::default();
        let audit_failed = Counter::default();
        let run_ahead_released = Counter::default();
        let run_ahead_rerun = Counter::default();
        let run_ahead_refused = Counter::default();
        let session_calls_direct = Counter::default();
        let sessionless_calls_direct = Counter::default();
        let bearer_refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            "bearer_refused",
            "requests refused with 401 by the bearer check, by reason (missing, malformed, refused by auth)",
            bearer_refused.clone(),
        );
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
        registry.register(
            "tool_calls_run_ahead_released",
            "tool calls started beside Authorize whose result was released: auth returned the same access",
            run_ahead_released.clone(),
        );
        registry.register(
            "tool_calls_run_ahead_rerun",
            "tool calls started beside Authorize that ran again: auth returned changed access",
            run_ahead_rerun.clone(),
        );
        registry.register(
            "tool_calls_run_ahead_refused",
            "tool calls started beside Authorize that auth refused; no result left the gateway",
            run_ahead_refused.clone(),
        );
        registry.register(
            "session_tool_calls_direct",
            "session tool calls answered as JSON on the HTTP task instead of through rmcp's session worker",
            session_calls_direct.clone(),
        );
        registry.register(
            "sessionless_tool_calls_direct",
            "sessionless (2026-07-28) tool calls answered as JSON on the HTTP task instead of through rmcp",
            sessionless_calls_direct.clone(),
        );
        GatewayMetrics {
            registry,
            audit_dropped,
            audit_failed,
            run_ahead_released,
            run_ahead_rerun,
            run_ahead_refused,
            session_calls_direct,
            sessionless_calls_direct,
            bearer_refused,
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
        for family in [
            "kgmesh_tool_calls_run_ahead_released_total",
            "kgmesh_tool_calls_run_ahead_rerun_total",
            "kgmesh_tool_calls_run_ahead_refused_total",
            "kgmesh_session_tool_calls_direct_total",
        ] {
            assert!(text.contains(family), "{family}: {text}");
        }
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
    }
}
