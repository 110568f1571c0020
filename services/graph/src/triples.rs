//! FileTriples: REL triples whose source and target are both mentioned by the file's
//! readable chunks, stated by files the caller may read, ordered by
//! (source entity key, relation type, target entity key) and paged after such a triple.

use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{CallerContext, FileTriplesRequest, FileTriplesResponse, Triple};
use serde_json::Value;

use crate::caps::{check_key, resolve};
use crate::error::{GraphError, Result};
use crate::hop::strings;
use crate::rows::{Row, to_u64};
use crate::service::{GraphService, Node, Query, Scope};

/// Default and hard maximum of triples per FileTriples page.
pub(crate) const FILE_TRIPLES_LIMIT: (u32, u32) = (50, 200);
/// Longest entity name returned.
const NAME_CAP: usize = 512;

impl GraphService {
    /// One page of the file's triples; `NOT_FOUND` when the file is unknown or unreadable.
    pub async fn file_triples_for(
        &self,
        caller: &CallerContext,
        request: FileTriplesRequest,
    ) -> Result<FileTriplesResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let limit = resolve("limit", request.limit, FILE_TRIPLES_LIMIT)?;
        check_key("file_id", &request.file_id)?;
        let after = [
            &request.after_source_entity_key,
            &request.after_relation_type_id,
            &request.after_target_entity_key,
        ];
        let cursor_set = after.iter().filter(|a| !a.is_empty()).count();
        if cursor_set != 0 && cursor_set != 3 {
            return Err(GraphError::invalid(
                "pass all three of after_source_entity_key, after_relation_type_id and \
                 after_target_entity_key (continueAfter of the previous page), or none",
            ));
        }
        let entities = self.file_entity_keys(&scope, &request.file_id).await?;
        if entities.is_empty() {
            return Ok(FileTriplesResponse::default());
        }

        let mut q = Query::new();
        let pr = q.access(scope.access, "r", Node::Content);
        let list: Vec<Value> = entities.iter().map(|e| Value::from(e.as_str())).collect();
        q.param("entities", list);
        let matching = format!(
            "UNWIND $entities AS sk \
             MATCH (s:Entity {{entityKey: sk}}) WITH s \
             MATCH (s)-[r:REL]->(t:Entity) \
             WHERE t.entityKey IN $entities AND r.enabled = true AND {pr}"
        );
        q.set_text(format!(
            "{matching} \
             WITH DISTINCT s.entityKey AS sk, r.relationTypeId AS rt, t.entityKey AS tk \
             RETURN count(*)"
        ));
        let rows = self.read(&scope, &q).await?;
        let total = match rows.rows.first() {
            Some(cells) => to_u64(Row(cells).int(0)?)?,
            None => 0,
        };

        let cursor = if cursor_set == 3 {
            q.param("as", request.after_source_entity_key.as_str())
                .param("ar", request.after_relation_type_id.as_str())
                .param("at", request.after_target_entity_key.as_str());
            "WHERE sk > $as OR (sk = $as AND rt > $ar) OR (sk = $as AND rt = $ar AND tk > $at) "
        } else {
            ""
        };
        q.param("take", limit as i64 + 1);
        q.set_text(format!(
            "{matching} \
             WITH DISTINCT s.entityKey AS sk, s.name AS sn, r.relationTypeId AS rt, \
                  t.entityKey AS tk, t.name AS tn \
             {cursor}\
             RETURN sk, sn, rt, tk, tn ORDER BY sk, rt, tk LIMIT $take"
        ));
        let rows = self.read(&scope, &q).await?;
        let mut triples = Vec::with_capacity(rows.rows.len());
        for cells in &rows.rows {
            let row = Row(cells);
            triples.push(Triple {
                source_entity_key: row.str(0)?.to_owned(),
                source_name: sanitize_text(row.opt_str(1)?.unwrap_or_default(), NAME_CAP),
                relation_type_id: row.opt_str(2)?.unwrap_or_default().to_owned(),
                target_entity_key: row.str(3)?.to_owned(),
                target_name: sanitize_text(row.opt_str(4)?.unwrap_or_default(), NAME_CAP),
            });
        }
        let truncated = triples.len() > limit;
        triples.truncate(limit);
        Ok(FileTriplesResponse {
            continue_after: truncated.then(|| triples.last().cloned()).flatten(),
            truncated,
            total: total.max(triples.len() as u64),
            triples,
        })
    }

    /// Distinct keys of the entities the file's readable chunks mention; `NOT_FOUND` when
    /// the file itself is unreadable.
    async fn file_entity_keys(&self, scope: &Scope<'_>, file_id: &str) -> Result<Vec<String>> {
        let mut q = Query::new();
        let pf = q.access(scope.access, "f", Node::File);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("fileId", file_id);
        q.set_text(format!(
            "MATCH (f:FileRef {{fileId: $fileId}}) WHERE {pf} \
             OPTIONAL MATCH (c:Chunk)-[:PART_OF]->(f) WHERE {pc} \
             OPTIONAL MATCH (c)-[:MENTIONS]->(e:Entity) \
             RETURN f.fileId, collect(DISTINCT e.entityKey)"
        ));
        let rows = self.read(scope, &q).await?;
        let Some(cells) = rows.rows.first() else {
            return Err(GraphError::NotFound(format!("file `{file_id}` not found")));
        };
        strings(Row(cells).list(1)?)
    }
}
