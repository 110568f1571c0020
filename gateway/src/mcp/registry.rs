//! The tool set as data: name, title, agent-facing description, input and
//! output JSON Schemas and annotations of every tool, and which handler runs it.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::args::{
    CAPS, DEFAULT_LANES, FILE_FORMATS, FILE_MAX_ROWS, FILES_LIMIT, KNOWN_LANES,
    MAX_FILE_QUERY_CHARS, MAX_LINE, MAX_OUTLINE_DEPTH, MAX_PATTERN_CHARS, MAX_QUERY_CHARS,
    MAX_TOKEN_BUDGET, OPEN_LIMIT, OUTLINE_LIMIT, TOP_K,
};

/// Which handler runs a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    Namespaces,
    Search,
    Open,
    Outline,
    Files,
    File,
    Hop,
    Ontology,
    FileEntities,
    FileTriples,
    Cypher,
    KnowledgeGraph,
    EntitySearch,
}

/// One registered tool.
#[derive(Debug, Clone)]
pub(crate) struct ToolEntry {
    pub(crate) kind: ToolKind,
    pub(crate) tool: Tool,
}

/// The tools this gateway serves, in listing order.
#[derive(Debug, Clone)]
pub(crate) struct ToolRegistry {
    entries: Arc<Vec<ToolEntry>>,
}

impl ToolRegistry {
    /// The tool set: kg_namespaces, kg_search, kg_open, kg_outline, kg_files, kg_file.
    pub(crate) fn builtin() -> Self {
        let mut entries = vec![
            entry(
                ToolKind::Namespaces,
                "kg_namespaces",
                "List readable namespaces",
                NAMESPACES_DESCRIPTION,
                namespaces_input(),
                namespaces_output(),
            ),
            entry(
                ToolKind::Search,
                "kg_search",
                "Search the knowledge graph",
                SEARCH_DESCRIPTION,
                search_input(),
                search_output(),
            ),
            entry(
                ToolKind::Open,
                "kg_open",
                "Open chunk packages by key",
                OPEN_DESCRIPTION,
                open_input(),
                packages_output(),
            ),
            entry(
                ToolKind::Outline,
                "kg_outline",
                "Read a file's outline",
                OUTLINE_DESCRIPTION,
                outline_input(),
                outline_output(),
            ),
            entry(
                ToolKind::Files,
                "kg_files",
                "Find files in a namespace",
                FILES_DESCRIPTION,
                files_input(),
                files_output(),
            ),
            entry(
                ToolKind::File,
                "kg_file",
                "Read or query one file",
                FILE_DESCRIPTION,
                file_input(),
                file_output(),
            ),
        ];
        entries.extend(super::navigation::entries(entry));
        entries.push(super::cypher::tool_entry(entry));
        entries.push(super::knowledge_graph::tool_entry(entry));
        entries.push(super::entity_search::tool_entry(entry));
        Self {
            entries: Arc::new(entries),
        }
    }

    /// Every tool, for `tools/list`.
    pub(crate) fn tools(&self) -> Vec<Tool> {
        self.entries.iter().map(|e| e.tool.clone()).collect()
    }

    /// The entry named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&ToolEntry> {
        self.entries.iter().find(|e| e.tool.name == name)
    }
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn entry(
    kind: ToolKind,
    name: &'static str,
    title: &str,
    description: &'static str,
    input: Value,
    output: Value,
) -> ToolEntry {
    let annotations = ToolAnnotations::with_title(title)
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false);
    let tool = Tool::new(name, description, object(input))
        .with_title(title)
        .with_raw_output_schema(object(output))
        .with_annotations(annotations);
    ToolEntry { kind, tool }
}

const NAMESPACES_DESCRIPTION: &str = "List the knowledge-graph namespaces you may read, with your permission (read, write or admin) in each. \
Call it first when you do not know which namespace holds the answer; pass the names to kg_search, kg_open and kg_outline. \
Takes no arguments. Returns {namespaces: [{name, permission}]}.";

const SEARCH_DESCRIPTION: &str = "Find the chunks of text that answer a question, across one or more namespaces, when you do not yet know the file or key. \
Runs retrieval lanes (default fulltext, vector, graph_expand) fused with reciprocal rank fusion; several namespaces interleave by rank, never by raw score. \
Add co_annotation to lanes when you want chunks that mention two entities named in the question: the answer's grounding then lists per namespace the grounded entities with roles, the chosen pair, directCount, bridgeCount or a reason (no_grounded_entities, too_few_bridges, no_evidence; or the error code, such as index_missing or unavailable, when the lane or the namespace failed). \
filters narrow every lane: collections (any of), folderPrefix, dateFrom/dateTo (documentDate, YYYY-MM-DD), effectiveAt (inside the effective window), relationTypeIds (chunks whose entities take part in such a relation). \
Returns up to topK chunk packages (default 8, hard max 32), best first. Each package has the chunk text, contextHeader (Document › Heading trail), \
citation (namespace/path › section, pages when known) to quote in your answer, position (chunkIndex, char and line span, tokenCount, prevChunkKey/nextChunkKey) \
and its outline section with ancestors, siblings and children. total counts the readable candidates and truncated says more exist than were returned. \
A text found in several chunks (a paragraph pasted into many files) comes back once, as its best-ranked copy with duplicates {count, copies: [{chunkKey, fileId, path}]} (the first 5) naming where else you may read it; ranking.collapseDuplicates false returns every copy as its own result. \
A namespace or lane that fails is skipped and reported in trace rather than failing the search. \
trace.missingOffsets lists hit files indexed before character offsets existed (their positions are unreliable until reprocessed). Pass tokenBudget to cap the returned text: \
packages keep their order, the one that overflows is cut (textTruncated) and later ones lose their text (textOmitted). \
Naming a namespace you may not read is an error. Next steps: kg_open {chunkKey} for a neighbour via prev/nextChunkKey, kg_outline {fileId} for the file's structure.";

const OPEN_DESCRIPTION: &str = "Open chunk packages when you already hold a key: pass namespace and exactly one of chunkKey (that chunk), \
outlineKey (the chunks of that section, in order), entityKey (chunks that mention the entity) or fileId (the file's chunks in order). \
Use it after kg_search (prevChunkKey/nextChunkKey to read on) or kg_outline (outlineKey to read a section). \
Returns {packages, total, truncated} in the same package shape as kg_search; limit defaults to 8 (hard max 32) and truncated says more exist. \
tokenBudget caps the returned text as in kg_search (packages keep their order, the one that overflows is cut, later ones lose their text), reported in tokenBudget. \
trace.missingOffsets, when present, lists files indexed before character offsets existed. \
A fileId you may read that has no chunks is failed_precondition with its status: pending (retry shortly), failed (with the reason) or stored (a type with no text).";

const OUTLINE_DESCRIPTION: &str = "Read a file's table of contents: its sections in document order with outlineKey, title, depth, order, parentKey, \
line and page starts and how many chunks each covers. Use it to navigate a long file, then kg_open {namespace, outlineKey} to read one section. \
Paged: limit defaults to 50 (hard max 200); when nextCursor is not null pass it back as cursor for the next page. \
maxDepth keeps only headings up to that depth (1 = top level). Returns {fileId, path, sections, nextCursor, total}. \
A file you may read that has no chunks is failed_precondition with its status (pending, failed with the reason, or stored).";

const FILES_DESCRIPTION: &str = "Find files in one namespace by folder, path and content. folderPrefix (a folder such as reports/), \
name (a case-insensitive glob: *.csv or *runbook* match the file name, a glob with / such as reports/**/*.csv the path; a bare word matches part of the path) \
and pattern (a regular expression over file contents) combine: \
a file is returned when it matches all that are given. Omit pattern to list a page of files (cheap); with pattern each file carries its first matching lines \
(matches: lineNumber, line) and the scan runs under a time and byte budget: stoppedEarly and stopReason say when it stopped before the end, \
filesScanned how many files it read. Paged: limit defaults to 50 (hard max 200); when nextCursor is not null pass it back as cursor (same other arguments). \
total counts the matching files you may read. Hidden files and files you may not read never appear. \
Each file has namespace, path, fileId, size (bytes), mime and status (indexing). Next step: kg_file {namespace, path} to read or query one of them.";

const FILE_DESCRIPTION: &str = "Read or query one file: pass namespace and exactly one of path or fileId (a chat reference @kg:<namespace>/<path> works as path). \
Omit format for size, mime type and indexing status (and the reason when it failed); a CSV or TSV also returns columns (its header names) and columnTypes. \
format \"sql\" (CSV, TSV): one read-only SELECT or WITH statement over the table data, e.g. SELECT region, sum(amount) FROM data GROUP BY region; \
quote a header that is not a bare name: \"Market Value (AUD)\". Several statements, DDL/DML, functions that read files or the network, and a self-join without an equality condition (a cross join, or ON with only <, >, <>; a one-row side such as (SELECT max(x) FROM data) is fine) are refused. \
Returns {columns, types, rows, rowCount, truncated}, plus malformedRows when rows were left out because their field count differs from the header's (the metadata says so too) and cellsCut when text cells were cut at 65,536 characters (each ends in …). format \"text\" (any text file): query is a regular expression and returns the matching lines with \
lineNumber (a regular expression is at most 4096 bytes), or omit query and pass startLine and endLine (1-based, inclusive; at most 2000 lines, 200 when endLine is omitted) for a line window. format \"jsonpath\" (RFC 9535), \"jsonata\" or \"jinja\" \
(JSON files): query is the expression or template; a Jinja template reads the parsed document as data. maxRows caps rows and matches \
(default 100, hard max 1000) and truncated says when more exist. A file over 10 MiB returns only its size: read it with format text and a line window. \
Errors are {code, message}: not_found for a path you cannot read, invalid_argument with the position of a SQL error, \
resource_exhausted or timeout when a query is too costly, PAYLOAD_TOO_LARGE for a file or result that is too big.";

pub(super) fn caps_input() -> Value {
    let mut properties = serde_json::Map::new();
    for (name, default, max) in CAPS {
        properties.insert(
            name.to_owned(),
            json!({
                "type": "integer", "minimum": 0, "maximum": max, "default": default,
                "description": format!("Most {name} entries per package (default {default}, hard max {max}); 0 leaves the list empty and still reports its total in counts."),
            }),
        );
    }
    json!({
        "type": "object",
        "description": "Per-package list caps; an omitted cap takes its default, values over the hard max are refused.",
        "properties": properties,
        "additionalProperties": false,
    })
}

pub(super) fn token_budget_input() -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": MAX_TOKEN_BUDGET,
           "description": "Estimated token cap on the returned chunk text."})
}

pub(super) fn token_budget_output() -> Value {
    json!({"type": "object", "properties": {
        "budget": {"type": "integer"}, "used": {"type": "integer"},
        "omitted": {"type": "integer"}, "truncated": {"type": "boolean"}
    }, "required": ["budget", "used", "omitted", "truncated"]})
}

/// kg_search's caps: the package caps, and topK, which the caps table lists with them.
fn search_caps_input() -> Value {
    let mut caps = caps_input();
    caps["properties"]["topK"] = json!({
        "type": "integer", "minimum": 1, "maximum": TOP_K.1, "default": TOP_K.0,
        "description": "The same as topK: how many packages to return (hard max 32). Pass it in one place, or the same value in both.",
    });
    caps
}

pub(super) fn namespace_input() -> Value {
    json!({"type": "string", "description": "A namespace you may read (see kg_namespaces).", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"})
}

fn namespaces_input() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn search_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS, "description": "The words or question to search for."},
            "namespaces": {"type": "array", "items": namespace_input(), "minItems": 1, "maxItems": 32,
                           "description": "Namespaces to search; omit to search every namespace you may read."},
            "lanes": {"type": "array", "items": {"type": "string", "enum": KNOWN_LANES}, "minItems": 1, "default": DEFAULT_LANES,
                      "description": "Retrieval lanes to run; omit for the defaults (fulltext, vector, graph_expand). A lane that is not available soft-fails and is reported in trace."},
            "topK": {"type": "integer", "minimum": 1, "maximum": TOP_K.1, "default": TOP_K.0, "description": "How many packages to return (hard max 32)."},
            "tokenBudget": token_budget_input(),
            "ranking": {
                "type": "object",
                "properties": {
                    "rrfK": {"type": "number", "minimum": 1, "maximum": 1000, "default": 60, "description": "RRF constant k (default 60)."},
                    "laneWeights": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": 100},
                                    "propertyNames": {"enum": KNOWN_LANES},
                                    "default": KNOWN_LANES.iter().map(|lane| (lane.to_string(), json!(1))).collect::<serde_json::Map<_, _>>(),
                                    "description": "Per-lane multipliers on RRF contributions, by lane name (default 1 each)."},
                    "minScore": {"type": "number", "minimum": 0, "maximum": 1, "description": "Drop hits below this display score (see score: it says how well the lanes agree on a hit, not how relevant it is)."},
                    "collapseDuplicates": {"type": "boolean",
                                           "description": "Fold chunks with the same text into one result that lists the others under `duplicates` (default true, or as the deployment sets it)."}
                },
                "additionalProperties": false
            },
            "caps": search_caps_input(),
            "filters": super::entity_search::filters_input(),
        },
        "required": ["query"],
        "additionalProperties": false,
    })
}

fn open_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "chunkKey": {"type": "string", "description": "Open this chunk."},
            "outlineKey": {"type": "string", "description": "Open the chunks of this outline section, in order."},
            "entityKey": {"type": "string", "description": "Open chunks that mention this entity."},
            "fileId": {"type": "string", "description": "Open the file's chunks in order."},
            "limit": {"type": "integer", "minimum": 1, "maximum": OPEN_LIMIT.1, "default": OPEN_LIMIT.0, "description": "Most packages to return (hard max 32)."},
            "caps": caps_input(),
            "tokenBudget": token_budget_input(),
        },
        "required": ["namespace"],
        "additionalProperties": false,
    })
}

fn outline_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "fileId": {"type": "string", "description": "The file, as fileId from a package or kg_open."},
            "cursor": {"type": "string", "description": "nextCursor from the previous page, with the same other arguments."},
            "limit": {"type": "integer", "minimum": 1, "maximum": OUTLINE_LIMIT.1, "default": OUTLINE_LIMIT.0, "description": "Sections per page (hard max 200)."},
            "maxDepth": {"type": "integer", "minimum": 1, "maximum": MAX_OUTLINE_DEPTH, "description": "Deepest heading level to include (1 = top level)."},
        },
        "required": ["namespace", "fileId"],
        "additionalProperties": false,
    })
}

fn files_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "folderPrefix": {"type": "string", "maxLength": 1024, "description": "Only files under this folder, e.g. reports/2024/."},
            "name": {"type": "string", "maxLength": MAX_PATTERN_CHARS,
                     "description": "A case-insensitive glob: without / it matches the file name (*.csv), with / the path (reports/**/*.csv); * stays within a folder, ** crosses folders. A word without glob characters matches part of the path."},
            "pattern": {"type": "string", "maxLength": MAX_PATTERN_CHARS,
                        "description": "A regular expression over file contents (Rust regex syntax; (?i) for case-insensitive). Omit it to list a page."},
            "cursor": {"type": "string", "description": "nextCursor from the previous page, with the same other arguments."},
            "limit": {"type": "integer", "minimum": 1, "maximum": FILES_LIMIT.1, "default": FILES_LIMIT.0, "description": "Files per page (hard max 200)."},
        },
        "required": ["namespace"],
        "additionalProperties": false,
    })
}

fn file_input() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespace": namespace_input(),
            "path": {"type": "string", "maxLength": 1100,
                     "description": "The path inside the namespace (e.g. reports/q3.csv), or a chat reference @kg:<namespace>/<path>."},
            "fileId": {"type": "string", "description": "The fileId from kg_files or a chunk package."},
            "format": {"type": "string", "enum": FILE_FORMATS,
                       "description": "Omit for metadata; sql for CSV/TSV, text for any text file, jsonpath, jsonata or jinja for JSON."},
            "query": {"type": "string", "maxLength": MAX_FILE_QUERY_CHARS,
                      "description": "The SQL statement, regular expression (at most 4096 bytes), JSONPath, JSONata expression or Jinja template; required for every format but text with a line window."},
            "startLine": {"type": "integer", "minimum": 1, "maximum": MAX_LINE, "description": "format text: first line of the window (1-based)."},
            "endLine": {"type": "integer", "minimum": 1, "maximum": MAX_LINE, "description": "format text: last line of the window (inclusive); a window holds at most 2000 lines."},
            "maxRows": {"type": "integer", "minimum": 1, "maximum": FILE_MAX_ROWS.1, "default": FILE_MAX_ROWS.0,
                        "description": "Most rows (sql) or matching lines (text) to return (hard max 1000)."},
        },
        "required": ["namespace"],
        "additionalProperties": false,
    })
}

fn namespaces_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "namespaces": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "permission": {"type": "string", "enum": ["read", "write", "admin"]}
                },
                "required": ["name", "permission"]
            }}
        },
        "required": ["namespaces"],
    })
}

fn outline_ref_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "outlineKey": {"type": "string"}, "title": {"type": "string"},
            "depth": {"type": "integer"}, "order": {"type": "integer"}
        },
        "required": ["outlineKey", "title", "depth", "order"]
    })
}

/// The chunk package shape shared by kg_search, kg_open and later tools.
pub(crate) fn package_schema() -> Value {
    let int = json!({"type": "integer"});
    let string = json!({"type": "string"});
    json!({
        "type": "object",
        "properties": {
            "namespace": string, "chunkKey": string, "fileId": string, "path": string,
            "score": {"type": "number", "description": "Display score in [0, 1] for search hits: the fused score over the best possible for the lanes that found something, so 1 is a hit each of them ranked first. It compares hits of one search; it does not measure relevance (the top hit of a query nothing matches well still scores high), so read the lanes' own scores in lanes[] for that."},
            "text": string, "contextHeader": string, "citation": string,
            "textTruncated": {"type": "boolean"}, "textOmitted": {"type": "boolean"},
            "position": {
                "type": "object",
                "properties": {
                    "chunkIndex": int, "charStart": int, "charEnd": int, "pageStart": int, "pageEnd": int,
                    "lineStart": int, "lineEnd": int, "tokenCount": int, "prevChunkKey": string, "nextChunkKey": string
                },
                "required": ["chunkIndex", "tokenCount"]
            },
            "outline": {
                "type": "object",
                "properties": {
                    "section": outline_ref_schema(),
                    "ancestors": {"type": "array", "items": outline_ref_schema()},
                    "siblings": {"type": "array", "items": outline_ref_schema()},
                    "children": {"type": "array", "items": outline_ref_schema()}
                },
                "required": ["ancestors", "siblings", "children"]
            },
            "mentions": {"type": "array", "items": {"type": "object", "properties": {
                "entityKey": string, "name": string, "typeId": string, "typeLabel": string,
                "method": string, "quote": string, "charStart": int, "charEnd": int
            }}},
            "relNeighbors": {"type": "array", "items": {"type": "object", "properties": {
                "sourceEntityKey": string, "relationTypeId": string, "targetEntityKey": string,
                "targetName": string, "statedInFileId": string, "sourceName": string,
                "direction": {"type": "string", "description": "out when the mentioned entity (entityKey) is the source, in when it is the target."}, "entityKey": string,
                "otherEntityKey": string, "otherName": string, "otherTypeId": string, "statedInChunkKey": string
            }}},
            "dates": {"type": "object", "properties": {
                "documentDate": string, "effectiveFrom": string, "effectiveTo": string,
                "collections": {"type": "array", "items": string}
            }},
            "similarFiles": {"type": "array", "items": {"type": "object", "properties": {
                "fileId": string, "path": string, "score": {"type": "number"}
            }}},
            "counts": {"type": "object",
                       "description": "Present when a cap clipped a list: by the list's name in this package (mentions, relNeighbors, ancestors, siblings, children, similarFiles), its total and truncated.",
                       "additionalProperties": {"type": "object", "properties": {
                "total": int, "truncated": {"type": "boolean"}
            }}},
            "duplicates": {
                "type": "object",
                "description": "Search hits only: other chunks with the same text, folded into this one (ranking.collapseDuplicates). count counts them all; copies lists the first 5, best first.",
                "properties": {
                    "count": int,
                    "copies": {"type": "array", "items": {"type": "object", "properties": {
                        "chunkKey": string, "fileId": string, "path": string
                    }, "required": ["chunkKey", "fileId", "path"]}}
                },
                "required": ["count", "copies"]
            },
            "lanes": {
                "type": "array",
                "description": "Search hits only: each lane that ranked this chunk, its rank there (1-based, within the hit's namespace) and the lane's own score before fusion (fulltext: BM25 of its best passage, or the sparse index's score; vector: cosine similarity; graph_expand: the summed idf weight of the entities it shares with the best hits; co_annotation: 2 for a chunk naming both entities, 1 for one a relation away). A hit ranked by one lane alone was found only lexically or only by meaning.",
                "items": {"type": "object", "properties": {
                    "lane": {"type": "string", "enum": KNOWN_LANES}, "rank": int, "score": {"type": "number"}
                }, "required": ["lane", "rank", "score"]}
            }
        },
        "required": ["namespace", "chunkKey", "fileId", "path", "text", "contextHeader", "citation", "position", "outline",
                     "mentions", "relNeighbors", "dates", "similarFiles"]
    })
}

fn search_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "results": {"type": "array", "items": package_schema()},
            "total": {"type": "integer", "description": "Readable candidates across the searched namespaces."},
            "truncated": {"type": "boolean"},
            "grounding": {"type": "array", "description": "When co_annotation ran: one entry per searched namespace.",
                          "items": {"type": "object", "properties": {
                "namespace": {"type": "string"}, "entities": {"type": "array"}, "pair": {"type": "array", "items": {"type": "string"}},
                "directCount": {"type": "integer"}, "bridgeCount": {"type": "integer"}, "reason": {"type": "string"}
            }, "required": ["namespace", "entities", "pair", "directCount", "bridgeCount"]}},
            "trace": {
                "type": "object",
                "properties": {
                    "lanes": {"type": "array", "items": {"type": "object", "properties": {
                        "namespace": {"type": "string"}, "lane": {"type": "string"}, "ok": {"type": "boolean"},
                        "errorCode": {"type": "string"}, "message": {"type": "string"},
                        "hits": {"type": "integer"}, "millis": {"type": "number"}
                    }, "required": ["namespace", "lane", "ok"]}},
                    "namespaces": {"type": "array", "items": {"type": "object", "properties": {
                        "namespace": {"type": "string"}, "ok": {"type": "boolean"}, "errorCode": {"type": "string"},
                        "stage": {"type": "string", "enum": ["search", "packages"]}, "message": {"type": "string"}
                    }, "required": ["namespace", "ok"]}},
                    "tokenBudget": token_budget_output(),
                    "vectorWidening": {"type": "array", "items": {"type": "object", "properties": {
                        "namespace": {"type": "string"}, "pool": {"type": "integer"}, "rounds": {"type": "integer"},
                        "capReached": {"type": "boolean"}
                    }, "required": ["namespace", "pool", "rounds", "capReached"]}},
                    "duplicatesCollapsed": {"type": "array", "description": "Per namespace: chunks folded into a result with the same text, over all candidates.",
                                            "items": {"type": "object", "properties": {
                        "namespace": {"type": "string"}, "chunks": {"type": "integer"}
                    }, "required": ["namespace", "chunks"]}},
                    "missingOffsets": missing_offsets_output()
                },
                "required": ["lanes", "namespaces"]
            }
        },
        "required": ["results", "total", "truncated", "trace"],
    })
}

/// `trace.missingOffsets` of every tool that returns packages.
pub(super) fn missing_offsets_output() -> Value {
    json!({"type": "array", "description": "Files of returned packages indexed before character offsets existed: their positions are unreliable until the file is reprocessed.",
           "items": {"type": "object", "properties": {
        "namespace": {"type": "string"}, "fileId": {"type": "string"}, "path": {"type": "string"},
        "chunkKeys": {"type": "array", "items": {"type": "string"}}
    }, "required": ["namespace", "fileId", "path", "chunkKeys"]}})
}

pub(super) fn packages_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "packages": {"type": "array", "items": package_schema()},
            "total": {"type": "integer"},
            "truncated": {"type": "boolean"},
            "tokenBudget": token_budget_output(),
            "trace": {"type": "object", "properties": {"missingOffsets": missing_offsets_output()}}
        },
        "required": ["packages", "total", "truncated"],
    })
}

fn outline_output() -> Value {
    let int = json!({"type": "integer"});
    json!({
        "type": "object",
        "properties": {
            "fileId": {"type": "string"},
            "path": {"type": "string"},
            "sections": {"type": "array", "items": {"type": "object", "properties": {
                "outlineKey": {"type": "string"}, "title": {"type": "string"}, "depth": int, "order": int,
                "parentKey": {"type": "string"}, "lineStart": int, "pageStart": int, "pageEnd": int, "chunkCount": int
            }, "required": ["outlineKey", "title", "depth", "order", "chunkCount"]}},
            "nextCursor": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "total": int
        },
        "required": ["fileId", "path", "sections", "nextCursor", "total"],
    })
}

/// The indexing states a file reports.
const FILE_STATUSES: [&str; 6] = [
    "pending", "indexed", "failed", "stored", "deleted", "unknown",
];

fn files_output() -> Value {
    let int = json!({"type": "integer"});
    let string = json!({"type": "string"});
    json!({
        "type": "object",
        "properties": {
            "files": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "namespace": string, "path": string, "fileId": string, "size": int, "mime": string,
                    "status": {"type": "string", "enum": FILE_STATUSES}, "statusReason": string, "documentDate": string,
                    "matches": {"type": "array", "items": {"type": "object", "properties": {
                        "lineNumber": int, "line": string
                    }, "required": ["lineNumber", "line"]}},
                    "matchesTruncated": {"type": "boolean", "description": "Some matching lines were left out to keep the result small."}
                },
                "required": ["namespace", "path", "fileId", "size", "mime", "status"]
            }},
            "nextCursor": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "total": {"type": "integer", "description": "Matching files you may read (with pattern: among those scanned so far)."},
            "stoppedEarly": {"type": "boolean", "description": "The content scan stopped on its time or byte budget."},
            "stopReason": string,
            "filesScanned": int
        },
        "required": ["files", "nextCursor", "total", "stoppedEarly"],
    })
}

fn file_output() -> Value {
    let string = json!({"type": "string"});
    json!({
        "type": "object",
        "properties": {
            "file": {
                "type": "object",
                "properties": {
                    "namespace": string, "path": string, "fileId": string, "size": {"type": "integer"}, "mime": string,
                    "status": {"type": "string", "enum": FILE_STATUSES}, "statusReason": string
                },
                "required": ["namespace", "path", "fileId", "size", "mime", "status"]
            },
            "format": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "The format that ran; null for metadata."},
            "columns": {"type": "array", "items": string, "description": "CSV/TSV header names in file order."},
            "result": {"type": "object", "additionalProperties": true, "description": "Depends on format. Metadata: {size, mime, status, statusReason?, tooLarge, columnTypes?}. \
    sql: {columns, types, rows, rowCount, truncated, malformedRows?}. text: {matches: [{lineNumber, line}], ...} or {startLine, endLine, lines}. \
    jsonpath, jsonata, jinja: {result}."},
            "truncated": {"type": "boolean", "description": "More rows, matches or lines exist than were returned."}
        },
        "required": ["file", "format", "result", "truncated"],
    })
}

/// A checker for the JSON Schema subset these schemas use (type, anyOf, enum,
/// properties, required, items, additionalProperties, and the length, count and range
/// bounds), so tests can prove results match the outputSchema that MCP clients validate
/// against, and that an input schema states the caps the arguments are checked with.
#[cfg(test)]
pub(crate) fn check_schema(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let type_ok = |t: &str| match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        _ => false,
    };
    match schema.get("type") {
        Some(Value::String(t)) if !type_ok(t) => {
            return Err(format!("{path}: expected {t}, got {value}"));
        }
        Some(Value::Array(ts)) if !ts.iter().filter_map(Value::as_str).any(type_ok) => {
            return Err(format!("{path}: expected one of {ts:?}, got {value}"));
        }
        _ => {}
    }
    if let Some(Value::Array(branches)) = schema.get("anyOf")
        && !branches
            .iter()
            .any(|branch| check_schema(branch, value, path).is_ok())
    {
        return Err(format!("{path}: {value} matches none of {branches:?}"));
    }
    let bound = |name: &str| schema.get(name).and_then(Value::as_f64);
    let size = match value {
        Value::String(text) => Some(("characters", text.chars().count())),
        Value::Array(items) => Some(("items", items.len())),
        _ => None,
    };
    if let Some((unit, size)) = size {
        let (min, max) = match value {
            Value::String(_) => (bound("minLength"), bound("maxLength")),
            _ => (bound("minItems"), bound("maxItems")),
        };
        if min.is_some_and(|min| (size as f64) < min) || max.is_some_and(|max| size as f64 > max) {
            return Err(format!("{path}: {size} {unit}, outside {min:?}..={max:?}"));
        }
    }
    if let Some(number) = value.as_f64()
        && (bound("minimum").is_some_and(|min| number < min)
            || bound("maximum").is_some_and(|max| number > max))
    {
        return Err(format!("{path}: {number} is out of range"));
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        return Err(format!("{path}: {value} is not in {allowed:?}"));
    }
    if let Value::Object(map) = value {
        for key in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = key.as_str().unwrap_or_default();
            if !map.contains_key(key) {
                return Err(format!("{path}: missing required `{key}`"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (key, v) in map {
            let child = format!("{path}.{key}");
            match (
                properties.and_then(|p| p.get(key)),
                schema.get("additionalProperties"),
            ) {
                (Some(s), _) => check_schema(s, v, &child)?,
                (None, Some(Value::Bool(false))) => return Err(format!("{child}: not allowed")),
                (None, Some(s @ Value::Object(_))) => check_schema(s, v, &child)?,
                _ => {}
            }
        }
    }
    if let (Value::Array(items), Some(s)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check_schema(s, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_is_described_read_only_and_closed() {
        let registry = ToolRegistry::builtin();
        let tools = registry.tools();
        let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "kg_namespaces",
                "kg_search",
                "kg_open",
                "kg_outline",
                "kg_files",
                "kg_file",
                "kg_hop",
                "kg_ontology",
                "kg_file_entities",
                "kg_file_triples",
                "kg_cypher",
                "get_knowledge_graph",
                "kg_entity_search"
            ]
        );
        for tool in &tools {
            assert!(tool.title.is_some());
            assert!(tool.description.as_ref().is_some_and(|d| d.len() > 80));
            assert_eq!(tool.input_schema.get("type"), Some(&json!("object")));
            assert_eq!(
                tool.input_schema.get("additionalProperties"),
                Some(&json!(false))
            );
            assert_eq!(
                tool.output_schema.as_ref().unwrap().get("type"),
                Some(&json!("object"))
            );
            let a = tool.annotations.as_ref().unwrap();
            assert_eq!(
                (
                    a.read_only_hint,
                    a.destructive_hint,
                    a.idempotent_hint,
                    a.open_world_hint
                ),
                (Some(true), Some(false), Some(true), Some(false))
            );
        }
        assert_eq!(
            registry.get("kg_open").map(|e| e.kind),
            Some(ToolKind::Open)
        );
        assert_eq!(
            registry.get("kg_cypher").map(|e| e.kind),
            Some(ToolKind::Cypher)
        );

        // Input schemas accept what validation accepts and refuse unknown fields.
        let input =
            |name: &str| Value::Object((*registry.get(name).unwrap().tool.input_schema).clone());
        let search = json!({"query": "q", "namespaces": ["demo"], "lanes": ["fulltext"], "topK": 8, "tokenBudget": 100,
                            "ranking": {"rrfK": 60, "laneWeights": {"fulltext": 1.5}, "minScore": 0.1}, "caps": {"mentions": 2}});
        check_schema(&input("kg_search"), &search, "$").unwrap();
        assert!(
            check_schema(&input("kg_search"), &json!({"query": "q", "bogus": 1}), "$").is_err()
        );
        assert!(
            check_schema(
                &input("kg_search"),
                &json!({"query": "q", "caps": {"bogus": 1}}),
                "$"
            )
            .is_err()
        );
        assert!(check_schema(&input("kg_search"), &json!({"topK": 1}), "$").is_err());
        check_schema(
            &input("kg_open"),
            &json!({"namespace": "demo", "chunkKey": "c1", "limit": 3}),
            "$",
        )
        .unwrap();
        check_schema(
            &input("kg_outline"),
            &json!({"namespace": "demo", "fileId": "f1", "cursor": "x"}),
            "$",
        )
        .unwrap();
        assert!(check_schema(&input("kg_namespaces"), &json!({"x": 1}), "$").is_err());
        check_schema(
            &input("kg_files"),
            &json!({"namespace": "demo", "folderPrefix": "a/", "name": "*.csv", "pattern": "x", "cursor": "c", "limit": 10}),
            "$",
        )
        .unwrap();
        check_schema(
            &input("kg_file"),
            &json!({"namespace": "demo", "path": "a.csv", "format": "sql", "query": "SELECT 1", "maxRows": 5}),
            "$",
        )
        .unwrap();
        check_schema(
            &input("kg_file"),
            &json!({"namespace": "demo", "fileId": "f", "format": "text", "startLine": 1, "endLine": 9}),
            "$",
        )
        .unwrap();
        assert!(
            check_schema(
                &input("kg_file"),
                &json!({"namespace": "demo", "path": "a", "format": "xml"}),
                "$"
            )
            .is_err()
        );
        assert!(
            check_schema(
                &input("kg_files"),
                &json!({"namespace": "demo", "q": 1}),
                "$"
            )
            .is_err()
        );
        let nullable = json!({"anyOf": [{"type": "string"}, {"type": "null"}]});
        assert!(check_schema(&nullable, &json!(3), "$").is_err());
        assert!(check_schema(&nullable, &json!(null), "$").is_ok());
        assert!(check_schema(&nullable, &json!("next"), "$").is_ok());
        assert!(check_schema(&json!({"type": ["string", "null"]}), &json!(3), "$").is_err());
    }

    #[test]
    fn every_built_in_name_is_reserved_from_ontology_projects() {
        for tool in ToolRegistry::builtin().tools() {
            assert!(
                kg_common::tool_names::is_reserved(&tool.name),
                "{} is not in kg_common::tool_names: a project could generate it",
                tool.name
            );
        }
    }

    #[test]
    fn output_schemas_spell_nullable_values_portably() {
        // A `type` array is legal JSON Schema, but clients that map schemas onto a single-type
        // dialect (Gemini's OpenAPI subset) reject or mangle it; anyOf branches map everywhere.
        fn walk(schema: &Value, path: &str, found: &mut Vec<String>) {
            match schema {
                Value::Object(map) => {
                    if matches!(map.get("type"), Some(Value::Array(_))) {
                        found.push(path.to_owned());
                    }
                    for (key, value) in map {
                        walk(value, &format!("{path}.{key}"), found);
                    }
                }
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        walk(item, &format!("{path}[{i}]"), found);
                    }
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        for tool in ToolRegistry::builtin().tools() {
            let output = Value::Object((*tool.output_schema.clone().unwrap()).clone());
            let input = Value::Object((*tool.input_schema).clone());
            walk(&output, &format!("{}.outputSchema", tool.name), &mut found);
            walk(&input, &format!("{}.inputSchema", tool.name), &mut found);
        }
        assert!(found.is_empty(), "type arrays: {found:?}");
    }
}
