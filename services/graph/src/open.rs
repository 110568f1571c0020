//! Open: resolve exactly one key (chunk, outline section, entity, file) to packages.

use crate::caps::{Caps, OPEN_LIMIT, check_key, resolve};
use crate::error::{GraphError, Result};
use crate::rows::{Row, to_u64};
use crate::service::{GraphService, Node, Query, Scope};
use kg_proto::v1::open_request::Key;
use kg_proto::v1::{CallerContext, OpenRequest, PackagesResponse};

impl GraphService {
    /// Packages for one key. An unknown key and one the caller may not read give the same
    /// `NOT_FOUND`; an entity nobody readable mentions gives an empty list.
    pub async fn open_for(
        &self,
        caller: &CallerContext,
        request: OpenRequest,
    ) -> Result<PackagesResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let caps = Caps::from_request(request.caps.as_ref())?;
        let limit = resolve("limit", request.limit, OPEN_LIMIT)?;
        let key = request.key.ok_or_else(|| {
            GraphError::invalid("set exactly one of chunk_key, outline_key, entity_key or file_id")
        })?;
        let (total, keys) = match &key {
            Key::ChunkKey(chunk_key) => {
                check_key("chunk_key", chunk_key)?;
                (1, vec![chunk_key.clone()])
            }
            Key::FileId(file_id) => {
                check_key("file_id", file_id)?;
                self.file_chunks(&scope, file_id, limit)
                    .await?
                    .ok_or_else(|| GraphError::NotFound(format!("file `{file_id}` not found")))?
            }
            Key::OutlineKey(outline_key) => {
                check_key("outline_key", outline_key)?;
                self.section_chunks(&scope, outline_key, limit)
                    .await?
                    .ok_or_else(|| {
                        GraphError::NotFound(format!("outline section `{outline_key}` not found"))
                    })?
            }
            Key::EntityKey(entity_key) => {
                check_key("entity_key", entity_key)?;
                self.entity_chunks(&scope, entity_key, limit).await?
            }
        };
        let packages = self.build_packages(&scope, &keys, &caps).await?;
        if let Key::ChunkKey(chunk_key) = &key
            && packages.is_empty()
        {
            return Err(GraphError::NotFound(format!(
                "chunk `{chunk_key}` not found"
            )));
        }
        Ok(PackagesResponse {
            // Between the two reads a chunk may vanish; never report fewer than we return.
            total: total.max(packages.len() as u64),
            truncated: total > packages.len() as u64,
            packages,
        })
    }

    /// The file's readable chunk keys in order (first `limit`) and their total, or `None`
    /// when the file is unknown or unreadable.
    async fn file_chunks(
        &self,
        scope: &Scope<'_>,
        file_id: &str,
        limit: usize,
    ) -> Result<Option<(u64, Vec<String>)>> {
        let mut q = Query::new();
        let pf = q.access(scope.access, "f", Node::File);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("fileId", file_id).param("limit", limit as i64);
        q.set_text(format!(
            "MATCH (f:FileRef {{fileId: $fileId}}) WHERE {pf} \
             OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) WHERE {pc} \
             WITH f, c ORDER BY c.chunkIndex \
             WITH f, collect(c.chunkKey) AS keys \
             RETURN size(keys), keys[0..$limit]"
        ));
        keys_and_total(&self.read(scope, &q).await?)
    }

    /// Chunks the section COVERS, in document order.
    async fn section_chunks(
        &self,
        scope: &Scope<'_>,
        outline_key: &str,
        limit: usize,
    ) -> Result<Option<(u64, Vec<String>)>> {
        let mut q = Query::new();
        let po = q.access(scope.access, "o", Node::Content);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("outlineKey", outline_key)
            .param("limit", limit as i64);
        q.set_text(format!(
            "MATCH (o:OutlineNode {{outlineKey: $outlineKey}}) WHERE {po} \
             OPTIONAL MATCH (o)-[:COVERS]->(c:Chunk) WHERE {pc} \
             WITH o, c ORDER BY c.chunkIndex \
             WITH o, collect(c.chunkKey) AS keys \
             RETURN size(keys), keys[0..$limit]"
        ));
        keys_and_total(&self.read(scope, &q).await?)
    }

    /// Readable chunks that MENTION the entity, by path then position.
    async fn entity_chunks(
        &self,
        scope: &Scope<'_>,
        entity_key: &str,
        limit: usize,
    ) -> Result<(u64, Vec<String>)> {
        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("entityKey", entity_key)
            .param("limit", limit as i64);
        // Entity bound by its index first, as in hop.rs: one pattern scans every Chunk.
        q.set_text(format!(
            "MATCH (e:Entity {{entityKey: $entityKey}}) WITH e \
             MATCH (c:Chunk)-[:MENTIONS]->(e) WHERE {pc} \
             WITH DISTINCT c \
             WITH c ORDER BY c.path, c.chunkIndex \
             WITH collect(c.chunkKey) AS keys \
             RETURN size(keys), keys[0..$limit]"
        ));
        Ok(keys_and_total(&self.read(scope, &q).await?)?.unwrap_or_default())
    }
}

/// Reads `size(keys), keys[0..limit]` from the single row, if there is one.
pub(crate) fn keys_and_total(rows: &kg_stores::graph::Rows) -> Result<Option<(u64, Vec<String>)>> {
    let Some(cells) = rows.rows.first() else {
        return Ok(None);
    };
    let row = Row(cells);
    let total = to_u64(row.int(0)?)?;
    let keys = row
        .list(1)?
        .iter()
        .map(|k| {
            k.as_str().map(str::to_owned).ok_or_else(|| {
                GraphError::UnexpectedReply(format!("chunk key is not a string: {k}"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((total, keys)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_and_totals_decode() {
        let rows = kg_stores::graph::Rows {
            columns: vec!["size".into(), "keys".into()],
            rows: vec![vec![json!(5), json!(["a", "b"])]],
        };
        assert_eq!(
            keys_and_total(&rows).unwrap(),
            Some((5, vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            keys_and_total(&kg_stores::graph::Rows::default()).unwrap(),
            None
        );
        let bad = kg_stores::graph::Rows {
            columns: vec![],
            rows: vec![vec![json!(1), json!([1])]],
        };
        assert!(keys_and_total(&bad).is_err());
    }
}
