//! Outline: a file's sections in document order, paged with an opaque cursor.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{CallerContext, OutlineRequest, OutlineResponse, OutlineSection};
use sha2::{Digest, Sha256};

use crate::caps::{OUTLINE_LIMIT, check_key, resolve};
use crate::error::{GraphError, Result};
use crate::rows::{Row, to_u64};
use crate::service::{GraphService, Node, Query};

/// Longest section title returned.
const TITLE_CAP: usize = 512;

impl GraphService {
    /// One page of the file's outline. An unknown file and one the caller may not read
    /// give the same `NOT_FOUND`; `total` counts the readable sections within `max_depth`.
    pub async fn outline_for(
        &self,
        caller: &CallerContext,
        request: OutlineRequest,
    ) -> Result<OutlineResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        check_key("file_id", &request.file_id)?;
        let limit = resolve("limit", request.limit, OUTLINE_LIMIT)?;
        let after = decode_cursor(&request.cursor, &request.file_id, request.max_depth)?;
        if request.max_depth == Some(0) {
            return Err(GraphError::invalid(
                "max_depth must be at least 1 (top-level sections)",
            ));
        }
        let depth_clause = if request.max_depth.is_some() {
            " AND o.depth <= $maxDepth"
        } else {
            ""
        };

        let mut q = Query::new();
        let pf = q.access(scope.access, "f", Node::File);
        let po = q.access(scope.access, "o", Node::Content);
        q.param("fileId", request.file_id.as_str());
        if let Some(max_depth) = request.max_depth {
            q.param("maxDepth", i64::from(max_depth));
        }
        q.set_text(format!(
            "MATCH (f:FileRef {{fileId: $fileId}}) WHERE {pf} \
             OPTIONAL MATCH (o:OutlineNode {{fileId: $fileId}}) WHERE {po}{depth_clause} \
             RETURN f.vfsPath, count(o)"
        ));
        let rows = self.read(&scope, &q).await?;
        let Some(cells) = rows.rows.first() else {
            return Err(GraphError::NotFound(format!(
                "file `{}` not found",
                request.file_id
            )));
        };
        let head = Row(cells);
        let path = head.str(0)?.to_owned();
        let total = to_u64(head.int(1)?)?;

        let mut q = Query::new();
        let po = q.access(scope.access, "o", Node::Content);
        let pc = q.access(scope.access, "c", Node::Content);
        q.param("fileId", request.file_id.as_str())
            .param("after", after)
            // One extra row tells whether another page follows.
            .param("fetch", limit as i64 + 1);
        if let Some(max_depth) = request.max_depth {
            q.param("maxDepth", i64::from(max_depth));
        }
        q.set_text(format!(
            "MATCH (o:OutlineNode {{fileId: $fileId}}) WHERE {po}{depth_clause} AND o.order > $after \
             OPTIONAL MATCH (o)-[:COVERS]->(c:Chunk) WHERE {pc} \
             WITH o, count(c) AS chunks ORDER BY o.order LIMIT $fetch \
             RETURN o.outlineKey, o.title, o.depth, o.order, o.parentKey, o.pageStart, o.pageEnd, o.lineStart, \
                    chunks"
        ));
        let rows = self.read(&scope, &q).await?;
        let mut sections = Vec::with_capacity(rows.rows.len());
        for cells in &rows.rows {
            let row = Row(cells);
            sections.push(OutlineSection {
                outline_key: row.str(0)?.to_owned(),
                title: sanitize_text(row.str(1)?, TITLE_CAP),
                depth: row.int(2)?,
                order: row.int(3)?,
                parent_key: row.opt_str(4)?.map(str::to_owned),
                page_start: row.opt_int(5)?,
                page_end: row.opt_int(6)?,
                line_start: row.opt_int(7)?,
                chunk_count: row.int(8)?,
            });
        }
        let next_cursor = if sections.len() > limit {
            sections.truncate(limit);
            sections
                .last()
                .map(|s| encode_cursor(s.order, &request.file_id, request.max_depth))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(OutlineResponse {
            file_id: request.file_id,
            path,
            sections,
            next_cursor,
            total,
        })
    }
}

/// The cursor is the order of the last section returned, bound to the file and
/// depth it pages through (resuming another file's outline from it would skip
/// sections silently); opaque to clients.
pub(crate) fn encode_cursor(order: i64, file_id: &str, max_depth: Option<u32>) -> String {
    let outline = outline_digest(file_id, max_depth);
    URL_SAFE_NO_PAD.encode(format!("o{order}:{outline}"))
}

/// A short digest naming the outline a cursor pages through.
fn outline_digest(file_id: &str, max_depth: Option<u32>) -> String {
    let text = format!("{file_id}\0{max_depth:?}");
    URL_SAFE_NO_PAD.encode(&Sha256::digest(text.as_bytes())[..6])
}

/// "" starts at the beginning (returns -1: orders are 0-based).
pub(crate) fn decode_cursor(cursor: &str, file_id: &str, max_depth: Option<u32>) -> Result<i64> {
    if cursor.is_empty() {
        return Ok(-1);
    }
    let bad =
        || GraphError::invalid("cursor is not one this service issued; pass nextCursor unchanged");
    let bytes = URL_SAFE_NO_PAD.decode(cursor.trim()).map_err(|_| bad())?;
    let text = std::str::from_utf8(&bytes).map_err(|_| bad())?;
    let (order, outline) = text
        .strip_prefix('o')
        .and_then(|rest| rest.split_once(':'))
        .ok_or_else(bad)?;
    let order: i64 = order.parse().map_err(|_| bad())?;
    if order < 0 {
        return Err(bad());
    }
    if outline != outline_digest(file_id, max_depth) {
        return Err(GraphError::invalid(
            "cursor belongs to another outline; repeat the fileId and maxDepth of the call that returned it, or start without a cursor",
        ));
    }
    Ok(order)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        assert_eq!(decode_cursor("", "f1", None).unwrap(), -1);
        assert_eq!(
            decode_cursor(&encode_cursor(41, "f1", None), "f1", None).unwrap(),
            41
        );
        for bad in [
            "!!",
            "o1",
            &URL_SAFE_NO_PAD.encode("o41"),
            &URL_SAFE_NO_PAD.encode(format!("o-3:{}", outline_digest("f1", None))),
            &URL_SAFE_NO_PAD.encode(format!("x1:{}", outline_digest("f1", None))),
        ] {
            assert!(decode_cursor(bad, "f1", None).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cursor_resumes_only_the_outline_that_returned_it() {
        let cursor = encode_cursor(7, "f1", Some(2));
        assert_eq!(decode_cursor(&cursor, "f1", Some(2)).unwrap(), 7);
        for (file, depth) in [("f2", Some(2)), ("f1", None), ("f1", Some(3))] {
            let err = decode_cursor(&cursor, file, depth).unwrap_err().to_string();
            assert!(err.contains("another outline"), "{file} {depth:?}: {err}");
        }
    }
}
