//! Entities around chunks and files: the `mentions` and `relNeighbors` lists of chunk
//! packages, and FileEntities (the entities a file's readable chunks mention, ordered by
//! entity key and paged with `after_entity_key`, plus the types they are instances of).

use std::collections::HashMap;

use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{
    CallerContext, ChunkPackage, EntityTypeRef, FileEntitiesRequest, FileEntitiesResponse,
    FileEntity, ListCounts, Mention, RelNeighbor,
};
use serde_json::Value;

use crate::caps::{Caps, check_key, resolve};
use crate::error::{GraphError, Result};
use crate::packages::note_count;
use crate::rows::{Row, to_u64};
use crate::service::{GraphService, Node, Query, Scope};

/// Default and hard maximum of entities per FileEntities page.
pub(crate) const FILE_ENTITIES_LIMIT: (u32, u32) = (50, 200);
/// Longest name or label returned.
const NAME_CAP: usize = 512;

/// Longest quote returned; mentions are short spans.
const QUOTE_CAP: usize = 1024;

/// Mentions and REL neighbours per chunk key, clipped at their caps, with totals.
#[derive(Default)]
pub(crate) struct EntityLists {
    mentions: HashMap<String, (u64, Vec<Mention>)>,
    rels: HashMap<String, (u64, Vec<RelNeighbor>)>,
}

impl EntityLists {
    /// Puts the chunk's lists into its package and records clipped totals.
    pub(crate) fn fill(&self, package: &mut ChunkPackage) {
        let mut counts = package.counts.take().map(|c| c.lists).unwrap_or_default();
        if let Some((total, list)) = self.mentions.get(&package.chunk_key) {
            package.mentions = list.clone();
            note_count(&mut counts, "mentions", *total, list.len());
        }
        if let Some((total, list)) = self.rels.get(&package.chunk_key) {
            package.rel_neighbors = list.clone();
            note_count(&mut counts, "relNeighbors", *total, list.len());
        }
        package.counts = (!counts.is_empty()).then_some(ListCounts { lists: counts });
    }
}

impl GraphService {
    /// Mentions (in text order) and REL neighbours of the mentioned entities whose stating
    /// file is readable (by relation type, then entity keys) of readable chunks.
    pub(crate) async fn entity_lists(
        &self,
        scope: &Scope<'_>,
        keys: &[&str],
        caps: &Caps,
    ) -> Result<EntityLists> {
        let mut lists = EntityLists::default();
        if keys.is_empty() {
            return Ok(lists);
        }
        let key_list: Vec<Value> = keys.iter().map(|k| Value::from(*k)).collect();

        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("keys", key_list.clone())
            .param("cap", caps.mentions as i64);
        q.set_text(format!(
            "UNWIND $keys AS key \
             MATCH (c:Chunk {{chunkKey: key}})-[m:MENTIONS]->(e:Entity) WHERE {pc} \
             OPTIONAL MATCH (e)-[:INSTANCE_OF]->(t:EntityType) \
             WITH key, m, e, head(collect(t.label)) AS label \
             WITH key, m, e, label ORDER BY m.charStart, e.entityKey \
             WITH key, collect([e.entityKey, e.name, e.typeId, label, m.method, m.quote, \
                                m.charStart, m.charEnd]) AS ms \
             RETURN key, size(ms), ms[0..$cap]"
        ));
        let mentions = q;

        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        let pr = q.access(scope.access, "r", Node::Content);
        q.param("keys", key_list).param("cap", caps.rel as i64);
        q.set_text(format!(
            "UNWIND $keys AS key \
             MATCH (c:Chunk {{chunkKey: key}})-[:MENTIONS]->(e:Entity)-[r:REL]-(o:Entity) \
             WHERE {pc} AND r.enabled = true AND {pr} \
             WITH DISTINCT key, e, r, o \
             WITH key, e, r, o, CASE WHEN ID(startNode(r)) = ID(e) THEN 'out' ELSE 'in' END AS dir \
             ORDER BY r.relationTypeId, e.entityKey, o.entityKey, dir \
             WITH key, collect([e.entityKey, e.name, r.relationTypeId, dir, o.entityKey, o.name, \
                                o.typeId, r.fileId, r.chunkKey]) AS rels \
             RETURN key, size(rels), rels[0..$cap]"
        ));
        let rels = q;

        let (mentions, rels) =
            tokio::try_join!(self.read(scope, &mentions), self.read(scope, &rels))?;
        for cells in &mentions.rows {
            let row = Row(cells);
            let mut items = Vec::new();
            for item in row.list(2)? {
                let cells = item.as_array().map(Vec::as_slice).unwrap_or_default();
                let m = Row(cells);
                items.push(Mention {
                    entity_key: m.str(0)?.to_owned(),
                    name: sanitize_text(m.opt_str(1)?.unwrap_or_default(), NAME_CAP),
                    type_id: m.opt_str(2)?.unwrap_or_default().to_owned(),
                    type_label: sanitize_text(m.opt_str(3)?.unwrap_or_default(), NAME_CAP),
                    method: m.opt_str(4)?.unwrap_or_default().to_owned(),
                    quote: sanitize_text(m.opt_str(5)?.unwrap_or_default(), QUOTE_CAP),
                    char_start: m.opt_int(6)?,
                    char_end: m.opt_int(7)?,
                });
            }
            lists
                .mentions
                .insert(row.str(0)?.to_owned(), (to_u64(row.int(1)?)?, items));
        }

        for cells in &rels.rows {
            let row = Row(cells);
            let mut items = Vec::new();
            for item in row.list(2)? {
                let cells = item.as_array().map(Vec::as_slice).unwrap_or_default();
                items.push(rel_neighbor(&Row(cells))?);
            }
            lists
                .rels
                .insert(row.str(0)?.to_owned(), (to_u64(row.int(1)?)?, items));
        }
        Ok(lists)
    }

    /// One page of the file's entities with mention counts; `NOT_FOUND` when the file is
    /// unknown or unreadable (never told apart).
    pub async fn file_entities_for(
        &self,
        caller: &CallerContext,
        request: FileEntitiesRequest,
    ) -> Result<FileEntitiesResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let limit = resolve("limit", request.limit, FILE_ENTITIES_LIMIT)?;
        check_key("file_id", &request.file_id)?;
        if !request.after_entity_key.is_empty() {
            check_key("after_entity_key", &request.after_entity_key)?;
        }
        let (total, entity_types) = self.file_entity_summary(&scope, &request.file_id).await?;

        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("fileId", request.file_id.as_str())
            .param("after", request.after_entity_key.as_str())
            .param("take", limit as i64 + 1);
        q.set_text(format!(
            "MATCH (c:Chunk {{fileId: $fileId}})-[m:MENTIONS]->(e:Entity) \
             WHERE {pc} AND e.entityKey > $after \
             OPTIONAL MATCH (e)-[:INSTANCE_OF]->(t:EntityType) \
             WITH e, count(DISTINCT m) AS n, collect(DISTINCT t.label) AS labels \
             WITH e, n, labels ORDER BY e.entityKey LIMIT $take \
             RETURN e.entityKey, e.name, e.typeId, labels, n"
        ));
        let rows = self.read(&scope, &q).await?;
        let mut entities = Vec::with_capacity(rows.rows.len());
        for cells in &rows.rows {
            let row = Row(cells);
            let label = row
                .list(3)?
                .iter()
                .find_map(|v| v.as_str())
                .unwrap_or_default();
            entities.push(FileEntity {
                entity_key: row.str(0)?.to_owned(),
                name: sanitize_text(row.opt_str(1)?.unwrap_or_default(), NAME_CAP),
                type_id: row.opt_str(2)?.unwrap_or_default().to_owned(),
                type_label: sanitize_text(label, NAME_CAP),
                mention_count: to_u64(row.int(4)?)?,
            });
        }
        let truncated = entities.len() > limit;
        entities.truncate(limit);
        Ok(FileEntitiesResponse {
            entities,
            entity_types,
            truncated,
            total,
        })
    }

    /// How many distinct entities the file's readable chunks mention, and the types of
    /// those entities. `NOT_FOUND` when the file itself is unreadable.
    async fn file_entity_summary(
        &self,
        scope: &Scope<'_>,
        file_id: &str,
    ) -> Result<(u64, Vec<EntityTypeRef>)> {
        let mut q = Query::new();
        let pf = q.access(scope.access, "f", Node::File);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("fileId", file_id);
        q.set_text(format!(
            "MATCH (f:FileRef {{fileId: $fileId}}) WHERE {pf} \
             OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) WHERE {pc} \
             OPTIONAL MATCH (c)-[:MENTIONS]->(e:Entity) \
             OPTIONAL MATCH (e)-[:INSTANCE_OF]->(t:EntityType) \
             RETURN f.fileId, count(DISTINCT e), collect(DISTINCT [t.typeId, t.label])"
        ));
        let rows = self.read(scope, &q).await?;
        let Some(cells) = rows.rows.first() else {
            return Err(GraphError::NotFound(format!("file `{file_id}` not found")));
        };
        let row = Row(cells);
        let total = to_u64(row.int(1)?)?;
        let mut types = Vec::new();
        for pair in row.list(2)? {
            let cells = pair.as_array().map(Vec::as_slice).unwrap_or_default();
            let pair = Row(cells);
            // A missing type yields [null, null]; skip it.
            if let Some(type_id) = pair.opt_str(0)? {
                types.push(EntityTypeRef {
                    type_id: type_id.to_owned(),
                    label: sanitize_text(pair.opt_str(1)?.unwrap_or_default(), NAME_CAP),
                });
            }
        }
        types.sort_by(|a, b| a.type_id.cmp(&b.type_id));
        types.dedup_by(|a, b| a.type_id == b.type_id);
        Ok((total, types))
    }
}

/// `[entityKey, name, relationTypeId, dir, otherKey, otherName, otherTypeId, fileId, chunkKey]`
/// as a neighbour; source and target follow the edge's direction.
fn rel_neighbor(r: &Row<'_>) -> Result<RelNeighbor> {
    let entity_key = r.str(0)?.to_owned();
    let name = sanitize_text(r.opt_str(1)?.unwrap_or_default(), NAME_CAP);
    let direction = r.str(3)?.to_owned();
    let other_key = r.str(4)?.to_owned();
    let other_name = sanitize_text(r.opt_str(5)?.unwrap_or_default(), NAME_CAP);
    let ((source_entity_key, source_name), (target_entity_key, target_name)) = if direction == "out"
    {
        (
            (entity_key.clone(), name),
            (other_key.clone(), other_name.clone()),
        )
    } else {
        (
            (other_key.clone(), other_name.clone()),
            (entity_key.clone(), name),
        )
    };
    Ok(RelNeighbor {
        source_entity_key,
        source_name,
        relation_type_id: r.opt_str(2)?.unwrap_or_default().to_owned(),
        target_entity_key,
        target_name,
        direction,
        entity_key,
        other_entity_key: other_key,
        other_name,
        other_type_id: r.opt_str(6)?.unwrap_or_default().to_owned(),
        stated_in_file_id: r.opt_str(7)?.unwrap_or_default().to_owned(),
        stated_in_chunk_key: r.opt_str(8)?.unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rel_neighbours_follow_the_edge_direction() {
        let cells = [
            json!("ent:person:alice"),
            json!("Alice"),
            json!("knows"),
            json!("in"),
            json!("ent:person:carol"),
            json!("Carol\u{202E}"),
            json!("person"),
            json!("fc"),
            json!("c0"),
        ];
        let r = rel_neighbor(&Row(&cells)).unwrap();
        assert_eq!(
            (r.source_entity_key.as_str(), r.target_entity_key.as_str()),
            ("ent:person:carol", "ent:person:alice")
        );
        assert_eq!(
            (r.source_name.as_str(), r.target_name.as_str()),
            ("Carol", "Alice")
        );
        assert_eq!(r.other_name, "Carol", "names are sanitised");
        assert_eq!(
            (r.stated_in_file_id.as_str(), r.stated_in_chunk_key.as_str()),
            ("fc", "c0")
        );
        let mut out = cells.clone();
        out[3] = json!("out");
        let r = rel_neighbor(&Row(&out)).unwrap();
        assert_eq!(r.source_entity_key, "ent:person:alice");
        assert_eq!(r.direction, "out");
        out[0] = json!(null);
        assert!(
            rel_neighbor(&Row(&out)).is_err(),
            "a missing key is a broken reply"
        );
    }

    #[test]
    fn clipped_lists_are_counted() {
        let mut lists = EntityLists::default();
        lists
            .mentions
            .insert("c1".into(), (3, vec![Mention::default()]));
        lists.rels.insert("c1".into(), (0, Vec::new()));
        let mut package = ChunkPackage {
            chunk_key: "c1".into(),
            ..Default::default()
        };
        lists.fill(&mut package);
        assert_eq!(package.mentions.len(), 1);
        let counts = package.counts.unwrap().lists;
        assert_eq!(counts.len(), 1);
        assert_eq!(
            (
                counts[0].list.as_str(),
                counts[0].total,
                counts[0].truncated
            ),
            ("mentions", 3, true)
        );
        let mut other = ChunkPackage {
            chunk_key: "c2".into(),
            ..Default::default()
        };
        lists.fill(&mut other);
        assert!(other.counts.is_none() && other.mentions.is_empty());
    }
}
