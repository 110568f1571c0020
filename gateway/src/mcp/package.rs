//! Chunk packages and outline sections as the camelCase JSON tools return.
//! Every string that came from a file or a store is sanitised here, the last
//! hop before a model reads it.
//!
//! Packages are the bulk of most answers (a kg_search answer is mostly its eight
//! packages' text and outlines), so they serialize straight from the proto messages
//! through borrowing views: clean strings are written where they lie, and no
//! intermediate `Value` tree is built and dropped per call.

use std::borrow::Cow;

use kg_common::sanitize::{DEFAULT_FIELD_CAP, sanitized};
use kg_proto::v1::{
    ChunkPackage, LaneRank, ListCounts, Mention, OutlineRef, OutlineSection, Permission,
    RelNeighbor, SearchHit, SimilarFile,
};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Map, Value, json};

/// Cap on short fields (titles, names, keys).
const SHORT_FIELD_CAP: usize = 1024;

/// A short untrusted string (a title, a name), sanitised into a JSON string.
pub(crate) fn clean(text: &str) -> Value {
    Value::String(sanitized(text, SHORT_FIELD_CAP).into_owned())
}

/// A short untrusted string, sanitised as it is written.
#[derive(Clone, Copy)]
struct Clean<'a>(&'a str);

impl Serialize for Clean<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&sanitized(self.0, SHORT_FIELD_CAP))
    }
}

/// A JSON number; a non-finite float (which JSON cannot carry) is written as 0.
#[derive(Clone, Copy)]
struct Finite(f64);

impl Serialize for Finite {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(if self.0.is_finite() { self.0 } else { 0.0 })
    }
}

/// A JSON number; a non-finite float (which JSON cannot carry) becomes 0.
pub(crate) fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or_else(|| json!(0.0), Value::Number)
}

fn put_opt<T: Into<Value>>(map: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        map.insert(key.to_owned(), v.into());
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The lowercase name of a permission.
pub(crate) fn permission_name(permission: Permission) -> &'static str {
    match permission {
        Permission::Admin => "admin",
        Permission::Write => "write",
        // An access entry exists only for readable namespaces.
        Permission::Read | Permission::Unspecified => "read",
    }
}

/// A search hit's folded copies (chunks with the same text), when it has any:
/// `{"count": n, "copies": [{"chunkKey", "fileId", "path"}, ...]}` with at most the first
/// few copies listed and `count` counting all of them.
#[derive(Serialize)]
pub(crate) struct Duplicates<'a> {
    count: u32,
    copies: Vec<Copy<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Copy<'a> {
    chunk_key: Clean<'a>,
    file_id: Clean<'a>,
    path: Clean<'a>,
}

impl<'a> Duplicates<'a> {
    pub(crate) fn of(hit: &'a SearchHit) -> Option<Self> {
        (hit.duplicate_count > 0).then(|| Self {
            count: hit.duplicate_count,
            copies: hit
                .duplicates
                .iter()
                .map(|c| Copy {
                    chunk_key: Clean(&c.chunk_key),
                    file_id: Clean(&c.file_id),
                    path: Clean(&c.path),
                })
                .collect(),
        })
    }
}

/// Why a search hit ranked where it did: each lane that ranked the chunk, its rank there
/// (1-based, within the hit's namespace) and the lane's own score before fusion.
#[derive(Serialize)]
struct LaneRankJson<'a> {
    lane: &'a str,
    rank: u32,
    score: Finite,
}

impl<'a> LaneRankJson<'a> {
    fn of(rank: &'a LaneRank) -> Self {
        Self {
            lane: &rank.lane,
            rank: rank.rank,
            score: Finite(rank.raw_score),
        }
    }
}

/// One chunk package in the shared JSON shape, borrowed from the proto message; a
/// search result also lists its folded copies.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PackageJson<'a> {
    namespace: Clean<'a>,
    chunk_key: Clean<'a>,
    file_id: Clean<'a>,
    path: Clean<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<Finite>,
    text: Cow<'a, str>,
    context_header: Clean<'a>,
    citation: Clean<'a>,
    #[serde(skip_serializing_if = "is_false")]
    text_truncated: bool,
    #[serde(skip_serializing_if = "is_false")]
    text_omitted: bool,
    position: PositionJson<'a>,
    outline: OutlineJson<'a>,
    mentions: Vec<MentionJson<'a>>,
    rel_neighbors: Vec<RelJson<'a>>,
    dates: DatesJson<'a>,
    similar_files: Vec<SimilarJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    counts: Option<CountsJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicates: Option<Duplicates<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    lanes: Vec<LaneRankJson<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PositionJson<'a> {
    chunk_index: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    char_start: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    char_end: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    page_start: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    page_end: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line_start: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line_end: Option<i64>,
    token_count: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    prev_chunk_key: Option<Clean<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_chunk_key: Option<Clean<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutlineRefJson<'a> {
    outline_key: Clean<'a>,
    title: Clean<'a>,
    depth: i64,
    order: i64,
}

impl<'a> OutlineRefJson<'a> {
    fn of(r: &'a OutlineRef) -> Self {
        Self {
            outline_key: Clean(&r.outline_key),
            title: Clean(&r.title),
            depth: r.depth,
            order: r.order,
        }
    }

    fn list(refs: &'a [OutlineRef]) -> Vec<Self> {
        refs.iter().map(Self::of).collect()
    }
}

#[derive(Serialize)]
struct OutlineJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    section: Option<OutlineRefJson<'a>>,
    ancestors: Vec<OutlineRefJson<'a>>,
    siblings: Vec<OutlineRefJson<'a>>,
    children: Vec<OutlineRefJson<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MentionJson<'a> {
    entity_key: Clean<'a>,
    name: Clean<'a>,
    type_id: Clean<'a>,
    type_label: Clean<'a>,
    method: Clean<'a>,
    quote: Clean<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    char_start: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    char_end: Option<i64>,
}

impl<'a> MentionJson<'a> {
    fn of(m: &'a Mention) -> Self {
        Self {
            entity_key: Clean(&m.entity_key),
            name: Clean(&m.name),
            type_id: Clean(&m.type_id),
            type_label: Clean(&m.type_label),
            method: Clean(&m.method),
            quote: Clean(&m.quote),
            char_start: m.char_start,
            char_end: m.char_end,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RelJson<'a> {
    source_entity_key: Clean<'a>,
    relation_type_id: Clean<'a>,
    target_entity_key: Clean<'a>,
    target_name: Clean<'a>,
    stated_in_file_id: Clean<'a>,
    source_name: Clean<'a>,
    direction: Clean<'a>,
    entity_key: Clean<'a>,
    other_entity_key: Clean<'a>,
    other_name: Clean<'a>,
    other_type_id: Clean<'a>,
    stated_in_chunk_key: Clean<'a>,
}

impl<'a> RelJson<'a> {
    fn of(r: &'a RelNeighbor) -> Self {
        Self {
            source_entity_key: Clean(&r.source_entity_key),
            relation_type_id: Clean(&r.relation_type_id),
            target_entity_key: Clean(&r.target_entity_key),
            target_name: Clean(&r.target_name),
            stated_in_file_id: Clean(&r.stated_in_file_id),
            source_name: Clean(&r.source_name),
            direction: Clean(&r.direction),
            entity_key: Clean(&r.entity_key),
            other_entity_key: Clean(&r.other_entity_key),
            other_name: Clean(&r.other_name),
            other_type_id: Clean(&r.other_type_id),
            stated_in_chunk_key: Clean(&r.stated_in_chunk_key),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DatesJson<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    document_date: Option<Clean<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    effective_from: Option<Clean<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    effective_to: Option<Clean<'a>>,
    collections: Vec<Clean<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SimilarJson<'a> {
    file_id: Clean<'a>,
    path: Clean<'a>,
    score: Finite,
}

impl<'a> SimilarJson<'a> {
    fn of(s: &'a SimilarFile) -> Self {
        Self {
            file_id: Clean(&s.file_id),
            path: Clean(&s.path),
            score: Finite(s.score),
        }
    }
}

/// `{"<list>": {"total", "truncated"}, ...}` for the lists a cap cut.
struct CountsJson<'a>(&'a ListCounts);

impl Serialize for CountsJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Count {
            total: i64,
            truncated: bool,
        }
        let mut map = serializer.serialize_map(Some(self.0.lists.len()))?;
        for c in &self.0.lists {
            map.serialize_entry(
                &Clean(&c.list),
                &Count {
                    total: c.total,
                    truncated: c.truncated,
                },
            )?;
        }
        map.end()
    }
}

impl<'a> PackageJson<'a> {
    /// The view of `p`; a package missing a part shows that part empty.
    pub(crate) fn of(p: &'a ChunkPackage) -> Self {
        let text = p.text.as_ref();
        let pos = p.position.as_ref();
        let outline = p.outline.as_ref();
        let dates = p.dates.as_ref();
        let str_of = |s: Option<&'a String>| s.map_or("", String::as_str);
        Self {
            namespace: Clean(&p.namespace),
            chunk_key: Clean(&p.chunk_key),
            file_id: Clean(&p.file_id),
            path: Clean(&p.path),
            score: p.score.map(Finite),
            text: sanitized(str_of(text.map(|t| &t.text)), DEFAULT_FIELD_CAP),
            context_header: Clean(str_of(text.map(|t| &t.context_header))),
            citation: Clean(str_of(text.map(|t| &t.citation))),
            text_truncated: text.is_some_and(|t| t.text_truncated),
            text_omitted: text.is_some_and(|t| t.text_omitted),
            position: PositionJson {
                chunk_index: pos.map_or(0, |p| p.chunk_index),
                char_start: pos.and_then(|p| p.char_start),
                char_end: pos.and_then(|p| p.char_end),
                page_start: pos.and_then(|p| p.page_start),
                page_end: pos.and_then(|p| p.page_end),
                line_start: pos.and_then(|p| p.line_start),
                line_end: pos.and_then(|p| p.line_end),
                token_count: pos.map_or(0, |p| p.token_count),
                prev_chunk_key: pos.and_then(|p| p.prev_chunk_key.as_deref()).map(Clean),
                next_chunk_key: pos.and_then(|p| p.next_chunk_key.as_deref()).map(Clean),
            },
            outline: OutlineJson {
                section: outline
                    .and_then(|o| o.section.as_ref())
                    .map(OutlineRefJson::of),
                ancestors: outline.map_or_else(Vec::new, |o| OutlineRefJson::list(&o.ancestors)),
                siblings: outline.map_or_else(Vec::new, |o| OutlineRefJson::list(&o.siblings)),
                children: outline.map_or_else(Vec::new, |o| OutlineRefJson::list(&o.children)),
            },
            mentions: p.mentions.iter().map(MentionJson::of).collect(),
            rel_neighbors: p.rel_neighbors.iter().map(RelJson::of).collect(),
            dates: DatesJson {
                document_date: dates.and_then(|d| d.document_date.as_deref()).map(Clean),
                effective_from: dates.and_then(|d| d.effective_from.as_deref()).map(Clean),
                effective_to: dates.and_then(|d| d.effective_to.as_deref()).map(Clean),
                collections: dates.map_or_else(Vec::new, |d| {
                    d.collections.iter().map(|c| Clean(c)).collect()
                }),
            },
            similar_files: p.similar_files.iter().map(SimilarJson::of).collect(),
            counts: p
                .counts
                .as_ref()
                .filter(|c| !c.lists.is_empty())
                .map(CountsJson),
            duplicates: None,
            lanes: Vec::new(),
        }
    }

    /// The view of a search result: the package and the hit's folded copies.
    pub(crate) fn of_hit(p: &'a ChunkPackage, hit: &'a SearchHit) -> Self {
        Self {
            duplicates: Duplicates::of(hit),
            lanes: hit.lanes.iter().map(LaneRankJson::of).collect(),
            ..Self::of(p)
        }
    }
}

/// One chunk package in the shared JSON shape, as a `Value`, for answers that hold a few.
pub(crate) fn package_json(p: &ChunkPackage) -> Value {
    // Every key is a string and every number finite, so this does not fail; if it ever
    // did, the package shows as null and the log says so rather than the call failing.
    serde_json::to_value(PackageJson::of(p)).unwrap_or_else(|err| {
        tracing::error!(error = %err, "a chunk package did not serialize");
        Value::Null
    })
}

/// Whether a package's chunk has no character offsets: written by an indexer from before
/// offsets existed, so its citation cannot point into the text until the file is
/// reprocessed.
fn lacks_offsets(package: &ChunkPackage) -> bool {
    package
        .position
        .as_ref()
        .is_none_or(|p| p.char_start.is_none() || p.char_end.is_none())
}

/// `trace.missingOffsets` of any answer made of packages: each file holding a package
/// without offsets, by namespace and path, with those packages' chunk keys in answer order.
/// Empty when every package has its offsets.
pub(crate) fn missing_offsets<'a>(
    packages: impl IntoIterator<Item = &'a ChunkPackage>,
) -> Vec<Value> {
    let mut files: std::collections::BTreeMap<(&str, &str, &str), Vec<&str>> =
        std::collections::BTreeMap::new();
    for package in packages.into_iter().filter(|p| lacks_offsets(p)) {
        let chunk_keys = files
            .entry((&package.namespace, &package.path, &package.file_id))
            .or_default();
        // A chunk can back several entity hits' evidence: name it once.
        if !chunk_keys.contains(&package.chunk_key.as_str()) {
            chunk_keys.push(&package.chunk_key);
        }
    }
    files
        .into_iter()
        .map(|((namespace, path, file_id), chunk_keys)| {
            json!({
                "namespace": clean(namespace), "fileId": clean(file_id), "chunkKeys": chunk_keys.iter().map(|k| clean(k)).collect::<Vec<_>>(),
                "path": clean(path),
            })
        })
        .collect()
}

/// One outline section in the kg_outline JSON shape.
pub(crate) fn section_json(s: &OutlineSection) -> Value {
    let mut out = Map::new();
    out.insert("outlineKey".into(), clean(&s.outline_key));
    out.insert("title".into(), clean(&s.title));
    out.insert("depth".into(), s.depth.into());
    out.insert("order".into(), s.order.into());
    put_opt(&mut out, "parentKey", s.parent_key.as_deref().map(clean));
    put_opt(&mut out, "lineStart", s.line_start);
    put_opt(&mut out, "pageStart", s.page_start);
    put_opt(&mut out, "pageEnd", s.page_end);
    out.insert("chunkCount".into(), s.chunk_count.into());
    Value::Object(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::{ChunkText, ListCount, ListCounts, Position};
    use kg_proto::v1::{Dates, DuplicateCopy, OutlineContext};

    #[test]
    fn every_field_of_a_package_is_written_and_cleaned() {
        let r = |k: &str, t: &str| OutlineRef {
            outline_key: k.into(),
            title: t.into(),
            depth: 2,
            order: 3,
        };
        let full = ChunkPackage {
            namespace: "de\u{200b}mo".into(),
            chunk_key: "c1".into(),
            file_id: "f1".into(),
            path: "a/\u{202e}b.md".into(),
            score: Some(0.123456789),
            text: Some(ChunkText {
                text: "Hello \"q\" \\ \u{1b}[31mred naïve 東京\n\tend".into(),
                context_header: "H › S".into(),
                citation: "cit".into(),
                text_truncated: true,
                text_omitted: true,
            }),
            position: Some(Position {
                chunk_index: 4,
                char_start: Some(1),
                char_end: Some(2),
                page_start: Some(3),
                page_end: Some(4),
                line_start: Some(5),
                line_end: Some(6),
                token_count: 7,
                prev_chunk_key: Some("p".into()),
                next_chunk_key: Some("n\u{7}".into()),
            }),
            outline: Some(OutlineContext {
                section: Some(r("s", "Sec")),
                ancestors: vec![r("a1", "A1"), r("a2", "A\u{e0041}2")],
                siblings: vec![r("s1", "S1")],
                children: vec![r("c1", "C1"), r("c2", "C2")],
            }),
            mentions: vec![Mention {
                entity_key: "e".into(),
                name: "N".into(),
                type_id: "t".into(),
                type_label: "T".into(),
                method: "m".into(),
                quote: "q".into(),
                char_start: Some(1),
                char_end: None,
            }],
            rel_neighbors: vec![RelNeighbor {
                source_entity_key: "a".into(),
                relation_type_id: "b".into(),
                target_entity_key: "c".into(),
                target_name: "d".into(),
                stated_in_file_id: "e".into(),
                source_name: "f".into(),
                direction: "out".into(),
                entity_key: "g".into(),
                other_entity_key: "h".into(),
                other_name: "i".into(),
                other_type_id: "j".into(),
                stated_in_chunk_key: "k".into(),
            }],
            dates: Some(Dates {
                document_date: Some("2024-01-01".into()),
                effective_from: None,
                effective_to: Some("2025".into()),
                collections: vec!["x".into(), "y\u{200d}".into()],
            }),
            similar_files: vec![
                SimilarFile {
                    file_id: "sf".into(),
                    path: "sp".into(),
                    score: f64::NAN,
                },
                SimilarFile {
                    file_id: "sf2".into(),
                    path: "sp2".into(),
                    score: 0.25,
                },
            ],
            counts: Some(ListCounts {
                lists: vec![
                    ListCount {
                        list: "mentions".into(),
                        total: 30,
                        truncated: true,
                    },
                    ListCount {
                        list: "relNeighbors\u{202e}".into(),
                        total: 2,
                        truncated: false,
                    },
                ],
            }),
        };
        // Every field, hidden characters stripped, a non-finite score written as 0.
        let expected: Value = serde_json::from_str(
            r#"{
                "namespace": "demo",
                "chunkKey": "c1",
                "fileId": "f1",
                "path": "a/b.md",
                "score": 0.123456789,
                "text": "Hello \"q\" \\ red naïve 東京\n\tend",
                "contextHeader": "H › S",
                "citation": "cit",
                "textTruncated": true,
                "textOmitted": true,
                "position": {"chunkIndex": 4, "charStart": 1, "charEnd": 2, "pageStart": 3, "pageEnd": 4, "lineStart": 5, "lineEnd": 6, "tokenCount": 7, "prevChunkKey": "p", "nextChunkKey": "n"},
                "outline": {"section": {"outlineKey": "s", "title": "Sec", "depth": 2, "order": 3}, "ancestors": [{"outlineKey": "a1", "title": "A1", "depth": 2, "order": 3}, {"outlineKey": "a2", "title": "A2", "depth": 2, "order": 3}], "siblings": [{"outlineKey": "s1", "title": "S1", "depth": 2, "order": 3}], "children": [{"outlineKey": "c1", "title": "C1", "depth": 2, "order": 3}, {"outlineKey": "c2", "title": "C2", "depth": 2, "order": 3}]},
                "mentions": [{"entityKey": "e", "name": "N", "typeId": "t", "typeLabel": "T", "method": "m", "quote": "q", "charStart": 1}],
                "relNeighbors": [{"sourceEntityKey": "a", "relationTypeId": "b", "targetEntityKey": "c", "targetName": "d", "statedInFileId": "e", "sourceName": "f", "direction": "out", "entityKey": "g", "otherEntityKey": "h", "otherName": "i", "otherTypeId": "j", "statedInChunkKey": "k"}],
                "dates": {"documentDate": "2024-01-01", "effectiveTo": "2025", "collections": ["x", "y"]},
                "similarFiles": [{"fileId": "sf", "path": "sp", "score": 0.0}, {"fileId": "sf2", "path": "sp2", "score": 0.25}],
                "counts": {"mentions": {"total": 30, "truncated": true}, "relNeighbors": {"total": 2, "truncated": false}}
            }"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(PackageJson::of(&full)).unwrap(),
            expected
        );
        assert_eq!(package_json(&full), expected);

        // A search hit also lists its folded copies and the lanes that ranked it, last.
        let mut hit = SearchHit {
            duplicate_count: 3,
            duplicates: vec![DuplicateCopy {
                chunk_key: "k".into(),
                file_id: "f".into(),
                path: "p\u{200b}".into(),
            }],
            ..Default::default()
        };
        let mut with_copies = expected;
        with_copies["duplicates"] =
            json!({"count": 3, "copies": [{"chunkKey": "k", "fileId": "f", "path": "p"}]});
        assert_eq!(
            serde_json::to_value(PackageJson::of_hit(&full, &hit)).unwrap(),
            with_copies
        );
        hit.lanes = vec![
            LaneRank {
                lane: "fulltext".into(),
                rank: 1,
                raw_score: 7.25,
            },
            LaneRank {
                lane: "vector".into(),
                rank: 8,
                raw_score: f64::NAN,
            },
        ];
        let text = serde_json::to_string(&PackageJson::of_hit(&full, &hit)).unwrap();
        assert!(text.ends_with(
            r#""copies":[{"chunkKey":"k","fileId":"f","path":"p"}]},"lanes":[{"lane":"fulltext","rank":1,"score":7.25},{"lane":"vector","rank":8,"score":0.0}]}"#
        ));

        // A package missing its parts shows them empty.
        assert_eq!(
            package_json(&ChunkPackage::default()),
            json!({
                "namespace": "", "chunkKey": "", "fileId": "", "path": "", "text": "",
                "contextHeader": "", "citation": "",
                "position": {"chunkIndex": 0, "tokenCount": 0},
                "outline": {"ancestors": [], "siblings": [], "children": []},
                "mentions": [], "relNeighbors": [], "dates": {"collections": []},
                "similarFiles": [],
            })
        );
    }

    #[test]
    fn package_has_the_shared_shape_and_clean_text() {
        let p = ChunkPackage {
            namespace: "demo".into(),
            chunk_key: "c1".into(),
            file_id: "f1".into(),
            path: "guides/intro.md".into(),
            score: Some(0.5),
            text: Some(ChunkText {
                text: "Hello\u{202E} world\u{1b}[31m!".into(),
                context_header: "Intro › Setup".into(),
                citation: "demo/guides/intro.md › Setup".into(),
                ..Default::default()
            }),
            position: Some(Position {
                chunk_index: 2,
                char_start: Some(10),
                char_end: Some(20),
                line_start: Some(3),
                line_end: Some(4),
                token_count: 5,
                next_chunk_key: Some("c2".into()),
                ..Default::default()
            }),
            counts: Some(ListCounts {
                lists: vec![ListCount {
                    list: "mentions".into(),
                    total: 30,
                    truncated: true,
                }],
            }),
            ..Default::default()
        };
        let v = package_json(&p);
        assert_eq!(v["text"], "Hello world!");
        assert_eq!(v["score"], 0.5);
        assert_eq!(v["position"]["chunkIndex"], 2);
        assert_eq!(v["position"]["nextChunkKey"], "c2");
        assert!(v["position"].get("prevChunkKey").is_none());
        assert!(v["position"].get("pageStart").is_none());
        assert_eq!(v["outline"]["ancestors"], json!([]));
        assert!(v["outline"].get("section").is_none());
        assert_eq!(v["dates"], json!({"collections": []}));
        assert_eq!(
            v["counts"]["mentions"],
            json!({"total": 30, "truncated": true})
        );
        assert!(v.get("textOmitted").is_none());
    }
}
