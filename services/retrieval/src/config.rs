//! [`RetrievalConfig`]: what the retrieval service needs to start.

/// Configuration of the retrieval service.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalConfig {
    /// FalkorDB address, `redis://host:port`.
    pub falkordb_url: String,
}
