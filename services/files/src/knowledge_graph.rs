//! get_knowledge_graph: the Markdown link graph over the file versions of a
//! lookup target (main, a preview branch, a release, an environment).
//!
//! Scope first, then everything else: the target's versions are read with the
//! caller's access predicate in SQL, then narrowed by the caller's selector;
//! the root walk, filters, counts, pages, edges and links are computed only
//! from that scope. A link whose target path the caller may not read is
//! dropped whole, whether or not a file exists there, so neither an edge, a
//! broken-link label nor a count reveals a denied file. A link to a readable
//! path with no readable file is broken (the answer a reader gets for a file
//! that does not exist): so is a link to a file denied by its id, or hidden,
//! as dropping it would tell that a file is there. A link to a readable file
//! outside the selection, filters or depth is simply not part of this graph.

use std::collections::{HashMap, HashSet, VecDeque};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use globset::{GlobBuilder, GlobMatcher};
use kg_common::access::{allows, normalize_folder_prefix, normalize_path, validate_namespace};
use kg_common::caller::access_for;
use kg_proto::v1::{
    AccessFilter, CallerContext, GetKnowledgeGraphRequest, GetKnowledgeGraphResponse,
    GraphBrokenLink, GraphEdge, GraphExternalLink, GraphNode, caller_selector,
};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::error::{FilesError, Result};
use crate::links::{LinkKind, LinkResolution, LivePaths, VersionLinks};
use crate::service::FilesService;
use crate::versions::Member;

/// Nodes per page: default and hard maximum.
pub const DEFAULT_GRAPH_LIMIT: u32 = 100;
/// Hard maximum of `pagination.limit`.
pub const MAX_GRAPH_LIMIT: u32 = 200;
/// Deepest root walk.
pub const MAX_GRAPH_DEPTH: u32 = 3;
/// Depth of a root walk when `max_depth` is omitted.
pub const DEFAULT_GRAPH_DEPTH: u32 = 1;
/// Largest answer, as JSON text (REST 413, MCP PAYLOAD_TOO_LARGE).
pub const MAX_GRAPH_BYTES: usize = 512 * 1024;
/// Most links (edges, external and broken together) in one answer.
pub const MAX_GRAPH_LINKS: usize = 2000;
/// Input limits of the published schema.
const MAX_SELECTOR_CHARS: usize = 4096;
const MAX_SELECTOR_ITEMS: usize = 1024;
const MAX_SEARCH_CHARS: usize = 256;
const MAX_TYPE_CHARS: usize = 128;
const MAX_TAGS: usize = 64;
const MAX_CURSOR_CHARS: usize = 2048;
/// JSON around the lists (counts, flags, page_info with two cursors).
const ENVELOPE_BYTES: usize = 512 + 2 * MAX_CURSOR_CHARS;

/// One rule of a caller selector.
#[derive(Debug, Clone)]
enum Rule {
    Exact(String),
    Folder(String),
    Glob(GlobMatcher),
}

impl Rule {
    fn parse(text: &str) -> Result<Self> {
        if text.is_empty() || text.chars().count() > MAX_SELECTOR_CHARS {
            return Err(FilesError::Invalid(format!(
                "a caller_selector entry must be 1-{MAX_SELECTOR_CHARS} characters"
            )));
        }
        if text.contains(['*', '?', '[', '{']) {
            let glob = GlobBuilder::new(text.trim_start_matches('/'))
                .literal_separator(true)
                .build()
                .map_err(|e| FilesError::Invalid(format!("invalid caller_selector glob: {e}")))?;
            return Ok(Rule::Glob(glob.compile_matcher()));
        }
        if text.ends_with('/') {
            return Ok(Rule::Folder(normalize_folder_prefix(text)?));
        }
        Ok(Rule::Exact(normalize_path(text)?))
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            Rule::Exact(p) => path == p,
            Rule::Folder(prefix) => path.starts_with(prefix.as_str()),
            Rule::Glob(m) => m.is_match(path),
        }
    }
}

/// The caller-selected scope, compiled. `true` / omitted: everything
/// readable; `false`: nothing; a string or list: paths, folders (ending in
/// `/`) or globs, unioned; an object: entries `true` include, entries `false`
/// exclude, and with no `true` entry everything readable is included first.
#[derive(Debug, Clone)]
pub(crate) struct Selector {
    include_all: bool,
    include: Vec<Rule>,
    exclude: Vec<Rule>,
    /// A canonical text for the cursor fingerprint.
    canonical: String,
}

impl Selector {
    pub(crate) fn compile(form: Option<&caller_selector::Form>) -> Result<Self> {
        let mut selector = Selector {
            include_all: false,
            include: Vec::new(),
            exclude: Vec::new(),
            canonical: String::new(),
        };
        match form {
            None | Some(caller_selector::Form::All(true)) => {
                selector.include_all = true;
                selector.canonical = "all".to_owned();
            }
            Some(caller_selector::Form::All(false)) => selector.canonical = "none".to_owned(),
            Some(caller_selector::Form::Selector(text)) => {
                selector.include.push(Rule::parse(text)?);
                selector.canonical = format!("one\0{text}");
            }
            Some(caller_selector::Form::AnyOf(list)) => {
                if list.selectors.len() > MAX_SELECTOR_ITEMS {
                    return Err(FilesError::Invalid(format!(
                        "caller_selector has {} entries; the limit is {MAX_SELECTOR_ITEMS}",
                        list.selectors.len()
                    )));
                }
                for text in &list.selectors {
                    selector.include.push(Rule::parse(text)?);
                }
                selector.canonical = format!("any\0{}", list.selectors.join("\0"));
            }
            Some(caller_selector::Form::Map(map)) => {
                if map.entries.len() > MAX_SELECTOR_ITEMS {
                    return Err(FilesError::Invalid(format!(
                        "caller_selector has {} entries; the limit is {MAX_SELECTOR_ITEMS}",
                        map.entries.len()
                    )));
                }
                let mut entries: Vec<(&String, &bool)> = map.entries.iter().collect();
                entries.sort();
                for (text, include) in &entries {
                    let rule = Rule::parse(text)?;
                    if **include {
                        selector.include.push(rule);
                    } else {
                        selector.exclude.push(rule);
                    }
                }
                selector.include_all = selector.include.is_empty();
                selector.canonical = entries
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("\0");
            }
        }
        Ok(selector)
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        (self.include_all || self.include.iter().any(|r| r.matches(path)))
            && !self.exclude.iter().any(|r| r.matches(path))
    }
}

/// Validated filters, lowercased.
#[derive(Debug, Clone, Default)]
struct Filters {
    search: String,
    doc_type: String,
    tags: Vec<String>,
}

impl Filters {
    fn parse(request: &GetKnowledgeGraphRequest) -> Result<Self> {
        let Some(f) = &request.filters else {
            return Ok(Self::default());
        };
        if f.search.chars().count() > MAX_SEARCH_CHARS {
            return Err(FilesError::Invalid(format!(
                "filters.search is over {MAX_SEARCH_CHARS} characters"
            )));
        }
        if f.r#type.chars().count() > MAX_TYPE_CHARS {
            return Err(FilesError::Invalid(format!(
                "filters.type is over {MAX_TYPE_CHARS} characters"
            )));
        }
        if f.tags.len() > MAX_TAGS {
            return Err(FilesError::Invalid(format!(
                "filters.tags has {} tags; the limit is {MAX_TAGS}",
                f.tags.len()
            )));
        }
        if f.tags
            .iter()
            .any(|t| t.is_empty() || t.chars().count() > MAX_TYPE_CHARS)
        {
            return Err(FilesError::Invalid(format!(
                "each of filters.tags must be 1-{MAX_TYPE_CHARS} characters"
            )));
        }
        Ok(Self {
            search: f.search.to_lowercase(),
            doc_type: f.r#type.to_lowercase(),
            tags: f.tags.iter().map(|t| t.to_lowercase()).collect(),
        })
    }

    fn matches(&self, path: &str, data: Option<&VersionLinks>) -> bool {
        let meta = data.map(|d| &d.meta);
        let title = meta.and_then(|d| d.title.as_deref()).unwrap_or_default();
        if !self.search.is_empty()
            && !path.to_lowercase().contains(&self.search)
            && !title.to_lowercase().contains(&self.search)
        {
            return false;
        }
        if !self.doc_type.is_empty()
            && meta
                .and_then(|d| d.doc_type.as_deref())
                .is_none_or(|t| t.to_lowercase() != self.doc_type)
        {
            return false;
        }
        self.tags
            .iter()
            .all(|want| meta.is_some_and(|d| d.tags.iter().any(|t| t.to_lowercase() == *want)))
    }

    fn canonical(&self) -> String {
        format!(
            "{}\0{}\0{}",
            self.search,
            self.doc_type,
            self.tags.join("\0")
        )
    }
}

/// Where a page starts: after the node with this (depth, path) key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Cursor {
    /// Fingerprint of the query the cursor belongs to.
    f: String,
    d: u32,
    p: String,
}

fn encode_cursor(cursor: &Cursor) -> String {
    let text = serde_json::to_string(cursor).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(text.as_bytes())
}

fn decode_cursor(text: &str, fingerprint: &str) -> Result<Option<Cursor>> {
    if text.is_empty() {
        return Ok(None);
    }
    let bad = || {
        FilesError::Invalid(
            "pagination.cursor is not one this query returned; pass page_info.next from the previous page with the same other arguments, or start without a cursor".to_owned(),
        )
    };
    if text.len() > MAX_CURSOR_CHARS {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| bad())?;
    let cursor: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if cursor.f != fingerprint {
        return Err(bad());
    }
    Ok(Some(cursor))
}

/// The reserved flag: a path segment starting with `_` or `.` marks an index,
/// config or system file rather than an ordinary document.
pub(crate) fn is_reserved(path: &str) -> bool {
    path.split('/')
        .any(|segment| segment.starts_with('_') || segment.starts_with('.'))
}

/// Longest title, type or tag a node shows, in characters (the gateway's cut too).
pub const NODE_FIELD_CHARS: usize = 2048;

/// A node's text field as callers see it: sanitised and cut to [`NODE_FIELD_CHARS`].
fn shown(text: &str) -> String {
    kg_common::sanitize::sanitize_text(text, NODE_FIELD_CHARS)
}

/// Estimated JSON bytes of a value in the answer.
fn json_len(value: &serde_json::Value) -> usize {
    value.to_string().len() + 1
}

fn node_json(node: &GraphNode) -> serde_json::Value {
    json!({
        "file_id": node.file_id, "file_version_id": node.file_version_id, "path": node.path,
        "title": node.title, "type": node.r#type, "tags": node.tags, "reserved": node.reserved,
    })
}

/// Everything the pure graph computation reads.
pub(crate) struct GraphInput<'a> {
    /// Readable, visible versions of the target, by path.
    pub members: Vec<Member>,
    /// Metadata and links by version id (versions never indexed are absent).
    pub data: &'a HashMap<String, VersionLinks>,
    pub access: &'a AccessFilter,
    pub fingerprint_seed: String,
}

/// Builds one page of the graph from the scoped versions.
pub(crate) fn build_graph(
    input: GraphInput<'_>,
    request: &GetKnowledgeGraphRequest,
) -> Result<GetKnowledgeGraphResponse> {
    let selector = Selector::compile(
        request
            .caller_selector
            .as_ref()
            .and_then(|s| s.form.as_ref()),
    )?;
    let filters = Filters::parse(request)?;
    let limit = match request.limit {
        0 => DEFAULT_GRAPH_LIMIT,
        n if n > MAX_GRAPH_LIMIT => {
            return Err(FilesError::Invalid(format!(
                "pagination.limit {n} is over the maximum of {MAX_GRAPH_LIMIT}"
            )));
        }
        n => n,
    };
    let has_root = !request.root_path.is_empty() || !request.root_file_version_id.is_empty();
    if !request.root_path.is_empty() && !request.root_file_version_id.is_empty() {
        return Err(FilesError::Invalid(
            "pass root_path or root_file_version_id, not both".to_owned(),
        ));
    }
    let max_depth = match (request.max_depth, has_root) {
        (Some(d), _) if d > MAX_GRAPH_DEPTH => {
            return Err(FilesError::Invalid(format!(
                "max_depth {d} is over the maximum of {MAX_GRAPH_DEPTH}"
            )));
        }
        (Some(_), false) => {
            return Err(FilesError::Invalid(
                "max_depth needs root_path or root_file_version_id; omit it to read the whole visible set".to_owned(),
            ));
        }
        (Some(d), true) => d,
        (None, _) => DEFAULT_GRAPH_DEPTH,
    };
    if request.root_path.chars().count() > kg_common::access::MAX_PATH_LEN {
        return Err(FilesError::Invalid(
            "root_path is over 1024 characters".to_owned(),
        ));
    }
    if !request.root_file_version_id.is_empty()
        && uuid::Uuid::parse_str(&request.root_file_version_id).is_err()
    {
        return Err(FilesError::Invalid(
            "root_file_version_id must be a UUID (a file_version_id from a node)".to_owned(),
        ));
    }

    // The scope: readable (SQL) and selected. Nodes, counts and edges come
    // only from it; the readable set decides only whether a link is broken.
    let readable = input.members;
    let scope: Vec<&Member> = readable
        .iter()
        .filter(|m| selector.matches(&m.path))
        .collect();
    let by_path: HashMap<&str, &Member> = scope.iter().map(|m| (m.path.as_str(), *m)).collect();
    // Links resolve only against readable files, so a denied file can neither
    // complete an edge nor turn a broken link into a resolved one.
    let live = LivePaths::new(readable.iter().map(|m| m.path.clone()));
    let readable_path = |path: &str| allows(input.access, path, "", true, false);

    // Reach: every scoped version at depth 0, or a BFS over links from the root.
    let mut reached: Vec<(u32, &Member)> = Vec::new();
    if has_root {
        let root = if request.root_path.is_empty() {
            scope
                .iter()
                .find(|m| m.version_id == request.root_file_version_id)
                .copied()
        } else {
            let path = normalize_path(&request.root_path)?;
            by_path.get(path.as_str()).copied()
        };
        let Some(root) = root else {
            let shown = if request.root_path.is_empty() {
                format!("root_file_version_id `{}`", request.root_file_version_id)
            } else {
                format!(
                    "root_path `{}`",
                    request.root_path.chars().take(200).collect::<String>()
                )
            };
            return Err(FilesError::TargetNotFound(format!("{shown} in the target")));
        };
        let mut seen: HashSet<&str> = HashSet::from([root.version_id.as_str()]);
        let mut queue = VecDeque::from([(0u32, root)]);
        while let Some((depth, member)) = queue.pop_front() {
            reached.push((depth, member));
            if depth >= max_depth {
                continue;
            }
            for link in input
                .data
                .get(&member.version_id)
                .map(|d| d.links.as_slice())
                .unwrap_or_default()
            {
                if link.kind != LinkKind::Internal || !readable_path(&link.target_path) {
                    continue;
                }
                if let LinkResolution::File(path) = live.resolve(link)
                    && let Some(next) = by_path.get(path.as_str())
                    && seen.insert(next.version_id.as_str())
                {
                    queue.push_back((depth + 1, *next));
                }
            }
        }
    } else {
        reached = scope.iter().map(|m| (0, *m)).collect();
    }
    let mut result: Vec<(u32, &Member)> = reached
        .into_iter()
        .filter(|(_, m)| filters.matches(&m.path, input.data.get(&m.version_id)))
        .collect();
    result.sort_by(|a, b| (a.0, &a.1.path).cmp(&(b.0, &b.1.path)));
    let result_versions: HashSet<&str> =
        result.iter().map(|(_, m)| m.version_id.as_str()).collect();

    let fingerprint = {
        let text = format!(
            "{}\0{}\0{}\0{}\0{}\0{}",
            input.fingerprint_seed,
            selector.canonical,
            request.root_path,
            request.root_file_version_id,
            if has_root { max_depth } else { 0 },
            filters.canonical()
        );
        hex::encode(&Sha256::digest(text.as_bytes())[..8])
    };
    let cursor = decode_cursor(&request.cursor, &fingerprint)?;
    let start = match &cursor {
        None => 0,
        Some(c) => result.partition_point(|(d, m)| (*d, m.path.as_str()) <= (c.d, c.p.as_str())),
    };
    let page: Vec<(u32, &Member)> = result
        .iter()
        .skip(start)
        .take(limit as usize)
        .copied()
        .collect();
    let more = start + page.len() < result.len();

    let nodes: Vec<GraphNode> = page
        .iter()
        .map(|(_, m)| {
            let data = input.data.get(&m.version_id);
            GraphNode {
                file_id: m.file_id.clone(),
                file_version_id: m.version_id.clone(),
                path: m.path.clone(),
                // Cut here as the gateway shows them, so the size check below counts what
                // the caller gets (it counted whole 3,000-character titles, refusing pages
                // that fit).
                title: data.and_then(|d| d.meta.title.as_deref().map(shown)),
                r#type: data.and_then(|d| d.meta.doc_type.as_deref().map(shown)),
                tags: data
                    .map(|d| d.meta.tags.iter().map(|t| shown(t)).collect())
                    .unwrap_or_default(),
                reserved: is_reserved(&m.path),
            }
        })
        .collect();
    let next_cursor = match (more, page.last()) {
        (true, Some((d, m))) => encode_cursor(&Cursor {
            f: fingerprint,
            d: *d,
            p: m.path.clone(),
        }),
        _ => String::new(),
    };
    let mut bytes = ENVELOPE_BYTES + nodes.iter().map(|n| json_len(&node_json(n))).sum::<usize>();
    if bytes > MAX_GRAPH_BYTES {
        return Err(FilesError::GraphTooLarge {
            bytes,
            limit: MAX_GRAPH_BYTES,
        });
    }

    let mut response = GetKnowledgeGraphResponse {
        returned_nodes: u32::try_from(nodes.len()).unwrap_or(u32::MAX),
        total_nodes: result.len() as u64,
        limit,
        self_cursor: request.cursor.clone(),
        next_cursor,
        nodes,
        ..Default::default()
    };
    let mut links = 0usize;
    'nodes: for (_, member) in &page {
        let Some(data) = input.data.get(&member.version_id) else {
            continue;
        };
        if data.meta.links_omitted > 0 {
            response.links_truncated = true;
        }
        for link in &data.links {
            let source = member.version_id.clone();
            // A target path the caller may not read: drop the link whole.
            if link.kind == LinkKind::Internal && !readable_path(&link.target_path) {
                continue;
            }
            let (entry, size) = match live.resolve(link) {
                LinkResolution::External(url) => {
                    let size = json_len(
                        &json!({"source_file_version_id": source, "ordinal": link.ordinal, "url": url}),
                    );
                    let e = GraphExternalLink {
                        source_file_version_id: source,
                        ordinal: link.ordinal,
                        url,
                    };
                    (Entry::External(e), size)
                }
                LinkResolution::File(path) => match by_path.get(path.as_str()) {
                    Some(target) if result_versions.contains(target.version_id.as_str()) => {
                        let e = GraphEdge {
                            source_file_version_id: source,
                            target_file_version_id: target.version_id.clone(),
                            ordinal: link.ordinal,
                        };
                        let size = json_len(
                            &json!({"source_file_version_id": e.source_file_version_id, "target_file_version_id": e.target_file_version_id, "ordinal": e.ordinal}),
                        );
                        (Entry::Edge(e), size)
                    }
                    // A readable file left out by the selector, filters or depth: not broken.
                    _ => continue,
                },
                LinkResolution::Broken => {
                    let label = if link.kind == LinkKind::Internal {
                        link.target_path.clone()
                    } else {
                        link.raw_target.clone()
                    };
                    if label.is_empty() {
                        continue;
                    }
                    broken(source, link.ordinal, label)
                }
            };
            if links >= MAX_GRAPH_LINKS || bytes + size > MAX_GRAPH_BYTES {
                response.links_truncated = true;
                break 'nodes;
            }
            links += 1;
            bytes += size;
            match entry {
                Entry::Edge(e) => response.edges.push(e),
                Entry::External(e) => response.external_links.push(e),
                Entry::Broken(e) => response.broken_links.push(e),
            }
        }
    }
    response.partial = more || response.links_truncated;
    Ok(response)
}

enum Entry {
    Edge(GraphEdge),
    External(GraphExternalLink),
    Broken(GraphBrokenLink),
}

fn broken(source: String, ordinal: u32, target_path: String) -> (Entry, usize) {
    let size = json_len(
        &json!({"source_file_version_id": source, "ordinal": ordinal, "target_path": target_path}),
    );
    (
        Entry::Broken(GraphBrokenLink {
            source_file_version_id: source,
            ordinal,
            target_path,
        }),
        size,
    )
}

impl FilesService {
    /// get_knowledge_graph over the caller's readable part of a lookup target.
    pub async fn get_knowledge_graph(
        &self,
        caller: &CallerContext,
        request: &GetKnowledgeGraphRequest,
    ) -> Result<GetKnowledgeGraphResponse> {
        validate_namespace(&request.namespace)?;
        let access = access_for(caller, &request.namespace)?;
        let resolved = self
            .versions
            .resolve(&request.namespace, request.lookup_target.as_ref())
            .await?;
        let members = self
            .versions
            .members(&request.namespace, &resolved, access, "", None)
            .await?;
        let versions: Vec<String> = members.iter().map(|m| m.version_id.clone()).collect();
        let data: HashMap<String, VersionLinks> = self
            .version_links(&versions)
            .await?
            .into_iter()
            .map(|v| (v.meta.version_id.clone(), v))
            .collect();
        build_graph(
            GraphInput {
                members,
                data: &data,
                access,
                fingerprint_seed: format!("{}\0{resolved:?}", request.namespace),
            },
            request,
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use kg_common::{ErrorCode, ErrorExt as _};

    use super::*;
    use crate::links::{LinkSyntax, VersionLinkRecord, VersionMetadata};

    fn member(i: usize, path: String) -> Member {
        Member {
            file_id: format!("f{i}"),
            version_id: format!("v{i}"),
            path,
        }
    }

    fn data(version_id: &str, title: String, links: Vec<VersionLinkRecord>) -> VersionLinks {
        VersionLinks {
            meta: VersionMetadata {
                version_id: version_id.to_owned(),
                namespace: "ns".into(),
                file_id: String::new(),
                source_path: String::new(),
                title: Some(title),
                doc_type: None,
                tags: Vec::new(),
                document_date: None,
                effective_from: None,
                effective_to: None,
                collections: Vec::new(),
                links_omitted: 0,
            },
            links,
        }
    }

    fn everyone() -> AccessFilter {
        AccessFilter {
            allow_prefixes: vec![String::new()],
            ..Default::default()
        }
    }

    fn request(limit: u32) -> GetKnowledgeGraphRequest {
        GetKnowledgeGraphRequest {
            namespace: "ns".into(),
            limit,
            ..Default::default()
        }
    }

    #[test]
    fn a_page_over_the_payload_limit_names_the_ways_to_narrow() {
        let members: Vec<Member> = (0..200)
            .map(|i| member(i, format!("{i:03}/{}", "p".repeat(1000))))
            .collect();
        let map: HashMap<String, VersionLinks> = members
            .iter()
            .map(|m| {
                (
                    m.version_id.clone(),
                    data(&m.version_id, "t".repeat(2000), Vec::new()),
                )
            })
            .collect();
        let access = everyone();
        let input = |members: Vec<Member>| GraphInput {
            members,
            data: &map,
            access: &access,
            fingerprint_seed: String::new(),
        };
        let err = build_graph(input(members.clone()), &request(200)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::PayloadTooLarge);
        for way in ["root_path", "max_depth", "filters", "pagination.limit"] {
            assert!(err.to_string().contains(way), "{err}");
        }
        // A lower limit is the way out.
        let page = build_graph(input(members), &request(100)).unwrap();
        assert_eq!((page.returned_nodes, page.total_nodes), (100, 200));
        assert!(page.partial && !page.next_cursor.is_empty());
    }

    /// Titles and tags longer than a node shows count as shown: 85 nodes with 4,000-character
    /// titles and tags (about 360 KB as returned) were refused as if each were whole.
    #[test]
    fn the_payload_limit_counts_fields_as_they_are_shown() {
        let members: Vec<Member> = (0..85).map(|i| member(i, format!("{i:03}.md"))).collect();
        let map: HashMap<String, VersionLinks> = members
            .iter()
            .map(|m| {
                let mut version = data(&m.version_id, "t".repeat(4_000), Vec::new());
                version.meta.tags = vec!["g".repeat(4_000)];
                (m.version_id.clone(), version)
            })
            .collect();
        let page = build_graph(
            GraphInput {
                members,
                data: &map,
                access: &everyone(),
                fingerprint_seed: String::new(),
            },
            &request(85),
        )
        .unwrap();
        assert_eq!(page.returned_nodes, 85);
        let node = &page.nodes[0];
        // Cut to the cap, plus the "…" that says so.
        let shown_len = |t: &str| t.chars().count();
        assert_eq!(
            shown_len(node.title.as_ref().unwrap()),
            NODE_FIELD_CHARS + 1
        );
        assert_eq!(shown_len(&node.tags[0]), NODE_FIELD_CHARS + 1);
    }

    #[test]
    fn links_over_the_combined_cap_are_cut_and_flagged() {
        let links: Vec<VersionLinkRecord> = (0..2500u32)
            .map(|i| VersionLinkRecord {
                ordinal: i,
                kind: if i % 2 == 0 {
                    LinkKind::External
                } else {
                    LinkKind::Internal
                },
                syntax: LinkSyntax::Link,
                target_path: if i % 2 == 0 {
                    format!("https://x.example/{i}")
                } else {
                    format!("gone/{i}.md")
                },
                raw_target: String::new(),
                fragment: None,
                label: String::new(),
            })
            .collect();
        let g = one_node(data("v0", "t".into(), links));
        assert_eq!(
            g.external_links.len() + g.broken_links.len() + g.edges.len(),
            MAX_GRAPH_LINKS
        );
        assert!(g.links_truncated && g.partial);
        assert_eq!(g.limit, DEFAULT_GRAPH_LIMIT);
        assert!(g.next_cursor.is_empty(), "one node: no next page");
    }

    /// The graph of one readable node, `a.md` at version `v0`, with `links`.
    fn one_node(version: VersionLinks) -> GetKnowledgeGraphResponse {
        let map = HashMap::from([("v0".to_owned(), version)]);
        build_graph(
            GraphInput {
                members: vec![member(0, "a.md".into())],
                data: &map,
                access: &everyone(),
                fingerprint_seed: String::new(),
            },
            &request(0),
        )
        .unwrap()
    }

    fn external(ordinal: u32, url: String) -> VersionLinkRecord {
        VersionLinkRecord {
            ordinal,
            kind: LinkKind::External,
            syntax: LinkSyntax::Link,
            target_path: url,
            raw_target: String::new(),
            fragment: None,
            label: String::new(),
        }
    }

    /// Links cut for bytes before the count cap: the page holds every node, stays under the
    /// payload limit, and says its links are truncated.
    #[test]
    fn links_over_the_byte_budget_are_cut_and_flagged() {
        let long = |i: u32| format!("https://x.example/{i}/{}", "u".repeat(4_000));
        let links: Vec<VersionLinkRecord> = (0..300).map(|i| external(i, long(i))).collect();
        let g = one_node(data("v0", "t".into(), links));
        let kept = g.external_links.len();
        assert!(kept > 0 && kept < 300, "{kept}");
        let bytes: usize = g.external_links.iter().map(|l| l.url.len() + 64).sum();
        assert!(bytes <= MAX_GRAPH_BYTES, "{bytes}");
        assert_eq!(g.returned_nodes, 1);
        assert!(g.links_truncated && g.partial);
    }

    /// Links the indexer dropped from a long document (past its per-version budget) make the
    /// page say its links are truncated, though every stored link fits.
    #[test]
    fn links_the_indexer_dropped_are_reported_as_truncated() {
        let mut version = data(
            "v0",
            "t".into(),
            vec![external(0, "https://x.example".into())],
        );
        let whole = one_node(version.clone());
        assert!(!whole.links_truncated && !whole.partial);
        version.meta.links_omitted = 12;
        let cut = one_node(version);
        assert_eq!(cut.external_links.len(), 1);
        assert!(cut.links_truncated && cut.partial);
    }

    #[test]
    fn selectors_parse_and_match() {
        use caller_selector::Form;
        let sel = |form: Form| Selector::compile(Some(&form)).unwrap();
        assert!(sel(Form::All(true)).matches("a/b.md"));
        assert!(!sel(Form::All(false)).matches("a/b.md"));
        let folder = sel(Form::Selector("docs/".into()));
        assert!(folder.matches("docs/x.md") && !folder.matches("docsx.md"));
        let glob = sel(Form::Selector("docs/**/*.md".into()));
        assert!(glob.matches("docs/a/b.md") && !glob.matches("docs/a/b.txt"));
        assert!(sel(Form::Selector("/a.md".into())).matches("a.md"));
        assert!(Selector::compile(Some(&Form::Selector("a/../b".into()))).is_err());
        assert!(Selector::compile(Some(&Form::Selector("[".into()))).is_err());
        assert!(is_reserved("_index.md") && is_reserved("a/.config/x.md"));
        assert!(!is_reserved("a/b_c.md"));
    }
}
