//! Navigation tools: kg_hop, kg_ontology, kg_file_entities and kg_file_triples. Their
//! argument validation, handlers (one graph call each, with the signed caller context) and
//! the tool definitions the registry lists.

use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{
    FileEntitiesRequest, FileEntitiesResponse, FileTriplesRequest, FileTriplesResponse, HopKind,
    HopRequest, OntologyRequest, OntologyResponse, PackageCaps,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::args::{Int, OPEN_LIMIT, RawCaps, bounded, caps, key, namespace, parse, token_budget};
use super::registry::{
    ToolEntry, ToolKind, caps_input, namespace_input, packages_output, token_budget_input,
};
use super::tools::{packages_result, require_readable};
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// Hop kinds by their tool name, in listing order.
pub(crate) const HOP_KINDS: [(&str, HopKind); 9] = [
    ("next_chunk", HopKind::NextChunk),
    ("prev_chunk", HopKind::PrevChunk),
    ("similar", HopKind::Similar),
    ("mentions", HopKind::Mentions),
    ("rel", HopKind::Rel),
    ("same_type", HopKind::SameType),
    ("outline_child", HopKind::OutlineChild),
    ("outline_parent", HopKind::OutlineParent),
    ("outline_siblings", HopKind::OutlineSiblings),
];
/// Entities of one kg_file_entities page: default and hard maximum.
pub(crate) const FILE_ENTITIES_LIMIT: (u32, u32) = (50, 200);
/// Triples of one kg_file_triples page: default and hard maximum.
pub(crate) const FILE_TRIPLES_LIMIT: (u32, u32) = (50, 200);
/// Cap on names, labels and keys in results.
const FIELD_CAP: usize = 1024;

fn clean(text: &str) -> Value {
    Value::String(sanitize_text(text, FIELD_CAP))
}

// ---- arguments ---------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHop {
    namespace: String,
    from_key: String,
    kind: String,
    limit: Option<Int>,
    #[serde(default, deserialize_with = "super::args::nested_object")]
    caps: Option<RawCaps>,
    token_budget: Option<Int>,
}

/// Validated `kg_hop` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HopArgs {
    pub(crate) namespace: String,
    pub(crate) from_key: String,
    pub(crate) kind: HopKind,
    pub(crate) limit: u32,
    pub(crate) caps: PackageCaps,
    pub(crate) token_budget: Option<u32>,
}

/// Validates `kg_hop` arguments.
pub(crate) fn hop_args(args: &Map<String, Value>) -> Result<HopArgs, ClientError> {
    let raw: RawHop = parse(args)?;
    let kind = HOP_KINDS
        .iter()
        .find(|(name, _)| *name == raw.kind.trim())
        .map(|(_, kind)| *kind)
        .ok_or_else(|| {
            let names: Vec<&str> = HOP_KINDS.iter().map(|(n, _)| *n).collect();
            ClientError::invalid(format!(
                "kind `{}` is not a hop kind; use one of {}",
                sanitize_text(&raw.kind, 64),
                names.join(", ")
            ))
        })?;
    Ok(HopArgs {
        namespace: namespace("namespace", &raw.namespace)?,
        from_key: key("fromKey", &raw.from_key)?,
        kind,
        limit: bounded("limit", raw.limit, 1, OPEN_LIMIT.0, OPEN_LIMIT.1)?,
        caps: caps(raw.caps)?,
        token_budget: token_budget(raw.token_budget)?,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOntology {
    namespace: String,
}

/// Validates `kg_ontology` arguments: the namespace.
pub(crate) fn ontology_args(args: &Map<String, Value>) -> Result<String, ClientError> {
    let raw: RawOntology = parse(args)?;
    namespace("namespace", &raw.namespace)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFileEntities {
    namespace: String,
    file_id: String,
    limit: Option<Int>,
    after_entity_key: Option<String>,
}

/// Validates `kg_file_entities` arguments.
pub(crate) fn file_entities_args(
    args: &Map<String, Value>,
) -> Result<FileEntitiesRequest, ClientError> {
    let raw: RawFileEntities = parse(args)?;
    Ok(FileEntitiesRequest {
        namespace: namespace("namespace", &raw.namespace)?,
        file_id: key("fileId", &raw.file_id)?,
        limit: bounded(
            "limit",
            raw.limit,
            1,
            FILE_ENTITIES_LIMIT.0,
            FILE_ENTITIES_LIMIT.1,
        )?,
        after_entity_key: optional_key("afterEntityKey", raw.after_entity_key.as_deref())?,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFileTriples {
    namespace: String,
    file_id: String,
    limit: Option<Int>,
    after_source_entity_key: Option<String>,
    after_relation_type_id: Option<String>,
    after_target_entity_key: Option<String>,
}

/// Validates `kg_file_triples` arguments: the three `after*` fields come together.
pub(crate) fn file_triples_args(
    args: &Map<String, Value>,
) -> Result<FileTriplesRequest, ClientError> {
    let raw: RawFileTriples = parse(args)?;
    let request = FileTriplesRequest {
        namespace: namespace("namespace", &raw.namespace)?,
        file_id: key("fileId", &raw.file_id)?,
        limit: bounded(
            "limit",
            raw.limit,
            1,
            FILE_TRIPLES_LIMIT.0,
            FILE_TRIPLES_LIMIT.1,
        )?,
        after_source_entity_key: optional_key(
            "afterSourceEntityKey",
            raw.after_source_entity_key.as_deref(),
        )?,
        after_relation_type_id: optional_key(
            "afterRelationTypeId",
            raw.after_relation_type_id.as_deref(),
        )?,
        after_target_entity_key: optional_key(
            "afterTargetEntityKey",
            raw.after_target_entity_key.as_deref(),
        )?,
    };
    let given = [
        &request.after_source_entity_key,
        &request.after_relation_type_id,
        &request.after_target_entity_key,
    ]
    .iter()
    .filter(|v| !v.is_empty())
    .count();
    if given != 0 && given != 3 {
        return Err(ClientError::invalid(
            "pass afterSourceEntityKey, afterRelationTypeId and afterTargetEntityKey together \
             (copy them from continueAfter of the previous page), or none of them for the first page",
        ));
    }
    Ok(request)
}

/// An optional key: absent or blank is "", anything else must be a valid key.
fn optional_key(name: &str, value: Option<&str>) -> Result<String, ClientError> {
    match value.map(str::trim) {
        None | Some("") => Ok(String::new()),
        Some(v) => key(name, v),
    }
}

// ---- handlers ----------------------------------------------------------------

/// Runs one navigation tool.
pub(crate) async fn run(
    state: &GatewayState,
    caller: &Caller,
    kind: ToolKind,
    args: &Map<String, Value>,
) -> Result<Value, ClientError> {
    let graph_error = |status: tonic::Status| ClientError::from_status("graph", &status);
    let mut client = state.backends.graph.clone();
    match kind {
        ToolKind::Hop => {
            let args = hop_args(args)?;
            require_readable(caller.context(), &args.namespace)?;
            let response = client
                .hop(caller.request(HopRequest {
                    namespace: args.namespace,
                    from_key: args.from_key,
                    kind: args.kind as i32,
                    limit: args.limit,
                    caps: Some(args.caps),
                }))
                .await
                .map_err(graph_error)?
                .into_inner();
            Ok(packages_result(response, args.token_budget))
        }
        ToolKind::Ontology => {
            let namespace = ontology_args(args)?;
            require_readable(caller.context(), &namespace)?;
            let response = client
                .ontology(caller.request(OntologyRequest { namespace }))
                .await
                .map_err(graph_error)?
                .into_inner();
            Ok(ontology_result(&response))
        }
        ToolKind::FileEntities => {
            let request = file_entities_args(args)?;
            require_readable(caller.context(), &request.namespace)?;
            let file_id = request.file_id.clone();
            let response = client
                .file_entities(caller.request(request))
                .await
                .map_err(graph_error)?
                .into_inner();
            Ok(file_entities_result(&file_id, &response))
        }
        ToolKind::FileTriples => {
            let request = file_triples_args(args)?;
            require_readable(caller.context(), &request.namespace)?;
            let file_id = request.file_id.clone();
            let response = client
                .file_triples(caller.request(request))
                .await
                .map_err(graph_error)?
                .into_inner();
            Ok(file_triples_result(&file_id, &response))
        }
        other => Err(ClientError::invalid(format!(
            "{other:?} is not a navigation tool"
        ))),
    }
}

fn ontology_result(response: &OntologyResponse) -> Value {
    let entity_types: Vec<Value> = response
        .entity_types
        .iter()
        .map(|t| {
            json!({
                "typeId": clean(&t.type_id),
                "label": clean(&t.label),
                "aliases": t.aliases.iter().map(|a| clean(a)).collect::<Vec<_>>(),
                "side": clean(&t.side),
                "instances": t.instances.iter().map(|i| json!({
                    "name": clean(&i.name),
                    "aliases": i.aliases.iter().map(|a| clean(a)).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let relation_types: Vec<Value> = response
        .relation_types
        .iter()
        .map(|r| {
            json!({
                "relationTypeId": clean(&r.relation_type_id),
                "label": clean(&r.label),
                "sourceTypeId": clean(&r.source_type_id),
                "targetTypeId": clean(&r.target_type_id),
                "pattern": format!(
                    "(:{})-[:{}]->(:{})",
                    sanitize_text(&r.source_type_id, FIELD_CAP),
                    sanitize_text(&r.relation_type_id, FIELD_CAP),
                    sanitize_text(&r.target_type_id, FIELD_CAP)
                ),
            })
        })
        .collect();
    json!({
        "namespace": clean(&response.namespace),
        "published": response.published,
        "version": response.version,
        "publishedAtMs": response.published.then_some(response.published_at_ms),
        "entityTypes": entity_types,
        "relationTypes": relation_types,
    })
}

fn file_entities_result(file_id: &str, response: &FileEntitiesResponse) -> Value {
    let entities: Vec<Value> = response
        .entities
        .iter()
        .map(|e| {
            json!({
                "entityKey": clean(&e.entity_key),
                "name": clean(&e.name),
                "typeId": clean(&e.type_id),
                "typeLabel": clean(&e.type_label),
                "mentionCount": e.mention_count,
            })
        })
        .collect();
    let next = response
        .truncated
        .then(|| response.entities.last())
        .flatten()
        .map(|e| clean(&e.entity_key));
    json!({
        "fileId": clean(file_id),
        "entities": entities,
        "entityTypes": response.entity_types.iter()
            .map(|t| json!({"typeId": clean(&t.type_id), "label": clean(&t.label)}))
            .collect::<Vec<_>>(),
        "total": response.total.max(response.entities.len() as u64),
        "truncated": response.truncated,
        "nextAfterEntityKey": next,
    })
}

fn file_triples_result(file_id: &str, response: &FileTriplesResponse) -> Value {
    let triples: Vec<Value> = response
        .triples
        .iter()
        .map(|t| {
            json!({
                "sourceEntityKey": clean(&t.source_entity_key),
                "sourceName": clean(&t.source_name),
                "relationTypeId": clean(&t.relation_type_id),
                "targetEntityKey": clean(&t.target_entity_key),
                "targetName": clean(&t.target_name),
            })
        })
        .collect();
    let continue_after = response.continue_after.as_ref().map(|t| {
        json!({
            "afterSourceEntityKey": clean(&t.source_entity_key),
            "afterRelationTypeId": clean(&t.relation_type_id),
            "afterTargetEntityKey": clean(&t.target_entity_key),
        })
    });
    json!({
        "fileId": clean(file_id),
        "triples": triples,
        "total": response.total.max(response.triples.len() as u64),
        "truncated": response.truncated,
        "continueAfter": continue_after,
    })
}

// ---- tool definitions --------------------------------------------------------

const HOP_DESCRIPTION: &str = "Move from a key you hold to related chunk packages, by kind. From a chunkKey: next_chunk (the chunks after it in its file, in order), \
prev_chunk (the chunks before it, in order), similar (first chunks of files similar to the chunk's file). From an entityKey (ent:...) or a chunkKey \
(then: the entities that chunk mentions): mentions (other chunks mentioning the same entities, most shared first), rel (chunks mentioning entities \
related to them by a typed relation stated in a file you may read), same_type (chunks mentioning other entities of the same type). From an outlineKey: \
outline_child (first chunk of each subsection), outline_parent (the parent section's chunks), outline_siblings (first chunk of each sibling section). \
Returns {packages, total, truncated} in the kg_search package shape; limit defaults to 8 (hard max 32) and caps sets per-package list sizes. \
tokenBudget caps the returned text as in kg_search, reported in tokenBudget; trace.missingOffsets, when present, lists files indexed before character offsets existed. \
A chunk or section you cannot read is not_found; an entity no readable chunk mentions has no neighbours.";

const ONTOLOGY_DESCRIPTION: &str = "Read the published type box (TBox) of one namespace: its entity types (typeId, label, aliases, side) and relation types \
(relationTypeId, label, and the PATTERN endpoints sourceTypeId and targetTypeId, also shown as pattern \"(:Source)-[:REL]->(:Target)\"). \
Use it before kg_cypher or kg_file_triples to learn which typeId and relationTypeId values exist, instead of reading types off search hits. \
When nothing was published, published is false and both lists are empty. Needs read access to the namespace.";

const FILE_ENTITIES_DESCRIPTION: &str = "List the entities the chunks of one file mention, ordered by entityKey, with name, typeId, typeLabel and mentionCount, \
plus entityTypes (the types of those entities). Use it to see what was extracted from a file before editing the ontology or to pick an entityKey \
for kg_open or kg_hop. Paged: limit defaults to 50 (hard max 200); when truncated is true pass nextAfterEntityKey back as afterEntityKey. \
total counts the distinct entities the file's readable chunks mention. A file you cannot read is not_found.";

const FILE_TRIPLES_DESCRIPTION: &str = "List typed relation triples (sourceEntityKey -[relationTypeId]-> targetEntityKey, with names) where both the source and \
the target are mentioned in one file, counting only relations stated by files you may read. Ordered by (sourceEntityKey, relationTypeId, targetEntityKey). \
Paged: limit defaults to 50 (hard max 200); when truncated is true pass the three fields of continueAfter back as afterSourceEntityKey, afterRelationTypeId \
and afterTargetEntityKey (all three, or none for the first page). total counts every such triple. A file you cannot read is not_found.";

/// The four navigation tools, built with the registry's `entry` constructor.
pub(crate) fn entries(
    entry: impl Fn(ToolKind, &'static str, &str, &'static str, Value, Value) -> ToolEntry,
) -> Vec<ToolEntry> {
    vec![
        entry(
            ToolKind::Hop,
            "kg_hop",
            "Hop to related chunk packages",
            HOP_DESCRIPTION,
            hop_input(),
            packages_output(),
        ),
        entry(
            ToolKind::Ontology,
            "kg_ontology",
            "Read a namespace's published types",
            ONTOLOGY_DESCRIPTION,
            ontology_input(),
            ontology_output(),
        ),
        entry(
            ToolKind::FileEntities,
            "kg_file_entities",
            "List a file's entities",
            FILE_ENTITIES_DESCRIPTION,
            file_entities_input(),
            file_entities_output(),
        ),
        entry(
            ToolKind::FileTriples,
            "kg_file_triples",
            "List a file's relation triples",
            FILE_TRIPLES_DESCRIPTION,
            file_triples_input(),
            file_triples_output(),
        ),
    ]
}

fn hop_input() -> Value {
    let kinds: Vec<&str> = HOP_KINDS.iter().map(|(n, _)| *n).collect();
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "fromKey": {"type": "string", "minLength": 1,
                        "description": "Where to start: a chunkKey, an entityKey (ent:...) or an outlineKey, as the kind needs."},
            "kind": {"type": "string", "enum": kinds, "description": "Which relation to follow."},
            "limit": {"type": "integer", "minimum": 1, "maximum": OPEN_LIMIT.1, "default": OPEN_LIMIT.0,
                      "description": "Most packages to return (hard max 32)."},
            "caps": caps_input(),
            "tokenBudget": token_budget_input(),
        },
        "required": ["namespace", "fromKey", "kind"],
        "additionalProperties": false,
    })
}

fn ontology_input() -> Value {
    json!({
        "type": "object",
        "properties": {"namespace": namespace_input()},
        "required": ["namespace"],
        "additionalProperties": false,
    })
}

fn ontology_output() -> Value {
    let string = json!({"type": "string"});
    json!({
        "type": "object",
        "properties": {
            "namespace": string,
            "published": {"type": "boolean", "description": "False when the namespace has no published TBox."},
            "version": {"type": "integer"},
            "publishedAtMs": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "entityTypes": {"type": "array", "items": {"type": "object", "properties": {
                "typeId": string, "label": string, "aliases": {"type": "array", "items": string}, "side": string,
                "instances": {"type": "array", "items": {"type": "object", "properties": {
                    "name": string, "aliases": {"type": "array", "items": string}
                }, "required": ["name", "aliases"]}}
            }, "required": ["typeId", "label"]}},
            "relationTypes": {"type": "array", "items": {"type": "object", "properties": {
                "relationTypeId": string, "label": string, "sourceTypeId": string, "targetTypeId": string, "pattern": string
            }, "required": ["relationTypeId", "sourceTypeId", "targetTypeId"]}}
        },
        "required": ["namespace", "published", "entityTypes", "relationTypes"],
    })
}

fn file_entities_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "fileId": {"type": "string", "minLength": 1, "description": "The file, as fileId from kg_files or a package."},
            "limit": {"type": "integer", "minimum": 1, "maximum": FILE_ENTITIES_LIMIT.1, "default": FILE_ENTITIES_LIMIT.0,
                      "description": "Entities per page (hard max 200)."},
            "afterEntityKey": {"type": "string", "description": "nextAfterEntityKey of the previous page."},
        },
        "required": ["namespace", "fileId"],
        "additionalProperties": false,
    })
}

fn file_entities_output() -> Value {
    let string = json!({"type": "string"});
    let int = json!({"type": "integer"});
    json!({
        "type": "object",
        "properties": {
            "fileId": string,
            "entities": {"type": "array", "items": {"type": "object", "properties": {
                "entityKey": string, "name": string, "typeId": string, "typeLabel": string, "mentionCount": int
            }, "required": ["entityKey", "name", "typeId", "mentionCount"]}},
            "entityTypes": {"type": "array", "items": {"type": "object", "properties": {
                "typeId": string, "label": string
            }, "required": ["typeId", "label"]}},
            "total": int,
            "truncated": {"type": "boolean"},
            "nextAfterEntityKey": {"anyOf": [{"type": "string"}, {"type": "null"}]}
        },
        "required": ["fileId", "entities", "entityTypes", "total", "truncated", "nextAfterEntityKey"],
    })
}

fn file_triples_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "fileId": {"type": "string", "minLength": 1, "description": "The file, as fileId from kg_files or a package."},
            "limit": {"type": "integer", "minimum": 1, "maximum": FILE_TRIPLES_LIMIT.1, "default": FILE_TRIPLES_LIMIT.0,
                      "description": "Triples per page (hard max 200)."},
            "afterSourceEntityKey": {"type": "string", "description": "continueAfter.afterSourceEntityKey of the previous page."},
            "afterRelationTypeId": {"type": "string", "description": "continueAfter.afterRelationTypeId of the previous page."},
            "afterTargetEntityKey": {"type": "string", "description": "continueAfter.afterTargetEntityKey of the previous page."},
        },
        "required": ["namespace", "fileId"],
        "additionalProperties": false,
    })
}

fn file_triples_output() -> Value {
    let string = json!({"type": "string"});
    json!({
        "type": "object",
        "properties": {
            "fileId": string,
            "triples": {"type": "array", "items": {"type": "object", "properties": {
                "sourceEntityKey": string, "sourceName": string, "relationTypeId": string,
                "targetEntityKey": string, "targetName": string
            }, "required": ["sourceEntityKey", "relationTypeId", "targetEntityKey"]}},
            "total": {"type": "integer"},
            "truncated": {"type": "boolean"},
            "continueAfter": {"anyOf": [{"type": "object"}, {"type": "null"}], "properties": {
                "afterSourceEntityKey": string, "afterRelationTypeId": string, "afterTargetEntityKey": string
            }}
        },
        "required": ["fileId", "triples", "total", "truncated", "continueAfter"],
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::mcp::registry::check_schema;
    use kg_proto::v1::{EntityType, RelationType, Triple};

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn hop_arguments_are_checked_with_fixes() {
        let args = hop_args(&map(
            json!({"namespace": "demo", "fromKey": "ch_1", "kind": "rel"}),
        ))
        .unwrap();
        assert_eq!((args.kind, args.limit), (HopKind::Rel, 8));
        assert_eq!(args.caps.mentions, Some(8));
        let err = hop_args(&map(
            json!({"namespace": "demo", "fromKey": "ch_1", "kind": "sideways"}),
        ))
        .unwrap_err();
        assert!(err.message.contains("next_chunk") && err.message.contains("outline_siblings"));
        let err = hop_args(&map(
            json!({"namespace": "demo", "fromKey": "ch_1", "kind": "rel", "limit": 33}),
        ))
        .unwrap_err();
        assert!(err.message.contains("hard max"), "{}", err.message);
        let err = hop_args(&map(
            json!({"namespace": "demo", "fromKey": "ch_1", "kind": "rel", "caps": {"rel": 25}}),
        ))
        .unwrap_err();
        assert!(err.message.contains("caps.rel"), "{}", err.message);
        assert!(
            hop_args(&map(
                json!({"namespace": "demo", "fromKey": "", "kind": "rel"})
            ))
            .is_err()
        );
        assert!(
            hop_args(&map(
                json!({"namespace": "demo", "fromKey": "x", "kind": "rel", "extra": 1})
            ))
            .is_err()
        );
    }

    #[test]
    fn paging_arguments_come_together() {
        let r = file_entities_args(&map(
            json!({"namespace": "demo", "fileId": "f1", "afterEntityKey": "ent:a:b"}),
        ))
        .unwrap();
        assert_eq!((r.limit, r.after_entity_key.as_str()), (50, "ent:a:b"));
        assert!(
            file_entities_args(&map(
                json!({"namespace": "demo", "fileId": "f1", "limit": 201})
            ))
            .is_err()
        );
        let r = file_triples_args(&map(json!({"namespace": "demo", "fileId": "f1"}))).unwrap();
        assert!(r.after_source_entity_key.is_empty());
        let err = file_triples_args(&map(
            json!({"namespace": "demo", "fileId": "f1", "afterSourceEntityKey": "ent:a:b"}),
        ))
        .unwrap_err();
        assert!(err.message.contains("together"));
        let r = file_triples_args(&map(json!({"namespace": "demo", "fileId": "f1", "limit": 2,
            "afterSourceEntityKey": "ent:a:b", "afterRelationTypeId": "r", "afterTargetEntityKey": "ent:c:d"}))).unwrap();
        assert_eq!((r.limit, r.after_relation_type_id.as_str()), (2, "r"));
        assert_eq!(
            ontology_args(&map(json!({"namespace": "demo"}))).unwrap(),
            "demo"
        );
        assert!(ontology_args(&map(json!({"namespace": "Bad Name"}))).is_err());
    }

    #[test]
    fn results_match_their_output_schemas() {
        let ontology = ontology_result(&OntologyResponse {
            namespace: "demo".into(),
            published: true,
            version: 3,
            published_at_ms: 5,
            entity_types: vec![EntityType {
                type_id: "person".into(),
                label: "Person".into(),
                ..Default::default()
            }],
            relation_types: vec![RelationType {
                relation_type_id: "works_for".into(),
                source_type_id: "person".into(),
                target_type_id: "org".into(),
                ..Default::default()
            }],
        });
        check_schema(&ontology_output(), &ontology, "$").unwrap();
        assert_eq!(
            ontology["relationTypes"][0]["pattern"],
            "(:person)-[:works_for]->(:org)"
        );
        let empty = ontology_result(&OntologyResponse {
            namespace: "demo".into(),
            ..Default::default()
        });
        check_schema(&ontology_output(), &empty, "$").unwrap();
        assert_eq!(empty["publishedAtMs"], Value::Null);

        let entities = file_entities_result(
            "f1",
            &FileEntitiesResponse {
                entities: vec![kg_proto::v1::FileEntity {
                    entity_key: "ent:a:b".into(),
                    mention_count: 2,
                    ..Default::default()
                }],
                truncated: true,
                total: 4,
                ..Default::default()
            },
        );
        check_schema(&file_entities_output(), &entities, "$").unwrap();
        assert_eq!(entities["nextAfterEntityKey"], "ent:a:b");

        let triple = Triple {
            source_entity_key: "ent:a:x".into(),
            relation_type_id: "r".into(),
            target_entity_key: "ent:a:y".into(),
            ..Default::default()
        };
        let triples = file_triples_result(
            "f1",
            &FileTriplesResponse {
                triples: vec![triple.clone()],
                truncated: true,
                total: 2,
                continue_after: Some(triple),
            },
        );
        check_schema(&file_triples_output(), &triples, "$").unwrap();
        assert_eq!(triples["continueAfter"]["afterTargetEntityKey"], "ent:a:y");
        check_schema(&hop_input(), &json!({"namespace": "demo", "fromKey": "ch_1", "kind": "similar", "limit": 4, "caps": {"similar": 2}}), "$").unwrap();
        assert!(
            check_schema(
                &hop_input(),
                &json!({"namespace": "demo", "fromKey": "ch_1", "kind": "up"}),
                "$"
            )
            .is_err()
        );
    }
}
