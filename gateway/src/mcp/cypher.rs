//! kg_cypher: one read-only openCypher statement against one namespace graph. The graph
//! service parses, validates and rewrites it (access predicate on every Chunk, FileRef and
//! REL); this file holds the tool's arguments, handler and definition.

use kg_proto::v1::{CypherRequest, CypherResponse};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::args::{namespace, parse};
use super::registry::{ToolEntry, ToolKind};
use super::tools::require_readable;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// Longest statement accepted (the graph service enforces the same bound).
pub(crate) const MAX_STATEMENT_BYTES: usize = 16 * 1024;
/// Largest `params` object, serialized.
const MAX_PARAMS_BYTES: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCypher {
    namespace: String,
    statement: String,
    params: Option<Map<String, Value>>,
}

/// Validated `kg_cypher` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CypherArgs {
    pub(crate) namespace: String,
    pub(crate) statement: String,
    pub(crate) params_json: String,
}

/// Validates `kg_cypher` arguments (the statement itself is judged by the graph service).
pub(crate) fn cypher_args(args: &Map<String, Value>) -> Result<CypherArgs, ClientError> {
    let raw: RawCypher = parse(args)?;
    let statement = raw.statement.trim().to_owned();
    if statement.is_empty() {
        return Err(ClientError::invalid(
            "statement must not be empty; write MATCH ... RETURN ... LIMIT n",
        ));
    }
    if statement.len() > MAX_STATEMENT_BYTES {
        return Err(ClientError::invalid(format!(
            "statement is {} bytes; the limit is {MAX_STATEMENT_BYTES}",
            statement.len()
        )));
    }
    let params_json = match raw.params {
        Some(map) if !map.is_empty() => Value::Object(map).to_string(),
        _ => String::new(),
    };
    if params_json.len() > MAX_PARAMS_BYTES {
        return Err(ClientError::invalid(format!(
            "params is {} bytes; the limit is {MAX_PARAMS_BYTES}",
            params_json.len()
        )));
    }
    Ok(CypherArgs {
        namespace: namespace("namespace", &raw.namespace)?,
        statement,
        params_json,
    })
}

/// Runs `kg_cypher`.
pub(crate) async fn run(
    state: &GatewayState,
    caller: &Caller,
    args: &Map<String, Value>,
) -> Result<Value, ClientError> {
    let args = cypher_args(args)?;
    require_readable(caller.context(), &args.namespace)?;
    let request = caller.request(CypherRequest {
        namespace: args.namespace.clone(),
        statement: args.statement,
        params_json: args.params_json,
    });
    let response = state
        .backends
        .graph
        .clone()
        .cypher(request)
        .await
        .map_err(|status| ClientError::from_status("graph", &status))?
        .into_inner();
    cypher_result(&args.namespace, response)
}

fn cypher_result(namespace: &str, response: CypherResponse) -> Result<Value, ClientError> {
    let rows = response
        .rows_json
        .iter()
        .map(|row| serde_json::from_str::<Value>(row))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| {
            if super::args::nests_too_deep(&err) {
                return ClientError::new(
                    kg_common::ErrorCode::ResourceExhausted,
                    "a row nests deeper than the 127 levels a tool result carries; return a \
                     shallower part of it",
                );
            }
            ClientError::new(
                kg_common::ErrorCode::Internal,
                "graph returned a malformed row",
            )
        })?;
    Ok(json!({
        "namespace": namespace,
        "columns": response.columns,
        "rowCount": rows.len(),
        "rows": rows,
        "rewrittenStatement": response.rewritten_statement,
        "millis": response.millis,
    }))
}

/// The tool definition, built by the registry's `entry`.
pub(crate) fn tool_entry(
    entry: impl Fn(ToolKind, &'static str, &str, &'static str, Value, Value) -> ToolEntry,
) -> ToolEntry {
    entry(
        ToolKind::Cypher,
        "kg_cypher",
        "Run one read-only Cypher statement",
        DESCRIPTION,
        input_schema(),
        output_schema(),
    )
}

const DESCRIPTION: &str = "Run one read-only openCypher statement against one namespace graph (at most 50 rows, 2 second limit), for an exact word, a figure or a known path. Return the file path and the chunk text: an entity name alone is not a citation. \
Rules (a refusal names the rule and the fix): one statement; only MATCH, OPTIONAL MATCH, WHERE, WITH, UNWIND, RETURN, ORDER BY, LIMIT (no CREATE/MERGE/SET/DELETE/REMOVE/FOREACH/LOAD CSV/CALL, no procedures); \
label every node with exactly one of Chunk, FileRef, Entity, EntityType, OutlineNode, Folder (a variable bound earlier may omit it); one relationship per hop with one explicit type (PART_OF, NEXT_CHUNK, HAS_CHILD, COVERS, HAS_SUBSECTION, MENTIONS, INSTANCE_OF, REL), no `*` lengths, no shortestPath, no named paths; \
end with a literal LIMIT from 1 to 50; SKIP is rejected: page with ORDER BY ID(n) and WHERE ID(n) > $afterId, passing params {\"afterId\": <last id>}. \
An Entity must be reached from a chunk ((c:Chunk)-[:MENTIONS]->(e:Entity)), an OutlineNode through COVERS, a Folder as the parent of a FileRef; REL edges only from such an entity, and only relations stated by a file you may read are returned. \
Names and parameters starting with kg_ are reserved. Functions: count, collect, sum, avg, min, max, toLower, toUpper, trim, size, id, labels, type, coalesce, toString, toInteger, toFloat, substring, left, right, replace, split, head, last, keys, properties, abs, round, floor, ceil. \
Graph: (:Chunk {text, path, chunkIndex, chunkKey})-[:PART_OF]->(:FileRef {vfsPath, name, fileId}); (:Chunk)-[:NEXT_CHUNK]->(:Chunk); (:OutlineNode {title, depth})-[:COVERS]->(:Chunk); (:Folder {folderPath})-[:HAS_CHILD]->(:FileRef); (:Chunk)-[:MENTIONS {quote}]->(:Entity {name, typeId})-[:INSTANCE_OF]->(:EntityType {typeId, label}); (:Entity)-[:REL {relationTypeId}]->(:Entity). \
The enabled-file check and your folder and file permissions are added to every Chunk, FileRef, OutlineNode and REL before the statement runs (rewrittenStatement shows it). Example: MATCH (c:Chunk)-[:PART_OF]->(f:FileRef) WHERE toLower(c.text) CONTAINS 'dkim' RETURN f.vfsPath AS path, c.text AS text LIMIT 10. \
Parallel calls wait in line, one statement at a time (busy only when the line outlasts the call: retry); use kg_search when you do not know the words.";

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$", "description": "The namespace whose graph to query (see kg_namespaces)."},
            "statement": {"type": "string", "maxLength": MAX_STATEMENT_BYTES, "description": "One read-only openCypher statement ending in RETURN ... LIMIT n (1-50)."},
            "params": {"type": "object", "description": "Values for $name parameters in the statement, e.g. {\"afterId\": 42}. Names starting with kg_ are reserved.", "additionalProperties": true}
        },
        "required": ["namespace", "statement"],
        "additionalProperties": false
    })
}

fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": {"type": "string"},
            "columns": {"type": "array", "items": {"type": "string"}, "description": "RETURN column names, in order."},
            "rowCount": {"type": "integer", "minimum": 0, "maximum": 50},
            "rows": {"type": "array", "items": {"type": "array"}, "description": "One array per row, aligned with columns. A returned node is its property map plus _label; strings are sanitised and capped."},
            "rewrittenStatement": {"type": "string", "description": "The statement as it ran, with the access predicates added."},
            "millis": {"type": "number"}
        },
        "required": ["namespace", "columns", "rowCount", "rows", "rewrittenStatement", "millis"]
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn arguments_are_checked_before_the_graph_sees_them() {
        let ok = cypher_args(&args(json!({
            "namespace": "demo",
            "statement": " MATCH (c:Chunk) RETURN c.text LIMIT 1 ",
            "params": {"afterId": 3}
        })))
        .unwrap();
        assert_eq!(ok.statement, "MATCH (c:Chunk) RETURN c.text LIMIT 1");
        assert_eq!(ok.params_json, r#"{"afterId":3}"#);
        assert!(cypher_args(&args(json!({"namespace": "demo", "statement": "  "}))).is_err());
        assert!(cypher_args(&args(json!({"namespace": "Demo!", "statement": "x"}))).is_err());
        assert!(
            cypher_args(&args(
                json!({"namespace": "demo", "statement": "x", "limit": 3})
            ))
            .is_err()
        );
        let long = "x".repeat(MAX_STATEMENT_BYTES + 1);
        assert!(cypher_args(&args(json!({"namespace": "demo", "statement": long}))).is_err());
    }

    #[test]
    fn rows_become_json_arrays() {
        let value = cypher_result(
            "demo",
            CypherResponse {
                columns: vec!["path".into()],
                rows_json: vec![r#"["docs/a.md"]"#.into()],
                rewritten_statement: "MATCH ...".into(),
                millis: 1.5,
            },
        )
        .unwrap();
        assert_eq!(value["rows"], json!([["docs/a.md"]]));
        assert_eq!(value["rowCount"], 1);
    }
}
