//! `kgmesh serve <service>`: one service per process, as each runs on Kubernetes (one
//! Deployment each, the lanes scaled on their own). The same config file as `kgmesh up`,
//! plus its `[cluster]` section: where this process listens, where the other services are,
//! and the state shared between processes (the auth keys, the blob volume). Stores are never
//! embedded here: each process connects to the same PostgreSQL, FalkorDB, NATS and Qdrant.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use kg_common::caller::{ContextSigner, ContextVerifier, PublicKey};
use kg_common::config::ConfigError;
use kg_gateway::BackendAddrs;
use kg_stores::blobs::BlobStore;
use kg_stores::graph::GraphStore;
use kg_stores::sql::SqlStore;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::ClusterSection;
use crate::mesh::{MeshOptions, OntologyOptions};

/// How long a service waits at start for auth to hand out the caller-context key.
const SIGNING_KEY_WAIT: Duration = Duration::from_secs(60);
/// The key auth signs caller contexts with (32 bytes) in `[cluster] secrets_dir`.
pub const CALLER_SIGNING_KEY_FILE: &str = "caller-signing.key";
/// The key PAT hashes are keyed with (32 bytes) in `[cluster] secrets_dir`.
pub const PAT_KEY_FILE: &str = "pat-hmac.key";

/// A service `kgmesh serve` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Service {
    /// Principals, grants, PATs; signs caller contexts.
    Auth,
    /// File registry, blobs, versions; kg_files, kg_file, get_knowledge_graph.
    Files,
    /// The ingest consumer (gRPC health only).
    Indexer,
    /// kg_search lanes and kg_entity_search.
    Retrieval,
    /// Chunk packages, hops, outlines, kg_cypher.
    Graph,
    /// Ontology projects and TBoxes.
    Ontology,
    /// Proposals, decisions and effects.
    Approval,
    /// MCP, admin REST, /health and /metrics on `http_addr`.
    Gateway,
}

impl Service {
    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Service::Auth => "auth",
            Service::Files => "files",
            Service::Indexer => "indexer",
            Service::Retrieval => "retrieval",
            Service::Graph => "graph",
            Service::Ontology => "ontology",
            Service::Approval => "approval",
            Service::Gateway => "gateway",
        }
    }

    /// The gRPC port a service listens on unless `[cluster] listen_addr` says otherwise.
    pub fn default_port(self) -> Option<u16> {
        match self {
            Service::Auth => Some(7101),
            Service::Files => Some(7102),
            Service::Retrieval => Some(7103),
            Service::Graph => Some(7104),
            Service::Ontology => Some(7105),
            Service::Approval => Some(7106),
            Service::Indexer => Some(7107),
            Service::Gateway => None,
        }
    }

    fn needs_sql(self) -> bool {
        matches!(
            self,
            Service::Auth | Service::Files | Service::Ontology | Service::Approval
        )
    }

    fn needs_graph(self) -> bool {
        matches!(self, Service::Indexer | Service::Retrieval | Service::Graph)
    }

    fn needs_nats(self) -> bool {
        matches!(
            self,
            Service::Files | Service::Indexer | Service::Graph | Service::Ontology
        )
    }

    /// Services that read or write the vector index.
    fn needs_vectors(self) -> bool {
        matches!(self, Service::Indexer | Service::Retrieval | Service::Graph)
    }

    /// The config sections this service reads beyond the shared ones.
    pub fn sections(self) -> crate::config::Sections {
        crate::config::Sections {
            embedding: self.needs_vectors(),
            llm: self == Service::Indexer,
            http_tls: self == Service::Gateway,
        }
    }
}

/// Everything one `kgmesh serve` process runs with.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Which service.
    pub service: Service,
    /// The resolved settings shared with `kgmesh up`.
    pub mesh: MeshOptions,
    /// `[cluster]`.
    pub cluster: ClusterSection,
    /// The ontology project (ontology service only).
    pub ontology: OntologyOptions,
}

impl ServeOptions {
    /// Every problem that stops `service` from starting with these settings, at once.
    pub fn check(&self) -> Result<(), ConfigError> {
        let service = self.service;
        let name = service.name();
        let mut problems = Vec::new();
        let mut require = |present: bool, key: &str, why: &str| {
            if !present {
                problems.push(format!("{key}: required by `kgmesh serve {name}` ({why})"));
            }
        };
        let mesh = &self.mesh;
        let cluster = &self.cluster;
        if service.needs_sql() {
            require(
                mesh.database_url.is_some(),
                "database_url",
                "its registry; every service shares one PostgreSQL",
            );
        }
        if service.needs_graph() {
            require(
                mesh.falkordb_url.is_some(),
                "falkordb_url",
                "no FalkorDB is embedded when services run apart",
            );
        }
        if service.needs_nats() {
            require(
                mesh.nats_url.is_some(),
                "nats_url",
                "ingest events and TBoxes travel over NATS JetStream",
            );
        }
        if service != Service::Auth {
            require(
                cluster.auth_addr.is_some(),
                "cluster.auth_addr",
                "the key that verifies caller contexts comes from auth",
            );
        }
        if service == Service::Gateway {
            for (present, key) in [
                (cluster.files_addr.is_some(), "cluster.files_addr"),
                (cluster.retrieval_addr.is_some(), "cluster.retrieval_addr"),
                (cluster.graph_addr.is_some(), "cluster.graph_addr"),
            ] {
                require(present, key, "the gateway calls it");
            }
        }
        if service == Service::Auth {
            require(
                cluster.deployment_id.is_some(),
                "cluster.deployment_id",
                "PATs carry its tag; keep it for the life of the install",
            );
            let dir = cluster.secrets_dir(&mesh.data_dir);
            for file in [CALLER_SIGNING_KEY_FILE, PAT_KEY_FILE] {
                if let Err(problem) = check_key_file(&dir.join(file)) {
                    problems.push(format!("cluster.secrets_dir: {problem}"));
                }
            }
        }
        // What the service reads at start beyond this file: the webhook secret's variable,
        // and the ontology project (parsed and checked; the warehouse is not dialled).
        if service == Service::Approval
            && let Some(env_name) = mesh.approval.webhook_signing_secret_env.as_deref()
            && let Err(err) = kg_approval::load_signing_secret(Some(env_name), Path::new(""))
        {
            problems.push(format!("approval.webhook_signing_secret_env: {err}"));
        }
        if service == Service::Ontology
            && let Some(dir) = &self.ontology.project_dir
        {
            match kg_ontology::LoadedProject::load(dir) {
                Ok(loaded) => {
                    for problem in kg_ontology::check_static(&loaded.project) {
                        problems.push(format!("--project-dir {}: {problem}", dir.display()));
                    }
                    if let Err(err) = loaded.warehouse_url(self.ontology.warehouse_url.as_deref()) {
                        problems.push(format!("--project-dir {}: {err}", dir.display()));
                    }
                }
                Err(err) => problems.push(format!("--project-dir: {err}")),
            }
        }
        if service.needs_vectors()
            && mesh.indexer.embedding.provider != kg_embed::Provider::None
            && mesh.indexer.qdrant_url.is_none()
        {
            problems.push(format!(
                "vector.qdrant_url: required by `kgmesh serve {name}` while embeddings are on \
                 (the embedded qdrant-edge lives in one process; services apart share a Qdrant \
                 server), or set embedding.provider = \"none\""
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }

    /// The address this process listens on: `[cluster] listen_addr`, else the service's port
    /// on every interface (the gateway: `http_addr`).
    pub fn listen_addr(&self) -> SocketAddr {
        match (self.cluster.listen_addr, self.service.default_port()) {
            (Some(addr), _) => addr,
            (None, Some(port)) => SocketAddr::from(([0, 0, 0, 0], port)),
            (None, None) => self.mesh.http_addr,
        }
    }
}

/// Why a key file of `secrets_dir` cannot be used.
fn check_key_file(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 32 => Ok(()),
        Ok(meta) => Err(format!(
            "{} holds {} bytes; it must hold exactly 32",
            path.display(),
            meta.len()
        )),
        Err(_) => Err(format!(
            "{} is missing: every auth replica must read the same key, so serve never \
             creates it (`head -c 32 /dev/urandom > {}` once, or mount the chart's Secret)",
            path.display(),
            path.display()
        )),
    }
}

fn read_key(dir: &Path, file: &str) -> anyhow::Result<[u8; 32]> {
    let path = dir.join(file);
    check_key_file(&path).map_err(|problem| anyhow!(problem))?;
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(&path) {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                "{} is readable by others than its owner (mode {mode:03o}): whoever reads it \
                 can sign a caller context (an admin's included) or mint PAT hashes; \
                 `chmod 600` it",
                path.display()
            );
        }
    }
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| anyhow!("{} must hold exactly 32 bytes", path.display()))
}

/// The auth service over the shared keys, for `serve auth` and `bootstrap-admin`.
pub async fn open_auth(options: &ServeOptions) -> anyhow::Result<kg_auth::AuthService> {
    let dir = options.cluster.secrets_dir(&options.mesh.data_dir);
    let signer = ContextSigner::from_secret_bytes(&read_key(&dir, CALLER_SIGNING_KEY_FILE)?);
    let pat_key = read_key(&dir, PAT_KEY_FILE)?.to_vec();
    let deployment_id = options
        .cluster
        .deployment_id
        .clone()
        .context("cluster.deployment_id is required")?;
    let sql = connect_sql(&options.mesh).await?;
    Ok(kg_auth::AuthService::new(sql, signer, pat_key, deployment_id).await?)
}

async fn connect_sql(mesh: &MeshOptions) -> anyhow::Result<SqlStore> {
    let url = mesh
        .database_url
        .as_deref()
        .context("database_url is required")?;
    SqlStore::connect(url)
        .await
        .context("cannot open the database at database_url")
}

async fn connect_graph(mesh: &MeshOptions) -> anyhow::Result<GraphStore> {
    let url = mesh
        .falkordb_url
        .as_deref()
        .context("falkordb_url is required")?;
    GraphStore::connect(url)
        .await
        .context("cannot reach FalkorDB at falkordb_url")
}

async fn connect_nats(mesh: &MeshOptions) -> anyhow::Result<async_nats::jetstream::Context> {
    let url = mesh.nats_url.as_deref().context("nats_url is required")?;
    kg_stores::events::connect(url)
        .await
        .context("cannot reach NATS at nats_url")
}

/// The embedder with the vector index (a Qdrant server: `check` refuses the embedded one
/// here) and the sparse full-text index, each when configured.
async fn open_vector_lanes(
    mesh: &MeshOptions,
) -> anyhow::Result<(
    Option<kg_indexer::Vectors>,
    Option<kg_stores::vector::sparse::SparseIndex>,
)> {
    let settings = &mesh.indexer;
    let vectors = settings
        .open_vectors(&mesh.data_dir.join("vectors"))
        .await
        .context("cannot start embeddings and the vector index")?;
    let sparse = settings
        .open_sparse(&mesh.data_dir.join("sparse"))
        .await
        .context("cannot open the sparse full-text index")?;
    Ok((vectors, sparse))
}

/// Asks auth for the public key that verifies caller contexts, retrying while it starts;
/// None when `shutdown` fires first (a pod stopped before auth came up exits at once).
async fn fetch_verifier(
    auth_addr: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<ContextVerifier>> {
    use kg_proto::v1::SigningKeyRequest;
    use kg_proto::v1::auth_client::AuthClient;
    let channel = kg_common::grpc::channel(auth_addr)
        .with_context(|| format!("cluster.auth_addr `{auth_addr}` is not a gRPC address"))?;
    let mut client = AuthClient::new(channel);
    let deadline = Instant::now() + SIGNING_KEY_WAIT;
    let mut said_waiting_at: Option<Instant> = None;
    loop {
        let answer = tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            answer = client.signing_key(SigningKeyRequest {}) => answer,
        };
        match answer {
            Ok(reply) => {
                let key = PublicKey::from_bytes(&reply.into_inner().public_key)
                    .map_err(|err| anyhow!("auth at {auth_addr} sent an unusable key: {err}"))?;
                return Ok(Some(ContextVerifier::new(vec![key])));
            }
            // The message carries the cause (a refused connection, a certificate the CA did
            // not issue), which the code alone (Unavailable) hides.
            Err(status) if Instant::now() > deadline => bail!(
                "auth at {auth_addr} did not hand out its signing key within {SIGNING_KEY_WAIT:?} \
                 (last answer: {:?}: {})",
                status.code(),
                status.message()
            ),
            Err(status) => {
                // Said once and then every 10 s: a service waiting for auth is not hung.
                if said_waiting_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                    tracing::info!(auth = auth_addr, code = ?status.code(), cause = status.message(),
                        "waiting for auth to hand out its signing key before serving");
                    said_waiting_at = Some(Instant::now());
                }
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(None),
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}

fn required_addr(addr: &Option<String>, key: &str) -> anyhow::Result<String> {
    addr.clone().with_context(|| format!("{key} is required"))
}

type Tasks = JoinSet<(&'static str, anyhow::Result<()>)>;

/// Runs `options.service` until `shutdown` fires or a part of it fails.
pub async fn serve(options: ServeOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    options.check()?;
    // Before anything listens or dials: every server and channel of the process uses it.
    if let Some(files) = &options.cluster.tls {
        let tls = kg_common::tls::ClusterTls::load(files)?;
        tls.spawn_reload(kg_common::tls::RELOAD_EVERY, shutdown.child_token());
        kg_common::tls::install(tls)?;
    }
    let service = options.service;
    let addr = options.listen_addr();
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let metrics = match (options.cluster.metrics_addr, service) {
        (Some(addr), service) if service != Service::Gateway => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on cluster.metrics_addr {addr}"))?,
        ),
        _ => None,
    };
    let mut tasks: Tasks = JoinSet::new();
    start(&options, listener, shutdown.clone(), &mut tasks).await?;
    // Its /health answers once the service is up, so it doubles as a readiness check.
    if let Some(metrics) = metrics {
        let token = shutdown.clone();
        tasks.spawn(async move { ("metrics", serve_metrics(metrics, token).await) });
    }
    tracing::info!(service = service.name(), %addr, "serving");
    let first = tokio::select! {
        biased;
        _ = shutdown.cancelled() => None,
        Some(joined) = tasks.join_next() => Some(joined),
    };
    // A part that ends cleanly after the signal is stopping, not failing.
    let stopping = shutdown.is_cancelled();
    shutdown.cancel();
    let result = match first {
        None => Ok(()),
        Some(Ok((_, Ok(())))) if stopping => Ok(()),
        Some(Ok((part, Ok(())))) => Err(anyhow!("{part} stopped unexpectedly")),
        Some(Ok((part, Err(err)))) => Err(err.context(format!("{part} failed"))),
        Some(Err(join)) => Err(anyhow!("a task of {} panicked: {join}", service.name())),
    };
    // In-flight calls finish within the grace period; then what is left is dropped.
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.abort_all();
    }
    result
}

async fn start(
    options: &ServeOptions,
    listener: TcpListener,
    shutdown: CancellationToken,
    tasks: &mut Tasks,
) -> anyhow::Result<()> {
    let mesh = &options.mesh;
    let cluster = &options.cluster;
    let verifier = match options.service {
        Service::Auth => None,
        _ => {
            let auth_addr = required_addr(&cluster.auth_addr, "cluster.auth_addr")?;
            match fetch_verifier(&auth_addr, &shutdown).await? {
                Some(verifier) => Some(verifier),
                // Stopped while waiting for auth: nothing was started.
                None => return Ok(()),
            }
        }
    };
    let verifier = move || verifier.clone().context("no caller-context verifier");
    let blobs = || BlobStore::new(cluster.blob_dir(&mesh.data_dir));
    match options.service {
        Service::Auth => {
            let auth = open_auth(options).await?;
            if let Some(keep) = mesh.audit_retention {
                let auth = auth.clone();
                let token = shutdown.clone();
                tasks.spawn(async move {
                    kg_auth::run_audit_retention(auth, keep, token).await;
                    ("audit-retention", Ok(()))
                });
            }
            tasks.spawn(async move {
                let served = kg_auth::serve(auth, listener, shutdown).await;
                ("auth", served.map_err(Into::into))
            });
        }
        Service::Files => {
            let jetstream = connect_nats(mesh).await?;
            let files = crate::parts::files_service(
                mesh,
                connect_sql(mesh).await?,
                blobs(),
                jetstream.clone(),
            )
            .await?;
            {
                let files = files.clone();
                let token = shutdown.clone();
                tasks.spawn(async move {
                    let consumed = kg_files::run_status_consumer(files, jetstream, token).await;
                    ("files-status", consumed.map_err(Into::into))
                });
            }
            {
                let files = files.clone();
                let token = shutdown.clone();
                tasks.spawn(async move {
                    kg_files::run_stream_check(files, token).await;
                    ("files-stream-check", Ok(()))
                });
            }
            if let Some(sweep) = options.mesh.blob_sweep {
                let files = files.clone();
                let token = shutdown.clone();
                tasks.spawn(async move {
                    kg_files::run_blob_sweep(files, sweep, token).await;
                    ("files-blob-sweep", Ok(()))
                });
            }
            let verifier = verifier()?;
            tasks.spawn(async move {
                let served = kg_files::serve(files, verifier, listener, shutdown).await;
                ("files", served.map_err(Into::into))
            });
        }
        Service::Indexer => {
            let (vectors, sparse) = open_vector_lanes(mesh).await?;
            let config = crate::parts::indexer_config(mesh, vectors, sparse)?;
            let graph = connect_graph(mesh).await?;
            let jetstream = connect_nats(mesh).await?;
            let blobs = blobs();
            {
                let token = shutdown.clone();
                tasks.spawn(async move {
                    let ran = kg_indexer::run(config, graph, blobs, jetstream, token).await;
                    ("indexer", ran.map_err(Into::into))
                });
            }
            // Nothing to call, but probes and meshes expect a health service on the port.
            tasks.spawn(async move {
                let served = serve_health_only(listener, "kg.v1.Indexer", shutdown).await;
                ("indexer-health", served)
            });
        }
        Service::Retrieval => {
            let (vectors, sparse) = open_vector_lanes(mesh).await?;
            let retrieval = crate::parts::retrieval_service(
                mesh,
                connect_graph(mesh).await?,
                vectors.as_ref(),
                sparse,
            )?;
            let verifier = verifier()?;
            tasks.spawn(async move {
                let served =
                    kg_retrieval::serve_with(retrieval, verifier, listener, shutdown).await;
                ("retrieval", served.map_err(Into::into))
            });
        }
        Service::Graph => {
            let jetstream = connect_nats(mesh).await?;
            let vectors = mesh
                .indexer
                .open_vectors(&mesh.data_dir.join("vectors"))
                .await
                .context("cannot open the vector index")?;
            let graph = crate::parts::graph_service(
                connect_graph(mesh).await?,
                &jetstream,
                vectors.as_ref(),
            )
            .await?;
            let verifier = verifier()?;
            tasks.spawn(async move {
                let served = kg_graph::serve_with(graph, verifier, listener, shutdown).await;
                ("graph", served.map_err(Into::into))
            });
        }
        Service::Ontology => {
            let jetstream = connect_nats(mesh).await?;
            let tbox = kg_ontology::TboxStore::open(
                connect_sql(mesh).await?,
                Some(kg_stores::tbox::TboxBucket::open(&jetstream).await?),
            )
            .await?;
            let ontology = kg_ontology::OntologyService::new(
                kg_ontology::OntologyConfig {
                    project_dir: options.ontology.project_dir.clone(),
                    warehouse_url: options.ontology.warehouse_url.clone(),
                    approval_addr: cluster.approval_addr.clone(),
                    allow_auto_effects: options.ontology.allow_auto_effects,
                },
                Some(tbox),
            )
            .await?;
            let verifier = verifier()?;
            tasks.spawn(async move {
                let served = kg_ontology::serve(ontology, verifier, listener, shutdown).await;
                ("ontology", served.map_err(Into::into))
            });
        }
        Service::Approval => {
            let env_name = mesh.approval.webhook_signing_secret_env.clone();
            let secret = kg_approval::load_signing_secret(
                env_name.as_deref(),
                &cluster
                    .secrets_dir(&mesh.data_dir)
                    .join("webhook-signing.secret"),
            )?;
            let mut config =
                kg_approval::ApprovalConfig::new(secret, cluster.ontology_addr.clone());
            config.protected_env.extend(env_name);
            config.four_eyes = mesh.approval.four_eyes;
            let approval =
                kg_approval::ApprovalService::new(connect_sql(mesh).await?, config).await?;
            let verifier = verifier()?;
            tasks.spawn(async move {
                let served = kg_approval::serve(approval, verifier, listener, shutdown).await;
                ("approval", served.map_err(Into::into))
            });
        }
        Service::Gateway => {
            // The gateway verifies nothing itself, but waiting for auth's key means it starts
            // answering only once auth does.
            verifier()?;
            let mut config = mesh.gateway_config(BackendAddrs {
                auth: required_addr(&cluster.auth_addr, "cluster.auth_addr")?,
                files: required_addr(&cluster.files_addr, "cluster.files_addr")?,
                retrieval: required_addr(&cluster.retrieval_addr, "cluster.retrieval_addr")?,
                graph: required_addr(&cluster.graph_addr, "cluster.graph_addr")?,
            });
            config.ontology_addr = cluster.ontology_addr.clone();
            config.approval_addr = cluster.approval_addr.clone();
            config.validate()?;
            tasks.spawn(async move {
                let served = kg_gateway::serve(config, listener, shutdown).await;
                ("gateway", served.map_err(Into::into))
            });
        }
    }
    Ok(())
}

/// The standard gRPC health service alone, SERVING for `name` and for the whole server ("").
async fn serve_health_only(
    listener: TcpListener,
    name: &'static str,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    use tonic_health::ServingStatus;
    let (reporter, health) = tonic_health::server::health_reporter();
    for service in ["", name] {
        reporter
            .set_service_status(service, ServingStatus::Serving)
            .await;
    }
    let connections = kg_common::grpc::incoming(listener, &shutdown);
    tonic::transport::Server::builder()
        .add_service(health)
        .serve_with_incoming_shutdown(connections, shutdown.cancelled_owned())
        .await
        .context("health server failed")
}

/// `GET /metrics` (OpenMetrics) and `GET /health` for one service process.
async fn serve_metrics(listener: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    use axum::routing::get;
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(|| async {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    kg_common::metrics::encode_text(),
                )
            }),
        )
        .route(
            "/health",
            get(|| async { axum::Json(serde_json::json!({"ok": true})) }),
        );
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .context("metrics server failed")
}

impl ClusterSection {
    /// Where auth's keys (and approval's generated webhook secret) live.
    pub fn secrets_dir(&self, data_dir: &Path) -> PathBuf {
        self.secrets_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("secrets"))
    }

    /// The blob directory files writes and the indexer reads.
    pub fn blob_dir(&self, data_dir: &Path) -> PathBuf {
        self.blob_dir
            .clone()
            .unwrap_or_else(|| data_dir.join("blobs"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn options(service: Service, toml: &str) -> Result<ServeOptions, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kgmesh.toml");
        std::fs::write(&file, toml).unwrap();
        let (mesh, _, cluster) = crate::config::resolve_with_cluster(
            Some(&file),
            Default::default(),
            service.sections(),
        )?;
        let options = ServeOptions {
            service,
            mesh,
            cluster,
            ontology: OntologyOptions::default(),
        };
        options.check().map(|()| options)
    }

    const SHARED: &str = r#"
database_url = "postgres://kgmesh@db/kgmesh"
falkordb_url = "redis://falkordb:6379"
nats_url = "nats://nats:4222"
[embedding]
provider = "none"
[cluster]
auth_addr = "http://auth:7101"
files_addr = "http://files:7102"
retrieval_addr = "http://retrieval:7103"
graph_addr = "http://graph:7104"
"#;

    #[test]
    fn each_service_names_the_settings_it_lacks() {
        let err = options(Service::Retrieval, "[embedding]\nprovider = \"none\"\n").unwrap_err();
        let text = err.problems.join("\n");
        assert!(
            text.contains("falkordb_url: required by `kgmesh serve retrieval`"),
            "{text}"
        );
        assert!(text.contains("cluster.auth_addr: required"), "{text}");
        assert!(
            !text.contains("database_url"),
            "retrieval reads no SQL: {text}"
        );
        assert!(
            !text.contains("nats_url"),
            "retrieval reads no events: {text}"
        );

        let err = options(Service::Gateway, "[embedding]\nprovider = \"none\"\n").unwrap_err();
        let text = err.problems.join("\n");
        for key in [
            "cluster.files_addr",
            "cluster.retrieval_addr",
            "cluster.graph_addr",
        ] {
            assert!(text.contains(key), "{key} missing from: {text}");
        }
        assert!(!text.contains("falkordb_url"), "{text}");

        for service in [
            Service::Files,
            Service::Indexer,
            Service::Retrieval,
            Service::Graph,
        ] {
            options(service, SHARED).unwrap();
        }
    }

    #[test]
    fn what_approval_and_ontology_read_at_start_is_checked_too() {
        // A variable no test environment sets: the real start stops on it after waiting for
        // auth; --check said "configuration ok".
        let approval = format!(
            "{SHARED}[approval]\nwebhook_signing_secret_env = \"KGMESH_TEST_SURELY_UNSET_SECRET\"\n"
        );
        let err = options(Service::Approval, &approval).unwrap_err();
        let text = err.problems.join("\n");
        assert!(
            text.contains("approval.webhook_signing_secret_env")
                && text.contains("KGMESH_TEST_SURELY_UNSET_SECRET"),
            "{text}"
        );

        let dir = tempfile::tempdir().unwrap();
        let (mesh, _, cluster) = crate::config::resolve_with_cluster(
            None,
            Default::default(),
            Service::Ontology.sections(),
        )
        .unwrap();
        let with_project = |project_dir: PathBuf| ServeOptions {
            service: Service::Ontology,
            mesh: mesh.clone(),
            cluster: ClusterSection {
                auth_addr: Some("http://auth:7101".into()),
                ..cluster.clone()
            },
            ontology: OntologyOptions {
                project_dir: Some(project_dir),
                ..OntologyOptions::default()
            },
        };
        let missing = with_project(dir.path().join("nope")).check().unwrap_err();
        assert!(
            missing.problems.iter().any(|p| p.contains("cannot read")),
            "{:?}",
            missing.problems
        );
        std::fs::write(
            dir.path().join("ontology.yaml"),
            "name: empty\nwarehouse: {url: \"sqlite://x.db\"}\nobjects: {}\n",
        )
        .unwrap();
        let empty = with_project(dir.path().to_path_buf()).check().unwrap_err();
        assert!(
            empty
                .problems
                .iter()
                .any(|p| p.contains("declare at least one object")),
            "{:?}",
            empty.problems
        );
    }

    #[test]
    fn embeddings_apart_need_a_qdrant_server() {
        let with_minilm = SHARED.replace("provider = \"none\"", "provider = \"minilm\"");
        for service in [Service::Indexer, Service::Retrieval, Service::Graph] {
            let err = options(service, &with_minilm).unwrap_err();
            assert!(
                err.problems
                    .iter()
                    .any(|p| p.starts_with("vector.qdrant_url: required")),
                "{service:?}: {:?}",
                err.problems
            );
        }
        // Services that hold no vectors do not care.
        options(Service::Files, &with_minilm).unwrap();
        let with_server = with_minilm.replace(
            "[cluster]",
            "[vector]\nqdrant_url = \"http://qdrant:6334\"\n[cluster]",
        );
        options(Service::Retrieval, &with_server).unwrap();
    }

    #[test]
    fn auth_needs_its_shared_keys_and_never_makes_them() {
        let secrets = tempfile::tempdir().unwrap();
        let config = format!(
            "{SHARED}secrets_dir = \"{}\"\ndeployment_id = \"prod-1\"\n",
            secrets.path().display()
        );
        let err = options(Service::Auth, &config).unwrap_err();
        let text = err.problems.join("\n");
        assert!(text.contains("caller-signing.key is missing"), "{text}");
        assert!(text.contains("pat-hmac.key is missing"), "{text}");
        assert!(
            std::fs::read_dir(secrets.path()).unwrap().next().is_none(),
            "a check must not create keys"
        );
        std::fs::write(secrets.path().join(CALLER_SIGNING_KEY_FILE), [7u8; 32]).unwrap();
        std::fs::write(secrets.path().join(PAT_KEY_FILE), [9u8; 31]).unwrap();
        let err = options(Service::Auth, &config).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{:?}", err.problems);
        assert!(
            err.problems[0].contains("holds 31 bytes"),
            "{:?}",
            err.problems
        );
        std::fs::write(secrets.path().join(PAT_KEY_FILE), [9u8; 32]).unwrap();
        options(Service::Auth, &config).unwrap();
        let without_id = config.replace("deployment_id = \"prod-1\"\n", "");
        let err = options(Service::Auth, &without_id).unwrap_err();
        assert!(
            err.problems[0].starts_with("cluster.deployment_id: required"),
            "{:?}",
            err.problems
        );
    }

    /// `config` is refused for `owner`, with a problem starting `problem`, and accepted for
    /// services that do not read the section.
    fn checked_only_for(owner: Service, config: &str, problem: &str) {
        let err = options(owner, config).unwrap_err();
        assert!(
            err.problems.iter().any(|p| p.starts_with(problem)),
            "{:?}",
            err.problems
        );
        for service in [Service::Retrieval, Service::Graph, Service::Files] {
            options(service, config).unwrap();
        }
    }

    #[test]
    fn a_section_only_the_indexer_reads_cannot_stop_another_service() {
        let with_llm = format!(
            "{SHARED}[indexer.llm]\nenabled = true\nendpoint = \"https://llm.example/v1\"\n\
             model = \"m\"\napi_key_env = \"KG_SERVE_TEST_UNSET_LLM_KEY\"\n"
        );
        checked_only_for(Service::Indexer, &with_llm, "indexer.llm.api_key_env");
    }

    #[test]
    fn the_gateways_certificate_is_checked_only_where_the_gateway_runs() {
        let with_https = format!(
            "{SHARED}\n[http_tls]\ncert_file = \"/nonexistent/tls.crt\"\nkey_file = \"/nonexistent/tls.key\"\n"
        );
        checked_only_for(
            Service::Gateway,
            &with_https,
            "http_tls.cert_file: cannot read /nonexistent/tls.crt",
        );
    }

    #[test]
    fn addresses_and_ports_follow_the_service() {
        let bad = SHARED.replace("http://graph:7104", "graph:7104");
        let err = options(Service::Gateway, &bad).unwrap_err();
        assert!(
            err.problems
                .iter()
                .any(|p| p.contains("cluster.graph_addr: expected http://HOST:PORT")),
            "{:?}",
            err.problems
        );
        let retrieval = options(Service::Retrieval, SHARED).unwrap();
        assert_eq!(retrieval.listen_addr(), "0.0.0.0:7103".parse().unwrap());
        let pinned = SHARED.replace("[cluster]", "[cluster]\nlisten_addr = \"127.0.0.1:9000\"");
        assert_eq!(
            options(Service::Graph, &pinned).unwrap().listen_addr(),
            "127.0.0.1:9000".parse().unwrap()
        );
        let gateway = options(
            Service::Gateway,
            &format!("http_addr = \"0.0.0.0:8080\"\n{SHARED}"),
        )
        .unwrap();
        assert_eq!(gateway.listen_addr(), "0.0.0.0:8080".parse().unwrap());
    }

    #[tokio::test]
    async fn the_indexer_answers_health_checks_for_itself_and_the_server() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let served = tokio::spawn(serve_health_only(
            listener,
            "kg.v1.Indexer",
            shutdown.clone(),
        ));
        for service in ["", "kg.v1.Indexer"] {
            crate::mesh::wait_serving(&addr, service, Duration::from_secs(10))
                .await
                .unwrap();
        }
        shutdown.cancel();
        served.await.unwrap().unwrap();
    }
}
