//! The whole mesh in one process: embedded stores as child processes, every
//! service on its own loopback gRPC port, the gateway on the HTTP address.
//! `kgmesh up` and the end-to-end tests use this same composition; `up` runs
//! the approval service as a separate child process (`approval_child`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kg_common::caller::{ContextSigner, ContextVerifier};
use kg_gateway::{BackendAddrs, GatewayConfig};
use kg_stores::blobs::BlobStore;
use kg_stores::embedded::{EmbeddedFalkor, EmbeddedNats};
use kg_stores::graph::GraphStore;
use kg_stores::sql::SqlStore;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// File in the data dir that tells other commands where the running mesh is.
pub const MESH_FILE: &str = "mesh.json";

/// How to start the mesh.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// Where state lives (SQLite file, graph and stream data, blobs, keys).
    pub data_dir: PathBuf,
    /// Gateway HTTP address (port 0 picks a free port).
    pub http_addr: SocketAddr,
    /// SQL URL; default a SQLite file in the data dir.
    pub database_url: Option<String>,
    /// FalkorDB URL; default an embedded FalkorDB child process.
    pub falkordb_url: Option<String>,
    /// NATS URL; default an embedded nats-server child process.
    pub nats_url: Option<String>,
    /// Extra Host header values the gateway accepts besides loopback.
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call the gateway.
    pub allowed_origins: Vec<String>,
    /// Externally visible base URL.
    pub public_base_url: Option<String>,
    /// HTTPS on `http_addr` with this certificate (`[http_tls]`); plain HTTP when unset.
    pub http_tls: Option<kg_common::tls::HttpsFiles>,
    /// Override of kg_file's query size limit (default 10 MiB).
    pub max_query_file_bytes: Option<u64>,
    /// The sweep of blobs no version needs (`[files] blob_sweep_*`); `None` turns it off.
    pub blob_sweep: Option<kg_files::BlobSweep>,
    /// How long the audit log keeps an event (`[audit] retention_days`); `None` keeps every
    /// event.
    pub audit_retention: Option<std::time::Duration>,
    /// Override of the admin REST upload limit (default 32 MiB).
    pub max_upload_bytes: Option<usize>,
    /// Full-text words match by English stem (`[retrieval] fulltext_stemming`, default off).
    pub fulltext_stemming: bool,
    /// Share of the query's idf weight a full-text hit must match to earn its rank's whole
    /// contribution beside vector hits (`[retrieval] fusion_fulltext_full_match`, default 0.5).
    pub fusion_fulltext_full_match: f64,
    /// Fold chunks with the same text into one hit (`[retrieval] collapse_duplicates`,
    /// default on).
    pub collapse_duplicates: bool,
    /// How long per-scope counts are trusted before a background recount
    /// (`[retrieval] statistics_ttl_seconds`, default 60 s).
    pub statistics_ttl: std::time::Duration,
    /// The approval service (`[approval]`).
    pub approval: ApprovalOptions,
    /// Embeddings, vector index and indexer concurrency (`[embedding]`, `[vector]`, `[indexer]`).
    pub indexer: kg_indexer::IndexerSettings,
}

/// `[approval]` of `kgmesh up`.
#[derive(Debug, Clone, Default)]
pub struct ApprovalOptions {
    /// Environment variable holding the webhook signing secret; when unset a
    /// random secret is kept in `<data_dir>/secrets/webhook-signing.secret`.
    pub webhook_signing_secret_env: Option<String>,
    /// Four-eyes rule: a proposer may not approve their own proposal.
    pub four_eyes: bool,
    /// Run the service as a separate process started with this command
    /// (`kgmesh up`); `None` runs it in-process (the Rust tests).
    pub child: Option<crate::approval_child::ChildCommand>,
    /// Logging of that process (the mesh's `[telemetry]`).
    pub telemetry: kg_common::telemetry::TelemetryConfig,
}

/// The ontology project `kgmesh up` serves generated tools from.
#[derive(Debug, Clone, Default)]
pub struct OntologyOptions {
    /// Directory holding `ontology.yaml`; None serves no generated tools.
    pub project_dir: Option<PathBuf>,
    /// Overrides the project's warehouse URL.
    pub warehouse_url: Option<String>,
    /// Actions that declare no approval may run at once (`--allow-auto-effects`).
    pub allow_auto_effects: bool,
}

/// Where a running mesh listens; written to `<data_dir>/mesh.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeshInfo {
    /// Gateway base URL.
    pub base_url: String,
    /// MCP endpoint.
    pub mcp_url: String,
    /// gRPC addresses of the services.
    pub grpc: BackendAddrs,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Process id of `kgmesh up`.
    pub pid: u32,
    /// gRPC address of the ontology service.
    #[serde(default)]
    pub ontology: Option<String>,
    /// gRPC address of the approval service.
    #[serde(default)]
    pub approval: Option<String>,
}

impl MeshInfo {
    /// Reads the mesh file of a data dir.
    pub fn load(data_dir: &Path) -> anyhow::Result<Self> {
        let path = data_dir.join(MESH_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no running mesh found: cannot read {} (start one with `kgmesh up`)",
                path.display()
            )
        })?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a mesh file", path.display()))
    }
}

impl MeshOptions {
    /// The gateway's configuration over these options (`kgmesh up` and `kgmesh serve gateway`).
    pub(crate) fn gateway_config(&self, backends: BackendAddrs) -> GatewayConfig {
        let mut config = GatewayConfig::new(backends);
        config
            .allowed_hosts
            .extend(self.allowed_hosts.iter().cloned());
        config.allowed_origins = self.allowed_origins.clone();
        config.public_base_url = self.public_base_url.clone();
        config.https = self.http_tls.clone();
        if let Some(max) = self.max_upload_bytes {
            config.max_upload_bytes = max;
        }
        config
    }

    /// Checks what only the gateway would check once every store and service runs (hosts,
    /// origins, the public URL, the upload limit), so a bad setting fails before anything
    /// starts or is written, every problem at once.
    pub fn check(&self) -> anyhow::Result<()> {
        let unused = "http://127.0.0.1:1".to_owned();
        self.gateway_config(BackendAddrs {
            auth: unused.clone(),
            files: unused.clone(),
            retrieval: unused.clone(),
            graph: unused,
        })
        .validate()?;
        Ok(())
    }
}

/// A running mesh. Dropping it without [`Mesh::shutdown`] still stops the
/// child stores (they are killed on drop).
pub struct Mesh {
    /// Where it listens.
    pub info: MeshInfo,
    /// The first admin token, when this start created the admin.
    pub admin_token: Option<String>,
    auth: kg_auth::AuthService,
    files: kg_files::FilesService,
    shutdown: CancellationToken,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
    /// The embedded stores, each owned by the task that restarts it when its process dies;
    /// stopped after the services ([`Mesh::shutdown`]).
    stores: JoinSet<(&'static str, anyhow::Result<()>)>,
    stop_stores: CancellationToken,
    // Last, so it is released after the stores stop.
    _data_dir_lock: kg_stores::embedded::DirLock,
}

/// Reads a secret file or creates it with `len` random bytes (mode 0600).
fn load_or_create_secret(path: &Path, len: usize) -> anyhow::Result<Vec<u8>> {
    if path.exists() {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        if bytes.len() != len {
            bail!(
                "{} should hold {len} bytes; remove it to generate a new one",
                path.display()
            );
        }
        return Ok(bytes);
    }
    use rand::RngCore as _;
    let mut bytes = vec![0u8; len];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_private(path, &bytes)?;
    Ok(bytes)
}

/// Writes `bytes` to `path`, readable by its owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(bytes)?;
    Ok(())
}

/// The services' loopback ports, each taken again from the last run where it is free
/// (`<data_dir>/ports.json`, which stays when `mesh.json` goes at shutdown). A `kgmesh mcp
/// --stdio` started by an MCP host reads `mesh.json` once; with the same ports it reaches
/// the services again after `up` restarts, instead of answering "unavailable" until the
/// host restarts it.
struct LoopbackPorts {
    file: PathBuf,
    last: std::collections::HashMap<String, u16>,
    now: std::collections::BTreeMap<String, u16>,
}

impl LoopbackPorts {
    const FILE: &'static str = "ports.json";

    fn open(data_dir: &Path) -> Self {
        let file = data_dir.join(Self::FILE);
        // A missing or unreadable file means new ports, as on a first start.
        let last = std::fs::read(&file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Self {
            file,
            last,
            now: Default::default(),
        }
    }

    /// A listener for service `name`: its last port when free, else a new one.
    async fn bind(&mut self, name: &str) -> anyhow::Result<(TcpListener, String)> {
        let again = match self.last.get(name) {
            Some(&port) => TcpListener::bind(("127.0.0.1", port)).await.ok(),
            None => None,
        };
        let listener = match again {
            Some(listener) => listener,
            None => TcpListener::bind("127.0.0.1:0")
                .await
                .context("cannot bind a loopback port")?,
        };
        let local = listener.local_addr()?;
        self.now.insert(name.to_owned(), local.port());
        Ok((listener, format!("http://{local}")))
    }

    fn save(&self) -> anyhow::Result<()> {
        write_private(
            &self.file,
            serde_json::to_string_pretty(&self.now)?.as_bytes(),
        )
    }
}

impl Mesh {
    /// Starts stores, services and gateway; returns once every gRPC service
    /// reports SERVING and the gateway answers.
    pub async fn start(options: MeshOptions) -> anyhow::Result<Mesh> {
        Self::start_with(options, OntologyOptions::default()).await
    }

    /// [`Mesh::start`] serving the generated tools of an ontology project.
    pub async fn start_with(
        options: MeshOptions,
        ontology: OntologyOptions,
    ) -> anyhow::Result<Mesh> {
        // Boxed: the composed future is deep enough to overflow the compiler's
        // layout recursion in every caller otherwise.
        Box::pin(Self::start_inner(options, ontology)).await
    }

    async fn start_inner(options: MeshOptions, ontology: OntologyOptions) -> anyhow::Result<Mesh> {
        options.check()?;
        let data_dir = &options.data_dir;
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let data_dir = data_dir.canonicalize()?;
        // Before anything reads or writes it: a second mesh on these files corrupts them.
        let data_dir_lock = kg_stores::embedded::DirLock::claim(&data_dir).await?;
        // Before any store starts: an address in use fails in a moment, with nothing started.
        let http_listener = TcpListener::bind(options.http_addr)
            .await
            .with_context(|| format!("cannot bind the gateway to {}", options.http_addr))?;
        let http_addr = http_listener.local_addr()?;

        let secrets = data_dir.join("secrets");
        let signing_secret = load_or_create_secret(&secrets.join("caller-signing.key"), 32)?;
        let signing_secret: [u8; 32] = signing_secret
            .as_slice()
            .try_into()
            .context("signing key must be 32 bytes")?;
        let pat_key = load_or_create_secret(&secrets.join("pat-hmac.key"), 32)?;
        let deployment_id = {
            let path = data_dir.join("deployment-id");
            if path.exists() {
                std::fs::read_to_string(&path)?.trim().to_owned()
            } else {
                let id = uuid::Uuid::new_v4().to_string();
                std::fs::write(&path, &id)?;
                id
            }
        };
        let signer = ContextSigner::from_secret_bytes(&signing_secret);
        let verifier = ContextVerifier::new(vec![signer.public_key()]);
        let caller_public_key = signer.public_key().to_base64();

        let needs_venv = options.falkordb_url.is_none() || options.nats_url.is_none();
        let venv = if needs_venv {
            Some(kg_stores::embedded::find_venv()?)
        } else {
            None
        };
        let (falkordb, falkordb_url) = match (&options.falkordb_url, &venv) {
            (Some(url), _) => (None, url.clone()),
            (None, Some(venv)) => {
                let server = EmbeddedFalkor::start(venv, &data_dir.join("falkordb")).await?;
                let url = server.url.clone();
                (Some(server), url)
            }
            (None, None) => bail!("no FalkorDB URL and no virtualenv"),
        };
        let (nats, nats_url) = match (&options.nats_url, &venv) {
            (Some(url), _) => (None, url.clone()),
            (None, Some(venv)) => {
                let server = EmbeddedNats::start(venv, &data_dir.join("nats")).await?;
                let url = server.url.clone();
                (Some(server), url)
            }
            (None, None) => bail!("no NATS URL and no virtualenv"),
        };
        let database_url = options
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("kgmesh.db").display()));

        // Which store and where: the drivers' own errors rarely say (a pool timeout names
        // neither). main masks any password in the URL when it prints the error.
        let given = |set: bool, setting: &str| {
            if set {
                format!(
                    " (set by --{} or `{setting}` in the config)",
                    setting.replace('_', "-")
                )
            } else {
                " (embedded)".to_owned()
            }
        };
        let sql = SqlStore::connect(&database_url).await.with_context(|| {
            let how = given(options.database_url.is_some(), "database_url");
            format!("cannot use the SQL database at {database_url}{how}")
        })?;
        let graph = GraphStore::connect(&falkordb_url).await.with_context(|| {
            let how = given(options.falkordb_url.is_some(), "falkordb_url");
            format!("cannot use FalkorDB at {falkordb_url}{how}")
        })?;
        let jetstream = kg_stores::events::connect(&nats_url)
            .await
            .with_context(|| {
                let how = given(options.nats_url.is_some(), "nats_url");
                format!("cannot use NATS at {nats_url}{how}")
            })?;
        let blobs = BlobStore::new(data_dir.join("blobs"));
        // One embedder and one vector index for the process (qdrant-edge under the data dir).
        let vectors = options
            .indexer
            .open_vectors(&data_dir.join("vectors"))
            .await
            .context("cannot start embeddings and the vector index")?;
        // The sparse BM25 index of the `qdrant_sparse` full-text backend, shared likewise.
        let sparse = options
            .indexer
            .open_sparse(&data_dir.join("sparse"))
            .await
            .context("cannot open the sparse full-text index")?;
        let indexer_config =
            crate::parts::indexer_config(&options, vectors.clone(), sparse.clone())?;

        let auth = kg_auth::AuthService::new(sql.clone(), signer, pat_key, deployment_id).await?;
        let files =
            crate::parts::files_service(&options, sql.clone(), blobs.clone(), jetstream.clone())
                .await?;

        let mut ports = LoopbackPorts::open(&data_dir);
        let (auth_listener, auth_addr) = ports.bind("auth").await?;
        let (files_listener, files_addr) = ports.bind("files").await?;
        let (retrieval_listener, retrieval_addr) = ports.bind("retrieval").await?;
        let (graph_listener, graph_addr) = ports.bind("graph").await?;

        let backends = BackendAddrs {
            auth: auth_addr,
            files: files_addr,
            retrieval: retrieval_addr,
            graph: graph_addr,
        };
        let shutdown = CancellationToken::new();
        let mut tasks: JoinSet<(&'static str, anyhow::Result<()>)> = JoinSet::new();

        // Stores first, then the services, the gateway last (GreptimeDB's order).
        {
            let auth = auth.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "auth",
                    kg_auth::serve(auth, auth_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        {
            let files = files.clone();
            let verifier = verifier.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "files",
                    kg_files::serve(files, verifier, files_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        {
            let files = files.clone();
            let js = jetstream.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "files-status",
                    kg_files::run_status_consumer(files, js, token)
                        .await
                        .map_err(Into::into),
                )
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
        if let Some(keep) = options.audit_retention {
            let auth = auth.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                kg_auth::run_audit_retention(auth, keep, token).await;
                ("audit-retention", Ok(()))
            });
        }
        if let Some(sweep) = options.blob_sweep {
            let files = files.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                kg_files::run_blob_sweep(files, sweep, token).await;
                ("files-blob-sweep", Ok(()))
            });
        }
        {
            let graph = graph.clone();
            let js = jetstream.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "indexer",
                    kg_indexer::run(indexer_config, graph, blobs, js, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        {
            let service = crate::parts::retrieval_service(
                &options,
                graph.clone(),
                vectors.as_ref(),
                sparse.clone(),
            )?;
            let verifier = verifier.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "retrieval",
                    kg_retrieval::serve_with(service, verifier, retrieval_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        {
            let service =
                crate::parts::graph_service(graph.clone(), &jetstream, vectors.as_ref()).await?;
            let verifier = verifier.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "graph",
                    kg_graph::serve_with(service, verifier, graph_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        // Ontology and approval call each other (Submit, CheckAction): bind both first.
        let (ontology_listener, ontology_addr) = ports.bind("ontology").await?;
        let (approval_listener, approval_addr) = ports.bind("approval").await?;
        ports.save()?;
        {
            let tbox = kg_ontology::TboxStore::open(
                sql.clone(),
                Some(kg_stores::tbox::TboxBucket::open(&jetstream).await?),
            )
            .await?;
            let service = kg_ontology::OntologyService::new(
                kg_ontology::OntologyConfig {
                    project_dir: ontology.project_dir.clone(),
                    warehouse_url: ontology.warehouse_url.clone(),
                    approval_addr: Some(approval_addr.clone()),
                    allow_auto_effects: ontology.allow_auto_effects,
                },
                Some(tbox),
            )
            .await?;
            // The approval child inherits this environment: a variable missing here is
            // missing there, and approving the action would end `effect_misconfigured`.
            if let Some(active) = service.active() {
                for (variable, action) in active.compiled.project.unset_effect_secrets() {
                    tracing::warn!(
                        variable,
                        action,
                        "an effect's secret header names a variable that is not set; approving the action will end effect_misconfigured"
                    );
                }
            }
            let verifier = verifier.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "ontology",
                    kg_ontology::serve(service, verifier, ontology_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        // `[approval] webhook_signing_secret_env`, else a generated hex secret in
        // secrets/webhook-signing.secret that receivers are configured with.
        let env_name = options.approval.webhook_signing_secret_env.clone();
        if let Some(command) = &options.approval.child {
            // A separate process no model can address: it gets the socket and settings
            // (the secret's variable name, never its value) and is supervised here.
            let child = crate::approval_child::ApprovalChild::start(
                crate::approval_child::ChildConfig {
                    command: command.clone(),
                    database_url: database_url.clone(),
                    ontology_addr: ontology_addr.clone(),
                    caller_public_key,
                    signing_secret_env: env_name,
                    signing_secret_file: secrets.join("webhook-signing.secret"),
                    four_eyes: options.approval.four_eyes,
                    telemetry: options.approval.telemetry.clone(),
                },
                approval_listener.into_std()?,
            )
            .await?;
            let token = shutdown.clone();
            tasks.spawn(async move { ("approval", child.supervise(token).await) });
        } else {
            let secret = kg_approval::load_signing_secret(
                env_name.as_deref(),
                &secrets.join("webhook-signing.secret"),
            )?;
            let mut config = kg_approval::ApprovalConfig::new(secret, Some(ontology_addr.clone()));
            config.protected_env.extend(env_name);
            config.four_eyes = options.approval.four_eyes;
            let service = kg_approval::ApprovalService::new(sql.clone(), config).await?;
            let verifier = verifier.clone();
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "approval",
                    kg_approval::serve(service, verifier, approval_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }
        for (name, addr) in [
            ("kg.v1.Ontology", &ontology_addr),
            ("kg.v1.Approval", &approval_addr),
            ("kg.v1.Auth", &backends.auth),
            ("kg.v1.Files", &backends.files),
            ("kg.v1.Retrieval", &backends.retrieval),
            ("kg.v1.Graph", &backends.graph),
        ] {
            wait_serving(addr, name, Duration::from_secs(30)).await?;
        }

        let mut gateway_config = options.gateway_config(backends.clone());
        gateway_config.ontology_addr = Some(ontology_addr.clone());
        gateway_config.approval_addr = Some(approval_addr.clone());
        gateway_config.validate()?;
        {
            let token = shutdown.clone();
            tasks.spawn(async move {
                (
                    "gateway",
                    kg_gateway::serve(gateway_config, http_listener, token)
                        .await
                        .map_err(Into::into),
                )
            });
        }

        let admin_token = auth.bootstrap_admin().await?;
        let scheme = if options.http_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let base_url = format!("{scheme}://{http_addr}");
        let info = MeshInfo {
            mcp_url: format!("{base_url}/mcp"),
            base_url,
            grpc: backends,
            data_dir: data_dir.clone(),
            pid: std::process::id(),
            ontology: Some(ontology_addr),
            approval: Some(approval_addr),
        };
        write_private(
            &data_dir.join(MESH_FILE),
            serde_json::to_string_pretty(&info)?.as_bytes(),
        )?;
        let stop_stores = CancellationToken::new();
        let mut stores = JoinSet::new();
        if let Some(falkordb) = falkordb {
            stores.spawn(keep_running(falkordb, stop_stores.clone()));
        }
        if let Some(nats) = nats {
            stores.spawn(keep_running(nats, stop_stores.clone()));
        }
        Ok(Mesh {
            info,
            admin_token,
            auth,
            files,
            shutdown,
            tasks,
            stores,
            stop_stores,
            _data_dir_lock: data_dir_lock,
        })
    }

    /// Loads a folder into `namespace` (created if missing) as the local
    /// operator, without a token: `kgmesh up --seed examples:demo`. Waits until
    /// every file is indexed, stored (not indexable) or failed; returns (indexed or stored,
    /// failed with reasons).
    pub async fn seed(
        &self,
        dir: &Path,
        namespace: &str,
        timeout: Duration,
    ) -> anyhow::Result<(usize, Vec<(String, String)>)> {
        use kg_proto::v1::{AccessFilter, CallerContext, FileStatus, Permission};
        let now = kg_common::caller::now_ms();
        let operator = CallerContext {
            principal_id: "system:seed".to_owned(),
            is_admin: true,
            // Seeding creates a namespace and writes files: admin-API operations, which
            // refuse a context minted for any other purpose.
            tool: format!("{}:seed", kg_common::caller::ADMIN_API_TOOL),
            access: vec![AccessFilter {
                namespace: namespace.to_owned(),
                allow_prefixes: vec![String::new()],
                enabled_only: false,
                permission: Permission::Admin as i32,
                write_prefixes: vec![String::new()],
                admin_prefixes: vec![String::new()],
                ..Default::default()
            }],
            issued_at_ms: now,
            expires_at_ms: now + timeout.as_millis() as i64,
            ..Default::default()
        };
        match self.auth.create_namespace(&operator, namespace, "").await {
            Ok(_) => {}
            Err(err) if kg_common::ErrorExt::code(&err) == kg_common::ErrorCode::AlreadyExists => {}
            Err(err) => return Err(err.into()),
        }
        let mut waiting = std::collections::HashMap::new();
        let collected = crate::ingest::collect_files(dir, false)?;
        let mut failed = collected.skipped;
        for (local, relative) in collected.files {
            let bytes = tokio::fs::read(&local)
                .await
                .with_context(|| format!("cannot read {}", local.display()))?;
            let uploaded = self
                .files
                .upload(&operator, namespace, &relative, &bytes, "")
                .await?;
            if let Some(file) = uploaded.file {
                waiting.insert(file.path.clone(), file.version_id.clone());
            }
        }
        let deadline = Instant::now() + timeout;
        let mut indexed = 0usize;
        while !waiting.is_empty() {
            let mut cursor = String::new();
            loop {
                let page = self
                    .files
                    .list_files(&operator, namespace, "", 1000, &cursor, true)
                    .await?;
                for file in &page.files {
                    if waiting.get(&file.path) != Some(&file.version_id) {
                        continue;
                    }
                    match file.status() {
                        // Kept, not indexed (an image): nothing to wait for, nothing failed.
                        FileStatus::Indexed | FileStatus::Stored => indexed += 1,
                        FileStatus::Failed => {
                            failed.push((file.path.clone(), file.status_reason.clone()))
                        }
                        _ => continue,
                    }
                    waiting.remove(&file.path);
                }
                if page.next_cursor.is_empty() {
                    break;
                }
                cursor = page.next_cursor;
            }
            if waiting.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} file(s) of {} not indexed within {timeout:?}",
                    waiting.len(),
                    dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((indexed, failed))
    }

    /// Waits until a task fails or `stop` fires, then shuts everything down.
    pub async fn run_until(
        mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let failure = tokio::select! {
            _ = stop => None,
            Some(joined) = self.tasks.join_next() => Some(joined),
            Some(joined) = self.stores.join_next() => Some(joined),
        };
        let result = match failure {
            None => Ok(()),
            Some(Ok((name, Ok(())))) => Err(anyhow::anyhow!("{name} stopped unexpectedly")),
            Some(Ok((name, Err(err)))) => Err(err.context(format!("{name} failed"))),
            Some(Err(join)) => Err(anyhow::anyhow!("a service task panicked: {join}")),
        };
        self.shutdown().await;
        result
    }

    /// Stops the gateway and services (in-flight calls get a grace period),
    /// then the child stores.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        let grace = tokio::time::sleep(Duration::from_secs(10));
        tokio::pin!(grace);
        loop {
            tokio::select! {
                _ = &mut grace => {
                    self.tasks.abort_all();
                    break;
                }
                next = self.tasks.join_next() => {
                    if next.is_none() {
                        break;
                    }
                }
            }
        }
        // Then the stores: each stops (SIGTERM, flushing its data) as its task drops it.
        self.stop_stores.cancel();
        while self.stores.join_next().await.is_some() {}
        let _ = std::fs::remove_file(self.info.data_dir.join(MESH_FILE));
    }
}

/// Embedded store deaths tolerated within [`STORE_RESTART_WINDOW`]; one more stops the mesh.
const MAX_STORE_RESTARTS: usize = 5;
const STORE_RESTART_WINDOW: Duration = Duration::from_secs(300);

/// Owns an embedded store and starts it again, on its port and data, whenever its process
/// exits (a crash, the OOM killer, an operator's `kill`): the services' clients reconnect to
/// the URL they hold, and the NATS redeliveries of the writes that failed meanwhile land.
/// The gateway's `/ready` names it while it is down. More than [`MAX_STORE_RESTARTS`] deaths
/// in [`STORE_RESTART_WINDOW`], or a process that cannot be watched, fails the task, which
/// stops the mesh with the reason. Returns (dropping the store, which stops it) when `stop`
/// fires.
async fn keep_running<S: kg_stores::embedded::Restartable>(
    mut store: S,
    stop: CancellationToken,
) -> (&'static str, anyhow::Result<()>) {
    let name = store.name();
    let mut deaths: std::collections::VecDeque<Instant> = std::collections::VecDeque::new();
    loop {
        let exited = tokio::select! {
            () = stop.cancelled() => return (name, Ok(())),
            exited = store.wait_exit() => exited,
        };
        let status = match exited {
            Ok(status) => status,
            Err(err) => {
                return (
                    name,
                    Err(anyhow::anyhow!(
                        "cannot watch the embedded {name} process: {err}"
                    )),
                );
            }
        };
        let now = Instant::now();
        deaths.retain(|t| now.duration_since(*t) < STORE_RESTART_WINDOW);
        deaths.push_back(now);
        if deaths.len() > MAX_STORE_RESTARTS {
            return (
                name,
                Err(anyhow::anyhow!(
                    "the embedded {name} exited {} times within {}s (last: {status}); not restarting it again, see its log in the data dir",
                    deaths.len(),
                    STORE_RESTART_WINDOW.as_secs()
                )),
            );
        }
        kg_common::readiness::mark_down(name);
        tracing::error!(store = name, %status, deaths = deaths.len(), "the embedded store exited; restarting it on the same port");
        // 0.5 s, 1 s, 2 s, ... between restarts.
        let delay = Duration::from_millis(250 << deaths.len().min(5));
        let restarted = tokio::select! {
            () = stop.cancelled() => return (name, Ok(())),
            restarted = async {
                tokio::time::sleep(delay).await;
                store.restart().await
            } => restarted,
        };
        match restarted {
            Ok(()) => {
                kg_common::readiness::mark_up(name);
                tracing::warn!(store = name, "the embedded store is running again");
            }
            // Its process is gone again: the next turn counts it as another death.
            Err(err) => {
                tracing::error!(store = name, error = %err, "the embedded store did not start again")
            }
        }
    }
}

/// Polls the standard gRPC health service until `service` is SERVING.
pub async fn wait_serving(addr: &str, service: &str, timeout: Duration) -> anyhow::Result<()> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let deadline = Instant::now() + timeout;
    let channel = kg_common::grpc::channel(addr)?;
    let mut client = HealthClient::new(channel);
    loop {
        let reply = client
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await;
        if let Ok(reply) = reply
            && reply.get_ref().status == ServingStatus::Serving as i32
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{service} at {addr} did not become ready within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
