//! Chunk packages: a chunk with its text, citation, position and outline context,
//! assembled from a handful of batched queries that each carry the access predicate: the
//! chunk rows and then their outline context and similar files, while the mentions and
//! relations run beside them, so a set of packages costs two round trips to the graph, not six.

use std::collections::{HashMap, HashSet};

use kg_common::sanitize::{DEFAULT_FIELD_CAP, sanitize_text};
use kg_proto::v1::{
    CallerContext, ChunkPackage, ChunkText, Dates, ListCount, ListCounts, OutlineContext,
    OutlineRef, PackagesRequest, PackagesResponse, Position,
};
use serde_json::Value;

use crate::caps::{Caps, MAX_PACKAGE_KEYS, check_key};
use crate::error::{GraphError, Result};
use crate::rows::Row;
use crate::service::{GraphService, Node, Query, Scope};

/// Longest title or header returned; headings are short, anything longer is hostile.
const TITLE_CAP: usize = 512;

impl GraphService {
    /// Packages for `request.chunk_keys` in the given order. Keys the caller may not read
    /// (or that do not exist) are skipped without a trace.
    pub async fn packages_for(
        &self,
        caller: &CallerContext,
        request: PackagesRequest,
    ) -> Result<PackagesResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let caps = Caps::from_request(request.caps.as_ref())?;
        if request.chunk_keys.len() > MAX_PACKAGE_KEYS {
            return Err(GraphError::invalid(format!(
                "chunk_keys names {} keys; at most {MAX_PACKAGE_KEYS} per call",
                request.chunk_keys.len()
            )));
        }
        for key in &request.chunk_keys {
            check_key("chunk_key", key)?;
        }
        let packages = self
            .build_packages(&scope, &request.chunk_keys, &caps)
            .await?;
        Ok(PackagesResponse {
            total: packages.len() as u64,
            truncated: false,
            packages,
        })
    }

    /// Builds packages for `keys` (duplicates collapse to the first), in that order.
    pub(crate) async fn build_packages(
        &self,
        scope: &Scope<'_>,
        keys: &[String],
        caps: &Caps,
    ) -> Result<Vec<ChunkPackage>> {
        let mut seen = HashSet::new();
        let keys: Vec<&String> = keys.iter().filter(|k| seen.insert(k.as_str())).collect();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Mentions and relations carry their own access predicate on the chunk, so they need
        // not wait for the chunk rows; only chunks those rows admit get packages below. The
        // outline context and similar files need only the chunk rows, so they start as soon as
        // those are back, beside the entity lists.
        let all: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let around_chunks = async {
            let chunks = self.chunk_rows(scope, &keys).await?;
            let (context, similar) = {
                let sections: Vec<&str> = {
                    let mut seen = HashSet::new();
                    chunks
                        .values()
                        .filter_map(|c| c.section.as_ref().map(|s| s.outline_key.as_str()))
                        .filter(|k| seen.insert(*k))
                        .collect()
                };
                let files: Vec<&str> = keys
                    .iter()
                    .filter_map(|k| chunks.get(k.as_str()))
                    .map(|c| c.file_id.as_str())
                    .collect();
                let context = async {
                    if sections.is_empty() {
                        Ok(SectionContext::default())
                    } else {
                        self.section_context(scope, &sections, caps).await
                    }
                };
                tokio::join!(context, self.similar_lists(scope, &files, caps.similar))
            };
            Ok::<_, GraphError>((chunks, context?, similar))
        };
        let ((chunks, context, similar), entities) =
            tokio::try_join!(around_chunks, self.entity_lists(scope, &all, caps))?;
        Ok(keys
            .iter()
            .filter_map(|key| chunks.get(key.as_str()))
            .map(|chunk| {
                let mut package = package(scope.namespace, chunk, &context, caps);
                entities.fill(&mut package);
                crate::similar::fill(&mut package, &similar);
                package
            })
            .collect())
    }

    /// The chunks themselves, with file date, neighbours and section.
    async fn chunk_rows(
        &self,
        scope: &Scope<'_>,
        keys: &[&String],
    ) -> Result<HashMap<String, ChunkRow>> {
        let mut q = Query::new();
        let pc = q.access(scope.access, "c", Node::Content);
        let pf = q.access(scope.access, "f", Node::File);
        let pprev = q.access(scope.access, "prev", Node::Content);
        let pnext = q.access(scope.access, "nxt", Node::Content);
        let ps = q.access(scope.access, "s", Node::Content);
        q.param(
            "keys",
            keys.iter()
                .map(|k| Value::from(k.as_str()))
                .collect::<Vec<_>>(),
        );
        q.set_text(format!(
            "UNWIND $keys AS key \
             MATCH (c:Chunk {{chunkKey: key}})-[:PART_OF]->(f:FileRef) WHERE {pc} AND {pf} \
             OPTIONAL MATCH (prev:Chunk)-[:NEXT_CHUNK]->(c) WHERE {pprev} \
             OPTIONAL MATCH (c)-[:NEXT_CHUNK]->(nxt:Chunk) WHERE {pnext} \
             OPTIONAL MATCH (s:OutlineNode {{outlineKey: c.sectionKey}}) WHERE s.fileId = c.fileId AND {ps} \
             RETURN c.chunkKey, c.fileId, c.path, c.text, c.contextHeader, c.chunkIndex, \
                    c.charStart, c.charEnd, c.pageStart, c.pageEnd, c.lineStart, c.lineEnd, c.tokenCount, \
                    prev.chunkKey, nxt.chunkKey, f.documentDate, \
                    s.outlineKey, s.title, s.depth, s.order, \
                    f.effectiveFrom, f.effectiveTo, f.collections"
        ));
        let rows = self.read(scope, &q).await?;
        let mut out = HashMap::with_capacity(rows.rows.len());
        for cells in &rows.rows {
            let row = Row(cells);
            let section = match row.opt_str(16)? {
                Some(key) => Some(OutlineRef {
                    outline_key: key.to_owned(),
                    title: clean_title(row.str(17)?),
                    depth: row.int(18)?,
                    order: row.int(19)?,
                }),
                None => None,
            };
            let chunk = ChunkRow {
                chunk_key: row.str(0)?.to_owned(),
                file_id: row.str(1)?.to_owned(),
                path: row.str(2)?.to_owned(),
                text: row.opt_str(3)?.unwrap_or_default().to_owned(),
                context_header: row.opt_str(4)?.unwrap_or_default().to_owned(),
                position: Position {
                    chunk_index: row.int(5)?,
                    char_start: row.opt_int(6)?,
                    char_end: row.opt_int(7)?,
                    page_start: row.opt_int(8)?,
                    page_end: row.opt_int(9)?,
                    line_start: row.opt_int(10)?,
                    line_end: row.opt_int(11)?,
                    token_count: row.opt_int(12)?.unwrap_or(0),
                    prev_chunk_key: row.opt_str(13)?.map(str::to_owned),
                    next_chunk_key: row.opt_str(14)?.map(str::to_owned),
                },
                document_date: row.opt_str(15)?.map(str::to_owned),
                effective_from: row.opt_str(20)?.map(str::to_owned),
                effective_to: row.opt_str(21)?.map(str::to_owned),
                collections: crate::hop::strings(row.list(22)?)?,
                section,
            };
            // A key matches one chunk; keep the first row should the graph ever hold two.
            out.entry(chunk.chunk_key.clone()).or_insert(chunk);
        }
        Ok(out)
    }

    /// Ancestors (all of them: the citation needs the whole trail), siblings and children
    /// (clipped in the query, with their totals) of each section.
    async fn section_context(
        &self,
        scope: &Scope<'_>,
        sections: &[&str],
        caps: &Caps,
    ) -> Result<SectionContext> {
        let section_list: Vec<Value> = sections.iter().map(|s| Value::from(*s)).collect();

        let mut q = Query::new();
        let ps = q.access(scope.access, "s", Node::Content);
        let pa = q.access(scope.access, "a", Node::Content);
        q.param("sections", section_list.clone());
        // Depth is bounded by heading levels; 64 only guards against a cycle. The section is
        // bound first (index on outlineKey) and the path walked up from it: written as one
        // pattern, FalkorDB scans every OutlineNode as a start (28 ms at 7.8k sections).
        q.set_text(format!(
            "UNWIND $sections AS sk \
             MATCH (s:OutlineNode {{outlineKey: sk}}) WHERE {ps} \
             WITH sk, s \
             MATCH (s)<-[:HAS_SUBSECTION*1..64]-(a:OutlineNode) WHERE {pa} \
             RETURN sk, a.outlineKey, a.title, a.depth, a.order"
        ));
        let ancestors = q;

        let mut q = Query::new();
        let ps = q.access(scope.access, "s", Node::Content);
        let psib = q.access(scope.access, "sib", Node::Content);
        q.param("sections", section_list.clone());
        q.param("cap", caps.siblings as i64);
        // Nearest siblings first, so a clipped list stays around the section. The file id goes
        // through WITH as a value: `{fileId: s.fileId}` in the pattern makes FalkorDB scan
        // every OutlineNode and hash-join (25 ms at 7.8k sections) instead of using the index.
        q.set_text(format!(
            "UNWIND $sections AS sk \
             MATCH (s:OutlineNode {{outlineKey: sk}}) WHERE {ps} \
             WITH sk, s, s.fileId AS file_id \
             MATCH (sib:OutlineNode {{fileId: file_id}}) \
             WHERE sib.outlineKey <> s.outlineKey AND coalesce(sib.parentKey, '') = coalesce(s.parentKey, '') \
               AND {psib} \
             WITH sk, s, sib ORDER BY abs(sib.order - s.order), sib.order \
             WITH sk, collect([sib.outlineKey, sib.title, sib.depth, sib.order]) AS sibs \
             RETURN sk, size(sibs), sibs[0..$cap]"
        ));
        let siblings = q;

        let mut q = Query::new();
        let ps = q.access(scope.access, "s", Node::Content);
        let pch = q.access(scope.access, "ch", Node::Content);
        q.param("sections", section_list);
        q.param("cap", caps.children as i64);
        q.set_text(format!(
            "UNWIND $sections AS sk \
             MATCH (s:OutlineNode {{outlineKey: sk}})-[:HAS_SUBSECTION]->(ch:OutlineNode) \
             WHERE {ps} AND {pch} \
             WITH sk, ch ORDER BY ch.order \
             WITH sk, collect([ch.outlineKey, ch.title, ch.depth, ch.order]) AS kids \
             RETURN sk, size(kids), kids[0..$cap]"
        ));
        let children = q;

        let (rows, siblings, children) = tokio::try_join!(
            self.read(scope, &ancestors),
            self.read(scope, &siblings),
            self.read(scope, &children)
        )?;
        let mut context = SectionContext::default();
        for cells in &rows.rows {
            let row = Row(cells);
            context
                .ancestors
                .entry(row.str(0)?.to_owned())
                .or_default()
                .push(outline_ref(
                    row.str(1)?,
                    row.str(2)?,
                    row.int(3)?,
                    row.int(4)?,
                ));
        }
        for list in context.ancestors.values_mut() {
            list.sort_by_key(|a| a.depth);
            list.dedup_by(|a, b| a.outline_key == b.outline_key);
        }

        context.siblings = clipped_lists(&siblings)?;
        context.children = clipped_lists(&children)?;
        Ok(context)
    }
}

/// One readable chunk as read from the graph.
struct ChunkRow {
    chunk_key: String,
    file_id: String,
    path: String,
    text: String,
    context_header: String,
    position: Position,
    document_date: Option<String>,
    /// The file's effective window and collections, as its metadata set them.
    effective_from: Option<String>,
    effective_to: Option<String>,
    collections: Vec<String>,
    section: Option<OutlineRef>,
}

/// Outline lists per section key.
#[derive(Default)]
struct SectionContext {
    /// Root first, complete.
    ancestors: HashMap<String, Vec<OutlineRef>>,
    /// Already clipped at the cap, with the total before clipping.
    siblings: HashMap<String, (u64, Vec<OutlineRef>)>,
    children: HashMap<String, (u64, Vec<OutlineRef>)>,
}

fn clean_title(title: &str) -> String {
    sanitize_text(title, TITLE_CAP)
}

fn outline_ref(key: &str, title: &str, depth: i64, order: i64) -> OutlineRef {
    OutlineRef {
        outline_key: key.to_owned(),
        title: clean_title(title),
        depth,
        order,
    }
}

/// Rows of `sk, total, [[key, title, depth, order], ...]`.
fn clipped_lists(rows: &kg_stores::graph::Rows) -> Result<HashMap<String, (u64, Vec<OutlineRef>)>> {
    let mut out = HashMap::new();
    for cells in &rows.rows {
        let row = Row(cells);
        let total = crate::rows::to_u64(row.int(1)?)?;
        let mut items = Vec::new();
        for item in row.list(2)? {
            let cells = item.as_array().ok_or_else(|| {
                GraphError::UnexpectedReply(format!("outline entry is not a list: {item}"))
            })?;
            let entry = Row(cells);
            items.push(outline_ref(
                entry.str(0)?,
                entry.str(1)?,
                entry.int(2)?,
                entry.int(3)?,
            ));
        }
        // Chosen by distance, shown in document order.
        items.sort_by_key(|r| r.order);
        out.insert(row.str(0)?.to_owned(), (total, items));
    }
    Ok(out)
}

/// "<namespace>/<path> › <section trail>" plus the page span when known.
pub(crate) fn citation(
    namespace: &str,
    path: &str,
    trail: &[&str],
    pages: (Option<i64>, Option<i64>),
) -> String {
    let mut out = format!("{namespace}/{path}");
    for title in trail {
        out.push_str(" › ");
        out.push_str(title);
    }
    match pages {
        (Some(a), Some(b)) if a != b => out.push_str(&format!(" (pp. {a}–{b})")),
        (Some(a), _) | (None, Some(a)) => out.push_str(&format!(" (p. {a})")),
        (None, None) => {}
    }
    out
}

fn package(
    namespace: &str,
    chunk: &ChunkRow,
    context: &SectionContext,
    caps: &Caps,
) -> ChunkPackage {
    let mut counts = Vec::new();
    let mut outline = OutlineContext::default();
    let mut trail: Vec<&str> = Vec::new();
    if let Some(section) = &chunk.section {
        let key = section.outline_key.as_str();
        let ancestors = context
            .ancestors
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        trail.extend(ancestors.iter().map(|a| a.title.as_str()));
        trail.push(section.title.as_str());
        // The nearest ancestors matter most; keep those when clipping, root first.
        let skip = ancestors.len().saturating_sub(caps.ancestors);
        outline.ancestors = ancestors[skip..].to_vec();
        note_count(
            &mut counts,
            "ancestors",
            ancestors.len() as u64,
            outline.ancestors.len(),
        );
        if let Some((total, list)) = context.siblings.get(key) {
            outline.siblings = list.clone();
            note_count(&mut counts, "siblings", *total, list.len());
        }
        if let Some((total, list)) = context.children.get(key) {
            outline.children = list.clone();
            note_count(&mut counts, "children", *total, list.len());
        }
        outline.section = Some(section.clone());
    }
    let pages = (chunk.position.page_start, chunk.position.page_end);
    let text = sanitize_text(&chunk.text, DEFAULT_FIELD_CAP);
    let text_truncated = text.chars().count() > DEFAULT_FIELD_CAP;
    ChunkPackage {
        namespace: namespace.to_owned(),
        chunk_key: chunk.chunk_key.clone(),
        file_id: chunk.file_id.clone(),
        path: chunk.path.clone(),
        text: Some(ChunkText {
            text,
            context_header: sanitize_text(&chunk.context_header, TITLE_CAP * 4),
            citation: sanitize_text(
                &citation(namespace, &chunk.path, &trail, pages),
                TITLE_CAP * 8,
            ),
            text_truncated,
            text_omitted: false,
        }),
        position: Some(chunk.position.clone()),
        outline: Some(outline),
        mentions: Vec::new(),
        rel_neighbors: Vec::new(),
        dates: Some(Dates {
            document_date: chunk.document_date.as_deref().map(|d| sanitize_text(d, 64)),
            effective_from: chunk
                .effective_from
                .as_deref()
                .map(|d| sanitize_text(d, 64)),
            effective_to: chunk.effective_to.as_deref().map(|d| sanitize_text(d, 64)),
            collections: chunk
                .collections
                .iter()
                .map(|c| sanitize_text(c, TITLE_CAP))
                .collect(),
        }),
        similar_files: Vec::new(),
        score: None,
        counts: (!counts.is_empty()).then_some(ListCounts { lists: counts }),
    }
}

/// Records a list's total when the cap clipped it.
pub(crate) fn note_count(counts: &mut Vec<ListCount>, list: &str, total: u64, shown: usize) {
    if total > shown as u64 {
        counts.push(ListCount {
            list: list.to_owned(),
            total: i64::try_from(total).unwrap_or(i64::MAX),
            truncated: true,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn section(key: &str, depth: i64, order: i64) -> OutlineRef {
        outline_ref(key, &key.to_uppercase(), depth, order)
    }

    fn chunk(section: Option<OutlineRef>) -> ChunkRow {
        ChunkRow {
            chunk_key: "ch_1".into(),
            file_id: "f1".into(),
            path: "guides/a.md".into(),
            text: "hello\u{202E} world\u{1b}[31m".into(),
            context_header: "Guide › Setup".into(),
            position: Position {
                chunk_index: 2,
                page_start: Some(3),
                page_end: Some(4),
                ..Default::default()
            },
            document_date: Some("2024-05-01".into()),
            effective_from: Some("2024-01-01".into()),
            effective_to: None,
            collections: vec!["policies\u{202E}".into(), "hr".into()],
            section,
        }
    }

    #[test]
    fn citations_name_path_trail_and_pages() {
        assert_eq!(citation("demo", "a.md", &[], (None, None)), "demo/a.md");
        assert_eq!(
            citation("demo", "g/a.md", &["Guide", "Setup"], (Some(3), Some(5))),
            "demo/g/a.md › Guide › Setup (pp. 3–5)"
        );
        assert_eq!(
            citation("demo", "a.md", &["X"], (Some(7), Some(7))),
            "demo/a.md › X (p. 7)"
        );
    }

    #[test]
    fn package_clips_lists_and_reports_counts() {
        let mut context = SectionContext::default();
        context
            .ancestors
            .insert("s3".into(), vec![section("s1", 1, 0), section("s2", 2, 1)]);
        context
            .siblings
            .insert("s3".into(), (5, vec![section("s4", 3, 3)]));
        context.children.insert("s3".into(), (0, Vec::new()));
        let caps = Caps {
            ancestors: 1,
            siblings: 1,
            ..Caps::from_request(None).unwrap()
        };
        let pkg = package("demo", &chunk(Some(section("s3", 3, 2))), &context, &caps);
        let outline = pkg.outline.unwrap();
        assert_eq!(outline.section.unwrap().outline_key, "s3");
        assert_eq!(outline.ancestors.len(), 1);
        assert_eq!(
            outline.ancestors[0].outline_key, "s2",
            "the nearest ancestor is kept"
        );
        let counts = pkg.counts.unwrap().lists;
        assert_eq!(counts.len(), 2);
        assert!(
            counts
                .iter()
                .any(|c| c.list == "ancestors" && c.total == 2 && c.truncated)
        );
        assert!(
            counts
                .iter()
                .any(|c| c.list == "siblings" && c.total == 5 && c.truncated)
        );
        let text = pkg.text.unwrap();
        assert_eq!(text.text, "hello world");
        assert_eq!(text.citation, "demo/guides/a.md › S1 › S2 › S3 (pp. 3–4)");
        let dates = pkg.dates.unwrap();
        assert_eq!(dates.document_date.as_deref(), Some("2024-05-01"));
        assert_eq!(dates.effective_from.as_deref(), Some("2024-01-01"));
        assert_eq!(dates.effective_to, None);
        assert_eq!(dates.collections, ["policies", "hr"]);
    }

    #[test]
    fn package_without_section_has_empty_outline_and_no_counts() {
        let pkg = package(
            "demo",
            &chunk(None),
            &SectionContext::default(),
            &Caps::from_request(None).unwrap(),
        );
        assert_eq!(pkg.outline.unwrap(), OutlineContext::default());
        assert!(pkg.counts.is_none());
        assert_eq!(pkg.text.unwrap().citation, "demo/guides/a.md (pp. 3–4)");
    }
}
