//! [`GraphConfig`]: what the graph service needs to start.

/// Configuration of the graph service.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct GraphConfig {
    /// FalkorDB address, `redis://host:port`.
    pub falkordb_url: String,
}
