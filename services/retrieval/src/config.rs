//! [`RetrievalConfig`]: what the retrieval service needs to start.

/// Configuration of the retrieval service.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalConfig {
    /// FalkorDB address, `redis://host:port`.
    pub falkordb_url: String,
    /// Full-text query words match and count by their English stem, or exactly (default).
    #[serde(default)]
    pub fulltext_stemming: bool,
    /// Share (0..=1) of the query's idf weight a full-text hit must match to earn its rank's
    /// whole contribution beside vector hits; default
    /// [`crate::service::DEFAULT_FUSION_FULLTEXT_FULL_MATCH`], 0 weighs every hit fully.
    /// `fusion_fulltext_min_match`, its name when it was a cut, is still read.
    #[serde(default, alias = "fusion_fulltext_min_match")]
    pub fusion_fulltext_full_match: Option<f64>,
    /// Fold chunks with the same text into one hit unless a request says otherwise
    /// (default on).
    #[serde(default)]
    pub collapse_duplicates: Option<bool>,
    /// Seconds the counts cached per access scope (BM25 statistics, role degrees) are
    /// trusted before a search recounts them in the background (default 60; see
    /// [`crate::RetrievalService::with_statistics_ttl`]).
    #[serde(default)]
    pub statistics_ttl_seconds: Option<u64>,
}
