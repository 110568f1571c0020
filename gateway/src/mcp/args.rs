//! Argument validation for every tool: pure functions from the JSON arguments
//! to typed requests. Every refusal is `invalid_argument` with a message that
//! says what to change; values over a hard maximum fail closed.

use std::collections::BTreeMap;

use kg_common::access::validate_namespace;
use kg_proto::v1::PackageCaps;
use kg_proto::v1::open_request::Key;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ClientError;

/// Longest accepted search query, in characters.
pub(crate) const MAX_QUERY_CHARS: usize = 1000;
/// Results of one search: default and hard maximum.
pub(crate) const TOP_K: (u32, u32) = (8, 32);
/// Packages of one kg_open: default and hard maximum.
pub(crate) const OPEN_LIMIT: (u32, u32) = (8, 32);
/// Sections of one kg_outline page: default and hard maximum.
pub(crate) const OUTLINE_LIMIT: (u32, u32) = (50, 200);
/// Deepest heading level kg_outline accepts as maxDepth.
pub(crate) const MAX_OUTLINE_DEPTH: u32 = 32;
/// Most namespaces one search may name.
pub(crate) const MAX_NAMESPACES: usize = 32;
/// Largest tokenBudget accepted.
pub(crate) const MAX_TOKEN_BUDGET: u32 = 1_000_000;

/// Search lanes a caller may name (retrieval soft-fails those it does not run).
pub(crate) const KNOWN_LANES: [&str; 4] = ["fulltext", "vector", "graph_expand", "co_annotation"];
/// The lanes retrieval runs when a search names none (its `Lane::DEFAULT`), as the tool
/// schema advertises them.
pub(crate) const DEFAULT_LANES: [&str; 3] = ["fulltext", "vector", "graph_expand"];

/// Package list caps: (name, default, hard max), in PackageCaps field order.
pub(crate) const CAPS: [(&str, u32, u32); 6] = [
    ("mentions", 8, 24),
    ("rel", 8, 24),
    ("ancestors", 6, 12),
    ("siblings", 8, 24),
    ("children", 8, 24),
    ("similar", 4, 16),
];

/// A JSON number that must be a whole number (agents sometimes send `8.0`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int(pub(crate) i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let int = match &value {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            }),
            _ => None,
        };
        int.map(Int).ok_or_else(|| {
            serde::de::Error::custom(format!("expected a whole number, got {value}"))
        })
    }
}

/// Refuses arguments holding a NUL character (U+0000) in any string, key or value, at any
/// depth: no field takes one, and PostgreSQL refuses it in text, so one that got through
/// would fail deep in a service as an internal error instead of here, saying where.
pub(crate) fn no_nul_characters(args: &Map<String, Value>) -> Result<(), ClientError> {
    fn find(value: &Value, at: &str) -> Option<String> {
        match value {
            Value::String(s) if s.contains('\0') => Some(at.to_owned()),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| find(v, &format!("{at}[{i}]"))),
            Value::Object(map) => fields(map, at),
            _ => None,
        }
    }
    fn fields(map: &Map<String, Value>, at: &str) -> Option<String> {
        map.iter().find_map(|(key, v)| {
            let here = if at.is_empty() {
                key.clone()
            } else {
                format!("{at}.{key}")
            };
            if key.contains('\0') {
                return Some(here.replace('\0', "\\u0000"));
            }
            find(v, &here)
        })
    }
    match fields(args, "") {
        Some(at) => Err(ClientError::invalid(format!(
            "`{at}` holds a NUL character (U+0000), which no argument accepts; remove it"
        ))),
        None => Ok(()),
    }
}

/// Whether a backend's JSON failed to parse only because it nests deeper than serde_json's
/// recursion limit (127 levels), which a caller can avoid by asking for less.
pub(crate) fn nests_too_deep(err: &serde_json::Error) -> bool {
    err.to_string().starts_with("recursion limit exceeded")
}

pub(crate) fn parse<T: DeserializeOwned>(args: &Map<String, Value>) -> Result<T, ClientError> {
    // The path names the argument as the caller wrote it (`filters.dateFrom`, `ids[2]`):
    // serde's own text says only what it expected.
    serde_path_to_error::deserialize(Value::Object(args.clone())).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            ClientError::invalid(format!("invalid arguments: {inner}"))
        } else {
            ClientError::invalid(format!("invalid arguments: {path}: {inner}"))
        }
    })
}

/// An optional argument that is an object of named fields (`caps`, `ranking`, `filters`):
/// serde's derived structs also take an array of the field values in declaration order, which
/// read `"caps": [0, 99]` as mentions 0 and rel 99. Only an object (or null) is taken; the
/// fields keep their paths in errors (`caps.mentions`).
pub(crate) fn nested_object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOnly<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectOnly<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of named fields")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }
    deserializer.deserialize_any(ObjectOnly(std::marker::PhantomData))
}

pub(crate) fn bounded(
    name: &str,
    value: Option<Int>,
    min: u32,
    default: u32,
    max: u32,
) -> Result<u32, ClientError> {
    let Some(Int(v)) = value else {
        return Ok(default);
    };
    if v < i64::from(min) || v > i64::from(max) {
        return Err(ClientError::invalid(format!(
            "{name} must be from {min} to {max} (the hard max); got {v}"
        )));
    }
    u32::try_from(v).map_err(|_| ClientError::invalid(format!("{name} is out of range")))
}

pub(crate) fn namespace(name: &str, value: &str) -> Result<String, ClientError> {
    validate_namespace(value).map_err(|err| ClientError::invalid(format!("{name}: {err}")))?;
    Ok(value.to_owned())
}

/// A key, file id or cursor as an earlier result returned it: no service's key is longer than
/// [`kg_proto::limits::MAX_KEY_BYTES`] (the indexer cuts and hashes long entity names).
pub(crate) fn key(name: &str, value: &str) -> Result<String, ClientError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ClientError::invalid(format!("{name} must not be empty")));
    }
    if value.len() > kg_proto::limits::MAX_KEY_BYTES || value.chars().any(char::is_control) {
        return Err(ClientError::invalid(format!(
            "{name} is not a valid key: pass a key exactly as an earlier result returned it"
        )));
    }
    Ok(value.to_owned())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCaps {
    mentions: Option<Int>,
    rel: Option<Int>,
    ancestors: Option<Int>,
    siblings: Option<Int>,
    children: Option<Int>,
    similar: Option<Int>,
}

/// Resolves caps: defaults filled in, each value from 0 to its hard max.
/// Services always receive explicit values; 0 means an empty list whose total is
/// still reported, never "the default".
pub(crate) fn caps(raw: Option<RawCaps>) -> Result<PackageCaps, ClientError> {
    let raw = raw.unwrap_or_default();
    let values = [
        raw.mentions,
        raw.rel,
        raw.ancestors,
        raw.siblings,
        raw.children,
        raw.similar,
    ];
    let mut resolved = [0u32; 6];
    for (slot, ((name, default, max), value)) in resolved.iter_mut().zip(CAPS.iter().zip(values)) {
        *slot = bounded(&format!("caps.{name}"), value, 0, *default, *max)?;
    }
    let [mentions, rel, ancestors, siblings, children, similar] = resolved;
    Ok(PackageCaps {
        mentions: Some(mentions),
        rel: Some(rel),
        ancestors: Some(ancestors),
        siblings: Some(siblings),
        children: Some(children),
        similar: Some(similar),
    })
}

/// An optional list argument: omitted, empty (the tool's default); given, at least one item.
/// An empty list would otherwise read as the default, which is never what `[]` asks for.
pub(crate) fn given_list<T>(
    name: &str,
    list: Option<Vec<T>>,
    omitted: &str,
) -> Result<Vec<T>, ClientError> {
    match list {
        Some(list) if list.is_empty() => Err(ClientError::invalid(format!(
            "{name} is empty: name at least one, or omit {name} {omitted}"
        ))),
        list => Ok(list.unwrap_or_default()),
    }
}

/// `kg_namespaces` takes no arguments.
pub(crate) fn namespaces_args(args: &Map<String, Value>) -> Result<(), ClientError> {
    if let Some(name) = args.keys().next() {
        return Err(ClientError::invalid(format!(
            "kg_namespaces takes no arguments; remove `{name}`"
        )));
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRanking {
    rrf_k: Option<f64>,
    lane_weights: Option<BTreeMap<String, f64>>,
    min_score: Option<f64>,
    collapse_duplicates: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSearch {
    query: String,
    namespaces: Option<Vec<String>>,
    lanes: Option<Vec<String>>,
    top_k: Option<Int>,
    token_budget: Option<Int>,
    #[serde(default, deserialize_with = "nested_object")]
    ranking: Option<RawRanking>,
    #[serde(default, deserialize_with = "nested_object")]
    caps: Option<RawCaps>,
    #[serde(default, deserialize_with = "nested_object")]
    filters: Option<super::entity_search::RawFilters>,
}

/// Validated `kg_search` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SearchArgs {
    pub(crate) query: String,
    /// Empty = every namespace the caller may read.
    pub(crate) namespaces: Vec<String>,
    /// Empty = retrieval's default lanes.
    pub(crate) lanes: Vec<String>,
    pub(crate) top_k: u32,
    pub(crate) token_budget: Option<u32>,
    pub(crate) ranking: Option<kg_proto::v1::Ranking>,
    pub(crate) caps: PackageCaps,
    pub(crate) filters: Option<kg_proto::v1::SearchFilters>,
}

fn lane(name: &str, value: &str) -> Result<String, ClientError> {
    if KNOWN_LANES.contains(&value) {
        Ok(value.to_owned())
    } else {
        Err(ClientError::invalid(format!(
            "{name}: unknown lane `{value}`; use one of {}",
            KNOWN_LANES.join(", ")
        )))
    }
}

fn finite_in(name: &str, value: f64, min: f64, max: f64) -> Result<f64, ClientError> {
    if value.is_finite() && value >= min && value <= max {
        Ok(value)
    } else {
        Err(ClientError::invalid(format!(
            "{name} must be from {min} to {max}; got {value}"
        )))
    }
}

fn dedup(values: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(values.len());
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// `tokenBudget`, which every tool returning chunk packages takes: absent, or 1 to
/// [`MAX_TOKEN_BUDGET`].
pub(crate) fn token_budget(raw: Option<Int>) -> Result<Option<u32>, ClientError> {
    raw.map(|v| bounded("tokenBudget", Some(v), 1, 0, MAX_TOKEN_BUDGET))
        .transpose()
}

/// Validates `kg_search` arguments.
pub(crate) fn search_args(args: &Map<String, Value>) -> Result<SearchArgs, ClientError> {
    // The caps table lists topK with the package caps, so `caps.topK` is topK too.
    let mut args = args.clone();
    let caps_top_k = args
        .get_mut("caps")
        .and_then(Value::as_object_mut)
        .and_then(|caps| caps.remove("topK"));
    let raw: RawSearch = parse(&args)?;
    let query = raw.query.trim().to_owned();
    if query.is_empty() {
        return Err(ClientError::invalid(
            "query must not be empty: pass the words or question to search for",
        ));
    }
    let chars = query.chars().count();
    if chars > MAX_QUERY_CHARS {
        return Err(ClientError::invalid(format!(
            "query is {chars} characters; shorten it to at most {MAX_QUERY_CHARS}"
        )));
    }
    let namespaces = given_list(
        "namespaces",
        raw.namespaces,
        "to search every namespace you may read",
    )?
    .iter()
    .map(|ns| namespace("namespaces", ns))
    .collect::<Result<Vec<_>, _>>()?;
    // Counted as given, as the schema's maxItems counts them.
    if namespaces.len() > MAX_NAMESPACES {
        return Err(ClientError::invalid(format!(
            "namespaces names {} namespaces; pass at most {MAX_NAMESPACES}",
            namespaces.len()
        )));
    }
    let namespaces = dedup(namespaces);
    let lanes = given_list("lanes", raw.lanes, "for fulltext, vector and graph_expand")?
        .iter()
        .map(|l| lane("lanes", l))
        .collect::<Result<Vec<_>, _>>()?;
    let top_k = match caps_top_k {
        None => bounded("topK", raw.top_k, 1, TOP_K.0, TOP_K.1)?,
        Some(value) => {
            let value: Int = serde_json::from_value(value)
                .map_err(|err| ClientError::invalid(format!("caps.topK: {err}")))?;
            let in_caps = bounded("caps.topK", Some(value), 1, TOP_K.0, TOP_K.1)?;
            match raw.top_k {
                Some(Int(top)) if top != i64::from(in_caps) => {
                    return Err(ClientError::invalid(format!(
                        "topK is {top} and caps.topK is {in_caps}; pass one of them"
                    )));
                }
                _ => in_caps,
            }
        }
    };
    let token_budget = token_budget(raw.token_budget)?;
    let ranking = raw.ranking.map(ranking).transpose()?;
    Ok(SearchArgs {
        query,
        namespaces,
        lanes: dedup(lanes),
        top_k,
        token_budget,
        ranking,
        caps: caps(raw.caps)?,
        filters: super::entity_search::search_filters(raw.filters),
    })
}

fn ranking(raw: RawRanking) -> Result<kg_proto::v1::Ranking, ClientError> {
    let rrf_k = match raw.rrf_k {
        Some(k) => finite_in("ranking.rrfK", k, 1.0, 1000.0)?,
        None => 0.0,
    };
    let mut lane_weights = std::collections::HashMap::new();
    for (name, weight) in raw.lane_weights.unwrap_or_default() {
        let name = lane("ranking.laneWeights", &name)?;
        let weight = finite_in(&format!("ranking.laneWeights.{name}"), weight, 0.0, 100.0)?;
        lane_weights.insert(name, weight);
    }
    let min_score = raw
        .min_score
        .map(|s| finite_in("ranking.minScore", s, 0.0, 1.0))
        .transpose()?;
    Ok(kg_proto::v1::Ranking {
        rrf_k,
        lane_weights,
        min_score,
        collapse_duplicates: raw.collapse_duplicates,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOpen {
    namespace: String,
    chunk_key: Option<String>,
    outline_key: Option<String>,
    entity_key: Option<String>,
    file_id: Option<String>,
    limit: Option<Int>,
    #[serde(default, deserialize_with = "nested_object")]
    caps: Option<RawCaps>,
    token_budget: Option<Int>,
}

/// Validated `kg_open` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenArgs {
    pub(crate) namespace: String,
    pub(crate) key: Key,
    pub(crate) limit: u32,
    pub(crate) caps: PackageCaps,
    pub(crate) token_budget: Option<u32>,
}

/// Validates `kg_open` arguments: exactly one key.
pub(crate) fn open_args(args: &Map<String, Value>) -> Result<OpenArgs, ClientError> {
    let raw: RawOpen = parse(args)?;
    let namespace = namespace("namespace", &raw.namespace)?;
    let mut keys = Vec::new();
    if let Some(k) = &raw.chunk_key {
        keys.push(Key::ChunkKey(key("chunkKey", k)?));
    }
    if let Some(k) = &raw.outline_key {
        keys.push(Key::OutlineKey(key("outlineKey", k)?));
    }
    if let Some(k) = &raw.entity_key {
        keys.push(Key::EntityKey(key("entityKey", k)?));
    }
    if let Some(k) = &raw.file_id {
        keys.push(Key::FileId(key("fileId", k)?));
    }
    if keys.len() != 1 {
        return Err(ClientError::invalid(format!(
            "pass exactly one of chunkKey, outlineKey, entityKey or fileId (got {})",
            keys.len()
        )));
    }
    let Some(key) = keys.pop() else {
        return Err(ClientError::invalid(
            "pass exactly one of chunkKey, outlineKey, entityKey or fileId",
        ));
    };
    Ok(OpenArgs {
        namespace,
        key,
        limit: bounded("limit", raw.limit, 1, OPEN_LIMIT.0, OPEN_LIMIT.1)?,
        caps: caps(raw.caps)?,
        token_budget: token_budget(raw.token_budget)?,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOutline {
    namespace: String,
    file_id: String,
    cursor: Option<String>,
    limit: Option<Int>,
    max_depth: Option<Int>,
}

/// Validated `kg_outline` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutlineArgs {
    pub(crate) namespace: String,
    pub(crate) file_id: String,
    pub(crate) cursor: String,
    pub(crate) limit: u32,
    pub(crate) max_depth: Option<u32>,
}

/// Validates `kg_outline` arguments.
pub(crate) fn outline_args(args: &Map<String, Value>) -> Result<OutlineArgs, ClientError> {
    let raw: RawOutline = parse(args)?;
    let cursor = match raw.cursor.as_deref().map(str::trim) {
        None | Some("") => String::new(),
        Some(c) => key("cursor", c)?,
    };
    let max_depth = match raw.max_depth {
        None => None,
        Some(d) => Some(bounded("maxDepth", Some(d), 1, 0, MAX_OUTLINE_DEPTH)?),
    };
    Ok(OutlineArgs {
        namespace: namespace("namespace", &raw.namespace)?,
        file_id: key("fileId", &raw.file_id)?,
        cursor,
        limit: bounded("limit", raw.limit, 1, OUTLINE_LIMIT.0, OUTLINE_LIMIT.1)?,
        max_depth,
    })
}

/// Files of one kg_files page: default and hard maximum.
pub(crate) const FILES_LIMIT: (u32, u32) = (50, 200);
/// Rows (sql) or matches (text) of one kg_file call: default and hard maximum.
pub(crate) const FILE_MAX_ROWS: (u32, u32) = (100, 1000);
/// Longest accepted path glob or content regex, in characters.
pub(crate) const MAX_PATTERN_CHARS: usize = 1000;
/// Longest accepted kg_file query (SQL, regex, JSONPath, JSONata, template).
pub(crate) const MAX_FILE_QUERY_CHARS: usize = 16 * 1024;
/// Highest line number a line window may name.
pub(crate) const MAX_LINE: i64 = 1 << 40;
/// The formats kg_file knows, in the order the description lists them.
pub(crate) const FILE_FORMATS: [&str; 5] = ["sql", "text", "jsonpath", "jsonata", "jinja"];
/// Longest kg_files cursor (it encodes a path, which may be 1024 bytes).
pub(crate) const MAX_FILES_CURSOR_CHARS: usize = 4096;
/// Chat references to a file: `@kg:<namespace>/<path>`.
const KG_REF_PREFIX: &str = "@kg:";

/// An optional string argument: absent, null and blank are all "not given".
fn given(value: Option<&String>) -> Option<&str> {
    value.map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// A glob or regex: bounded length, no control characters (tab is fine in a regex).
fn pattern_text(name: &str, value: &str) -> Result<String, ClientError> {
    let chars = value.chars().count();
    if chars > MAX_PATTERN_CHARS {
        return Err(ClientError::invalid(format!(
            "{name} is {chars} characters; shorten it to at most {MAX_PATTERN_CHARS}"
        )));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ClientError::invalid(format!(
            "{name} contains control characters; write them as regex escapes such as \\n"
        )));
    }
    Ok(value.to_owned())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFiles {
    namespace: String,
    folder_prefix: Option<String>,
    name: Option<String>,
    pattern: Option<String>,
    cursor: Option<String>,
    limit: Option<Int>,
}

/// Validated `kg_files` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FilesArgs {
    pub(crate) namespace: String,
    /// "" or `a/b/`.
    pub(crate) folder_prefix: String,
    /// "" = any path.
    pub(crate) name: String,
    /// "" = list a page without reading contents.
    pub(crate) pattern: String,
    pub(crate) cursor: String,
    pub(crate) limit: u32,
}

/// Validates `kg_files` arguments.
pub(crate) fn files_args(args: &Map<String, Value>) -> Result<FilesArgs, ClientError> {
    let raw: RawFiles = parse(args)?;
    let folder_prefix = match given(raw.folder_prefix.as_ref()) {
        None => String::new(),
        Some(prefix) => kg_common::access::normalize_folder_prefix(prefix)
            .map_err(|err| ClientError::invalid(format!("folderPrefix: {err}")))?,
    };
    let name = match given(raw.name.as_ref()) {
        None => String::new(),
        Some(glob) => pattern_text("name", glob)?,
    };
    // A regex keeps its spaces: " foo" and "foo" match different lines.
    let pattern = match raw.pattern.as_deref() {
        None | Some("") => String::new(),
        Some(p) => pattern_text("pattern", p)?,
    };
    let cursor = match given(raw.cursor.as_ref()) {
        None => String::new(),
        Some(c)
            if c.chars().count() <= MAX_FILES_CURSOR_CHARS && !c.chars().any(char::is_control) =>
        {
            c.to_owned()
        }
        Some(_) => {
            return Err(ClientError::invalid(
                "cursor is not valid: pass nextCursor exactly as the previous page returned it",
            ));
        }
    };
    Ok(FilesArgs {
        namespace: namespace("namespace", &raw.namespace)?,
        folder_prefix,
        name,
        pattern,
        cursor,
        limit: bounded("limit", raw.limit, 1, FILES_LIMIT.0, FILES_LIMIT.1)?,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFile {
    namespace: String,
    path: Option<String>,
    file_id: Option<String>,
    format: Option<String>,
    query: Option<String>,
    start_line: Option<Int>,
    end_line: Option<Int>,
    max_rows: Option<Int>,
}

/// Validated `kg_file` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FileArgs {
    pub(crate) namespace: String,
    pub(crate) selector: kg_proto::v1::query_file_request::Selector,
    /// "" = metadata.
    pub(crate) format: String,
    pub(crate) query: String,
    pub(crate) start_line: Option<i64>,
    pub(crate) end_line: Option<i64>,
    pub(crate) max_rows: u32,
}

/// A path argument: a plain path, or `@kg:<namespace>/<path>` naming the same
/// namespace as the `namespace` argument.
fn file_path(namespace: &str, value: &str) -> Result<String, ClientError> {
    let value = value.trim();
    let path = match value.strip_prefix(KG_REF_PREFIX) {
        None => value,
        Some(reference) => {
            let Some((ns, path)) = reference.split_once('/') else {
                return Err(ClientError::invalid(
                    "path: an @kg reference looks like @kg:<namespace>/<path>, e.g. @kg:demo/reports/q3.csv",
                ));
            };
            if ns != namespace {
                return Err(ClientError::invalid(format!(
                    "path names namespace `{}` but namespace is `{namespace}`; pass the same namespace in both",
                    ns.chars().take(80).collect::<String>()
                )));
            }
            path
        }
    };
    kg_common::access::normalize_path(path)
        .map_err(|err| ClientError::invalid(format!("path: {err}")))
}

fn line_number(name: &str, value: Option<Int>) -> Result<Option<i64>, ClientError> {
    match value {
        None => Ok(None),
        Some(Int(v)) if (1..=MAX_LINE).contains(&v) => Ok(Some(v)),
        Some(Int(v)) => Err(ClientError::invalid(format!(
            "{name} must be a line number from 1 (the first line); got {v}"
        ))),
    }
}

/// What `query` must be for `format`, for the refusal when it is missing.
fn query_hint(format: &str) -> &'static str {
    match format {
        "sql" => "one SELECT or WITH statement over the table data",
        "jsonpath" => "an RFC 9535 JSONPath such as $.items[*].name",
        "jsonata" => "a JSONata expression such as items.name",
        _ => "a Jinja template that reads the parsed JSON as data, e.g. {{ data.title }}",
    }
}

/// Validates `kg_file` arguments: exactly one of path or fileId, a known
/// format, and the query or line window that format needs.
pub(crate) fn file_args(args: &Map<String, Value>) -> Result<FileArgs, ClientError> {
    use kg_proto::v1::query_file_request::Selector;
    let raw: RawFile = parse(args)?;
    let namespace = namespace("namespace", &raw.namespace)?;
    let selector = match (given(raw.path.as_ref()), given(raw.file_id.as_ref())) {
        (Some(path), None) => Selector::Path(file_path(&namespace, path)?),
        (None, Some(id)) => Selector::FileId(key("fileId", id)?),
        (Some(_), Some(_)) => {
            return Err(ClientError::invalid(
                "pass exactly one of path or fileId, not both",
            ));
        }
        (None, None) => {
            return Err(ClientError::invalid(
                "pass exactly one of path or fileId (kg_files lists both)",
            ));
        }
    };
    let format = match given(raw.format.as_ref()) {
        None => String::new(),
        Some(f) if FILE_FORMATS.contains(&f) => f.to_owned(),
        Some(f) => {
            return Err(ClientError::invalid(format!(
                "unknown format `{}`; use one of {}, or omit format for size, mime type and status",
                f.chars().take(40).collect::<String>(),
                FILE_FORMATS.join(", ")
            )));
        }
    };
    // Queries keep their whitespace (a regex may start with a space).
    let query = raw.query.unwrap_or_default();
    let query = if query.trim().is_empty() {
        String::new()
    } else {
        query
    };
    let chars = query.chars().count();
    if chars > MAX_FILE_QUERY_CHARS {
        return Err(ClientError::invalid(format!(
            "query is {chars} characters; shorten it to at most {MAX_FILE_QUERY_CHARS}"
        )));
    }
    let start_line = line_number("startLine", raw.start_line)?;
    let end_line = line_number("endLine", raw.end_line)?;
    let window = start_line.is_some() || end_line.is_some();
    match format.as_str() {
        "" if !query.is_empty() => {
            return Err(ClientError::invalid(format!(
                "query needs a format: pass format as one of {}",
                FILE_FORMATS.join(", ")
            )));
        }
        "text" if query.is_empty() && !window => {
            return Err(ClientError::invalid(
                "format text needs query (a regular expression) or startLine and endLine (a line window)",
            ));
        }
        "text" if !query.is_empty() && window => {
            return Err(ClientError::invalid(
                "format text takes either query (a regular expression) or startLine/endLine (a line window), not both",
            ));
        }
        "text" => {}
        _ if window => {
            return Err(ClientError::invalid(
                "startLine and endLine apply to format text only; pass format \"text\" for a line window",
            ));
        }
        "" => {}
        other if query.is_empty() => {
            return Err(ClientError::invalid(format!(
                "format {other} needs query: {}",
                query_hint(other)
            )));
        }
        _ => {}
    }
    if let (Some(start), Some(end)) = (start_line, end_line)
        && end < start
    {
        return Err(ClientError::invalid(format!(
            "endLine ({end}) is before startLine ({start}); pass endLine >= startLine"
        )));
    }
    Ok(FileArgs {
        namespace,
        selector,
        format,
        query,
        start_line,
        end_line,
        max_rows: bounded("maxRows", raw.max_rows, 1, FILE_MAX_ROWS.0, FILE_MAX_ROWS.1)?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_character_is_refused_wherever_it_is() {
        let args = |value: Value| value.as_object().unwrap().clone();
        assert!(no_nul_characters(&args(json!({"query": "tab\tand newline\n"}))).is_ok());
        for (value, at) in [
            (json!({"query": "a\0b"}), "`query`"),
            (
                json!({"filters": {"collections": ["ok", "x\0"]}}),
                "`filters.collections[1]`",
            ),
            (json!({"ranking": {"lane\0": 1}}), "`ranking.lane\\u0000`"),
        ] {
            let err = no_nul_characters(&args(value)).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArgument);
            assert!(err.message.starts_with(at), "{}", err.message);
        }
    }
    use kg_common::ErrorCode;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    /// `caps`, `ranking` and `filters` are objects: an array of values in field order (which
    /// serde's derived structs would take positionally) is refused naming the argument, and
    /// errors inside keep the field's path.
    #[test]
    fn nested_arguments_are_objects_only() {
        for caps in [json!([0, 99, 0, 0, 0, 0]), json!([]), json!("x"), json!(3)] {
            let err = open_args(&obj(
                json!({"namespace": "demo", "chunkKey": "c1", "caps": caps}),
            ))
            .unwrap_err();
            assert!(
                err.message.contains("caps") && err.message.contains("an object"),
                "{caps}: {}",
                err.message
            );
        }
        for (name, value) in [("ranking", json!([60])), ("filters", json!(["docs"]))] {
            let err = search_args(&obj(json!({"query": "q", name: value}))).unwrap_err();
            assert!(
                err.message.contains(name) && err.message.contains("an object"),
                "{name}: {}",
                err.message
            );
        }
        let err = open_args(&obj(
            json!({"namespace": "demo", "chunkKey": "c1", "caps": {"mentions": "x"}}),
        ))
        .unwrap_err();
        assert!(err.message.contains("caps.mentions"), "{}", err.message);
        let open = open_args(&obj(
            json!({"namespace": "demo", "chunkKey": "c1", "caps": null}),
        ))
        .unwrap();
        assert_eq!(open.caps, caps(None).unwrap());
        let open = open_args(&obj(
            json!({"namespace": "demo", "chunkKey": "c1", "caps": {"rel": 3}}),
        ))
        .unwrap();
        assert_eq!(open.caps.rel, Some(3));
    }

    #[test]
    fn a_wrong_type_names_the_argument_as_the_caller_wrote_it() {
        for (value, says) in [
            (
                json!({"query": 5}),
                "invalid arguments: query: invalid type: integer `5`",
            ),
            (
                json!({"query": "a", "namespaces": "team"}),
                "invalid arguments: namespaces: invalid type: string",
            ),
            (
                json!({"query": "a", "ranking": {"laneWeights": {"vector": "x"}}}),
                "invalid arguments: ranking.laneWeights.vector: invalid type: string",
            ),
            (
                json!({"query": "a", "topK": 2.5}),
                "invalid arguments: topK: expected a whole number, got 2.5",
            ),
        ] {
            let message = refused(search_args(&obj(value)));
            assert!(message.starts_with(says), "{message}");
        }
        // An unknown argument, nested or not, is named where it was written.
        let message = refused(search_args(&obj(
            json!({"query": "a", "ranking": {"rrk": 3}}),
        )));
        assert!(
            message.starts_with("invalid arguments: ranking.rrk: unknown field `rrk`"),
            "{message}"
        );
    }

    fn refused(result: Result<impl std::fmt::Debug, ClientError>) -> String {
        let err = result.expect_err("expected invalid arguments");
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        err.message
    }

    #[test]
    fn namespaces_takes_nothing() {
        namespaces_args(&Map::new()).unwrap();
        assert!(refused(namespaces_args(&obj(json!({"x": 1})))).contains("`x`"));
    }

    #[test]
    fn search_defaults_and_limits() {
        let args = search_args(&obj(json!({"query": "  rotate keys  "}))).unwrap();
        assert_eq!(args.query, "rotate keys");
        assert_eq!(args.top_k, 8);
        assert!(args.namespaces.is_empty() && args.lanes.is_empty());
        assert_eq!(args.token_budget, None);
        assert_eq!(args.caps.mentions, Some(8));
        assert_eq!(args.caps.ancestors, Some(6));
        assert_eq!(args.caps.similar, Some(4));

        let args = search_args(&obj(json!({
            "query": "q", "namespaces": ["a", "b", "a"], "lanes": ["fulltext"], "topK": 32.0,
            "tokenBudget": 500, "ranking": {"rrfK": 30, "laneWeights": {"fulltext": 2}, "minScore": 0.2},
            "caps": {"mentions": 0, "similar": 16}
        })))
        .unwrap();
        assert_eq!(args.namespaces, ["a", "b"]);
        assert_eq!(args.top_k, 32);
        assert_eq!(args.token_budget, Some(500));
        let ranking = args.ranking.unwrap();
        assert_eq!(ranking.rrf_k, 30.0);
        assert_eq!(ranking.lane_weights.get("fulltext"), Some(&2.0));
        assert_eq!(ranking.min_score, Some(0.2));
        assert_eq!((args.caps.mentions, args.caps.similar), (Some(0), Some(16)));

        // topK may sit with the package caps, as the caps table lists it.
        let args =
            search_args(&obj(json!({"query": "q", "caps": {"topK": 12, "rel": 3}}))).unwrap();
        assert_eq!((args.top_k, args.caps.rel), (12, Some(3)));
        let args = search_args(&obj(
            json!({"query": "q", "topK": 12, "caps": {"topK": 12.0}}),
        ))
        .unwrap();
        assert_eq!(args.top_k, 12);
    }

    #[test]
    fn search_refusals_say_what_to_change() {
        assert!(refused(search_args(&obj(json!({})))).contains("query"));
        assert!(refused(search_args(&obj(json!({"query": "   "})))).contains("must not be empty"));
        let long = "x".repeat(1001);
        assert!(refused(search_args(&obj(json!({"query": long})))).contains("at most 1000"));
        assert!(
            refused(search_args(&obj(json!({"query": "q", "topK": 33}))))
                .contains("32 (the hard max)")
        );
        assert!(refused(search_args(&obj(json!({"query": "q", "topK": 0})))).contains("topK"));
        assert!(
            refused(search_args(&obj(json!({"query": "q", "topK": 2.5})))).contains("whole number")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "caps": {"mentions": 25}})
            )))
            .contains("caps.mentions must be from 0 to 24")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "caps": {"similar": 17}})
            )))
            .contains("16 (the hard max)")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "caps": {"bogus": 1}})
            )))
            .contains("bogus")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "caps": {"topK": 33}})
            )))
            .contains("caps.topK must be from 1 to 32")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "topK": 5, "caps": {"topK": 6}})
            )))
            .contains("pass one of them")
        );
        assert!(
            refused(search_args(&obj(json!({"query": "q", "lanes": ["magic"]}))))
                .contains("fulltext")
        );
        // maxItems counts the list as given, repeats included.
        let many = vec!["demo"; MAX_NAMESPACES + 1];
        assert!(
            refused(search_args(&obj(json!({"query": "q", "namespaces": many}))))
                .contains("pass at most 32")
        );
        let repeated = vec!["demo"; MAX_NAMESPACES];
        assert!(search_args(&obj(json!({"query": "q", "namespaces": repeated}))).is_ok());
        assert!(
            refused(search_args(&obj(json!({"query": "q", "lanes": []}))))
                .contains("lanes is empty: name at least one, or omit lanes for fulltext")
        );
        assert!(
            refused(search_args(&obj(json!({"query": "q", "namespaces": []}))))
                .contains("namespaces is empty")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "namespaces": ["Bad NS"]})
            )))
            .contains("invalid namespace")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "ranking": {"minScore": 2}})
            )))
            .contains("ranking.minScore")
        );
        assert!(
            refused(search_args(&obj(json!({"query": "q", "tokenBudget": 0}))))
                .contains("tokenBudget")
        );
        assert!(
            refused(search_args(&obj(
                json!({"query": "q", "filters": {"folder": "x"}})
            )))
            .contains("unknown field `folder`")
        );
    }

    #[test]
    fn caps_zero_means_none_omitted_means_default() {
        let defaults = PackageCaps {
            mentions: Some(8),
            rel: Some(8),
            ancestors: Some(6),
            siblings: Some(8),
            children: Some(8),
            similar: Some(4),
        };
        assert_eq!(caps(None).unwrap(), defaults);
        let raw: RawCaps = parse(&obj(json!({}))).unwrap();
        assert_eq!(caps(Some(raw)).unwrap(), defaults);

        // Every cap at 0 goes to the services as an explicit 0, not as "unset".
        let zero = obj(
            json!({"mentions": 0, "rel": 0, "ancestors": 0, "siblings": 0,
                              "children": 0, "similar": 0}),
        );
        assert_eq!(
            caps(Some(parse(&zero).unwrap())).unwrap(),
            PackageCaps {
                mentions: Some(0),
                rel: Some(0),
                ancestors: Some(0),
                siblings: Some(0),
                children: Some(0),
                similar: Some(0),
            }
        );
        // One explicit 0 leaves the others at their defaults.
        let args = open_args(&obj(
            json!({"namespace": "demo", "chunkKey": "c1", "caps": {"rel": 0}}),
        ))
        .unwrap();
        assert_eq!(
            args.caps,
            PackageCaps {
                rel: Some(0),
                ..defaults
            }
        );
        let args = search_args(&obj(json!({"query": "q", "caps": {"mentions": 0}}))).unwrap();
        assert_eq!((args.caps.mentions, args.caps.rel), (Some(0), Some(8)));

        let message = refused(search_args(&obj(
            json!({"query": "q", "caps": {"mentions": 25}}),
        )));
        assert_eq!(
            message,
            "caps.mentions must be from 0 to 24 (the hard max); got 25"
        );
        assert!(
            refused(caps(Some(parse(&obj(json!({"similar": -1}))).unwrap())))
                .contains("caps.similar")
        );
        // A search that returns nothing is useless: topK 0 is refused with the range.
        assert_eq!(
            refused(search_args(&obj(json!({"query": "q", "topK": 0})))),
            "topK must be from 1 to 32 (the hard max); got 0"
        );
    }

    #[test]
    fn open_needs_exactly_one_key() {
        let args = open_args(&obj(json!({"namespace": "demo", "chunkKey": "c1"}))).unwrap();
        assert_eq!(args.key, Key::ChunkKey("c1".into()));
        assert_eq!(args.limit, 8);
        let args = open_args(&obj(
            json!({"namespace": "demo", "fileId": "f1", "limit": 32}),
        ))
        .unwrap();
        assert_eq!(args.key, Key::FileId("f1".into()));
        assert!(refused(open_args(&obj(json!({"namespace": "demo"})))).contains("exactly one"));
        assert!(
            refused(open_args(&obj(
                json!({"namespace": "demo", "chunkKey": "c", "fileId": "f"})
            )))
            .contains("(got 2)")
        );
        assert!(
            refused(open_args(&obj(
                json!({"namespace": "demo", "chunkKey": ""})
            )))
            .contains("chunkKey must not be empty")
        );
        assert!(
            refused(open_args(&obj(
                json!({"namespace": "demo", "chunkKey": "c", "limit": 33})
            )))
            .contains("limit")
        );
        assert!(refused(open_args(&obj(json!({"chunkKey": "c"})))).contains("namespace"));
        assert_eq!(args.token_budget, None);
        let args = open_args(&obj(
            json!({"namespace": "demo", "chunkKey": "c", "tokenBudget": 300}),
        ))
        .unwrap();
        assert_eq!(args.token_budget, Some(300));
        assert!(
            refused(open_args(&obj(
                json!({"namespace": "demo", "chunkKey": "c", "tokenBudget": 0})
            )))
            .contains("tokenBudget must be from 1")
        );
    }

    #[test]
    fn outline_defaults_and_limits() {
        let args = outline_args(&obj(json!({"namespace": "demo", "fileId": "f1"}))).unwrap();
        assert_eq!(
            (args.limit, args.max_depth, args.cursor.as_str()),
            (50, None, "")
        );
        let args = outline_args(&obj(json!({"namespace": "demo", "fileId": "f1", "cursor": "abc", "limit": 200, "maxDepth": 2}))).unwrap();
        assert_eq!(
            (args.limit, args.max_depth, args.cursor.as_str()),
            (200, Some(2), "abc")
        );
        assert!(
            refused(outline_args(&obj(
                json!({"namespace": "demo", "fileId": "f1", "limit": 201})
            )))
            .contains("200 (the hard max)")
        );
        assert!(
            refused(outline_args(&obj(
                json!({"namespace": "demo", "fileId": "f1", "maxDepth": 0})
            )))
            .contains("maxDepth")
        );
        assert!(refused(outline_args(&obj(json!({"namespace": "demo"})))).contains("fileId"));
    }

    #[test]
    fn files_defaults_and_limits() {
        let args = files_args(&obj(json!({"namespace": "demo"}))).unwrap();
        assert_eq!(
            args,
            FilesArgs {
                namespace: "demo".into(),
                folder_prefix: String::new(),
                name: String::new(),
                pattern: String::new(),
                cursor: String::new(),
                limit: 50,
            }
        );
        let args = files_args(&obj(
            json!({"namespace": "demo", "folderPrefix": "/reports/2024", "name": "**/*.csv",
                                          "pattern": " total\t", "cursor": "c1", "limit": 200}),
        ))
        .unwrap();
        assert_eq!(args.folder_prefix, "reports/2024/");
        assert_eq!(args.name, "**/*.csv");
        assert_eq!(args.pattern, " total\t");
        assert_eq!((args.cursor.as_str(), args.limit), ("c1", 200));
        // Blank optional strings mean "not given".
        let args = files_args(&obj(json!({"namespace": "demo", "folderPrefix": " ", "name": "", "pattern": "", "cursor": ""}))).unwrap();
        assert_eq!(
            (
                args.folder_prefix.as_str(),
                args.name.as_str(),
                args.pattern.as_str()
            ),
            ("", "", "")
        );

        assert!(
            refused(files_args(&obj(json!({"namespace": "demo", "limit": 201}))))
                .contains("200 (the hard max)")
        );
        assert!(
            refused(files_args(&obj(
                json!({"namespace": "demo", "folderPrefix": "a/../b"})
            )))
            .contains("folderPrefix")
        );
        let long = "a".repeat(MAX_PATTERN_CHARS + 1);
        assert!(
            refused(files_args(&obj(
                json!({"namespace": "demo", "pattern": long})
            )))
            .contains("at most 1000")
        );
        assert!(
            refused(files_args(&obj(
                json!({"namespace": "demo", "name": "a\u{0}b"})
            )))
            .contains("control")
        );
        assert!(refused(files_args(&obj(json!({"folderPrefix": "a/"})))).contains("namespace"));
        assert!(
            refused(files_args(&obj(json!({"namespace": "demo", "query": "x"}))))
                .contains("unknown field `query`")
        );
    }

    #[test]
    fn file_selects_exactly_one_file() {
        use kg_proto::v1::query_file_request::Selector;
        let args = file_args(&obj(
            json!({"namespace": "demo", "path": "/reports/q3.csv"}),
        ))
        .unwrap();
        assert_eq!(args.selector, Selector::Path("reports/q3.csv".into()));
        assert_eq!((args.format.as_str(), args.max_rows), ("", 100));
        let args = file_args(&obj(
            json!({"namespace": "demo", "path": "@kg:demo/reports/q3.csv"}),
        ))
        .unwrap();
        assert_eq!(args.selector, Selector::Path("reports/q3.csv".into()));
        let args = file_args(&obj(
            json!({"namespace": "demo", "fileId": "f1", "path": ""}),
        ))
        .unwrap();
        assert_eq!(args.selector, Selector::FileId("f1".into()));

        assert_eq!(
            refused(file_args(&obj(
                json!({"namespace": "demo", "path": "a.csv", "fileId": "f1"})
            ))),
            "pass exactly one of path or fileId, not both"
        );
        assert!(
            refused(file_args(&obj(json!({"namespace": "demo"}))))
                .starts_with("pass exactly one of path or fileId")
        );
        assert!(
            refused(file_args(&obj(
                json!({"namespace": "demo", "path": "@kg:other/a.csv"})
            )))
            .contains("names namespace `other` but namespace is `demo`")
        );
        assert!(
            refused(file_args(&obj(
                json!({"namespace": "demo", "path": "@kg:demo"})
            )))
            .contains("@kg:<namespace>/<path>")
        );
        assert!(
            refused(file_args(&obj(
                json!({"namespace": "demo", "path": "a/../../etc/passwd"})
            )))
            .contains("path:")
        );
    }

    #[test]
    fn file_formats_need_what_they_read() {
        let base = |extra: Value| {
            let mut v = json!({"namespace": "demo", "path": "a.csv"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            obj(v)
        };
        let args = file_args(&base(
            json!({"format": "sql", "query": "SELECT 1", "maxRows": 1000}),
        ))
        .unwrap();
        assert_eq!(
            (args.format.as_str(), args.query.as_str(), args.max_rows),
            ("sql", "SELECT 1", 1000)
        );
        let args = file_args(&base(json!({"format": "text", "query": " ERROR"}))).unwrap();
        assert_eq!(args.query, " ERROR");
        let args = file_args(&base(
            json!({"format": "text", "startLine": 10, "endLine": 20}),
        ))
        .unwrap();
        assert_eq!(
            (args.start_line, args.end_line, args.query.as_str()),
            (Some(10), Some(20), "")
        );
        let args = file_args(&base(json!({"format": "text", "startLine": 5}))).unwrap();
        assert_eq!((args.start_line, args.end_line), (Some(5), None));
        for format in ["jsonpath", "jsonata", "jinja"] {
            file_args(&base(json!({"format": format, "query": "x"}))).unwrap();
        }

        assert_eq!(
            refused(file_args(&base(json!({"format": "sql"})))),
            "format sql needs query: one SELECT or WITH statement over the table data"
        );
        assert!(
            refused(file_args(&base(
                json!({"format": "jsonpath", "query": "  "})
            )))
            .contains("RFC 9535")
        );
        assert!(refused(file_args(&base(json!({"format": "jinja"})))).contains("data"));
        assert!(
            refused(file_args(&base(json!({"format": "text"})))).contains("startLine and endLine")
        );
        assert!(
            refused(file_args(&base(
                json!({"format": "text", "query": "x", "startLine": 1})
            )))
            .contains("not both")
        );
        assert!(
            refused(file_args(&base(
                json!({"format": "sql", "query": "SELECT 1", "startLine": 1})
            )))
            .contains("format text only")
        );
        assert!(
            refused(file_args(&base(json!({"query": "SELECT 1"}))))
                .contains("query needs a format")
        );
        assert!(refused(file_args(&base(json!({"startLine": 1})))).contains("format text only"));
        assert!(
            refused(file_args(&base(json!({"format": "xml", "query": "x"}))))
                .contains("unknown format `xml`")
        );
        assert!(
            refused(file_args(&base(json!({"format": "text", "startLine": 0})))).contains("from 1")
        );
        assert!(
            refused(file_args(&base(
                json!({"format": "text", "startLine": 9, "endLine": 3})
            )))
            .contains("before startLine")
        );
        assert!(
            refused(file_args(&base(
                json!({"format": "sql", "query": "SELECT 1", "maxRows": 1001})
            )))
            .contains("1000 (the hard max)")
        );
        assert!(
            refused(file_args(&base(
                json!({"format": "sql", "query": "SELECT 1", "maxRows": 0})
            )))
            .contains("maxRows")
        );
        let long = "x".repeat(MAX_FILE_QUERY_CHARS + 1);
        assert!(
            refused(file_args(&base(json!({"format": "text", "query": long}))))
                .contains("at most 16384")
        );
    }
}
