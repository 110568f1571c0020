//! FalkorDB access: one graph per namespace (`kg_ns_<namespace>`), Cypher with JSON
//! parameters, results as JSON rows.
//!
//! Every call selects the graph afresh, so the client's schema cache (label and property ids)
//! never outlives a graph that another process deleted and recreated; queries that return
//! whole nodes pay one extra round trip for it.

mod assign;
mod fulltext;
mod params;

use std::collections::HashMap;
use std::num::NonZeroU8;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use falkordb::{FalkorAsyncClient, FalkorClientBuilder, FalkorConnectionInfo, FalkorDBError};
use falkordb::{FalkorValue, QueryResult, RowStream};
use futures::TryStreamExt;
use serde_json::{Map, Number, Value};

use crate::error::{StoreError, StoreKind};
use kg_common::error::{ErrorCode, ErrorExt as _};

pub use assign::assign_properties;
pub use fulltext::{
    FulltextIndexState, MAX_TERM_CHARS, MAX_TERMS, exact_term, fulltext_query, fulltext_terms,
    split_words, stemmed_term,
};
pub use params::{Params, cypher_literal};

/// Prefix of every namespace graph key.
pub const GRAPH_PREFIX: &str = "kg_ns_";

/// Range indexes every namespace graph has: (label, property).
pub const RANGE_INDEXES: &[(&str, &str)] = &[
    ("Chunk", "chunkKey"),
    ("Chunk", "fileId"),
    ("FileRef", "fileId"),
    ("FileRef", "vfsPath"),
    ("OutlineNode", "outlineKey"),
    ("OutlineNode", "fileId"),
    ("Entity", "entityKey"),
    ("Folder", "folderPath"),
];

/// Full-text indexes every namespace graph has: (label, properties). A chunk's contextHeader
/// (document title › headings) is indexed with its text: BM25 over both ranked docs-qa
/// better (nDCG@10 0.782 against 0.764 on text alone). `splitWords` holds the words the
/// index would read glued to a neighbour (see [`split_words`]).
pub const FULLTEXT_INDEXES: &[(&str, &[&str])] =
    &[("Chunk", &["text", "contextHeader", "splitWords"])];

/// Longest wait for a new or rebuilt full-text index to be searchable.
const INDEX_BUILD_WAIT: Duration = Duration::from_secs(60);

/// The graph key of a namespace: `kg_ns_<namespace>`.
pub fn graph_name(namespace: &str) -> String {
    format!("{GRAPH_PREFIX}{namespace}")
}

/// Query results as JSON: FalkorDB scalars, lists and maps map to their JSON forms; nodes and
/// edges become the map of their properties; paths become `{nodes: [...], edges: [...]}`;
/// points `{latitude, longitude}`; temporal values their seconds; non-finite floats `null`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Rows {
    /// Column names, in query order.
    pub columns: Vec<String>,
    /// One entry per row, one value per column.
    pub rows: Vec<Vec<Value>>,
}

/// A handle on FalkorDB, cheap to clone.
#[derive(Clone)]
pub struct GraphStore {
    client: FalkorAsyncClient,
    url: Arc<str>,
    /// Longest wait for one reply ([`GraphStore::with_reply_timeout`]).
    reply_timeout: Duration,
    /// Calls that met a dead connection or a server still loading: each may be a restart,
    /// after which FalkorDB rebuilds its indexes ([`GraphStore::fulltext_ro_query`]).
    restarts: Arc<AtomicU64>,
    /// Per namespace graph and label, the count of [`GraphStore::restarts`] when its full-text
    /// index was last seen built.
    fulltext_ready: Arc<Mutex<HashMap<(String, String), u64>>>,
}

impl std::fmt::Debug for GraphStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphStore").finish_non_exhaustive()
    }
}

/// Multiplexed sockets per client; commands pipeline over them.
const CONNECTIONS: u8 = 2;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the tries again of a read that met a dead connection may take, all together (see
/// [`GraphStore::read_again_on_dead_connection`]): a redial after a restart took up to about a
/// second under load; a server still down costs each read this much more before it fails.
const READ_AGAIN_WITHIN: Duration = Duration::from_secs(1);
/// Default longest wait for one reply: far above any query the services run (a large
/// file's write is seconds), so it only ends waits on a server that stopped answering.
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(120);

impl GraphStore {
    /// Connects to `redis://host:port` (or `falkor://`); fails with `Unavailable` when the
    /// server does not answer.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let info: FalkorConnectionInfo =
            url.try_into()
                .map_err(|err: FalkorDBError| StoreError::InvalidInput {
                    what: "graph store url",
                    reason: err.to_string(),
                })?;
        let connections = NonZeroU8::new(CONNECTIONS).unwrap_or(NonZeroU8::MIN);
        let client = FalkorClientBuilder::new_async()
            .with_connection_info(info)
            .with_num_connections(connections)
            .with_connect_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .await
            .map_err(map_falkor_error)?;
        Ok(GraphStore {
            client,
            url: url.into(),
            reply_timeout: DEFAULT_REPLY_TIMEOUT,
            restarts: Arc::default(),
            fulltext_ready: Arc::default(),
        })
    }

    /// Bounds the wait for each reply (default [`DEFAULT_REPLY_TIMEOUT`]). A server-side
    /// query timeout cannot end a wait on a server that stopped answering (seen: FalkorDB
    /// deadlocked in its module's globals lock, its sockets open and silent); past this the
    /// call fails with `Timeout` and the connection stays usable, as replies are matched to
    /// requests and a late one is dropped.
    pub fn with_reply_timeout(mut self, timeout: Duration) -> Self {
        self.reply_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Awaits one store call within the reply timeout.
    async fn answered<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.reply_timeout, call).await {
            Ok(Err(err)) if err.code() == ErrorCode::Unavailable => {
                self.restarts.fetch_add(1, Ordering::AcqRel);
                Err(err)
            }
            Ok(result) => result,
            Err(_elapsed) => Err(StoreError::timeout(
                StoreKind::Graph,
                format!(
                    "no reply from FalkorDB within {} ms",
                    self.reply_timeout.as_millis()
                ),
            )),
        }
    }

    /// How many calls of this handle (and its clones) met a dead connection or a server
    /// still loading.
    pub(crate) fn restarts_seen(&self) -> u64 {
        self.restarts.load(Ordering::Acquire)
    }

    /// The server this handle talks to, for per-server caches (never logged: it may hold a password).
    pub fn server_identity(&self) -> &str {
        &self.url
    }

    /// The graph key of a namespace (same as [`graph_name`]).
    pub fn graph_name(namespace: &str) -> String {
        graph_name(namespace)
    }

    /// Runs a (write) query with `GRAPH.QUERY`. Creates the graph when it does not exist.
    pub async fn query(
        &self,
        namespace: &str,
        cypher: &str,
        params: &Params,
    ) -> Result<Rows, StoreError> {
        // Boxed: the driver's future nests deep enough to overflow callers' type layout.
        self.answered(Box::pin(self.query_inner(namespace, cypher, params)))
            .await
    }

    async fn query_inner(
        &self,
        namespace: &str,
        cypher: &str,
        params: &Params,
    ) -> Result<Rows, StoreError> {
        let mut graph = self.client.select_graph(Self::graph_name(namespace));
        let encoded = encode_params(params)?;
        let mut builder = graph.query(cypher);
        for (name, literal) in encoded {
            builder = builder.with_raw_param(name, literal);
        }
        collect(builder.execute().await).await
    }

    /// Runs a read-only query with `GRAPH.RO_QUERY` and a server-side timeout (`Timeout` when
    /// it runs out; the server checks it between records, so a huge eager `range()` can
    /// overrun it). A write clause is rejected by the server (`GraphQuery`). A namespace whose
    /// graph does not exist yet returns no rows at all, even for `RETURN count(*)`.
    pub async fn ro_query(
        &self,
        namespace: &str,
        cypher: &str,
        params: &Params,
        timeout_ms: u64,
    ) -> Result<Rows, StoreError> {
        self.read_again_on_dead_connection(|| {
            self.answered(Box::pin(
                self.ro_query_inner(namespace, cypher, params, timeout_ms),
            ))
        })
        .await
    }

    /// Runs a read, and again (up to once per socket) when it failed for want of a connection:
    /// after FalkorDB restarted, each socket of the pool fails its first command before the
    /// driver dials it again (a redial to a live server takes milliseconds), and a read is safe
    /// to send twice. The tries again have [`READ_AGAIN_WITHIN`] in all: with the server still
    /// down the driver would wait seconds for a connection, and the first failure is the answer.
    async fn read_again_on_dead_connection<T, F, Fut>(&self, mut read: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let first = match read().await {
            Err(err) if err.code() == ErrorCode::Unavailable => err,
            answered => return answered,
        };
        tracing::debug!(error = %first, "graph read met a dead connection; sending it again");
        let again = async {
            for _ in 0..CONNECTIONS {
                match read().await {
                    Err(err) if err.code() == ErrorCode::Unavailable => {}
                    answered => return Some(answered),
                }
            }
            None
        };
        match tokio::time::timeout(READ_AGAIN_WITHIN, again).await {
            Ok(Some(answered)) => answered,
            Ok(None) | Err(_) => Err(first),
        }
    }

    async fn ro_query_inner(
        &self,
        namespace: &str,
        cypher: &str,
        params: &Params,
        timeout_ms: u64,
    ) -> Result<Rows, StoreError> {
        let mut graph = self.client.select_graph(Self::graph_name(namespace));
        let encoded = encode_params(params)?;
        let mut builder = graph
            .ro_query(cypher)
            .with_timeout(i64::try_from(timeout_ms.max(1)).unwrap_or(i64::MAX));
        for (name, literal) in encoded {
            builder = builder.with_raw_param(name, literal);
        }
        match collect(builder.execute().await).await {
            Err(StoreError::NotFound { .. }) => Ok(Rows::default()),
            other => other,
        }
    }

    /// Deletes a namespace's graph. Deleting a graph that does not exist is not an error.
    pub async fn delete_graph(&self, namespace: &str) -> Result<(), StoreError> {
        let mut graph = self.client.select_graph(Self::graph_name(namespace));
        match self
            .answered(async { graph.delete().await.map_err(map_falkor_error) })
            .await
        {
            Ok(()) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(err) => Err(err),
        }
    }

    async fn list_graphs(&self) -> Result<Vec<String>, StoreError> {
        self.read_again_on_dead_connection(|| {
            self.answered(async { self.client.list_graphs().await.map_err(map_falkor_error) })
        })
        .await
    }

    /// Whether a namespace's graph exists.
    pub async fn graph_exists(&self, namespace: &str) -> Result<bool, StoreError> {
        let name = Self::graph_name(namespace);
        let graphs = self.list_graphs().await?;
        Ok(graphs.contains(&name))
    }

    /// Creates the [`RANGE_INDEXES`] and [`FULLTEXT_INDEXES`] of a namespace graph (creating the
    /// graph if needed). Idempotent: indexes that already exist are left alone.
    pub async fn ensure_indexes(&self, namespace: &str) -> Result<(), StoreError> {
        let none = Params::new();
        for (label, property) in RANGE_INDEXES {
            let cypher = format!("CREATE INDEX FOR (n:{label}) ON (n.{property})");
            ignore_existing(self.query(namespace, &cypher, &none).await)?;
        }
        for (label, properties) in FULLTEXT_INDEXES {
            let fields: Vec<String> = properties.iter().map(|p| format!("'{p}'")).collect();
            let create = format!(
                "CALL db.idx.fulltext.createNodeIndex('{label}', {})",
                fields.join(", ")
            );
            ignore_existing(self.query(namespace, &create, &none).await)?;
            // An index from an older release covers fewer properties, and creating it again
            // only says "already indexed": drop and recreate it (FalkorDB indexes the
            // existing nodes again; range indexes on the label stay).
            // Only a built index that lacks a property is rebuilt: one still under
            // construction (or not listed yet) is the one just created.
            let covers_all =
                |built: &[String]| properties.iter().all(|p| built.iter().any(|b| b == p));
            let rebuilt = match self.fulltext_properties(namespace, label).await? {
                Some(indexed) if !indexed.is_empty() && !covers_all(&indexed) => {
                    let drop = format!("CALL db.idx.fulltext.drop('{label}')");
                    self.query(namespace, &drop, &none).await?;
                    self.query(namespace, &create, &none).await?;
                    true
                }
                _ => false,
            };
            // FalkorDB builds a new or recreated index in the background, and until it is
            // built a search misses the nodes it covers: wait for it (bounded), so that what
            // is written after this returns is searchable. A built index answers at once.
            // Right after a drop and create, `db.indexes()` can list no index for the label
            // yet, which reads as built, so a rebuilt index is waited for until it lists every
            // property.
            let deadline = std::time::Instant::now() + INDEX_BUILD_WAIT;
            while std::time::Instant::now() < deadline {
                match self.fulltext_properties(namespace, label).await? {
                    Some(built) if !rebuilt || covers_all(&built) => break,
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }
        Ok(())
    }

    /// Runs [`GraphStore::ensure_indexes`] on every namespace graph of the server (a start-up
    /// migration: an index definition that changed is rebuilt before the first search, not
    /// at the namespace's next write). Returns how many namespaces it checked.
    pub async fn ensure_all_indexes(&self) -> Result<usize, StoreError> {
        let namespaces = self.namespaces().await?;
        for namespace in &namespaces {
            self.ensure_indexes(namespace).await?;
        }
        Ok(namespaces.len())
    }

    /// The namespaces that have a graph on the server.
    pub async fn namespaces(&self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .list_graphs()
            .await?
            .into_iter()
            .filter_map(|graph| graph.strip_prefix(GRAPH_PREFIX).map(str::to_owned))
            .collect())
    }
}

fn ignore_existing(result: Result<Rows, StoreError>) -> Result<(), StoreError> {
    match result {
        Ok(_) => Ok(()),
        Err(StoreError::GraphQuery { detail }) if detail.contains("already indexed") => Ok(()),
        Err(err) => Err(err),
    }
}

fn encode_params(params: &Params) -> Result<Vec<(&str, String)>, StoreError> {
    params
        .iter()
        .map(|(name, value)| {
            params::validate_param_name(name)?;
            Ok((name.as_str(), cypher_literal(value)?))
        })
        .collect()
}

async fn collect(
    result: Result<QueryResult<RowStream>, FalkorDBError>,
) -> Result<Rows, StoreError> {
    let result = result.map_err(map_falkor_error)?;
    let columns = result.header.to_vec();
    let rows: Vec<falkordb::Row> = result.data.try_collect().await.map_err(map_falkor_error)?;
    let rows = rows
        .into_iter()
        .map(|row| row.into_values().into_iter().map(to_json).collect())
        .collect();
    Ok(Rows { columns, rows })
}

/// Converts one FalkorDB value to JSON (see [`Rows`]).
pub fn to_json(value: FalkorValue) -> Value {
    match value {
        FalkorValue::None => Value::Null,
        FalkorValue::Bool(b) => Value::Bool(b),
        FalkorValue::I64(i) => Value::from(i),
        FalkorValue::F64(f) => float(f),
        FalkorValue::String(s) => Value::String(s),
        FalkorValue::Array(items) => Value::Array(items.into_iter().map(to_json).collect()),
        FalkorValue::Map(map) => Value::Object(props(map)),
        FalkorValue::Node(node) => Value::Object(props(node.properties)),
        FalkorValue::Edge(edge) => Value::Object(props(edge.properties)),
        FalkorValue::Path(path) => {
            let nodes = path
                .nodes
                .into_iter()
                .map(|n| Value::Object(props(n.properties)));
            let edges = path
                .relationships
                .into_iter()
                .map(|e| Value::Object(props(e.properties)));
            let mut map = Map::new();
            map.insert("nodes".into(), Value::Array(nodes.collect()));
            map.insert("edges".into(), Value::Array(edges.collect()));
            Value::Object(map)
        }
        FalkorValue::Vec32(v) => {
            Value::Array(v.values.into_iter().map(|f| float(f.into())).collect())
        }
        FalkorValue::Point(p) => {
            let mut map = Map::new();
            map.insert("latitude".into(), float(p.latitude));
            map.insert("longitude".into(), float(p.longitude));
            Value::Object(map)
        }
        FalkorValue::DateTime(t) => Value::from(t.seconds().get()),
        FalkorValue::Date(t) => Value::from(t.seconds().get()),
        FalkorValue::Time(t) => Value::from(t.seconds().get()),
        FalkorValue::Duration(t) => Value::from(t.seconds().get()),
        // Only produced by the lossy row API, which we do not use; new variants land here too.
        _ => Value::Null,
    }
}

fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn props(map: std::collections::HashMap<String, FalkorValue>) -> Map<String, Value> {
    // Sorted keys, so equal entities serialize identically.
    let mut entries: Vec<_> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().map(|(k, v)| (k, to_json(v))).collect()
}

/// Maps a falkordb error to a [`StoreError`], keeping the server text out of client-visible
/// messages except for `GraphQuery` (coded Internal, so masked by kg-common).
pub(crate) fn map_falkor_error(err: FalkorDBError) -> StoreError {
    let store = StoreKind::Graph;
    match err {
        FalkorDBError::ConnectionDown
        | FalkorDBError::NoConnection
        | FalkorDBError::EmptyConnection
        | FalkorDBError::SentinelConnection(_) => StoreError::unavailable(store, err),
        FalkorDBError::Timeout { .. } => StoreError::timeout(store, err),
        FalkorDBError::ParamEncoding { .. } => StoreError::InvalidInput {
            what: "graph query parameter",
            reason: err.to_string(),
        },
        FalkorDBError::RedisError(message) => {
            let lower = message.to_ascii_lowercase();
            if lower.contains("timed out") || lower.contains("timeout") {
                StoreError::timeout(store, message)
            } else if lower.contains("empty key") || lower.contains("doesn't contain") {
                StoreError::NotFound {
                    what: "graph".into(),
                }
            } else if lower.contains("connection refused")
                || lower.contains("broken pipe")
                || lower.contains("connection reset")
                || lower.contains("loading")
            {
                StoreError::unavailable(store, message)
            } else {
                StoreError::GraphQuery { detail: message }
            }
        }
        other => StoreError::internal(store, other),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_common::error::{ErrorCode, ErrorExt};

    #[test]
    fn graph_names_are_prefixed() {
        assert_eq!(GraphStore::graph_name("handbook"), "kg_ns_handbook");
    }

    #[test]
    fn errors_map_to_codes() {
        let code = |e| map_falkor_error(e).code();
        assert_eq!(code(FalkorDBError::ConnectionDown), ErrorCode::Unavailable);
        assert_eq!(
            code(FalkorDBError::RedisError("Query timed out".into())),
            ErrorCode::Timeout
        );
        assert_eq!(
            code(FalkorDBError::RedisError(
                "Invalid graph operation on empty key".into()
            )),
            ErrorCode::NotFound
        );
        assert!(matches!(
            map_falkor_error(FalkorDBError::RedisError("errMsg: Invalid input".into())),
            StoreError::GraphQuery { .. }
        ));
    }

    #[test]
    fn values_become_json() {
        use std::collections::HashMap;
        let node = FalkorValue::Map(HashMap::from([
            ("b".to_owned(), FalkorValue::I64(2)),
            ("a".to_owned(), FalkorValue::F64(f64::NAN)),
            (
                "c".to_owned(),
                FalkorValue::Array(vec![FalkorValue::String("x".into()), FalkorValue::None]),
            ),
        ]));
        assert_eq!(
            serde_json::to_string(&to_json(node)).unwrap(),
            r#"{"a":null,"b":2,"c":["x",null]}"#
        );
    }
}
