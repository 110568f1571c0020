//! trace.missingOffsets: files among the returned hits whose chunks carry no character
//! offsets (written by an indexer from before offsets existed), so an agent knows their
//! citations cannot point into the text until the file is reprocessed.

use std::collections::BTreeMap;

use kg_common::access::cypher_predicate;
use kg_proto::v1::{AccessFilter, MissingOffsets};
use kg_stores::graph::{GraphStore, Params};
use serde_json::Value;

use crate::error::{Result, RetrievalError};

/// Server-side limit on the lookup; it reads at most top_k chunks by key.
const TIMEOUT_MS: u64 = 2_000;

/// The files of `chunk_keys` (the returned hits) with chunks lacking charStart or charEnd,
/// grouped per file in path order. The access predicate runs inside the query, so only
/// chunks the caller may read are reported.
pub(crate) async fn missing_offsets(
    store: &GraphStore,
    namespace: &str,
    access: &AccessFilter,
    chunk_keys: &[String],
) -> Result<Vec<MissingOffsets>> {
    if chunk_keys.is_empty() {
        return Ok(Vec::new());
    }
    let predicate = cypher_predicate(access, "c", "path", "acl_c_");
    let mut params = Params::new();
    params.extend(predicate.params);
    params.insert(
        "keys".into(),
        Value::Array(chunk_keys.iter().cloned().map(Value::from).collect()),
    );
    let cypher = format!(
        "MATCH (c:Chunk) WHERE c.chunkKey IN $keys AND {access} \
         AND (c.charStart IS NULL OR c.charEnd IS NULL) \
         RETURN c.fileId, c.path, c.chunkKey ORDER BY c.path, c.chunkKey",
        access = predicate.text,
    );
    let rows = store
        .ro_query(namespace, &cypher, &params, TIMEOUT_MS)
        .await?;
    let mut files: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for row in &rows.rows {
        let (Some(file_id), Some(path), Some(key)) = (
            row.first().and_then(Value::as_str),
            row.get(1).and_then(Value::as_str),
            row.get(2).and_then(Value::as_str),
        ) else {
            return Err(RetrievalError::UnexpectedReply(format!(
                "missing-offsets row {row:?}"
            )));
        };
        files
            .entry((path.to_owned(), file_id.to_owned()))
            .or_default()
            .push(key.to_owned());
    }
    Ok(files
        .into_iter()
        .map(|((path, file_id), chunk_keys)| MissingOffsets {
            file_id,
            path,
            chunk_keys,
        })
        .collect())
}
