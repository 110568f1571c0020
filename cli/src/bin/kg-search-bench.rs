//! `kg-search-bench`: the speed harness behind `make bench-search`.
//!
//! `corpus` picks real text deterministically (the Markdown and Rust sources of the
//! registry crates in Cargo.lock, ordered by a stable hash of their paths) until the
//! indexer's own parser and chunker count at least `--min-chunks` chunks, and copies it
//! into a folder `kgmesh ingest` can load (`.rs` files become `.rs.txt`: plain text).
//!
//! `run` times kg_search against a running mesh from one process, per query and lane set:
//! straight to the services over gRPC (retrieval `Search`, then graph `Packages` for the
//! winners, which is what the gateway does) and through the gateway over MCP Streamable
//! HTTP (JSON-RPC `tools/call kg_search`, bearer token, timed to the answer's last byte).
//! It prints p50/p95/p99/mean per lane and path, the gateway overhead per query (MCP minus
//! the two backend calls), and the Authorize call to auth that the gateway makes per
//! request, timed on its own.

// A report on stdout is this program's output.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use kg_indexer::IndexerConfig;
use kg_indexer::pipeline::{FileMeta, index_document};
use kg_proto::v1::auth_client::AuthClient;
use kg_proto::v1::graph_client::GraphClient;
use kg_proto::v1::retrieval_client::RetrievalClient;
use kg_proto::v1::{
    AuthorizeRequest, CypherRequest, PackageCaps, PackagesRequest, SearchRequest,
    SignedCallerContext, SigningKeyRequest,
};
use kgmesh::MeshInfo;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// Largest gRPC message either side sends (the gateway's limit).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Re-authorize well before the 60 s context TTL, outside any timed call.
const CONTEXT_REFRESH: Duration = Duration::from_secs(20);
/// The gateway's default package caps (mentions, rel, ancestors, siblings, children, similar),
/// sent explicitly as the gateway does (an absent cap would mean the same default).
const DEFAULT_CAPS: PackageCaps = PackageCaps {
    mentions: Some(8),
    rel: Some(8),
    ancestors: Some(6),
    siblings: Some(8),
    children: Some(8),
    similar: Some(4),
};
/// The MCP revisions the bench speaks: the session-based one most clients negotiate today,
/// and the sessionless one (SEP-2567) where every request carries its version in `_meta`.
const MCP_SESSION_PROTOCOL: &str = "2025-06-18";
const MCP_STATELESS_PROTOCOL: &str = "2026-07-28";

#[derive(Parser)]
#[command(
    name = "kg-search-bench",
    about = "kg_search latency over gRPC and MCP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Copy a deterministic corpus of at least --min-chunks chunks into --out.
    Corpus(CorpusArgs),
    /// Time kg_search against a running mesh.
    Run(RunArgs),
}

#[derive(Args)]
struct CorpusArgs {
    /// Cargo's registry sources (`$CARGO_HOME/registry/src`).
    #[arg(long)]
    registry: PathBuf,
    /// The Cargo.lock whose registry packages make the corpus.
    #[arg(long)]
    lock: PathBuf,
    /// Folder to create (must not exist).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 100_000)]
    min_chunks: usize,
    /// Larger files are mostly generated tables, not text anyone searches.
    #[arg(long, default_value_t = 256 * 1024)]
    max_file_bytes: u64,
}

#[derive(Args)]
struct RunArgs {
    /// Data dir of the running mesh (its mesh.json names the addresses).
    #[arg(long)]
    data_dir: PathBuf,
    /// PAT the calls run as (the MCP bearer token; auth turns it into the gRPC context).
    #[arg(long, env = "KGMESH_TOKEN", hide_env_values = true)]
    token: String,
    #[arg(long)]
    namespace: String,
    /// JSON lines, each with a "text" field.
    #[arg(long)]
    queries: PathBuf,
    /// Queries run through every path and lane set before timing starts.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Concurrent clients (each with its own MCP session); 1 = sequential.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Lane sets, comma-separated; `fused` is the default lanes together.
    #[arg(
        long,
        default_value = "fulltext,vector,graph_expand,co_annotation,fused"
    )]
    lanes: String,
    #[arg(long, default_value_t = 8)]
    top_k: u32,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// MCP protocol revision: 2025-06-18 (initialize, then a session) or 2026-07-28 (no
    /// session; each request names its version and capabilities in `_meta`).
    #[arg(long, default_value = MCP_SESSION_PROTOCOL, value_parser = [MCP_SESSION_PROTOCOL, MCP_STATELESS_PROTOCOL])]
    mcp_protocol: String,
    /// After the run, also time all-MiniLM-L6-v2 embedding each query alone in this process
    /// (the vector lane's first step) under this token cap: the mesh's own embedder config.
    #[arg(long)]
    time_embedding: Option<usize>,
    /// Also print, per lane set, the queries whose gRPC Search took longest (this many):
    /// where a tail comes from.
    #[arg(long, default_value_t = 0)]
    slowest: usize,
    /// Idle this many ms (untimed) before each timed search, gRPC and MCP alike: an agent
    /// that asks now and then, not a stream. Past a minute, every search finds the lanes'
    /// per-scope statistics cache expired.
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
}

fn main() -> anyhow::Result<()> {
    // SAFETY: first thing in main; no other thread exists before the runtime below starts.
    // The query embedding timed here then runs as it does in the mesh.
    #[allow(unsafe_code)]
    unsafe {
        kg_embed::pin_matmul_threads();
    }
    match Cli::parse().command {
        Command::Corpus(args) => corpus(&args),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(run(args)),
    }
}

// ---------------------------------------------------------------------------------------
// corpus
// ---------------------------------------------------------------------------------------

/// (name, version) of every crates.io package in a Cargo.lock.
fn lock_packages(lock: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text =
        std::fs::read_to_string(lock).with_context(|| format!("cannot read {}", lock.display()))?;
    let mut packages = Vec::new();
    let mut current: (Option<String>, Option<String>, bool) = (None, None, false);
    let mut flush = |current: &mut (Option<String>, Option<String>, bool)| {
        if let (Some(name), Some(version), true) = std::mem::take(current) {
            packages.push((name, version));
        }
    };
    for line in text.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            flush(&mut current);
        } else if let Some(value) = line.strip_prefix("name = ") {
            current.0 = Some(value.trim_matches('"').to_owned());
        } else if let Some(value) = line.strip_prefix("version = ") {
            current.1 = Some(value.trim_matches('"').to_owned());
        } else if let Some(value) = line.strip_prefix("source = ") {
            current.2 = value.trim_matches('"').starts_with("registry+");
        }
    }
    flush(&mut current);
    packages.sort();
    Ok(packages)
}

/// FNV-1a: a hash that is the same on every platform and release, unlike std's.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

struct Candidate {
    order: u64,
    /// `<crate>-<version>/<path inside the crate>`.
    name: String,
    source: PathBuf,
    markdown: bool,
}

fn candidates(args: &CorpusArgs) -> anyhow::Result<(Vec<Candidate>, usize)> {
    let mut indexes: Vec<PathBuf> = std::fs::read_dir(&args.registry)
        .with_context(|| format!("cannot read {}", args.registry.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    indexes.sort();
    let mut out = Vec::new();
    let mut crates = 0;
    for (name, version) in lock_packages(&args.lock)? {
        let dir_name = format!("{name}-{version}");
        let Some(root) = indexes
            .iter()
            .map(|i| i.join(&dir_name))
            .find(|p| p.is_dir())
        else {
            continue;
        };
        crates += 1;
        let walk = walkdir::WalkDir::new(&root)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| {
                let file = e.file_name().to_string_lossy();
                e.depth() == 0 || !(file.starts_with('.') || file == "target")
            });
        for entry in walk.filter_map(Result::ok) {
            if !entry.file_type().is_file() {
                continue;
            }
            let Ok(relative) = entry.path().strip_prefix(&root) else {
                continue;
            };
            let relative = relative.to_string_lossy().replace('\\', "/");
            let lower = relative.to_ascii_lowercase();
            let markdown = lower.ends_with(".md") || lower.ends_with(".markdown");
            if !(markdown || lower.ends_with(".rs")) {
                continue;
            }
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if size < 256 || size > args.max_file_bytes {
                continue;
            }
            let name = format!("{dir_name}/{relative}");
            out.push(Candidate {
                order: stable_hash(&name),
                name,
                source: entry.path().to_path_buf(),
                markdown,
            });
        }
    }
    // A hash order mixes crates and file kinds; the name breaks (unlikely) ties.
    out.sort_by(|a, b| a.order.cmp(&b.order).then_with(|| a.name.cmp(&b.name)));
    Ok((out, crates))
}

fn corpus(args: &CorpusArgs) -> anyhow::Result<()> {
    if args.out.exists() {
        bail!(
            "{} exists; the corpus goes into a new folder",
            args.out.display()
        );
    }
    let (candidates, crates) = candidates(args)?;
    let options = IndexerConfig::default().chunk;
    let (mut files, mut chunks, mut bytes, mut markdown_files) = (0usize, 0usize, 0u64, 0usize);
    for candidate in &candidates {
        if chunks >= args.min_chunks {
            break;
        }
        let content = std::fs::read(&candidate.source)
            .with_context(|| format!("cannot read {}", candidate.source.display()))?;
        if std::str::from_utf8(&content).is_err() {
            continue;
        }
        // Rust sources as plain text: the indexer has no Rust parser, and `.txt` tells it so.
        let (path, mime) = if candidate.markdown {
            (candidate.name.clone(), "text/markdown")
        } else {
            (format!("{}.txt", candidate.name), "text/plain")
        };
        let meta = FileMeta {
            namespace: "bench-search".into(),
            file_id: format!("f{files}"),
            version_id: format!("v{files}"),
            path: path.clone(),
            mime: mime.into(),
            enabled: true,
            hidden: false,
        };
        let Ok(doc) = index_document(&meta, &content, &options) else {
            continue;
        };
        if doc.chunks.is_empty() {
            continue;
        }
        let target = args.out.join(&path);
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&target, &content)
            .with_context(|| format!("cannot write {}", target.display()))?;
        files += 1;
        markdown_files += usize::from(candidate.markdown);
        chunks += doc.chunks.len();
        bytes += content.len() as u64;
    }
    if chunks < args.min_chunks {
        bail!(
            "the registry sources of {} only make {chunks} chunks, fewer than --min-chunks {}",
            args.lock.display(),
            args.min_chunks
        );
    }
    println!(
        "{}",
        json!({
            "files": files,
            "markdown_files": markdown_files,
            "chunks": chunks,
            "bytes": bytes,
            "crates": crates,
            "chunk_target_tokens": options.target_tokens,
        })
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// run: the two clients
// ---------------------------------------------------------------------------------------

/// The services the gateway calls, called directly with the context auth mints for the token.
#[derive(Clone)]
struct Direct {
    auth: AuthClient<Channel>,
    retrieval: RetrievalClient<Channel>,
    graph: GraphClient<Channel>,
    token: String,
    namespace: String,
    signed: SignedCallerContext,
    minted: Instant,
}

/// One timed direct call: the Authorize the gateway makes per request, retrieval Search, then
/// graph Packages for its hits.
struct DirectSample {
    /// auth's `SigningKey`: a gRPC round trip that reads nothing (the floor of any hop).
    round_trip: Duration,
    authorize: Duration,
    search: Duration,
    packages: Duration,
    hits: usize,
    failed_lanes: usize,
}

impl Direct {
    async fn connect(info: &MeshInfo, token: &str, namespace: &str) -> anyhow::Result<Self> {
        let channel = |addr: &str| {
            kg_common::grpc::channel(addr).with_context(|| format!("bad gRPC address {addr}"))
        };
        let mut direct = Self {
            auth: AuthClient::new(channel(&info.grpc.auth)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            retrieval: RetrievalClient::new(channel(&info.grpc.retrieval)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            graph: GraphClient::new(channel(&info.grpc.graph)?)
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            token: token.to_owned(),
            namespace: namespace.to_owned(),
            signed: SignedCallerContext::default(),
            minted: Instant::now(),
        };
        direct.authorize().await?;
        Ok(direct)
    }

    /// The signed context the gateway would forward for this token (auth mints it).
    async fn authorize(&mut self) -> anyhow::Result<()> {
        let response = self
            .auth
            .authorize(AuthorizeRequest {
                token: self.token.clone(),
                tool: "kg_search".into(),
                namespaces: vec![self.namespace.clone()],
                request_id: format!("bench-{}", kg_common::caller::now_ms()),
                asserted_role: None,
            })
            .await
            .context("auth refused the token")?
            .into_inner();
        self.signed = response
            .context
            .context("auth returned no caller context")?;
        self.minted = Instant::now();
        Ok(())
    }

    /// Times the Authorize call the gateway makes for every MCP request (same token and tool,
    /// no namespace selection); the context it returns is not used.
    async fn time_authorize(&mut self) -> anyhow::Result<Duration> {
        let request = AuthorizeRequest {
            token: self.token.clone(),
            tool: "kg_search".into(),
            namespaces: Vec::new(),
            request_id: format!("bench-{}", kg_common::caller::now_ms()),
            asserted_role: None,
        };
        let started = Instant::now();
        self.auth
            .authorize(request)
            .await
            .context("auth refused the token")?;
        Ok(started.elapsed())
    }

    /// Times auth's `SigningKey`, which answers from memory: one loopback gRPC round trip.
    async fn time_round_trip(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.auth
            .signing_key(SigningKeyRequest {})
            .await
            .context("auth SigningKey failed")?;
        Ok(started.elapsed())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        kg_common::caller::attach_caller(&mut request, &self.signed);
        request
    }

    /// Refreshes the context when it is getting old; call outside timed sections.
    async fn fresh(&mut self) -> anyhow::Result<()> {
        if self.minted.elapsed() > CONTEXT_REFRESH {
            self.authorize().await?;
        }
        Ok(())
    }

    async fn search(
        &mut self,
        query: &str,
        lanes: &[String],
        top_k: u32,
    ) -> anyhow::Result<DirectSample> {
        let round_trip = self.time_round_trip().await?;
        let authorize = self.time_authorize().await?;
        let request = self.request(SearchRequest {
            namespace: self.namespace.clone(),
            query: query.to_owned(),
            lanes: lanes.to_vec(),
            top_k,
            filters: None,
            ranking: None,
        });
        let started = Instant::now();
        let response = self
            .retrieval
            .search(request)
            .await
            .context("retrieval Search failed")?
            .into_inner();
        let search = started.elapsed();
        let chunk_keys: Vec<String> = response
            .hits
            .iter()
            .take(top_k as usize)
            .map(|h| h.chunk_key.clone())
            .collect();
        let hits = chunk_keys.len();
        let failed_lanes = response.lanes.iter().filter(|l| !l.ok).count();
        let request = self.request(PackagesRequest {
            namespace: self.namespace.clone(),
            chunk_keys,
            caps: Some(DEFAULT_CAPS),
        });
        let started = Instant::now();
        if hits > 0 {
            self.graph
                .packages(request)
                .await
                .context("graph Packages failed")?;
        }
        Ok(DirectSample {
            round_trip,
            authorize,
            search,
            packages: started.elapsed(),
            hits,
            failed_lanes,
        })
    }

    /// Chunks in the namespace, counted by the graph service (kg_cypher's path).
    async fn chunk_count(&mut self) -> anyhow::Result<u64> {
        let request = self.request(CypherRequest {
            namespace: self.namespace.clone(),
            statement: "MATCH (c:Chunk) RETURN count(c) AS chunks LIMIT 1".into(),
            params_json: "{}".into(),
        });
        let response = self
            .graph
            .cypher(request)
            .await
            .context("graph Cypher (chunk count) failed")?
            .into_inner();
        let row: Value = serde_json::from_str(
            response
                .rows_json
                .first()
                .context("the chunk count returned no row")?,
        )?;
        row.get(0)
            .and_then(Value::as_u64)
            .with_context(|| format!("the chunk count is not a number: {row}"))
    }
}

/// A minimal MCP Streamable HTTP client: JSON-RPC over POST, answers as JSON or as
/// server-sent events; one session under 2025-06-18, none under 2026-07-28.
struct Mcp {
    http: reqwest::Client,
    url: String,
    token: String,
    protocol: &'static str,
    session: Option<String>,
    next_id: u64,
}

impl Mcp {
    async fn connect(url: &str, token: &str, protocol: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()?;
        let protocol = match protocol {
            MCP_SESSION_PROTOCOL => MCP_SESSION_PROTOCOL,
            MCP_STATELESS_PROTOCOL => MCP_STATELESS_PROTOCOL,
            other => bail!("unsupported MCP protocol revision {other}"),
        };
        let mut mcp = Self {
            http,
            url: url.to_owned(),
            token: token.to_owned(),
            protocol,
            session: None,
            next_id: 1,
        };
        if mcp.stateless() {
            // No handshake: the first tools/call is the first request.
            return Ok(mcp);
        }
        mcp.call(
            "initialize",
            json!({
                "protocolVersion": MCP_SESSION_PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "kg-search-bench", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await
        .context("MCP initialize failed")?;
        mcp.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .context("MCP notifications/initialized failed")?;
        Ok(mcp)
    }

    fn stateless(&self) -> bool {
        self.protocol == MCP_STATELESS_PROTOCOL
    }

    async fn post(&mut self, body: &Value) -> anyhow::Result<(reqwest::StatusCode, String)> {
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", self.protocol)
            .json(body);
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        if self.stateless() {
            // SEP-2243: the method, and the tool's name, repeated as headers for routers.
            if let Some(method) = body.get("method").and_then(Value::as_str) {
                request = request.header("mcp-method", method);
            }
            if let Some(name) = body.pointer("/params/name").and_then(Value::as_str) {
                request = request.header("mcp-name", name);
            }
        }
        let response = request.send().await?;
        if let Some(session) = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(session.to_owned());
        }
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!(
                "HTTP {status}: {}",
                text.chars().take(500).collect::<String>()
            );
        }
        Ok((status, text))
    }

    /// One JSON-RPC request; returns its `result`.
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let (id, body) = self.send(method, params).await?;
        answer_of(method, &body, id)
    }

    /// Sends one JSON-RPC request; returns its id and the whole response body, unparsed.
    async fn send(&mut self, method: &str, mut params: Value) -> anyhow::Result<(u64, String)> {
        if self.stateless() {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": self.protocol,
                "io.modelcontextprotocol/clientCapabilities": {},
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        let (_, body) = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        Ok((id, body))
    }

    /// Timed tools/call kg_search; returns (elapsed, hits).
    async fn kg_search(
        &mut self,
        query: &str,
        namespace: &str,
        lanes: &[String],
        top_k: u32,
    ) -> anyhow::Result<(Duration, usize)> {
        let mut arguments = json!({"query": query, "namespaces": [namespace], "topK": top_k});
        if !lanes.is_empty() {
            arguments["lanes"] = json!(lanes);
        }
        // Timed to the last byte of the answer: parsing the JSON is the client's work, as
        // decoding the protobuf answers is (and is cheaper) on the gRPC side.
        let started = Instant::now();
        let (id, body) = self
            .send(
                "tools/call",
                json!({"name": "kg_search", "arguments": arguments}),
            )
            .await?;
        let elapsed = started.elapsed();
        let result = answer_of("tools/call", &body, id)?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            bail!("kg_search failed: {}", clip(&result.to_string()));
        }
        let hits = result
            .pointer("/structuredContent/results")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        Ok((elapsed, hits))
    }

    /// Timed tools/call kg_namespaces (no backend call), to the answer's last byte.
    async fn kg_namespaces(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let (id, body) = self
            .send(
                "tools/call",
                json!({"name": "kg_namespaces", "arguments": {}}),
            )
            .await?;
        let elapsed = started.elapsed();
        let result = answer_of("tools/call", &body, id)?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            bail!("kg_namespaces failed: {}", clip(&result.to_string()));
        }
        Ok(elapsed)
    }
}

/// The `result` of the JSON-RPC answer with `id` in `body`.
fn answer_of(method: &str, body: &str, id: u64) -> anyhow::Result<Value> {
    let mut answer = find_response(body, id)
        .with_context(|| format!("no JSON-RPC answer with id {id} in {}", clip(body)))?;
    if let Some(error) = answer.get("error") {
        bail!("{method}: JSON-RPC error {error}");
    }
    answer
        .get_mut("result")
        .map(Value::take)
        .with_context(|| format!("{method}: answer without result"))
}

fn clip(text: &str) -> String {
    text.chars().take(500).collect()
}

/// The JSON-RPC message with `id` in a body that is either JSON or an SSE stream.
fn find_response(body: &str, id: u64) -> Option<Value> {
    let matches = |v: &Value| v.get("id").and_then(Value::as_u64) == Some(id);
    if let Ok(value) = serde_json::from_str::<Value>(body) {
        return matches(&value).then_some(value);
    }
    // SSE: events separated by blank lines; an event's data lines join with '\n'.
    for event in body.replace("\r\n", "\n").split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        if let Ok(value) = serde_json::from_str::<Value>(&data.join("\n"))
            && matches(&value)
        {
            return Some(value);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// run: the measurement
// ---------------------------------------------------------------------------------------

struct LaneSet {
    name: String,
    /// Empty: retrieval's default lanes (fused).
    lanes: Vec<String>,
}

/// One query through both paths for one lane set.
struct Sample {
    lane_set: usize,
    /// Index of the query in the run's list.
    query: usize,
    round_trip: Duration,
    authorize: Duration,
    search: Duration,
    packages: Duration,
    mcp: Duration,
    /// `kg_namespaces` over MCP right after: the same HTTP, JSON-RPC and Authorize with no
    /// backend call and a few bytes of answer.
    mcp_floor: Duration,
    grpc_hits: usize,
    mcp_hits: usize,
    failed_lanes: usize,
}

fn load_queries(path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut queries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let query = value
            .get("text")
            .and_then(Value::as_str)
            .with_context(|| format!("{} line {}: no \"text\"", path.display(), i + 1))?;
        queries.push(query.to_owned());
    }
    Ok(queries)
}

/// Runs one query through both paths; the order alternates so neither path always
/// finds the other's work in a cache.
async fn both(
    direct: &mut Direct,
    mcp: &mut Mcp,
    query: &str,
    set: &LaneSet,
    grpc_first: bool,
    top_k: u32,
    pause: Duration,
) -> anyhow::Result<(DirectSample, (Duration, usize), Duration)> {
    let namespace = direct.namespace.clone();
    let (d, m) = if grpc_first {
        tokio::time::sleep(pause).await;
        direct.fresh().await?;
        let d = direct.search(query, &set.lanes, top_k).await?;
        tokio::time::sleep(pause).await;
        let m = mcp.kg_search(query, &namespace, &set.lanes, top_k).await?;
        (d, m)
    } else {
        tokio::time::sleep(pause).await;
        let m = mcp.kg_search(query, &namespace, &set.lanes, top_k).await?;
        tokio::time::sleep(pause).await;
        direct.fresh().await?;
        let d = direct.search(query, &set.lanes, top_k).await?;
        (d, m)
    };
    let floor = mcp.kg_namespaces().await?;
    Ok((d, m, floor))
}

async fn client_loop(
    mut direct: Direct,
    mut mcp: Mcp,
    queries: Arc<Vec<String>>,
    sets: Arc<Vec<LaneSet>>,
    next: Arc<AtomicUsize>,
    top_k: u32,
    pause: Duration,
) -> anyhow::Result<(Vec<Sample>, Vec<Failure>)> {
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(query) = queries.get(index) else {
            return Ok((samples, failures));
        };
        for (set_index, set) in sets.iter().enumerate() {
            let grpc_first = (index + set_index).is_multiple_of(2);
            // A failed call is counted and reported, not timed; the run goes on.
            match both(&mut direct, &mut mcp, query, set, grpc_first, top_k, pause).await {
                Ok((d, (mcp_time, mcp_hits), mcp_floor)) => samples.push(Sample {
                    lane_set: set_index,
                    query: index,
                    round_trip: d.round_trip,
                    authorize: d.authorize,
                    search: d.search,
                    packages: d.packages,
                    mcp: mcp_time,
                    mcp_floor,
                    grpc_hits: d.hits,
                    mcp_hits,
                    failed_lanes: d.failed_lanes,
                }),
                Err(err) => failures.push(Failure {
                    lane_set: set_index,
                    message: format!("query {query:?}: {err:#}"),
                }),
            }
        }
    }
}

/// A query whose gRPC or MCP call failed for one lane set.
struct Failure {
    lane_set: usize,
    message: String,
}

type Stats = kgmesh::percentiles::Summary;

/// Nearest-rank percentiles in milliseconds (signed: overheads can be negative).
fn stats(values: Vec<f64>) -> Stats {
    Stats::of(values)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn stats_json(s: Stats) -> Value {
    json!({"p50_ms": s.p50, "p95_ms": s.p95, "p99_ms": s.p99, "mean_ms": s.mean})
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let info = MeshInfo::load(&args.data_dir)?;
    let mut queries = load_queries(&args.queries)?;
    let mut seen = std::collections::HashSet::new();
    queries.retain(|q| seen.insert(q.clone()));
    if queries.is_empty() {
        bail!("{} holds no queries", args.queries.display());
    }
    let sets: Vec<LaneSet> = args
        .lanes
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| LaneSet {
            name: l.to_owned(),
            lanes: if l == "fused" {
                Vec::new()
            } else {
                vec![l.to_owned()]
            },
        })
        .collect();
    if sets.is_empty() {
        bail!("--lanes names no lane set");
    }
    let concurrency = args.concurrency.max(1);

    let mut direct = Direct::connect(&info, &args.token, &args.namespace).await?;
    let chunks = direct.chunk_count().await?;
    let mut mcp = Mcp::connect(&info.mcp_url, &args.token, &args.mcp_protocol).await?;
    println!(
        "namespace {}: {chunks} chunks; {} distinct queries x {} lane sets, top_k {}, concurrency {concurrency}, MCP {}",
        args.namespace,
        queries.len(),
        sets.len(),
        args.top_k,
        args.mcp_protocol
    );

    // Warm-up: loads the embedder, FalkorDB's and the vector index's pages, both connections.
    let warm_started = Instant::now();
    for (i, query) in queries.iter().take(args.warmup).enumerate() {
        for set in &sets {
            both(
                &mut direct,
                &mut mcp,
                query,
                set,
                i.is_multiple_of(2),
                args.top_k,
                Duration::ZERO,
            )
            .await?;
        }
    }
    println!(
        "warm-up: {} queries x {} lane sets in {:.1} s",
        args.warmup.min(queries.len()),
        sets.len(),
        warm_started.elapsed().as_secs_f64()
    );

    let queries = Arc::new(queries);
    let sets = Arc::new(sets);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..concurrency {
        let (d, m) = if i == 0 {
            (
                direct.clone(),
                Mcp::connect(&info.mcp_url, &args.token, &args.mcp_protocol).await?,
            )
        } else {
            (
                Direct::connect(&info, &args.token, &args.namespace).await?,
                Mcp::connect(&info.mcp_url, &args.token, &args.mcp_protocol).await?,
            )
        };
        clients.spawn(client_loop(
            d,
            m,
            queries.clone(),
            sets.clone(),
            next.clone(),
            args.top_k,
            Duration::from_millis(args.pause_ms),
        ));
    }
    let (mut samples, mut failures) = (Vec::new(), Vec::new());
    while let Some(joined) = clients.join_next().await {
        let (ok, failed) = joined.context("a client task panicked")??;
        samples.extend(ok);
        failures.extend(failed);
    }
    if samples.is_empty() {
        bail!(
            "every call failed; first: {}",
            failures.first().map_or("", |f| f.message.as_str())
        );
    }
    let wall = started.elapsed().as_secs_f64();

    let mut report = report(
        &args,
        &sets,
        &samples,
        &failures,
        chunks,
        queries.len(),
        wall,
    );
    if args.slowest > 0 {
        print_slowest(&sets, &samples, &queries, args.slowest);
    }
    if let Some(max_tokens) = args.time_embedding {
        let embedding = time_embedding(&queries, max_tokens).await?;
        println!(
            "query embedding alone (all-MiniLM-L6-v2, {max_tokens} word pieces, this process): p50 {:.2} / p95 {:.2} / p99 {:.2} ms",
            embedding.p50, embedding.p95, embedding.p99
        );
        report["query_embedding"] = stats_json(embedding);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{report}");
    Ok(())
}

/// Each query embedded alone, as the vector lane does it, by the model the mesh runs.
/// The `n` queries with the slowest gRPC Search in each lane set, slowest first.
fn print_slowest(sets: &[LaneSet], samples: &[Sample], queries: &[String], n: usize) {
    for (index, set) in sets.iter().enumerate() {
        let mut timed: Vec<&Sample> = samples.iter().filter(|s| s.lane_set == index).collect();
        timed.sort_by_key(|s| std::cmp::Reverse(s.search));
        println!("slowest gRPC Search, {}:", set.name);
        for sample in timed.into_iter().take(n) {
            let query = queries.get(sample.query).map_or("", String::as_str);
            println!(
                "  {:>8.2} ms  {:>2} hits  {}",
                ms(sample.search),
                sample.grpc_hits,
                query.chars().take(100).collect::<String>()
            );
        }
    }
}

async fn time_embedding(queries: &[String], max_tokens: usize) -> anyhow::Result<Stats> {
    use kg_embed::Embedder as _;
    let model = kg_embed::MiniLm::load(kg_embed::MiniLmOptions {
        max_tokens,
        ..kg_embed::MiniLmOptions::default()
    })
    .await?;
    // The first pass allocates and pages the weights in.
    model.embed(vec!["warm up".to_owned()]).await?;
    let mut times = Vec::with_capacity(queries.len());
    for query in queries {
        let started = Instant::now();
        model.embed(vec![query.clone()]).await?;
        times.push(ms(started.elapsed()));
    }
    Ok(stats(times))
}

fn report(
    args: &RunArgs,
    sets: &[LaneSet],
    samples: &[Sample],
    failures: &[Failure],
    chunks: u64,
    queries: usize,
    wall: f64,
) -> Value {
    println!(
        "\n{:<14}{:<24}{:>6}{:>9}{:>9}{:>9}{:>9}{:>7}",
        "lanes", "path", "n", "p50", "p95", "p99", "mean", "hits"
    );
    let mut lanes_json = BTreeMap::new();
    let mut goal_lines = Vec::new();
    for (index, set) in sets.iter().enumerate() {
        let of_set: Vec<&Sample> = samples.iter().filter(|s| s.lane_set == index).collect();
        let n = of_set.len();
        let mean_hits = |f: fn(&Sample) -> usize| {
            of_set.iter().map(|s| f(s) as f64).sum::<f64>() / n.max(1) as f64
        };
        let grpc_hits = mean_hits(|s| s.grpc_hits);
        let mcp_hits = mean_hits(|s| s.mcp_hits);
        let failed_lanes: usize = of_set.iter().map(|s| s.failed_lanes).sum();
        let rows: [(&str, Stats, Option<f64>); 9] = [
            (
                "grpc Search",
                stats(of_set.iter().map(|s| ms(s.search)).collect()),
                Some(grpc_hits),
            ),
            (
                "grpc Search+Packages",
                stats(of_set.iter().map(|s| ms(s.search + s.packages)).collect()),
                Some(grpc_hits),
            ),
            (
                "mcp kg_search",
                stats(of_set.iter().map(|s| ms(s.mcp)).collect()),
                Some(mcp_hits),
            ),
            (
                "overhead mcp-(S+P)",
                stats(
                    of_set
                        .iter()
                        .map(|s| ms(s.mcp) - ms(s.search + s.packages))
                        .collect(),
                ),
                None,
            ),
            (
                "overhead mcp-S",
                stats(of_set.iter().map(|s| ms(s.mcp) - ms(s.search)).collect()),
                None,
            ),
            (
                "grpc Authorize",
                stats(of_set.iter().map(|s| ms(s.authorize)).collect()),
                None,
            ),
            (
                "grpc SigningKey",
                stats(of_set.iter().map(|s| ms(s.round_trip)).collect()),
                None,
            ),
            (
                "mcp kg_namespaces",
                stats(of_set.iter().map(|s| ms(s.mcp_floor)).collect()),
                None,
            ),
            (
                "overhead mcp-(A+S+P)",
                stats(
                    of_set
                        .iter()
                        .map(|s| ms(s.mcp) - ms(s.authorize + s.search + s.packages))
                        .collect(),
                ),
                None,
            ),
        ];
        let mut set_json = serde_json::Map::new();
        for (path, s, hits) in rows {
            let hits = hits.map_or_else(String::new, |h| format!("{h:.1}"));
            println!(
                "{:<14}{:<24}{:>6}{:>9.2}{:>9.2}{:>9.2}{:>9.2}{:>7}",
                set.name, path, n, s.p50, s.p95, s.p99, s.mean, hits
            );
            set_json.insert(path.to_owned(), stats_json(s));
        }
        set_json.insert("n".into(), json!(n));
        set_json.insert("grpc_mean_hits".into(), json!(grpc_hits));
        set_json.insert("mcp_mean_hits".into(), json!(mcp_hits));
        set_json.insert("soft_failed_lanes".into(), json!(failed_lanes));
        let errors: Vec<&Failure> = failures.iter().filter(|f| f.lane_set == index).collect();
        set_json.insert("failed_calls".into(), json!(errors.len()));
        if let Some(first) = errors.first() {
            println!(
                "{:<14}  {} queries failed and are not timed; first: {}",
                set.name,
                errors.len(),
                clip(&first.message)
            );
        }
        if failed_lanes > 0 {
            println!(
                "{:<14}  {failed_lanes} lane runs soft-failed (retrieval trace ok=false)",
                set.name
            );
        }
        if set.lanes.is_empty() {
            let mcp = rows[2].1;
            let overhead = rows[3].1;
            goal_lines.push(format!(
                "goals ({}): mcp p50 {:.1} ms <= 30 {}; mcp p99 {:.1} ms <= 100 {}; gateway overhead p50 {:.2} ms <= 1 {}",
                set.name,
                mcp.p50,
                verdict(mcp.p50 <= 30.0),
                mcp.p99,
                verdict(mcp.p99 <= 100.0),
                overhead.p50,
                verdict(overhead.p50 <= 1.0),
            ));
        }
        lanes_json.insert(set.name.clone(), Value::Object(set_json));
    }
    let calls = samples.len();
    println!(
        "\nms per call; hits = mean results returned. Search = retrieval alone (query embedding included); \
         Packages = graph packages for its hits; Authorize = auth's per-request check of the token, as the \
         gateway makes it; MCP = tools/call sent to the last byte of its answer (the client's JSON parse \
         is not timed, as the gRPC side's protobuf decode is); overhead mcp-(S+P) = the same query's MCP \
         time minus the search backends (HTTP, JSON-RPC, JSON rendering, and what of the Authorize does \
         not overlap the backend reads: a read-only call runs beside it once auth knows the token), \
         mcp-(A+S+P) = also minus a whole Authorize; kg_namespaces = a tool call with no backend call and \
         a small answer (HTTP, JSON-RPC, the whole Authorize), timed after each kg_search; SigningKey = a \
         gRPC round trip to auth that reads nothing, the floor of any hop."
    );
    println!(
        "{calls} query x lane-set pairs in {wall:.1} s ({:.1} pairs/s, each pair = one gRPC and one MCP search)",
        calls as f64 / wall.max(1e-9)
    );
    for line in &goal_lines {
        println!("{line}");
    }
    json!({
        "namespace": args.namespace,
        "chunks": chunks,
        "queries": queries,
        "warmup": args.warmup,
        "concurrency": args.concurrency.max(1),
        "mcp_protocol": args.mcp_protocol,
        "top_k": args.top_k,
        "wall_seconds": wall,
        "lanes": lanes_json,
    })
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = stats((1..=100).map(f64::from).collect());
        assert_eq!((s.p50, s.p95, s.p99), (50.0, 95.0, 99.0));
        assert!((s.mean - 50.5).abs() < 1e-9);
        let one = stats(vec![-2.0]);
        assert_eq!((one.p50, one.p99), (-2.0, -2.0));
    }

    #[test]
    fn finds_the_answer_in_json_and_in_sse() {
        let plain = r#"{"jsonrpc":"2.0","id":3,"result":{"ok":true}}"#;
        assert_eq!(find_response(plain, 3).unwrap()["result"]["ok"], true);
        assert!(find_response(plain, 4).is_none());
        let sse = "id: 0\ndata: \n\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\r\ndata: \"result\":{}}\r\n\r\n";
        assert!(find_response(sse, 7).unwrap()["result"].is_object());
    }

    #[test]
    fn lock_packages_keep_registry_crates_only() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("Cargo.lock");
        std::fs::write(
            &lock,
            "version = 4\n\n[[package]]\nname = \"local\"\nversion = \"0.1.0\"\n\n\
             [[package]]\nname = \"serde\"\nversion = \"1.0.1\"\n\
             source = \"registry+https://github.com/rust-lang/crates.io-index\"\n\n\
             [[package]]\nname = \"git-dep\"\nversion = \"0.2.0\"\nsource = \"git+https://x\"\n",
        )
        .unwrap();
        assert_eq!(
            lock_packages(&lock).unwrap(),
            vec![("serde".to_owned(), "1.0.1".to_owned())]
        );
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
