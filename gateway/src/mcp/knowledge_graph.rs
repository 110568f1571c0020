//! get_knowledge_graph: the Markdown link graph of a namespace's files (main,
//! a preview branch, a release or an environment). The files service scopes
//! it to the caller's access and selector before counting and paging; here
//! arguments are validated against the published schema, text is sanitised
//! and the answer is held under the result limit (links are cut first).

use kg_common::ErrorCode;
use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{
    CallerContext, CallerSelector, EnvironmentTarget, GetKnowledgeGraphRequest,
    GetKnowledgeGraphResponse, GraphFilters, LookupTarget, PreviewBranchTarget, ReleaseTarget,
    SelectorList, SelectorMap, caller_selector, environment_target, lookup_target, release_target,
};
use serde_json::{Map, Value, json};

use super::registry::{ToolEntry, ToolKind};
use super::tools::require_readable;
use super::wire_len;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// The limits of the published schema (the service enforces them too).
const MAX_LIMIT: i64 = 200;
const DEFAULT_LIMIT: i64 = 100;
const MAX_DEPTH: i64 = 3;
const MAX_PATH_CHARS: usize = 1024;
const MAX_SELECTOR_CHARS: usize = 4096;
const MAX_SELECTOR_ITEMS: usize = 1024;
const MAX_NAME_CHARS: usize = 255;
const MAX_SEARCH_CHARS: usize = 256;
const MAX_TYPE_CHARS: usize = 128;
const MAX_TAGS: usize = 64;
const MAX_CURSOR_CHARS: usize = 2048;
/// Links of all three kinds in one answer, as the files service caps them.
const MAX_LINKS: usize = 2000;
/// Largest answer as JSON text; over it the call fails (REST 413, MCP PAYLOAD_TOO_LARGE).
const MAX_GRAPH_BYTES: usize = 512 * 1024;
/// Cap on a path, title, tag or URL in the answer.
const FIELD_CAP: usize = 2048;

pub(crate) const DESCRIPTION: &str = "Read the link graph of a namespace's files: visible knowledge files are nodes \
(file_id, file_version_id, path, title, type, tags, reserved), Markdown document links between them are edges \
(source/target file_version_id and the link's ordinal in the source), external_links are URLs and broken_links are internal \
links to a path with no readable file. Use it to find related files, then kg_file or kg_open to read them. \
project_reference is the namespace (see kg_namespaces); it may be omitted when you read exactly one. \
Give root_path or root_file_version_id with max_depth (0-3 link hops followed forward from the root, default 1) for a neighbourhood, \
or omit the root to read the whole visible set. filters.search matches title or path (case-insensitive), filters.type the document type, \
filters.tags needs every tag. Paged by nodes: pagination.limit 1-200 (default 100); pass page_info.next back as pagination.cursor \
with the same other arguments until it is null. total_nodes counts every page; partial is true while more pages exist or links were cut \
(links_truncated: over 2000 links or the byte budget). caller_selector narrows the scope and never widens your access: true (everything), \
false (nothing), a path, a folder ending in / or a glob, a list of those, or an object {selector: true to include, false to exclude}. \
Files you may not read never appear as nodes, edges or counts, and links into folders you may not read are left out whole; \
a file denied to you by its id reads as missing, so a link to it is broken exactly as a link to no file is. lookup_target reads a preview branch \
{kind: preview_branch, branch_id}, a release {kind: release, release_id or release_version} or the release deployed to an environment \
{kind: environment, environment_id or environment_name}; omit it for the main branch. Unresolved targets and roots are not_found. \
A result over 512 KiB of JSON fails with PAYLOAD_TOO_LARGE, and so does one whose MCP result passes about 1 MiB (it carries the JSON twice, \
as structuredContent and escaped as text): narrow it with root_path, max_depth, filters or pagination.limit.";

/// The registry entry (read-only, idempotent, closed world).
pub(crate) fn tool_entry(
    entry: impl Fn(ToolKind, &'static str, &str, &'static str, Value, Value) -> ToolEntry,
) -> ToolEntry {
    entry(
        ToolKind::KnowledgeGraph,
        "get_knowledge_graph",
        "Read the link graph of files",
        DESCRIPTION,
        input_schema(),
        output_schema(),
    )
}

fn uuid_schema(description: &str) -> Value {
    json!({"type": "string", "format": "uuid", "description": description})
}

/// The input schema (the published one, plus `namespace` as an alias of
/// `project_reference` like every other kgmesh tool).
pub(crate) fn input_schema() -> Value {
    let selector_string = json!({"type": "string", "minLength": 1, "maxLength": MAX_SELECTOR_CHARS,
        "description": "A path, a folder ending in / or a glob (*, **, ?, [..])."});
    json!({
        "type": "object",
        "properties": {
            "lookup_target": {
                "anyOf": [
                    {"type": "object", "properties": {
                        "kind": {"type": "string", "const": "preview_branch"},
                        "branch_id": {"anyOf": [uuid_schema("Branch identifier."), {"type": "null"}],
                                      "description": "Branch to read. Omit or use null for the main branch (the default)."}
                     }, "required": ["kind"], "additionalProperties": false,
                     "description": "Read a working branch, the default scope when lookup_target is omitted."},
                    {"type": "object", "properties": {
                        "kind": {"type": "string", "const": "environment"},
                        "environment_id": uuid_schema("ID of the environment whose deployed release to read."),
                        "environment_name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS,
                                             "description": "Name of the environment (for example \"production\")."}
                     }, "required": ["kind"], "additionalProperties": false,
                     "description": "Read the release currently deployed to an environment. Provide environment_id or environment_name."},
                    {"type": "object", "properties": {
                        "kind": {"type": "string", "const": "release"},
                        "release_id": uuid_schema("ID of the release to read."),
                        "release_version": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS,
                                            "description": "Version string of the release, e.g. v1.2.0."}
                     }, "required": ["kind"], "additionalProperties": false,
                     "description": "Read a published release. Provide release_id or release_version."}
                ],
                "description": "Omit to read the main branch. Unresolved targets are not_found."
            },
            "caller_selector": {
                "anyOf": [
                    {"type": "boolean", "description": "true: everything you may read; false: nothing."},
                    selector_string,
                    {"type": "array", "items": selector_string, "maxItems": MAX_SELECTOR_ITEMS, "description": "A union of selectors."},
                    {"type": "object", "additionalProperties": {"type": "boolean"},
                     "description": "selector -> true (include) / false (exclude); with no true entry everything readable is included first."}
                ],
                "description": "Caller-selected document scope, intersected with your access before pagination and counting."
            },
            "root_file_version_id": uuid_schema("The root node's file_version_id."),
            "root_path": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS, "description": "The root file's path."},
            "max_depth": {"type": "integer", "minimum": 0, "maximum": MAX_DEPTH,
                          "description": "Link hops from the root, 0 to 3 (default 1); omit the root to read the whole visible set. \
    Responses over 512 KiB fail with PAYLOAD_TOO_LARGE: narrow with root_path, max_depth, filters or pagination.limit."},
            "filters": {
                "type": "object",
                "properties": {
                    "search": {"type": "string", "minLength": 1, "maxLength": MAX_SEARCH_CHARS,
                               "description": "Case-insensitive title or path search within the authorized scope."},
                    "type": {"type": "string", "minLength": 1, "maxLength": MAX_TYPE_CHARS, "description": "Document type (case-insensitive)."},
                    "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": MAX_TYPE_CHARS},
                             "maxItems": MAX_TAGS, "description": "Every tag must be present."}
                },
                "additionalProperties": false
            },
            "pagination": {
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT,
                              "description": "Most nodes to return."},
                    "cursor": {"type": "string", "minLength": 1, "maxLength": MAX_CURSOR_CHARS,
                               "description": "page_info.next from the previous response."}
                },
                "additionalProperties": false
            },
            "project_reference": {"type": "string", "minLength": 1, "description": "The namespace whose knowledge is read; may be omitted when you read exactly one."},
            "namespace": {"type": "string", "minLength": 1, "description": "Same as project_reference."}
        },
        "additionalProperties": false
    })
}

/// The output schema, as published.
pub(crate) fn output_schema() -> Value {
    let uuid = json!({"type": "string", "format": "uuid"});
    let ordinal = json!({"type": "integer", "minimum": 0});
    json!({
        "type": "object",
        "properties": {
            "nodes": {"type": "array", "maxItems": MAX_LIMIT, "items": {
                "type": "object",
                "properties": {
                    "file_id": uuid, "file_version_id": uuid, "path": {"type": "string"},
                    "title": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "type": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "reserved": {"type": "boolean", "description": "A path segment starts with _ or . (index, config, system files)."}
                },
                "required": ["file_id", "file_version_id", "path", "title", "type", "tags", "reserved"],
                "additionalProperties": false
            }, "description": "Visible knowledge files as nodes."},
            "edges": {"type": "array", "maxItems": MAX_LINKS, "items": {
                "type": "object",
                "properties": {"source_file_version_id": uuid, "target_file_version_id": uuid, "ordinal": ordinal},
                "required": ["source_file_version_id", "target_file_version_id", "ordinal"],
                "additionalProperties": false
            }},
            "external_links": {"type": "array", "maxItems": MAX_LINKS, "items": {
                "type": "object",
                "properties": {"source_file_version_id": uuid, "ordinal": ordinal, "url": {"type": "string"}},
                "required": ["source_file_version_id", "ordinal", "url"],
                "additionalProperties": false
            }},
            "broken_links": {"type": "array", "maxItems": MAX_LINKS, "items": {
                "type": "object",
                "properties": {"source_file_version_id": uuid, "ordinal": ordinal, "target_path": {"type": "string"}},
                "required": ["source_file_version_id", "ordinal", "target_path"],
                "additionalProperties": false
            }},
            "returned_nodes": {"type": "integer", "minimum": 0},
            "total_nodes": {"type": "integer", "minimum": 0},
            "partial": {"type": "boolean"},
            "links_truncated": {"type": "boolean", "description": "True when the combined link count or byte budget omits links."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
            "page_info": {
                "type": "object",
                "properties": {
                    "self": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Cursor supplied on this request, if any."},
                    "first": {"type": "object", "description": "Reserved; a first-page cursor is not emitted."},
                    "next": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Cursor for the next page, or null on the last page."},
                    "prev": {"type": "object", "description": "Reserved; a previous-page cursor is not emitted."}
                },
                "required": ["self", "first", "next", "prev"],
                "additionalProperties": false
            }
        },
        "required": ["nodes", "edges", "external_links", "broken_links", "returned_nodes", "total_nodes",
                     "partial", "links_truncated", "limit", "page_info"],
        "additionalProperties": false
    })
}

fn invalid(message: impl Into<String>) -> ClientError {
    ClientError::invalid(message)
}

fn string_in(name: &str, value: &Value, max: usize) -> Result<String, ClientError> {
    match value.as_str() {
        Some(s)
            if !s.is_empty() && s.chars().count() <= max && !s.chars().any(char::is_control) =>
        {
            Ok(s.to_owned())
        }
        _ => Err(invalid(format!(
            "{name} must be a string of 1-{max} characters"
        ))),
    }
}

fn uuid_in(name: &str, value: &Value) -> Result<String, ClientError> {
    value
        .as_str()
        .filter(|s| uuid::Uuid::parse_str(s).is_ok())
        .map(str::to_owned)
        .ok_or_else(|| invalid(format!("{name} must be a UUID")))
}

fn int_in(name: &str, value: &Value, min: i64, max: i64) -> Result<u32, ClientError> {
    value
        .as_i64()
        .filter(|v| (min..=max).contains(v))
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| invalid(format!("{name} must be a whole number from {min} to {max}")))
}

/// Only the listed keys may appear in `object`.
fn closed(name: &str, object: &Map<String, Value>, allowed: &[&str]) -> Result<(), ClientError> {
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(invalid(format!(
            "{name}: unknown field `{}`; allowed: {}",
            k.chars().take(64).collect::<String>(),
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

fn lookup_target(value: &Value) -> Result<LookupTarget, ClientError> {
    let Some(object) = value.as_object() else {
        return Err(invalid("lookup_target must be an object with kind"));
    };
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let one_of = |a: &str, b: &str| -> Result<(), ClientError> {
        match (object.get(a), object.get(b)) {
            (Some(_), Some(_)) => Err(invalid(format!("lookup_target: pass {a} or {b}, not both"))),
            (None, None) => Err(invalid(format!(
                "lookup_target of kind {kind} needs {a} or {b}"
            ))),
            _ => Ok(()),
        }
    };
    let kind = match kind {
        "preview_branch" => {
            closed("lookup_target", object, &["kind", "branch_id"])?;
            let branch_id = match object.get("branch_id") {
                None | Some(Value::Null) => String::new(),
                Some(v) => uuid_in("lookup_target.branch_id", v)?,
            };
            lookup_target::Kind::PreviewBranch(PreviewBranchTarget {
                branch_id,
                branch_name: String::new(),
            })
        }
        "environment" => {
            closed(
                "lookup_target",
                object,
                &["kind", "environment_id", "environment_name"],
            )?;
            one_of("environment_id", "environment_name")?;
            let selector = match (object.get("environment_id"), object.get("environment_name")) {
                (Some(id), _) => environment_target::Selector::EnvironmentId(uuid_in(
                    "lookup_target.environment_id",
                    id,
                )?),
                (None, Some(name)) => environment_target::Selector::EnvironmentName(string_in(
                    "lookup_target.environment_name",
                    name,
                    MAX_NAME_CHARS,
                )?),
                (None, None) => {
                    return Err(invalid(
                        "lookup_target needs environment_id or environment_name",
                    ));
                }
            };
            lookup_target::Kind::Environment(EnvironmentTarget {
                selector: Some(selector),
            })
        }
        "release" => {
            closed(
                "lookup_target",
                object,
                &["kind", "release_id", "release_version"],
            )?;
            one_of("release_id", "release_version")?;
            let selector = match (object.get("release_id"), object.get("release_version")) {
                (Some(id), _) => {
                    release_target::Selector::ReleaseId(uuid_in("lookup_target.release_id", id)?)
                }
                (None, Some(v)) => release_target::Selector::ReleaseVersion(string_in(
                    "lookup_target.release_version",
                    v,
                    MAX_NAME_CHARS,
                )?),
                (None, None) => {
                    return Err(invalid("lookup_target needs release_id or release_version"));
                }
            };
            lookup_target::Kind::Release(ReleaseTarget {
                selector: Some(selector),
            })
        }
        _ => {
            return Err(invalid(
                "lookup_target.kind must be preview_branch, environment or release",
            ));
        }
    };
    Ok(LookupTarget { kind: Some(kind) })
}

fn caller_selector(value: &Value) -> Result<CallerSelector, ClientError> {
    let item = |v: &Value| string_in("caller_selector entry", v, MAX_SELECTOR_CHARS);
    let form = match value {
        Value::Bool(b) => caller_selector::Form::All(*b),
        Value::String(_) => caller_selector::Form::Selector(item(value)?),
        Value::Array(items) => {
            if items.len() > MAX_SELECTOR_ITEMS {
                return Err(invalid(format!(
                    "caller_selector has more than {MAX_SELECTOR_ITEMS} entries"
                )));
            }
            caller_selector::Form::AnyOf(SelectorList {
                selectors: items.iter().map(item).collect::<Result<_, _>>()?,
            })
        }
        Value::Object(map) => {
            if map.len() > MAX_SELECTOR_ITEMS {
                return Err(invalid(format!(
                    "caller_selector has more than {MAX_SELECTOR_ITEMS} entries"
                )));
            }
            let mut entries = std::collections::HashMap::new();
            for (k, v) in map {
                let include = v.as_bool().ok_or_else(|| {
                    invalid("caller_selector object values must be true or false")
                })?;
                entries.insert(item(&Value::String(k.clone()))?, include);
            }
            caller_selector::Form::Map(SelectorMap { entries })
        }
        _ => {
            return Err(invalid(
                "caller_selector must be a boolean, a string, a list of strings or an object of booleans",
            ));
        }
    };
    Ok(CallerSelector { form: Some(form) })
}

fn filters(value: &Value) -> Result<GraphFilters, ClientError> {
    let Some(object) = value.as_object() else {
        return Err(invalid("filters must be an object"));
    };
    closed("filters", object, &["search", "type", "tags"])?;
    let mut out = GraphFilters::default();
    if let Some(v) = object.get("search") {
        out.search = string_in("filters.search", v, MAX_SEARCH_CHARS)?;
    }
    if let Some(v) = object.get("type") {
        out.r#type = string_in("filters.type", v, MAX_TYPE_CHARS)?;
    }
    if let Some(v) = object.get("tags") {
        let tags = v
            .as_array()
            .ok_or_else(|| invalid("filters.tags must be a list of strings"))?;
        if tags.len() > MAX_TAGS {
            return Err(invalid(format!(
                "filters.tags has more than {MAX_TAGS} tags"
            )));
        }
        out.tags = tags
            .iter()
            .map(|t| string_in("filters.tags entry", t, MAX_TYPE_CHARS))
            .collect::<Result<_, _>>()?;
    }
    Ok(out)
}

/// Validates the arguments into a request; the namespace comes from
/// `project_reference` (or `namespace`), else the caller's only namespace.
pub(crate) fn request(
    context: &CallerContext,
    args: &Map<String, Value>,
) -> Result<GetKnowledgeGraphRequest, ClientError> {
    closed(
        "arguments",
        args,
        &[
            "lookup_target",
            "caller_selector",
            "root_file_version_id",
            "root_path",
            "max_depth",
            "filters",
            "pagination",
            "project_reference",
            "namespace",
        ],
    )?;
    let reference = args
        .get("project_reference")
        .or_else(|| args.get("namespace"));
    if let (Some(a), Some(b)) = (args.get("project_reference"), args.get("namespace"))
        && a != b
    {
        return Err(invalid(
            "project_reference and namespace disagree; pass one",
        ));
    }
    let namespace = match reference {
        Some(v) => {
            let ns = string_in("project_reference", v, 63)?;
            kg_common::access::validate_namespace(&ns)
                .map_err(|e| invalid(format!("project_reference: {e}")))?;
            ns
        }
        None => match context.access.as_slice() {
            [only] => only.namespace.clone(),
            _ => {
                return Err(invalid(
                    "pass project_reference: the namespace to read (see kg_namespaces)",
                ));
            }
        },
    };
    let mut request = GetKnowledgeGraphRequest {
        namespace,
        ..Default::default()
    };
    if let Some(v) = args.get("lookup_target").filter(|v| !v.is_null()) {
        request.lookup_target = Some(lookup_target(v)?);
    }
    if let Some(v) = args.get("caller_selector").filter(|v| !v.is_null()) {
        request.caller_selector = Some(caller_selector(v)?);
    }
    if let Some(v) = args.get("root_file_version_id") {
        request.root_file_version_id = uuid_in("root_file_version_id", v)?;
    }
    if let Some(v) = args.get("root_path") {
        request.root_path = string_in("root_path", v, MAX_PATH_CHARS)?;
    }
    if !request.root_path.is_empty() && !request.root_file_version_id.is_empty() {
        return Err(invalid("pass root_path or root_file_version_id, not both"));
    }
    if let Some(v) = args.get("max_depth") {
        request.max_depth = Some(int_in("max_depth", v, 0, MAX_DEPTH)?);
    }
    if let Some(v) = args.get("filters") {
        request.filters = Some(filters(v)?);
    }
    if let Some(v) = args.get("pagination") {
        let object = v
            .as_object()
            .ok_or_else(|| invalid("pagination must be an object"))?;
        closed("pagination", object, &["limit", "cursor"])?;
        if let Some(l) = object.get("limit") {
            request.limit = int_in("pagination.limit", l, 1, MAX_LIMIT)?;
        }
        if let Some(c) = object.get("cursor") {
            request.cursor = string_in("pagination.cursor", c, MAX_CURSOR_CHARS)?;
        }
    }
    Ok(request)
}

fn clean(text: &str) -> Value {
    Value::String(sanitize_text(text, FIELD_CAP))
}

fn nullable(text: Option<&str>) -> Value {
    text.map_or(Value::Null, clean)
}

fn cursor_value(cursor: &str) -> Value {
    if cursor.is_empty() {
        Value::Null
    } else {
        Value::String(cursor.to_owned())
    }
}

/// The answer in the published shape, sanitised.
pub(crate) fn result_json(response: &GetKnowledgeGraphResponse) -> Value {
    let nodes: Vec<Value> = response
        .nodes
        .iter()
        .map(|n| {
            json!({
                "file_id": n.file_id, "file_version_id": n.file_version_id, "path": clean(&n.path),
                "title": nullable(n.title.as_deref()), "type": nullable(n.r#type.as_deref()),
                "tags": n.tags.iter().map(|t| clean(t)).collect::<Vec<_>>(), "reserved": n.reserved,
            })
        })
        .collect();
    let edges: Vec<Value> = response
        .edges
        .iter()
        .map(|e| json!({"source_file_version_id": e.source_file_version_id, "target_file_version_id": e.target_file_version_id, "ordinal": e.ordinal}))
        .collect();
    let external: Vec<Value> = response
        .external_links
        .iter()
        .map(|e| json!({"source_file_version_id": e.source_file_version_id, "ordinal": e.ordinal, "url": clean(&e.url)}))
        .collect();
    let broken: Vec<Value> = response
        .broken_links
        .iter()
        .map(|e| json!({"source_file_version_id": e.source_file_version_id, "ordinal": e.ordinal, "target_path": clean(&e.target_path)}))
        .collect();
    json!({
        "nodes": nodes,
        "edges": edges,
        "external_links": external,
        "broken_links": broken,
        "returned_nodes": response.returned_nodes,
        "total_nodes": response.total_nodes,
        "partial": response.partial,
        "links_truncated": response.links_truncated,
        "limit": response.limit.max(1),
        "page_info": {
            "self": cursor_value(&response.self_cursor),
            "first": {},
            "next": cursor_value(&response.next_cursor),
            "prev": {},
        },
    })
}

/// What to narrow, said by every PAYLOAD_TOO_LARGE of this tool.
const NARROW: &str = "narrow it with root_path or root_file_version_id and a lower max_depth, filters (search, type, tags) \
                      or a lower pagination.limit";

fn too_large(bytes: usize, wire: Option<(usize, usize)>) -> ClientError {
    let message = match wire {
        // The JSON fits 512 KiB, but an MCP result carries it twice (structuredContent, and
        // the same JSON escaped as text), and one MCP response holds at most about 1 MiB.
        Some((wire, limit)) => format!(
            "the knowledge graph page is {bytes} bytes of JSON, {wire} bytes as an MCP result (which carries it twice: \
             as structuredContent and escaped as text), over the {limit}-byte limit of one MCP response; {NARROW}"
        ),
        None => format!(
            "the knowledge graph page is {bytes} bytes, over the {MAX_GRAPH_BYTES}-byte (512 KiB) limit; {NARROW}"
        ),
    };
    ClientError::new(ErrorCode::PayloadTooLarge, message)
}

/// Holds `value` to the link cap (whatever the files service sent), then under the 512 KiB
/// payload and `wire_limit`, the bytes the result may take on the MCP wire (`None` over
/// REST, where it travels once): links go first (last list first), then the call fails.
pub(crate) fn fit(mut value: Value, wire_limit: Option<usize>) -> Result<Value, ClientError> {
    let mut room = MAX_LINKS;
    let mut capped = false;
    for list in ["edges", "external_links", "broken_links"] {
        if let Some(items) = value.get_mut(list).and_then(Value::as_array_mut) {
            capped |= items.len() > room;
            items.truncate(room);
            room -= items.len();
        }
    }
    if capped {
        value["links_truncated"] = Value::Bool(true);
        value["partial"] = Value::Bool(true);
    }
    let fits = |v: &Value| {
        v.to_string().len() <= MAX_GRAPH_BYTES
            && wire_limit.is_none_or(|limit| wire_len(v) <= limit)
    };
    while !fits(&value) {
        let mut cut = false;
        for list in ["broken_links", "external_links", "edges"] {
            if let Some(items) = value.get_mut(list).and_then(Value::as_array_mut)
                && !items.is_empty()
            {
                let keep = items.len() / 2;
                items.truncate(keep);
                cut = true;
                break;
            }
        }
        if !cut {
            let bytes = value.to_string().len();
            let wire = wire_limit
                .filter(|_| bytes <= MAX_GRAPH_BYTES)
                .map(|limit| (wire_len(&value), limit));
            return Err(too_large(bytes, wire));
        }
        value["links_truncated"] = Value::Bool(true);
        value["partial"] = Value::Bool(true);
    }
    Ok(value)
}

/// Runs get_knowledge_graph; `wire_limit` as in [`fit`].
pub(crate) async fn run(
    state: &GatewayState,
    caller: &Caller,
    args: &Map<String, Value>,
    wire_limit: Option<usize>,
) -> Result<Value, ClientError> {
    let request = request(caller.context(), args)?;
    require_readable(caller.context(), &request.namespace)?;
    let response = state
        .backends
        .files
        .clone()
        .get_knowledge_graph(caller.request(request))
        .await
        .map_err(|status| ClientError::from_status("files", &status))?
        .into_inner();
    fit(result_json(&response), wire_limit)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::mcp::MAX_RESULT_BYTES;
    use crate::mcp::registry::check_schema;
    use kg_proto::v1::{AccessFilter, GraphBrokenLink, GraphEdge, GraphNode};

    fn context(namespaces: &[&str]) -> CallerContext {
        CallerContext {
            access: namespaces
                .iter()
                .map(|ns| AccessFilter {
                    namespace: (*ns).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    const ID: &str = "0190a0a0-0000-7000-8000-000000000001";

    #[test]
    fn every_argument_form_is_accepted_and_mapped() {
        let ctx = context(&["docs"]);
        let r = request(&ctx, &args(json!({}))).unwrap();
        assert_eq!(r.namespace, "docs", "the only namespace is the default");
        assert!(request(&context(&["a", "b"]), &args(json!({}))).is_err());

        let full = json!({
            "project_reference": "docs",
            "lookup_target": {"kind": "release", "release_version": "v1.2.0"},
            "caller_selector": {"guides/": true, "guides/old/": false},
            "root_path": "guides/a.md", "max_depth": 3,
            "filters": {"search": "intro", "type": "guide", "tags": ["core"]},
            "pagination": {"limit": 200, "cursor": "abc"}
        });
        check_schema(&input_schema(), &full, "$").unwrap();
        let r = request(&ctx, &args(full)).unwrap();
        assert_eq!(r.max_depth, Some(3));
        assert_eq!((r.limit, r.cursor.as_str()), (200, "abc"));
        assert_eq!(r.filters.as_ref().unwrap().tags, ["core"]);
        let Some(caller_selector::Form::Map(map)) = r.caller_selector.unwrap().form else {
            panic!("map form");
        };
        assert_eq!(map.entries.get("guides/old/"), Some(&false));
        assert!(matches!(
            r.lookup_target.unwrap().kind,
            Some(lookup_target::Kind::Release(ReleaseTarget {
                selector: Some(release_target::Selector::ReleaseVersion(_))
            }))
        ));

        for (selector, check) in [
            (json!(true), "All(true)"),
            (json!(false), "All(false)"),
            (json!("a.md"), "Selector"),
            (json!(["a.md", "b/"]), "AnyOf"),
        ] {
            let r = request(&ctx, &args(json!({"caller_selector": selector}))).unwrap();
            let form = format!("{:?}", r.caller_selector.unwrap().form.unwrap());
            assert!(form.starts_with(check), "{form}");
        }
        for target in [
            json!({"kind": "preview_branch"}),
            json!({"kind": "preview_branch", "branch_id": null}),
            json!({"kind": "preview_branch", "branch_id": ID}),
            json!({"kind": "environment", "environment_name": "production"}),
            json!({"kind": "environment", "environment_id": ID}),
            json!({"kind": "release", "release_id": ID}),
        ] {
            check_schema(&input_schema(), &json!({"lookup_target": target}), "$").unwrap();
            request(&ctx, &args(json!({"lookup_target": target}))).unwrap();
        }
    }

    #[test]
    fn bad_arguments_are_refused_with_what_to_change() {
        let ctx = context(&["docs"]);
        for bad in [
            json!({"max_depth": 4}),
            json!({"max_depth": -1}),
            json!({"pagination": {"limit": 0}}),
            json!({"pagination": {"limit": 201}}),
            json!({"pagination": {"cursor": ""}}),
            json!({"pagination": {"page": 2}}),
            json!({"root_path": ""}),
            json!({"root_path": "x".repeat(1025)}),
            json!({"root_file_version_id": "nope"}),
            json!({"root_path": "a.md", "root_file_version_id": ID}),
            json!({"filters": {"search": ""}}),
            json!({"filters": {"tags": vec!["t"; 65]}}),
            json!({"filters": {"owner": "x"}}),
            json!({"caller_selector": 3}),
            json!({"caller_selector": ""}),
            json!({"caller_selector": {"a.md": "yes"}}),
            json!({"lookup_target": {"kind": "tag"}}),
            json!({"lookup_target": {"kind": "release"}}),
            json!({"lookup_target": {"kind": "release", "release_id": ID, "release_version": "v1"}}),
            json!({"lookup_target": {"kind": "environment", "environment_id": "prod"}}),
            json!({"lookup_target": {"kind": "preview_branch", "branch_id": "main"}}),
            json!({"project_reference": "Bad NS"}),
            json!({"project_reference": "a", "namespace": "b"}),
            json!({"bogus": 1}),
        ] {
            let err = request(&ctx, &args(bad.clone())).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArgument, "{bad}");
        }
    }

    /// Each length and count cap of the input schema: accepted at the cap, refused one past it
    /// with the argument's name, and the schema says the same.
    #[test]
    fn every_cap_holds_exactly_at_its_limit() {
        /// The argument named in the error, the arguments with a value of a given size, the cap.
        type Cap = (&'static str, fn(usize) -> Value, usize);
        fn text(n: usize) -> String {
            "x".repeat(n)
        }
        fn entries(n: usize) -> Vec<&'static str> {
            vec!["a.md"; n]
        }
        let ctx = context(&["docs"]);
        let cases: [Cap; 11] = [
            (
                "caller_selector entry",
                |n| json!({"caller_selector": text(n)}),
                MAX_SELECTOR_CHARS,
            ),
            (
                "caller_selector entry",
                |n| json!({"caller_selector": [text(n)]}),
                MAX_SELECTOR_CHARS,
            ),
            (
                "caller_selector",
                |n| json!({"caller_selector": entries(n)}),
                MAX_SELECTOR_ITEMS,
            ),
            (
                "environment_name",
                |n| json!({"lookup_target": {"kind": "environment", "environment_name": text(n)}}),
                MAX_NAME_CHARS,
            ),
            (
                "release_version",
                |n| json!({"lookup_target": {"kind": "release", "release_version": text(n)}}),
                MAX_NAME_CHARS,
            ),
            (
                "filters.search",
                |n| json!({"filters": {"search": text(n)}}),
                MAX_SEARCH_CHARS,
            ),
            (
                "filters.type",
                |n| json!({"filters": {"type": text(n)}}),
                MAX_TYPE_CHARS,
            ),
            (
                "filters.tags entry",
                |n| json!({"filters": {"tags": [text(n)]}}),
                MAX_TYPE_CHARS,
            ),
            (
                "filters.tags",
                |n| json!({"filters": {"tags": vec!["t"; n]}}),
                MAX_TAGS,
            ),
            (
                "pagination.cursor",
                |n| json!({"pagination": {"cursor": text(n)}}),
                MAX_CURSOR_CHARS,
            ),
            (
                "root_path",
                |n| json!({"root_path": text(n)}),
                MAX_PATH_CHARS,
            ),
        ];
        let map_of = |n: usize| {
            let entries: Map<String, Value> =
                (0..n).map(|i| (format!("d{i}/"), json!(true))).collect();
            json!({"caller_selector": entries})
        };
        for (name, make, cap) in cases {
            let at = make(cap);
            check_schema(&input_schema(), &at, "$").unwrap_or_else(|e| panic!("{name}: {e}"));
            request(&ctx, &args(at)).unwrap_or_else(|e| panic!("{name} at {cap}: {e:?}"));
            let over = make(cap + 1);
            assert!(
                check_schema(&input_schema(), &over, "$").is_err(),
                "{name}: schema"
            );
            let err = request(&ctx, &args(over)).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArgument, "{name}");
            assert!(err.message.contains(name), "{name}: {}", err.message);
        }
        request(&ctx, &args(map_of(MAX_SELECTOR_ITEMS))).unwrap();
        let err = request(&ctx, &args(map_of(MAX_SELECTOR_ITEMS + 1))).unwrap_err();
        assert!(err.message.contains("caller_selector"), "{}", err.message);
    }

    fn response(nodes: usize, links: usize, path_len: usize) -> GetKnowledgeGraphResponse {
        GetKnowledgeGraphResponse {
            nodes: (0..nodes)
                .map(|i| GraphNode {
                    file_id: ID.into(),
                    file_version_id: ID.into(),
                    path: format!("{i}{}", "p".repeat(path_len)),
                    title: (i % 2 == 0).then(|| format!("T\u{202e}itle{}", "x".repeat(path_len))),
                    r#type: None,
                    tags: vec!["t".into()],
                    reserved: false,
                })
                .collect(),
            edges: (0..links)
                .map(|i| GraphEdge {
                    source_file_version_id: ID.into(),
                    target_file_version_id: ID.into(),
                    ordinal: u32::try_from(i).unwrap(),
                })
                .collect(),
            broken_links: vec![GraphBrokenLink {
                source_file_version_id: ID.into(),
                ordinal: 0,
                target_path: "gone.md".into(),
            }],
            returned_nodes: u32::try_from(nodes).unwrap(),
            total_nodes: nodes as u64,
            limit: 100,
            next_cursor: "next".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_tool_is_registered_read_only() {
        let registry = crate::mcp::ToolRegistry::builtin();
        let entry = registry.get("get_knowledge_graph").unwrap();
        assert_eq!(entry.kind, ToolKind::KnowledgeGraph);
        let a = entry.tool.annotations.as_ref().unwrap();
        assert_eq!(
            (a.read_only_hint, a.destructive_hint, a.open_world_hint),
            (Some(true), Some(false), Some(false))
        );
        assert_eq!(
            entry.tool.input_schema.get("additionalProperties"),
            Some(&json!(false))
        );
    }

    #[test]
    fn results_match_the_output_schema_and_fit() {
        let value = result_json(&response(3, 2, 5));
        check_schema(&output_schema(), &value, "$").unwrap();
        assert_eq!(value["page_info"]["self"], Value::Null);
        assert_eq!(value["page_info"]["next"], json!("next"));
        assert_eq!(value["nodes"][1]["title"], Value::Null);
        assert_eq!(
            value["nodes"][0]["title"],
            json!("Titlexxxxx"),
            "bidi overrides are stripped"
        );
        let fitted = fit(value.clone(), Some(MAX_RESULT_BYTES)).unwrap();
        assert_eq!(fitted, value);

        // Links are cut to fit, and the answer says so.
        let big = result_json(&response(10, 20_000, 5));
        assert!(big.to_string().len() > MAX_GRAPH_BYTES);
        let fitted = fit(big, Some(MAX_RESULT_BYTES)).unwrap();
        assert!(fitted.to_string().len() <= MAX_GRAPH_BYTES);
        assert_eq!(fitted["links_truncated"], json!(true));
        assert_eq!(fitted["partial"], json!(true));
        assert_eq!(fitted["nodes"].as_array().unwrap().len(), 10);
        check_schema(&output_schema(), &fitted, "$").unwrap();

        // More links than the cap (a files service of another version): cut to it, and said.
        let many = result_json(&response(2, 2_500, 5));
        let links = |v: &Value| {
            ["edges", "external_links", "broken_links"]
                .iter()
                .map(|l| v[*l].as_array().map_or(0, Vec::len))
                .sum::<usize>()
        };
        assert!(links(&many) > MAX_LINKS);
        let fitted = fit(many, Some(MAX_RESULT_BYTES)).unwrap();
        assert_eq!(links(&fitted), MAX_LINKS);
        assert_eq!(fitted["links_truncated"], json!(true));
        check_schema(&output_schema(), &fitted, "$").unwrap();

        // Nodes alone over the limit: PAYLOAD_TOO_LARGE naming the ways to narrow.
        let err = fit(result_json(&response(200, 0, 2000)), Some(MAX_RESULT_BYTES)).unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        for way in ["root_path", "max_depth", "filters", "pagination.limit"] {
            assert!(err.message.contains(way), "{}", err.message);
        }
        assert!(
            err.message.contains("over the 524288-byte (512 KiB) limit"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_page_under_512_kib_fails_on_mcp_only_for_the_wire_and_says_so() {
        // Quotes in titles take two bytes each in the text copy of an MCP result.
        let mut value = result_json(&response(1, 0, 5));
        let node = value["nodes"][0].clone();
        let nodes: Vec<Value> = (0..600)
            .map(|i| {
                let mut n = node.clone();
                n["title"] = json!(format!("{i} \"quoted\" {}", "\"".repeat(300)));
                n
            })
            .collect();
        value["nodes"] = json!(nodes);
        let bytes = value.to_string().len();
        assert!(
            bytes <= MAX_GRAPH_BYTES && wire_len(&value) > MAX_RESULT_BYTES,
            "{bytes}"
        );

        let err = fit(value.clone(), Some(MAX_RESULT_BYTES)).unwrap_err();
        assert_eq!(err.code, ErrorCode::PayloadTooLarge);
        // The page as cut (no links left, marked partial): still under 512 KiB.
        let said: usize = err
            .message
            .strip_prefix("the knowledge graph page is ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(said <= MAX_GRAPH_BYTES, "{}", err.message);
        assert!(err.message.contains(" bytes of JSON, "), "{}", err.message);
        assert!(
            err.message.contains(&format!(
                "over the {MAX_RESULT_BYTES}-byte limit of one MCP response"
            )),
            "{}",
            err.message
        );
        // REST sends it once: the same page is answered whole.
        assert_eq!(fit(value.clone(), None).unwrap(), value);
    }
}
