//! [`RetrievalConfig`]: what the retrieval service needs to start.

/// Configuration of the retrieval service.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalConfig {
    /// FalkorDB address, `redis://host:port`.
    pub falkordb_url: String,
    /// Full-text query words match and count by their English stem, or exactly (default).
    #[serde(default)]
    pub fulltext_stemming: bool,
}
