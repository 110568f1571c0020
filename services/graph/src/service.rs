//! [`GraphService`]: the domain methods behind the gRPC adapter, and the query
//! builder that puts the caller's access predicate into every Cypher `WHERE`.

use std::future::Future;
use std::pin::Pin;

use kg_common::access::{cypher_predicate, validate_namespace};
use kg_common::caller::access_for;
use kg_proto::v1::{AccessFilter, CallerContext};
use kg_stores::graph::{GraphStore, Params, Rows};
use kg_stores::tbox::TboxBucket;
use kg_stores::vector::VectorIndex;
use serde_json::Value;

use crate::config::GraphConfig;
use crate::error::Result;

/// Server-side limit on one read query.
pub(crate) const READ_TIMEOUT_MS: u64 = 5_000;

/// Reads one namespace graph at a time on behalf of a verified caller.
#[derive(Clone, Debug)]
pub struct GraphService {
    pub(crate) store: GraphStore,
    /// The published TBox per namespace (kg_ontology); `None` until the mesh hands it in.
    pub(crate) tbox: Option<TboxBucket>,
    /// File-level vectors (similar hops, similarFiles); `None` when the process has none.
    pub(crate) vectors: Option<VectorIndex>,
}

impl GraphService {
    /// A service over an existing FalkorDB handle.
    pub fn new(store: GraphStore) -> Self {
        Self {
            store,
            tbox: None,
            vectors: None,
        }
    }

    /// The same service reading published TBoxes from `tbox` (kg_ontology).
    pub fn with_tbox(mut self, tbox: TboxBucket) -> Self {
        self.tbox = Some(tbox);
        self
    }

    /// The same service with the vector index holding file vectors (similar files).
    pub fn with_vectors(mut self, vectors: VectorIndex) -> Self {
        self.vectors = Some(vectors);
        self
    }

    /// Connects to the FalkorDB named in `config`.
    pub async fn connect(config: &GraphConfig) -> Result<Self> {
        Ok(Self::new(GraphStore::connect(&config.falkordb_url).await?))
    }

    /// Checks the namespace name, then that the caller may read it.
    pub(crate) fn scope<'c>(
        &self,
        caller: &'c CallerContext,
        namespace: &'c str,
    ) -> Result<Scope<'c>> {
        validate_namespace(namespace)?;
        let access = access_for(caller, namespace)?;
        Ok(Scope { namespace, access })
    }

    /// Runs a read query. Boxed: the driver's future is deeply nested, and inlining it into
    /// every handler's state machine overflows the compiler's layout query depth.
    pub(crate) fn read<'a>(
        &'a self,
        scope: &'a Scope<'_>,
        query: &'a Query,
    ) -> Pin<Box<dyn Future<Output = Result<Rows>> + Send + 'a>> {
        Box::pin(async move {
            Ok(self
                .store
                .ro_query(scope.namespace, &query.text, &query.params, READ_TIMEOUT_MS)
                .await?)
        })
    }
}

/// A namespace the caller may read, with its access filter.
pub(crate) struct Scope<'c> {
    pub(crate) namespace: &'c str,
    pub(crate) access: &'c AccessFilter,
}

/// A Cypher statement under construction with its parameters.
#[derive(Debug, Default)]
pub(crate) struct Query {
    pub(crate) text: String,
    pub(crate) params: Params,
}

/// Which path property a node's access predicate reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Node {
    /// A Chunk or OutlineNode (`path`).
    Content,
    /// A FileRef (`vfsPath`).
    File,
}

impl Query {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn param(&mut self, name: &str, value: impl Into<Value>) -> &mut Self {
        self.params.insert(name.to_owned(), value.into());
        self
    }

    /// The caller's access predicate over the node bound to `var`, with its parameters
    /// registered under a prefix unique to `var`. Variables named `p` are reserved: the
    /// predicate iterates prefixes with it.
    ///
    /// Put every predicate in a MATCH/OPTIONAL MATCH `WHERE` before the query's first `WITH`:
    /// FalkorDB 4.16 evaluates a list predicate (`any(p IN $list WHERE x.path ...)`) over a
    /// variable bound after a `WITH` as false, and inside `WITH ... WHERE` it drops every row.
    /// Either way readable content would silently vanish; the restricted-caller tests catch it.
    pub(crate) fn access(&mut self, access: &AccessFilter, var: &str, node: Node) -> String {
        let path_prop = match node {
            Node::Content => "path",
            Node::File => "vfsPath",
        };
        let predicate = cypher_predicate(access, var, path_prop, &format!("acl_{var}_"));
        self.params.extend(predicate.params);
        predicate.text
    }

    pub(crate) fn set_text(&mut self, text: String) -> &mut Self {
        self.text = text;
        self
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn predicates_of_several_nodes_do_not_share_parameters() {
        let access = AccessFilter {
            namespace: "demo".into(),
            allow_prefixes: vec!["docs/".into()],
            deny_prefixes: vec!["docs/secret/".into()],
            enabled_only: true,
            ..Default::default()
        };
        let mut query = Query::new();
        let chunk = query.access(&access, "c", Node::Content);
        let file = query.access(&access, "f", Node::File);
        assert!(chunk.contains("c.path STARTS WITH") && chunk.contains("$acl_c_allow"));
        assert!(file.contains("f.vfsPath STARTS WITH") && file.contains("$acl_f_deny"));
        assert_eq!(query.params.len(), 4);
    }
}
