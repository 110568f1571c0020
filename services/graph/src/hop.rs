//! Hop: typed moves from a chunk, entity or outline section onto related packages.
//!
//! Every start key must itself be readable (an unreadable chunk or section is `NOT_FOUND`,
//! an entity no readable chunk mentions has no neighbours), and every query carries the
//! access predicate of each Chunk, OutlineNode and REL it touches.

use kg_proto::v1::{CallerContext, HopKind, HopRequest, PackagesResponse};
use serde_json::Value;

use crate::caps::{Caps, OPEN_LIMIT, check_key, resolve};
use crate::error::{GraphError, Result};
use crate::open::keys_and_total;
use crate::rows::Row;
use crate::service::{GraphService, Node, Query, Scope};

/// Entity keys start with this (see the graph schema); anything else is a chunk key.
const ENTITY_KEY_PREFIX: &str = "ent:";

/// What a mentions / rel / same_type hop starts from, once resolved.
struct EntityAnchor {
    /// The start entity, or the entities the start chunk mentions.
    entity_keys: Vec<String>,
    /// Their type ids.
    type_ids: Vec<String>,
    /// The start chunk, left out of the answer.
    exclude_chunk: String,
}

impl GraphService {
    /// Packages one typed hop away from `request.from_key`.
    pub async fn hop_for(
        &self,
        caller: &CallerContext,
        request: HopRequest,
    ) -> Result<PackagesResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let caps = Caps::from_request(request.caps.as_ref())?;
        let limit = resolve("limit", request.limit, OPEN_LIMIT)?;
        check_key("from_key", &request.from_key)?;
        let kind = HopKind::try_from(request.kind).unwrap_or(HopKind::Unspecified);
        let key = request.from_key.as_str();
        let (total, keys) = match kind {
            HopKind::Unspecified => {
                return Err(GraphError::invalid(
                    "kind is required: one of next_chunk, prev_chunk, similar, mentions, rel, \
                     same_type, outline_child, outline_parent, outline_siblings",
                ));
            }
            HopKind::NextChunk => self.neighbour_chunks(&scope, key, limit, true).await?,
            HopKind::PrevChunk => self.neighbour_chunks(&scope, key, limit, false).await?,
            HopKind::Similar => self.similar_chunks(&scope, key, limit).await?,
            HopKind::Mentions | HopKind::Rel | HopKind::SameType => {
                match self.entity_anchor(&scope, key).await? {
                    Some(anchor) => self.entity_hop(&scope, kind, &anchor, limit).await?,
                    None => (0, Vec::new()),
                }
            }
            HopKind::OutlineChild | HopKind::OutlineSiblings | HopKind::OutlineParent => {
                self.outline_hop(&scope, kind, key, limit).await?
            }
        };
        let packages = self.build_packages(&scope, &keys, &caps).await?;
        Ok(PackagesResponse {
            total: total.max(packages.len() as u64),
            truncated: total > packages.len() as u64,
            packages,
        })
    }

    /// The readable chunks after (or before) `chunk_key` in its file, in document order:
    /// the first `limit` after it, or the last `limit` before it.
    async fn neighbour_chunks(
        &self,
        scope: &Scope<'_>,
        chunk_key: &str,
        limit: usize,
        forward: bool,
    ) -> Result<(u64, Vec<String>)> {
        let mut q = Query::new();
        let p0 = q.access(scope.access, "c0", Node::Content);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("key", chunk_key).param("limit", limit as i64);
        let (cmp, order) = if forward { (">", "ASC") } else { ("<", "DESC") };
        q.set_text(format!(
            "MATCH (c0:Chunk {{chunkKey: $key}}) WHERE {p0} \
             OPTIONAL MATCH (c:Chunk {{fileId: c0.fileId}}) \
             WHERE c.chunkIndex {cmp} c0.chunkIndex AND {pc} \
             WITH c0, c ORDER BY c.chunkIndex {order} \
             WITH c0, collect(c.chunkKey) AS keys \
             RETURN size(keys), keys[0..$limit]"
        ));
        let (total, mut keys) = keys_and_total(&self.read(scope, &q).await?)?
            .ok_or_else(|| GraphError::NotFound(format!("chunk `{chunk_key}` not found")))?;
        if !forward {
            // Nearest first was only for clipping; packages read in document order.
            keys.reverse();
        }
        Ok((total, keys))
    }

    /// First chunks of the files most similar to the chunk's file (one package per file,
    /// best first). `UNAVAILABLE`, with the reason, when there are no file vectors.
    async fn similar_chunks(
        &self,
        scope: &Scope<'_>,
        chunk_key: &str,
        limit: usize,
    ) -> Result<(u64, Vec<String>)> {
        let mut q = Query::new();
        let p0 = q.access(scope.access, "c0", Node::Content);
        q.param("key", chunk_key);
        q.set_text(format!(
            "MATCH (c0:Chunk {{chunkKey: $key}}) WHERE {p0} RETURN c0.fileId"
        ));
        let rows = self.read(scope, &q).await?;
        let Some(cells) = rows.rows.first() else {
            return Err(GraphError::NotFound(format!(
                "chunk `{chunk_key}` not found"
            )));
        };
        let file_id = Row(cells).str(0)?.to_owned();
        self.similar_first_chunks(scope, &file_id, limit).await
    }

    /// Resolves a mentions / rel / same_type start key: an entity key (kept only when a
    /// readable chunk mentions it) or a chunk key (its mentioned entities; `NOT_FOUND` when
    /// the chunk is unreadable).
    async fn entity_anchor(&self, scope: &Scope<'_>, key: &str) -> Result<Option<EntityAnchor>> {
        let mut q = Query::new();
        let p0 = q.access(scope.access, "c0", Node::Content);
        q.param("key", key);
        if key.starts_with(ENTITY_KEY_PREFIX) {
            // The entity is bound by its index first: as one pattern FalkorDB starts from
            // every Chunk and walks their mentions (2 s at 100k chunks for an unknown key).
            q.set_text(format!(
                "MATCH (e:Entity {{entityKey: $key}}) WITH e \
                 MATCH (c0:Chunk)-[:MENTIONS]->(e) WHERE {p0} \
                 RETURN e.entityKey, e.typeId LIMIT 1"
            ));
            let rows = self.read(scope, &q).await?;
            let Some(cells) = rows.rows.first() else {
                return Ok(None);
            };
            let row = Row(cells);
            return Ok(Some(EntityAnchor {
                entity_keys: vec![row.str(0)?.to_owned()],
                type_ids: row.opt_str(1)?.map(str::to_owned).into_iter().collect(),
                exclude_chunk: String::new(),
            }));
        }
        q.set_text(format!(
            "MATCH (c0:Chunk {{chunkKey: $key}}) WHERE {p0} \
             OPTIONAL MATCH (c0)-[:MENTIONS]->(e:Entity) \
             RETURN c0.chunkKey, collect(DISTINCT e.entityKey), collect(DISTINCT e.typeId)"
        ));
        let rows = self.read(scope, &q).await?;
        let Some(cells) = rows.rows.first() else {
            return Err(GraphError::NotFound(format!("chunk `{key}` not found")));
        };
        let row = Row(cells);
        Ok(Some(EntityAnchor {
            entity_keys: strings(row.list(1)?)?,
            type_ids: strings(row.list(2)?)?,
            exclude_chunk: row.str(0)?.to_owned(),
        }))
    }

    /// Chunks sharing the anchor's entities (most shared first), mentioning entities
    /// related to them by a REL whose stating file is readable, or mentioning other
    /// entities of the same types.
    async fn entity_hop(
        &self,
        scope: &Scope<'_>,
        kind: HopKind,
        anchor: &EntityAnchor,
        limit: usize,
    ) -> Result<(u64, Vec<String>)> {
        if anchor.entity_keys.is_empty() {
            return Ok((0, Vec::new()));
        }
        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("entities", to_list(&anchor.entity_keys))
            .param("types", to_list(&anchor.type_ids))
            .param("exclude", anchor.exclude_chunk.as_str())
            .param("limit", limit as i64);
        let text = match kind {
            HopKind::Mentions => format!(
                "UNWIND $entities AS ek \
                 MATCH (e:Entity {{entityKey: ek}}) WITH ek, e \
                 MATCH (c:Chunk)-[:MENTIONS]->(e) \
                 WHERE {pc} AND c.chunkKey <> $exclude \
                 WITH c, count(DISTINCT ek) AS shared \
                 WITH c, shared ORDER BY shared DESC, c.path, c.chunkIndex \
                 WITH collect(c.chunkKey) AS keys \
                 RETURN size(keys), keys[0..$limit]"
            ),
            HopKind::Rel => {
                let pr = q.access(scope.access, "r", Node::Content);
                format!(
                    "UNWIND $entities AS ek \
                     MATCH (e:Entity {{entityKey: ek}}) WITH e \
                     MATCH (e)-[r:REL]-(x:Entity) \
                     WHERE r.enabled = true AND {pr} \
                     MATCH (c:Chunk)-[:MENTIONS]->(x) WHERE {pc} AND c.chunkKey <> $exclude \
                     WITH DISTINCT c \
                     WITH c ORDER BY c.path, c.chunkIndex \
                     WITH collect(c.chunkKey) AS keys \
                     RETURN size(keys), keys[0..$limit]"
                )
            }
            _ => format!(
                "UNWIND $types AS tid \
                 MATCH (x:Entity {{typeId: tid}}) WITH x \
                 MATCH (c:Chunk)-[:MENTIONS]->(x) \
                 WHERE {pc} AND c.chunkKey <> $exclude AND NOT x.entityKey IN $entities \
                 WITH DISTINCT c \
                 WITH c ORDER BY c.path, c.chunkIndex \
                 WITH collect(c.chunkKey) AS keys \
                 RETURN size(keys), keys[0..$limit]"
            ),
        };
        q.set_text(text);
        Ok(keys_and_total(&self.read(scope, &q).await?)?.unwrap_or_default())
    }

    /// outline_parent: the parent section's chunks in order. outline_child and
    /// outline_siblings: the first chunk of each child or sibling section, in document order.
    async fn outline_hop(
        &self,
        scope: &Scope<'_>,
        kind: HopKind,
        outline_key: &str,
        limit: usize,
    ) -> Result<(u64, Vec<String>)> {
        let mut q = Query::new();
        let po = q.access(scope.access, "o", Node::Content);
        let ps = q.access(scope.access, "s", Node::Content);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("key", outline_key).param("limit", limit as i64);
        let first_chunk_of_each = |pattern: &str, condition: &str| {
            format!(
                "MATCH (o:OutlineNode {{outlineKey: $key}}) WHERE {po} \
                 OPTIONAL MATCH {pattern} WHERE {condition}{ps} AND {pc} \
                 WITH o, s, c ORDER BY s.order, c.chunkIndex \
                 WITH o, s, collect(c.chunkKey) AS chunks \
                 WITH o, s, chunks[0] AS first ORDER BY s.order \
                 WITH o, collect(first) AS keys \
                 RETURN size(keys), keys[0..$limit]"
            )
        };
        let text = match kind {
            HopKind::OutlineChild => first_chunk_of_each(
                "(o)-[:HAS_SUBSECTION]->(s:OutlineNode)-[:COVERS]->(c:Chunk)",
                "",
            ),
            HopKind::OutlineSiblings => first_chunk_of_each(
                "(s:OutlineNode {fileId: o.fileId})-[:COVERS]->(c:Chunk)",
                "s.outlineKey <> o.outlineKey \
                 AND coalesce(s.parentKey, '') = coalesce(o.parentKey, '') AND ",
            ),
            _ => format!(
                "MATCH (o:OutlineNode {{outlineKey: $key}}) WHERE {po} \
                 OPTIONAL MATCH (s:OutlineNode)-[:HAS_SUBSECTION]->(o) WHERE {ps} \
                 OPTIONAL MATCH (s)-[:COVERS]->(c:Chunk) WHERE {pc} \
                 WITH o, c ORDER BY c.chunkIndex \
                 WITH o, collect(c.chunkKey) AS keys \
                 RETURN size(keys), keys[0..$limit]"
            ),
        };
        q.set_text(text);
        keys_and_total(&self.read(scope, &q).await?)?.ok_or_else(|| {
            GraphError::NotFound(format!("outline section `{outline_key}` not found"))
        })
    }
}

fn to_list(values: &[String]) -> Vec<Value> {
    values.iter().map(|v| Value::from(v.as_str())).collect()
}

/// A list cell of strings; nulls (absent properties) are skipped.
pub(crate) fn strings(cells: &[Value]) -> Result<Vec<String>> {
    cells
        .iter()
        .filter(|v| !v.is_null())
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| GraphError::UnexpectedReply(format!("expected a string: {v}")))
        })
        .collect()
}
