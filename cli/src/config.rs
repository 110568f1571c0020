//! The typed configuration of `kgmesh up`: defaults < TOML file (`--config`)
//! < `KGMESH_*` environment < command-line flags, validated before anything
//! starts. Every problem is reported at once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kg_common::config::ConfigError;
use kg_common::telemetry::TelemetryConfig;
use serde::Deserialize;

use crate::mesh::MeshOptions;

/// Default gateway address.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// Default data directory.
pub const DEFAULT_DATA_DIR: &str = ".kgmesh";
/// Longest `[retrieval] statistics_ttl_seconds`: a day.
const MAX_STATISTICS_TTL_SECONDS: u64 = 86_400;

/// What the file and the environment may set (`KGMESH_DATA_DIR`,
/// `KGMESH_TELEMETRY__LOG_JSON`, ...). Unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpConfig {
    /// Where state lives.
    pub data_dir: Option<PathBuf>,
    /// Gateway address.
    pub http_addr: Option<String>,
    /// `sqlite://...` or `postgres://...`.
    pub database_url: Option<String>,
    /// `redis://...` of a FalkorDB; embedded when unset.
    pub falkordb_url: Option<String>,
    /// `nats://...`; embedded when unset.
    pub nats_url: Option<String>,
    /// Host header values accepted besides loopback.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call the gateway.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The externally visible base URL (for OAuth protected-resource metadata).
    pub public_base_url: Option<String>,
    /// Largest upload the admin REST accepts (default 32 MiB, at most 64 MiB).
    pub max_upload_bytes: Option<usize>,
    /// `[http_tls]`: the gateway serves HTTPS on `http_addr` with this certificate.
    pub http_tls: Option<kg_common::tls::HttpsFiles>,
    /// Logging and tracing.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// File tools.
    #[serde(default)]
    pub files: FilesSection,
    #[serde(default)]
    pub audit: AuditSection,
    /// The approval service.
    #[serde(default)]
    pub approval: ApprovalSection,
    /// Which embedder the indexer (and vector search) use.
    #[serde(default)]
    pub embedding: kg_embed::EmbeddingConfig,
    /// Where vectors live.
    #[serde(default)]
    pub vector: VectorSection,
    /// Indexer throughput.
    #[serde(default)]
    pub indexer: IndexerSection,
    /// Search (`[retrieval]`).
    #[serde(default)]
    pub retrieval: RetrievalSection,
    /// One service per process (`kgmesh serve`); `kgmesh up` does not read it.
    #[serde(default)]
    pub cluster: ClusterSection,
}

/// `[cluster]`: what `kgmesh serve <service>` needs besides the shared settings: where this
/// process listens, where the other services are, and the state every replica must share.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// gRPC address of this process; default every interface on the service's own port
    /// (auth 7101, files 7102, retrieval 7103, graph 7104, ontology 7105, approval 7106,
    /// indexer 7107); the gateway listens on `http_addr`.
    pub listen_addr: Option<SocketAddr>,
    /// `http://HOST:PORT` of the auth service; every other service fetches the
    /// caller-context key from it.
    pub auth_addr: Option<String>,
    /// The files service (the gateway calls it).
    pub files_addr: Option<String>,
    /// The retrieval service (the gateway calls it).
    pub retrieval_addr: Option<String>,
    /// The graph service (the gateway calls it).
    pub graph_addr: Option<String>,
    /// The ontology service (the gateway; approval re-checks actions with it).
    pub ontology_addr: Option<String>,
    /// The approval service (the gateway; ontology submits proposals to it).
    pub approval_addr: Option<String>,
    /// Holds `caller-signing.key` and `pat-hmac.key` (32 bytes each) for auth; never created
    /// by serve. Default `<data_dir>/secrets`.
    pub secrets_dir: Option<PathBuf>,
    /// Blob directory: files writes, the indexer reads (one shared volume). Default
    /// `<data_dir>/blobs`.
    pub blob_dir: Option<PathBuf>,
    /// Tags every PAT auth issues; keep it for the life of the install.
    pub deployment_id: Option<String>,
    /// Plain HTTP `/metrics` and `/health` of a service process (the gateway has its own).
    pub metrics_addr: Option<SocketAddr>,
    /// `[cluster.tls]`: mutual TLS between the services (CA, certificate and key files, PEM).
    /// With it every service requires a client certificate from the CA and every `*_addr` is
    /// `https://`; without it they talk plain h2c.
    pub tls: Option<kg_common::tls::TlsFiles>,
}

/// `[retrieval]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalSection {
    /// Index of the `fulltext` lane: `falkordb` (default) or `qdrant_sparse` (BM25 sparse
    /// vectors in Qdrant, written with or without embeddings).
    pub fulltext_backend: Option<kg_stores::vector::sparse::FulltextBackend>,
    /// FalkorDB's full-text lane matches and counts query words by their English stem
    /// (`true`) or as exact tokens (`false`, the default).
    pub fulltext_stemming: Option<bool>,
    /// Share (0..=1) of the query's idf weight a full-text hit must match to earn its rank's
    /// whole contribution beside vector hits; less earns (held / share)² of it (default 0.5;
    /// 0 weighs every full-text hit fully). Read under its earlier name,
    /// `fusion_fulltext_min_match`, too.
    #[serde(alias = "fusion_fulltext_min_match")]
    pub fusion_fulltext_full_match: Option<f64>,
    /// Chunks whose text is the same fuse as one hit listing the others (default `true`);
    /// a request's `ranking.collapseDuplicates` overrides it.
    pub collapse_duplicates: Option<bool>,
    /// Seconds BM25's corpus statistics, document frequencies and graph_expand's role
    /// degrees are trusted per access scope before a search recounts them in the background
    /// (default 60; 1..=86400). Older counts keep serving, up to ten times as long, while
    /// they are recounted.
    pub statistics_ttl_seconds: Option<u64>,
}

/// `[vector]`: embedded qdrant-edge under the data dir unless a server is named.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorSection {
    /// gRPC URL of a Qdrant server, e.g. `http://qdrant:6334`.
    pub qdrant_url: Option<String>,
    /// Environment variable holding the Qdrant API key.
    pub api_key_env: Option<String>,
    /// Collection on the server (default `kgmesh`).
    pub collection: Option<String>,
}

/// `[indexer]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexerSection {
    /// Events indexed at once (default 4); one file's events never overlap.
    pub concurrency: Option<usize>,
    /// Blocks are packed into a chunk until the next would pass this many cl100k tokens
    /// (default 300). Files indexed before a change keep their chunks until a reindex.
    pub chunk_target_tokens: Option<usize>,
    /// No chunk holds more tokens than this, overlap included (default 512).
    pub chunk_max_tokens: Option<usize>,
    /// Tokens of the previous chunk's tail that a chunk continuing its section starts with
    /// (default 0).
    pub chunk_overlap_tokens: Option<usize>,
    /// `[indexer.llm]`: the optional LLM extractor, off by default.
    #[serde(default)]
    pub llm: kg_indexer::entities::llm::LlmConfig,
}

/// Bounds of `[indexer] chunk_max_tokens`: a chunk is the unit every lane ranks and every
/// package carries, so a page of 32 of the largest stays a few hundred kilobytes.
const CHUNK_MAX_TOKENS: std::ops::RangeInclusive<usize> = 16..=4096;

impl IndexerSection {
    fn chunk_options(&self) -> kg_indexer::document::ChunkOptions {
        let default = kg_indexer::document::ChunkOptions::default();
        kg_indexer::document::ChunkOptions {
            target_tokens: self.chunk_target_tokens.unwrap_or(default.target_tokens),
            max_tokens: self.chunk_max_tokens.unwrap_or(default.max_tokens),
            overlap_tokens: self.chunk_overlap_tokens.unwrap_or(default.overlap_tokens),
        }
    }

    fn chunk_problems(&self) -> Vec<String> {
        let options = self.chunk_options();
        let mut problems = Vec::new();
        if !CHUNK_MAX_TOKENS.contains(&options.max_tokens) {
            problems.push(format!(
                "indexer.chunk_max_tokens: expected {}..={}, got {}",
                CHUNK_MAX_TOKENS.start(),
                CHUNK_MAX_TOKENS.end(),
                options.max_tokens
            ));
        } else if !(1..=options.max_tokens).contains(&options.target_tokens) {
            problems.push(format!(
                "indexer.chunk_target_tokens: expected 1..={} (at most indexer.chunk_max_tokens), got {}",
                options.max_tokens, options.target_tokens
            ));
        } else if options.overlap_tokens >= options.target_tokens {
            problems.push(format!(
                "indexer.chunk_overlap_tokens: expected less than indexer.chunk_target_tokens ({}), got {}",
                options.target_tokens, options.overlap_tokens
            ));
        }
        problems
    }
}

/// `[approval]`: how approved effects are signed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSection {
    /// Name of the environment variable holding the webhook signing secret
    /// (at least 16 bytes). Unset: a random secret is generated once and kept
    /// in `<data_dir>/secrets/webhook-signing.secret`.
    pub webhook_signing_secret_env: Option<String>,
    /// Four-eyes rule: the proposer (the user behind the agent) may not
    /// approve their own proposal; another admin must. Default false.
    #[serde(default)]
    pub four_eyes: bool,
}

/// `[files]`: limits of kg_files / kg_file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesSection {
    /// Largest file kg_file queries (sql, regex, JSON); larger ones can only be
    /// read with a text line window. Default 10 MiB, as the tool documents.
    pub max_query_file_bytes: Option<u64>,
    /// Seconds between sweeps of the blobs no version needs (deleted files, replaced
    /// versions) and of the registry rows of versions nothing names; 0 turns the sweep off.
    /// Default 3600.
    pub blob_sweep_every_seconds: Option<u64>,
    /// Seconds an unreferenced blob is kept after it was written or uploaded again; at least
    /// 60, since a blob is stored just before its version is registered. Default 3600.
    pub blob_sweep_grace_seconds: Option<u64>,
}

impl FilesSection {
    fn problems(&self) -> Vec<String> {
        let least = kg_files::MIN_BLOB_SWEEP_GRACE.as_secs();
        match self.blob_sweep_grace_seconds {
            Some(grace) if grace < least => vec![format!(
                "files.blob_sweep_grace_seconds: expected at least {least} \
                 (an upload stores its blob just before it registers the version), got {grace}"
            )],
            _ => Vec::new(),
        }
    }

    /// The sweep these settings ask for; `None` when it is off.
    fn blob_sweep(&self) -> Option<kg_files::BlobSweep> {
        let default = kg_files::BlobSweep::default();
        let every = self
            .blob_sweep_every_seconds
            .map_or(default.every, Duration::from_secs);
        (!every.is_zero()).then(|| kg_files::BlobSweep {
            every,
            grace: self
                .blob_sweep_grace_seconds
                .map_or(default.grace, Duration::from_secs),
        })
    }
}

/// `[audit]`: how long the audit log keeps its events.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// Days an audit event is kept; older ones are deleted at start and then hourly. 0 or
    /// unset keeps every event.
    pub retention_days: Option<u64>,
}

/// The longest audit retention that is not "keep every event" (100 years).
const MAX_AUDIT_RETENTION_DAYS: u64 = 36_500;

impl AuditSection {
    fn problems(&self) -> Vec<String> {
        match self.retention_days {
            Some(days) if days > MAX_AUDIT_RETENTION_DAYS => vec![format!(
                "audit.retention_days: expected 0 (keep every event) to \
                 {MAX_AUDIT_RETENTION_DAYS}, got {days}"
            )],
            _ => Vec::new(),
        }
    }

    /// How long an event is kept; `None` keeps every event.
    fn retention(&self) -> Option<Duration> {
        self.retention_days
            .filter(|days| *days > 0)
            .map(|days| Duration::from_secs(days * 86_400))
    }
}

/// What is wrong with the host and port of a service address whose scheme is right: a
/// service is reached at a host and an explicit port, with no path (gRPC routes by its own).
fn authority_problem(addr: &str) -> Option<String> {
    let rest = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#']) {
        return Some("has a path or query; give only http://HOST:PORT".to_owned());
    }
    let Ok(authority) = rest.parse::<http::uri::Authority>() else {
        return Some(
            "does not name a host and a port (1-65535): expected http://HOST:PORT".to_owned(),
        );
    };
    // `Authority` reads a port past 65535 as none at all.
    let port_written = authority
        .as_str()
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()));
    match (port_written, authority.port_u16()) {
        _ if authority.host().is_empty() => {
            Some("names no host: expected http://HOST:PORT".to_owned())
        }
        (false, _) => {
            Some("names no port: every service listens on its own, e.g. :7101".to_owned())
        }
        (true, None | Some(0)) => Some("names no port from 1 to 65535 (1-65535)".to_owned()),
        (true, Some(_)) => None,
    }
}

impl ClusterSection {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, addr) in [
            ("auth_addr", &self.auth_addr),
            ("files_addr", &self.files_addr),
            ("retrieval_addr", &self.retrieval_addr),
            ("graph_addr", &self.graph_addr),
            ("ontology_addr", &self.ontology_addr),
            ("approval_addr", &self.approval_addr),
        ] {
            let Some(addr) = addr else { continue };
            match (addr.split_once("://").map(|(scheme, _)| scheme), &self.tls) {
                (Some("http"), None) | (Some("https"), Some(_)) => {
                    if let Some(problem) = authority_problem(addr) {
                        problems.push(format!("cluster.{key}: `{addr}` {problem}"));
                    }
                }
                (Some("http"), Some(_)) => problems.push(format!(
                    "cluster.{key}: `{addr}` is plaintext but [cluster.tls] is set, and every \
                     service then requires TLS: use https://HOST:PORT"
                )),
                (Some("https"), None) => problems.push(format!(
                    "cluster.{key}: `{addr}` needs TLS between services: set [cluster.tls] \
                     (ca_file, cert_file, key_file) or use http://HOST:PORT"
                )),
                _ => problems.push(format!(
                    "cluster.{key}: expected http://HOST:PORT (https:// with [cluster.tls]), \
                     got `{addr}`"
                )),
            }
        }
        // The certificates are read now, so `serve --check` reports them with the rest.
        if let Some(files) = &self.tls
            && let Err(problem) = kg_common::tls::ClusterTls::load(files)
        {
            problems.push(problem.to_string());
        }
        if let Some(id) = &self.deployment_id
            && (id.trim().is_empty() || id.len() > 200)
        {
            problems.push("cluster.deployment_id: expected 1 to 200 characters".to_owned());
        }
        problems
    }
}

/// Values given on the command line; `None` leaves the lower layers in charge.
#[derive(Debug, Default)]
pub struct UpFlags {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--http-addr`.
    pub http_addr: Option<String>,
    /// `--database-url`.
    pub database_url: Option<String>,
    /// `--falkordb-url`.
    pub falkordb_url: Option<String>,
    /// `--nats-url`.
    pub nats_url: Option<String>,
    /// `--allowed-host` (added to the configured ones).
    pub allowed_hosts: Vec<String>,
    /// `--log-json`.
    pub log_json: bool,
}

/// Loads the file and environment, applies flags, and validates.
pub fn resolve(
    file: Option<&Path>,
    flags: UpFlags,
) -> Result<(MeshOptions, TelemetryConfig), ConfigError> {
    resolve_with_cluster(file, flags, Sections::ALL)
        .map(|(options, telemetry, _)| (options, telemetry))
}

/// Which sections a process uses, so one it does not use cannot stop it: the LLM key is given
/// to the indexer alone, the embedder's CA file to the processes that embed.
#[derive(Debug, Clone, Copy)]
pub struct Sections {
    /// `[embedding]` (and the vector index it writes).
    pub embedding: bool,
    /// `[indexer.llm]`.
    pub llm: bool,
    /// `[http_tls]` (the gateway's certificate, mounted only where the gateway runs).
    pub http_tls: bool,
}

impl Sections {
    /// Every section: `kgmesh up`, which runs every service.
    pub const ALL: Sections = Sections {
        embedding: true,
        llm: true,
        http_tls: true,
    };
}

/// [`resolve`] for a process that uses `sections`, with the `[cluster]` section `kgmesh serve`
/// reads.
pub fn resolve_with_cluster(
    file: Option<&Path>,
    flags: UpFlags,
    sections: Sections,
) -> Result<(MeshOptions, TelemetryConfig, ClusterSection), ConfigError> {
    let config: UpConfig = kg_common::config::load(file)?;
    let mut problems = Vec::new();

    let http_addr_text = flags
        .http_addr
        .or(config.http_addr)
        .unwrap_or_else(|| DEFAULT_HTTP_ADDR.to_owned());
    let http_addr = match http_addr_text.parse::<SocketAddr>() {
        Ok(addr) => Some(addr),
        Err(_) => {
            problems.push(format!(
                "http_addr: expected an IP address and port such as 127.0.0.1:8080 or [::1]:8080 (not a host name), got `{http_addr_text}`"
            ));
            None
        }
    };
    let database_url = flags.database_url.or(config.database_url);
    if let Some(url) = &database_url
        && !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
    {
        problems.push("database_url: expected sqlite://PATH or postgres://USER@HOST/DB".to_owned());
    }
    let falkordb_url = flags.falkordb_url.or(config.falkordb_url);
    if let Some(url) = &falkordb_url
        && !(url.starts_with("redis://") || url.starts_with("falkor://"))
    {
        problems.push("falkordb_url: expected redis://HOST:PORT".to_owned());
    }
    let nats_url = flags.nats_url.or(config.nats_url);
    if let Some(url) = &nats_url
        && !(url.starts_with("nats://") || url.starts_with("tls://"))
    {
        problems.push("nats_url: expected nats://HOST:PORT".to_owned());
    }
    if let Some(url) = &config.public_base_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        problems.push("public_base_url: expected http://... or https://...".to_owned());
    }
    if let Some(name) = &config.approval.webhook_signing_secret_env {
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            problems.push(format!(
                "approval.webhook_signing_secret_env: `{name}` is not an environment variable name (A-Z, 0-9, _)"
            ));
        } else if name.starts_with(kg_common::config::ENV_PREFIX) {
            // KGMESH_* variables are read as config keys; a secret there would be refused as unknown.
            problems.push(format!(
                "approval.webhook_signing_secret_env: `{name}` starts with KGMESH_, which is reserved for configuration; pick another name"
            ));
        }
    }
    if sections.embedding {
        problems.extend(config.embedding.problems());
    }
    if config.retrieval.fulltext_backend
        == Some(kg_stores::vector::sparse::FulltextBackend::QdrantSparse)
        && config.vector.qdrant_url.is_none()
    {
        problems.push(
            "retrieval.fulltext_backend: qdrant_sparse needs vector.qdrant_url (the embedded \
             qdrant-edge 0.6.0 cannot search sparse vectors)"
                .to_owned(),
        );
    }
    if let Some(url) = &config.vector.qdrant_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        problems.push("vector.qdrant_url: expected http://HOST:6334".to_owned());
    }
    if let Some(n) = config.indexer.concurrency
        && !(1..=64).contains(&n)
    {
        problems.push(format!("indexer.concurrency: expected 1..=64, got {n}"));
    }
    problems.extend(config.indexer.chunk_problems());
    if let Some(share) = config.retrieval.fusion_fulltext_full_match
        && !(0.0..=1.0).contains(&share)
    {
        problems.push(format!(
            "retrieval.fusion_fulltext_full_match: expected a share from 0 to 1, got {share}"
        ));
    }
    if let Some(seconds) = config.retrieval.statistics_ttl_seconds
        && !(1..=MAX_STATISTICS_TTL_SECONDS).contains(&seconds)
    {
        problems.push(format!(
            "retrieval.statistics_ttl_seconds: expected 1..={MAX_STATISTICS_TTL_SECONDS} seconds, got {seconds}"
        ));
    }
    if sections.llm {
        problems.extend(config.indexer.llm.problems());
    }
    problems.extend(config.cluster.problems());
    problems.extend(config.files.problems());
    problems.extend(config.audit.problems());
    if let Some(files) = config.http_tls.as_ref().filter(|_| sections.http_tls)
        && let Err(problem) = kg_common::tls::https_server_config(files)
    {
        problems.push(problem.to_string());
    }
    let mut telemetry = config.telemetry;
    telemetry.log_json |= flags.log_json;
    if let Some(filter) = &telemetry.log_filter
        && let Err(err) = kg_common::telemetry::validate_filter(filter)
    {
        problems.push(format!("telemetry.log_filter: {err}"));
    }
    let (Some(http_addr), true) = (http_addr, problems.is_empty()) else {
        return Err(ConfigError { problems });
    };
    let mut allowed_hosts = config.allowed_hosts;
    allowed_hosts.extend(flags.allowed_hosts);
    let cluster = config.cluster;
    Ok((
        MeshOptions {
            data_dir: flags
                .data_dir
                .or(config.data_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
            http_addr,
            database_url,
            falkordb_url,
            nats_url,
            allowed_hosts,
            allowed_origins: config.allowed_origins,
            public_base_url: config.public_base_url,
            http_tls: config.http_tls,
            max_query_file_bytes: config.files.max_query_file_bytes,
            blob_sweep: config.files.blob_sweep(),
            audit_retention: config.audit.retention(),
            max_upload_bytes: config.max_upload_bytes,
            fulltext_stemming: config.retrieval.fulltext_stemming.unwrap_or(false),
            fusion_fulltext_full_match: config
                .retrieval
                .fusion_fulltext_full_match
                .unwrap_or(kg_retrieval::DEFAULT_FUSION_FULLTEXT_FULL_MATCH),
            collapse_duplicates: config.retrieval.collapse_duplicates.unwrap_or(true),
            statistics_ttl: config
                .retrieval
                .statistics_ttl_seconds
                .map_or(kg_retrieval::DEFAULT_STATISTICS_TTL, Duration::from_secs),
            approval: crate::mesh::ApprovalOptions {
                webhook_signing_secret_env: config.approval.webhook_signing_secret_env,
                four_eyes: config.approval.four_eyes,
                ..Default::default()
            },
            indexer: kg_indexer::IndexerSettings {
                embedding: config.embedding,
                qdrant_url: config.vector.qdrant_url,
                qdrant_api_key_env: config.vector.api_key_env,
                collection: config
                    .vector
                    .collection
                    .unwrap_or_else(|| kg_indexer::settings::DEFAULT_COLLECTION.to_owned()),
                concurrency: config.indexer.concurrency.unwrap_or(4),
                chunk: config.indexer.chunk_options(),
                llm: config.indexer.llm,
                fulltext_backend: config.retrieval.fulltext_backend.unwrap_or_default(),
            },
        },
        telemetry,
        cluster,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_sparse_fulltext_backend_needs_a_qdrant_server() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        std::fs::write(&file, "[retrieval]\nfulltext_backend = \"qdrant_sparse\"\n").unwrap();
        let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
        assert!(
            err.problems
                .iter()
                .any(|p| p.contains("qdrant_sparse needs vector.qdrant_url")),
            "{:?}",
            err.problems
        );
        std::fs::write(
            &file,
            "[retrieval]\nfulltext_backend = \"qdrant_sparse\"\n[vector]\nqdrant_url = \"http://q:6334\"\n",
        )
        .unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert_eq!(
            options.indexer.fulltext_backend,
            kg_stores::vector::sparse::FulltextBackend::QdrantSparse
        );
        let (options, _) = resolve(None, UpFlags::default()).unwrap();
        assert_eq!(
            options.indexer.fulltext_backend,
            kg_stores::vector::sparse::FulltextBackend::Falkordb
        );
    }

    #[test]
    fn fulltext_stemming_is_off_unless_switched_on() {
        let (options, _) = resolve(None, UpFlags::default()).unwrap();
        assert!(!options.fulltext_stemming);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        std::fs::write(&file, "[retrieval]\nfulltext_stemming = true\n").unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert!(options.fulltext_stemming);
        assert!((options.fusion_fulltext_full_match - 0.5).abs() < 1e-9);
        std::fs::write(&file, "[retrieval]\nfusion_fulltext_full_match = 0\n").unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert!(options.fusion_fulltext_full_match.abs() < 1e-9);
        // The setting's earlier name still configures it.
        std::fs::write(&file, "[retrieval]\nfusion_fulltext_min_match = 0.3\n").unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert!((options.fusion_fulltext_full_match - 0.3).abs() < 1e-9);
        assert!(options.collapse_duplicates, "on unless configured off");
        std::fs::write(&file, "[retrieval]\ncollapse_duplicates = false\n").unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert!(!options.collapse_duplicates);
        std::fs::write(&file, "[retrieval]\nfusion_fulltext_full_match = 1.5\n").unwrap();
        let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
        assert!(
            format!("{err:?}").contains("fusion_fulltext_full_match: expected a share from 0 to 1"),
            "{err:?}"
        );
        std::fs::write(&file, "[retrieval]\nfulltext_stemming = \"no\"\n").unwrap();
        let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
        assert!(
            err.problems.iter().any(|p| p.contains("fulltext_stemming")),
            "{:?}",
            err.problems
        );
    }

    #[test]
    fn statistics_ttl_is_a_minute_unless_configured_within_a_day() {
        let (options, _) = resolve(None, UpFlags::default()).unwrap();
        assert_eq!(options.statistics_ttl, Duration::from_secs(60));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        std::fs::write(&file, "[retrieval]\nstatistics_ttl_seconds = 300\n").unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert_eq!(options.statistics_ttl, Duration::from_secs(300));
        for bad in ["0", "86401"] {
            std::fs::write(
                &file,
                format!("[retrieval]\nstatistics_ttl_seconds = {bad}\n"),
            )
            .unwrap();
            let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
            assert!(
                err.problems.iter().any(|p| p.contains(&format!(
                    "retrieval.statistics_ttl_seconds: expected 1..=86400 seconds, got {bad}"
                ))),
                "{:?}",
                err.problems
            );
        }
    }

    #[test]
    fn chunk_sizes_are_the_chunkers_unless_configured_and_stay_consistent() {
        let (options, _) = resolve(None, UpFlags::default()).unwrap();
        assert_eq!(
            options.indexer.chunk,
            kg_indexer::document::ChunkOptions::default()
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        let with = |indexer: &str| {
            std::fs::write(&file, format!("[indexer]\n{indexer}\n")).unwrap();
            resolve(Some(&file), UpFlags::default())
        };
        let (options, _) =
            with("chunk_target_tokens = 180\nchunk_max_tokens = 250\nchunk_overlap_tokens = 30")
                .unwrap();
        assert_eq!(
            options.indexer.chunk,
            kg_indexer::document::ChunkOptions {
                target_tokens: 180,
                max_tokens: 250,
                overlap_tokens: 30,
            }
        );
        for (bad, problem) in [
            (
                "chunk_max_tokens = 8",
                "indexer.chunk_max_tokens: expected 16..=4096, got 8",
            ),
            (
                "chunk_max_tokens = 5000",
                "indexer.chunk_max_tokens: expected 16..=4096, got 5000",
            ),
            // The default target (300) over a smaller cap is named, not clamped silently.
            (
                "chunk_max_tokens = 200",
                "indexer.chunk_target_tokens: expected 1..=200 (at most indexer.chunk_max_tokens), got 300",
            ),
            (
                "chunk_target_tokens = 0",
                "indexer.chunk_target_tokens: expected 1..=512 (at most indexer.chunk_max_tokens), got 0",
            ),
            (
                "chunk_target_tokens = 100\nchunk_overlap_tokens = 100",
                "indexer.chunk_overlap_tokens: expected less than indexer.chunk_target_tokens (100), got 100",
            ),
        ] {
            let err = with(bad).unwrap_err();
            assert!(
                err.problems.iter().any(|p| p == problem),
                "{bad}: {:?}",
                err.problems
            );
        }
    }

    #[test]
    fn the_audit_log_keeps_every_event_unless_a_retention_is_set() {
        let (options, _) = resolve(None, UpFlags::default()).unwrap();
        assert_eq!(options.audit_retention, None);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        let with = |audit: &str| {
            std::fs::write(&file, format!("[audit]\n{audit}\n")).unwrap();
            resolve(Some(&file), UpFlags::default())
        };
        let (options, _) = with("retention_days = 90").unwrap();
        assert_eq!(
            options.audit_retention,
            Some(Duration::from_secs(90 * 86_400))
        );
        let (options, _) = with("retention_days = 0").unwrap();
        assert_eq!(options.audit_retention, None);
        let err = with("retention_days = 40000").unwrap_err();
        assert_eq!(
            err.problems,
            ["audit.retention_days: expected 0 (keep every event) to 36500, got 40000"]
        );
        let err = with("retention = 90").unwrap_err();
        assert!(
            err.problems.iter().any(|p| p.contains("retention")),
            "{:?}",
            err.problems
        );
    }

    #[test]
    fn the_blob_sweep_runs_hourly_unless_configured_and_keeps_a_minute_at_least() {
        let (options, _) = resolve(None, UpFlags::default()).unwrap();
        assert_eq!(options.blob_sweep, Some(kg_files::BlobSweep::default()));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        let with = |files: &str| {
            std::fs::write(&file, format!("[files]\n{files}\n")).unwrap();
            resolve(Some(&file), UpFlags::default())
        };
        let (options, _) =
            with("blob_sweep_every_seconds = 600\nblob_sweep_grace_seconds = 60").unwrap();
        assert_eq!(
            options.blob_sweep,
            Some(kg_files::BlobSweep {
                every: Duration::from_secs(600),
                grace: Duration::from_secs(60),
            })
        );
        let (options, _) = with("blob_sweep_every_seconds = 0").unwrap();
        assert_eq!(options.blob_sweep, None);
        let err = with("blob_sweep_grace_seconds = 5").unwrap_err();
        assert!(
            err.problems.iter().any(|p| p
                .starts_with("files.blob_sweep_grace_seconds: expected at least 60")
                && p.ends_with("got 5")),
            "{:?}",
            err.problems
        );
    }

    #[test]
    fn the_shipped_example_config_loads() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kgmesh.example.toml");
        let (options, telemetry) = resolve(Some(&example), UpFlags::default()).unwrap();
        assert_eq!(options.http_addr.to_string(), "127.0.0.1:8080");
        assert_eq!(options.data_dir, PathBuf::from(".kgmesh"));
        assert!(!telemetry.log_json);
    }

    #[test]
    fn flags_win_over_the_file_and_problems_are_all_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.toml");
        std::fs::write(
            &file,
            "http_addr = \"127.0.0.1:9000\"\ndata_dir = \"/tmp/a\"\n",
        )
        .unwrap();
        let flags = UpFlags {
            data_dir: Some("/tmp/b".into()),
            ..Default::default()
        };
        let (options, _) = resolve(Some(&file), flags).unwrap();
        assert_eq!(options.http_addr.to_string(), "127.0.0.1:9000");
        assert_eq!(options.data_dir, PathBuf::from("/tmp/b"));

        std::fs::write(
            &file,
            "http_addr = \"nowhere\"\ndatabase_url = \"mysql://x\"\nnats_url = \"http://x\"\n[telemetry]\nlog_filter = \"info,=[\"\n",
        )
        .unwrap();
        let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
        assert_eq!(err.problems.len(), 4, "{:?}", err.problems);
        assert!(err.problems[0].contains("http_addr"));

        std::fs::write(
            &file,
            "[approval]\nwebhook_signing_secret_env = \"SHOP_SIGNING_SECRET\"\n",
        )
        .unwrap();
        let (options, _) = resolve(Some(&file), UpFlags::default()).unwrap();
        assert_eq!(
            options.approval.webhook_signing_secret_env.as_deref(),
            Some("SHOP_SIGNING_SECRET")
        );
        for bad in ["KGMESH_SECRET", "lower-case"] {
            std::fs::write(
                &file,
                format!("[approval]\nwebhook_signing_secret_env = \"{bad}\"\n"),
            )
            .unwrap();
            let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
            assert!(
                err.to_string().contains("webhook_signing_secret_env"),
                "{err}"
            );
        }

        std::fs::write(&file, "no_such_key = 1\n").unwrap();
        let err = resolve(Some(&file), UpFlags::default()).unwrap_err();
        assert!(err.to_string().contains("no_such_key"), "{err}");
    }

    #[test]
    fn a_service_address_needs_a_host_and_a_port_and_no_path() {
        for good in [
            "http://auth:7101",
            "http://127.0.0.1:7101/",
            "http://[::1]:7101",
        ] {
            assert_eq!(authority_problem(good), None, "{good}");
        }
        for (bad, says) in [
            ("http://127.0.0.1:99999", "(1-65535)"),
            ("http://files", "names no port"),
            ("http://", "(1-65535)"),
            ("http://127.0.0.1:7104/some/path?x=1", "has a path or query"),
            ("http://auth:0", "(1-65535)"),
        ] {
            let problem = authority_problem(bad).unwrap_or_default();
            assert!(problem.contains(says), "{bad}: {problem}");
        }
    }
}
