//! kg_entity_search (entities by name or alias, with mention evidence packages), plus the
//! kg_search pieces that belong to the graph lanes: the `filters` argument and the
//! co_annotation `grounding` entries of kg_search.

use futures::future::join_all;
use kg_proto::limits::PACKAGE_KEYS_PER_CALL;
use kg_proto::v1::entity_search_response::Side;
use kg_proto::v1::{
    ChunkPackage, EntityHit, EntitySearchRequest, Grounding, PackageCaps, PackagesRequest,
    SearchFilters,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::args::{Int, MAX_NAMESPACES, RawCaps, bounded, caps, namespace, parse, token_budget};
use super::package::{clean, missing_offsets, number, package_json};
use super::registry::{
    ToolEntry, ToolKind, caps_input, missing_offsets_output, namespace_input, package_schema,
    token_budget_input, token_budget_output,
};
use super::search::{apply_token_budget, interleave};
use super::tools::resolve_namespaces;
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// Hits (default, hard max); the retrieval service enforces the same.
pub(crate) const ENTITY_LIMIT: (u32, u32) = (8, 32);
/// Evidence packages per hit (default, hard max).
pub(crate) const EVIDENCE_LIMIT: (u32, u32) = (3, 8);
/// Longest entity search text.
const MAX_TEXT_CHARS: usize = 512;
/// The `mode` values; the retrieval service checks the same and picks the default.
const MODES: [&str; 3] = ["text", "vector", "hybrid"];

/// The `filters` argument of kg_search, as the agent writes it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawFilters {
    collections: Option<Vec<String>>,
    folder_prefix: Option<String>,
    date_from: Option<String>,
    date_to: Option<String>,
    effective_at: Option<String>,
    relation_type_ids: Option<Vec<String>>,
}

/// Turns `filters` into the wire form; the retrieval service validates the values (dates
/// as YYYY-MM-DD, list sizes) and names the field in its error.
pub(crate) fn search_filters(raw: Option<RawFilters>) -> Option<SearchFilters> {
    let raw = raw?;
    Some(SearchFilters {
        collections: raw.collections.unwrap_or_default(),
        folder_prefix: raw.folder_prefix.unwrap_or_default(),
        date_from: raw.date_from,
        date_to: raw.date_to,
        effective_at: raw.effective_at,
        relation_type_ids: raw.relation_type_ids.unwrap_or_default(),
    })
}

/// JSON Schema of kg_search's `filters`.
pub(crate) fn filters_input() -> Value {
    let date = |what: &str| json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "description": what});
    json!({
        "type": "object",
        "properties": {
            "collections": {"type": "array", "items": {"type": "string"}, "maxItems": 64, "description": "Keep files in any of these collections."},
            "folderPrefix": {"type": "string", "description": "Keep files under this folder."},
            "dateFrom": date("Keep files whose documentDate is on or after this day (YYYY-MM-DD)."),
            "dateTo": date("Keep files whose documentDate is on or before this day (YYYY-MM-DD)."),
            "effectiveAt": date("Keep files whose effective window (effectiveFrom..effectiveTo, either end open) contains this day."),
            "relationTypeIds": {"type": "array", "items": {"type": "string"}, "maxItems": 64,
                                "description": "Keep chunks mentioning an entity in a relation of one of these types, stated by a file you may read."}
        },
        "additionalProperties": false
    })
}

/// One namespace's co_annotation grounding, as kg_search's `grounding[]` shows it.
pub(crate) fn grounding_json(grounding: &Grounding) -> Value {
    let mut out = json!({
        "namespace": grounding.namespace,
        "entities": grounding.entities.iter().map(|e| json!({
            "entityKey": e.entity_key, "name": clean(&e.name), "typeId": e.type_id,
            "phrase": clean(&e.phrase), "degree": e.degree, "role": e.role,
        })).collect::<Vec<_>>(),
        "pair": grounding.pair,
        "directCount": grounding.direct_count,
        "bridgeCount": grounding.bridge_count,
    });
    if !grounding.reason.is_empty() {
        out["reason"] = json!(grounding.reason);
    }
    out
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEntitySearch {
    text: String,
    namespaces: Option<Vec<String>>,
    limit: Option<Int>,
    evidence_limit: Option<Int>,
    #[serde(default, deserialize_with = "super::args::nested_object")]
    caps: Option<RawCaps>,
    mode: Option<String>,
    token_budget: Option<Int>,
}

/// Validated `kg_entity_search` arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EntitySearchArgs {
    pub(crate) text: String,
    pub(crate) namespaces: Vec<String>,
    pub(crate) limit: u32,
    pub(crate) evidence_limit: u32,
    pub(crate) caps: PackageCaps,
    /// text | vector | hybrid; empty lets the service pick (hybrid with embeddings).
    pub(crate) mode: String,
    /// Caps the evidence packages' text, in hit order.
    pub(crate) token_budget: Option<u32>,
}

pub(crate) fn entity_search_args(
    args: &Map<String, Value>,
) -> Result<EntitySearchArgs, ClientError> {
    let raw: RawEntitySearch = parse(args)?;
    let text = raw.text.trim().to_owned();
    if text.is_empty() {
        return Err(ClientError::invalid(
            "text must not be empty: pass the entity name or alias to look up",
        ));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(ClientError::invalid(format!(
            "text is longer than {MAX_TEXT_CHARS} characters"
        )));
    }
    let mut namespaces: Vec<String> = Vec::new();
    let given = super::args::given_list(
        "namespaces",
        raw.namespaces,
        "to search every namespace you may read",
    )?;
    // Counted as given, as the schema's maxItems counts them.
    if given.len() > MAX_NAMESPACES {
        return Err(ClientError::invalid(format!(
            "namespaces names {} namespaces; pass at most {MAX_NAMESPACES}",
            given.len()
        )));
    }
    for ns in given {
        let ns = namespace("namespaces", &ns)?;
        if !namespaces.contains(&ns) {
            namespaces.push(ns);
        }
    }
    let mode = raw.mode.unwrap_or_default().trim().to_owned();
    if !mode.is_empty() && !MODES.contains(&mode.as_str()) {
        return Err(ClientError::invalid(format!(
            "unknown mode `{}`; valid modes: {}",
            mode.chars().take(64).collect::<String>(),
            MODES.join(", ")
        )));
    }
    Ok(EntitySearchArgs {
        mode,
        text,
        namespaces,
        limit: bounded("limit", raw.limit, 1, ENTITY_LIMIT.0, ENTITY_LIMIT.1)?,
        evidence_limit: bounded(
            "evidenceLimit",
            raw.evidence_limit,
            0,
            EVIDENCE_LIMIT.0,
            EVIDENCE_LIMIT.1,
        )?,
        caps: caps(raw.caps)?,
        token_budget: token_budget(raw.token_budget)?,
    })
}

/// Runs `kg_entity_search`: EntitySearch per namespace (a failed namespace soft-fails and
/// is reported), hits interleaved by rank, then evidence packages per namespace.
pub(crate) async fn run(
    state: &GatewayState,
    caller: &Caller,
    args: &Map<String, Value>,
) -> Result<Value, ClientError> {
    let args = entity_search_args(args)?;
    let namespaces = resolve_namespaces(caller.context(), &args.namespaces)?;
    let calls = namespaces.iter().map(|ns| {
        let mut client = state.backends.retrieval.clone();
        let request = caller.request(EntitySearchRequest {
            namespace: ns.clone(),
            text: args.text.clone(),
            limit: args.limit,
            // 0 would mean "the default" to the service; asking for none needs no keys.
            evidence_limit: args.evidence_limit.max(1),
            mode: args.mode.clone(),
        });
        async move {
            client
                .entity_search(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| ClientError::from_status("retrieval", &status))
        }
    });
    let mut trace = Vec::new();
    let mut lists: Vec<Vec<EntityHit>> = Vec::new();
    let mut total: u64 = 0;
    let mut first_error = None;
    for (ns, result) in namespaces.iter().zip(join_all(calls).await) {
        match result {
            Ok(response) => {
                let sides: Vec<Value> = response.sides.iter().map(side_json).collect();
                trace.push(
                    json!({"namespace": ns, "ok": true, "mode": response.mode, "sides": sides}),
                );
                total = total.saturating_add(response.total_candidates);
                lists.push(response.hits);
            }
            Err(err) if super::tools::is_caller_error(&err) => return Err(err),
            Err(err) => {
                tracing::warn!(namespace = %ns, code = %err.code, "entity search soft-failed");
                trace.push(json!({"namespace": ns, "ok": false, "errorCode": err.code.as_str()}));
                lists.push(Vec::new());
                first_error.get_or_insert(err);
            }
        }
    }
    if let Some(err) = first_error
        && trace.iter().all(|t| t["ok"] == false)
    {
        return Err(err);
    }
    let winners = interleave(lists, args.limit as usize);
    let (evidence, evidence_failures) =
        evidence_packages(state, caller, &namespaces, &winners, &args).await;
    if let Some((_, err)) = evidence_failures
        .iter()
        .find(|(_, err)| super::tools::is_caller_error(err))
    {
        return Err(err.clone());
    }
    Ok(entity_result(
        &namespaces,
        trace,
        &winners,
        total,
        &Evidence {
            packages: evidence,
            failures: evidence_failures,
            per_hit: args.evidence_limit as usize,
            token_budget: args.token_budget,
        },
    ))
}

/// What [`evidence_packages`] read, how many packages a hit shows and the text budget.
struct Evidence {
    packages: std::collections::HashMap<(String, String), ChunkPackage>,
    failures: Vec<(usize, ClientError)>,
    per_hit: usize,
    token_budget: Option<u32>,
}

/// The tool result: the interleaved hits with their evidence, names sanitised, how many
/// matched (`total`, over the namespaces that answered), and the trace with each namespace
/// whose evidence could not be read and the evidence files that predate offsets.
fn entity_result(
    namespaces: &[String],
    mut trace: Vec<Value>,
    winners: &[(usize, EntityHit)],
    total: u64,
    evidence: &Evidence,
) -> Value {
    for (index, err) in &evidence.failures {
        if let Some(entry) = trace.get_mut(*index) {
            entry["evidence"] = json!({"ok": false, "errorCode": err.code.as_str()});
        }
    }
    // Each hit's evidence in hit order, so a token budget keeps the best hits' text; the
    // budget runs over them all at once, then each hit takes its own back.
    let per_hit: Vec<Vec<ChunkPackage>> = winners
        .iter()
        .map(|(index, hit)| {
            let ns = namespaces.get(*index).map_or("", String::as_str);
            hit.evidence_chunk_keys
                .iter()
                .take(evidence.per_hit)
                .filter_map(|key| evidence.packages.get(&(ns.to_owned(), key.clone())))
                .cloned()
                .collect()
        })
        .collect();
    let counts: Vec<usize> = per_hit.iter().map(Vec::len).collect();
    let mut flat: Vec<ChunkPackage> = per_hit.into_iter().flatten().collect();
    let budget = evidence
        .token_budget
        .map(|b| apply_token_budget(&mut flat, b));
    let missing_offsets = missing_offsets(&flat);
    let mut flat = flat.iter();
    let hits: Vec<Value> = winners
        .iter()
        .zip(counts)
        .map(|((index, hit), count)| {
            let ns = namespaces.get(*index).map_or("", String::as_str);
            let packages: Vec<Value> = flat.by_ref().take(count).map(package_json).collect();
            json!({
                "namespace": ns,
                "entityKey": hit.entity_key,
                "name": clean(&hit.name),
                "typeId": hit.type_id,
                "typeLabels": hit.type_labels.iter().map(|label| clean(label)).collect::<Vec<_>>(),
                "degree": hit.degree,
                "role": hit.role,
                "score": number(hit.score),
                "evidence": packages,
                "evidenceTruncated": hit.evidence_truncated || packages.len() < hit.evidence_chunk_keys.len(),
            })
        })
        .collect();
    let mut trace = json!({"namespaces": trace});
    if let Some(report) = budget {
        trace["tokenBudget"] = json!(report);
    }
    if !missing_offsets.is_empty() {
        trace["missingOffsets"] = json!(missing_offsets);
    }
    let returned = hits.len() as u64;
    json!({"hits": hits, "total": total.max(returned), "truncated": total > returned, "trace": trace})
}

/// One side of a namespace's entity search, as `trace.namespaces[].sides[]` shows it.
fn side_json(side: &Side) -> Value {
    let mut out = json!({"side": side.side, "ok": side.ok, "candidates": side.candidates});
    if !side.ok {
        out["errorCode"] = json!(side.error_code);
        out["message"] = json!(side.message);
    }
    out
}

/// Evidence packages by (namespace, chunk key), and the namespaces (by index) with a Packages
/// call that failed: the keys of that call contribute none, their hits say
/// evidenceTruncated and the namespace's trace entry says why.
async fn evidence_packages(
    state: &GatewayState,
    caller: &Caller,
    namespaces: &[String],
    winners: &[(usize, EntityHit)],
    args: &EntitySearchArgs,
) -> (
    std::collections::HashMap<(String, String), ChunkPackage>,
    Vec<(usize, ClientError)>,
) {
    let mut keys: Vec<Vec<String>> = vec![Vec::new(); namespaces.len()];
    for (index, hit) in winners {
        if let Some(list) = keys.get_mut(*index) {
            for key in hit
                .evidence_chunk_keys
                .iter()
                .take(args.evidence_limit as usize)
            {
                if !list.contains(key) {
                    list.push(key.clone());
                }
            }
        }
    }
    // One namespace's keys can outnumber what one Packages call may name (32 hits of up to
    // 8 chunks each), so they go out in batches, all at once.
    let batches: Vec<(usize, Vec<String>)> = keys
        .iter()
        .enumerate()
        .flat_map(|(index, list)| {
            list.chunks(PACKAGE_KEYS_PER_CALL)
                .map(move |batch| (index, batch.to_vec()))
        })
        .collect();
    let calls = batches.into_iter().map(|(index, chunk_keys)| {
        let mut client = state.backends.graph.clone();
        let ns = namespaces.get(index).cloned().unwrap_or_default();
        let request = caller.request(PackagesRequest {
            namespace: ns,
            chunk_keys,
            caps: Some(args.caps),
        });
        async move {
            let result = client
                .packages(request)
                .await
                .map(|response| response.into_inner().packages)
                .map_err(|status| ClientError::from_status("graph", &status));
            (index, result)
        }
    });
    let mut out = std::collections::HashMap::new();
    let mut failures: Vec<(usize, ClientError)> = Vec::new();
    for (index, result) in join_all(calls).await {
        let ns = namespaces.get(index).map_or("", String::as_str);
        match result {
            Ok(packages) => {
                for package in packages {
                    out.insert((ns.to_owned(), package.chunk_key.clone()), package);
                }
            }
            // A namespace is reported once, however many of its batches failed; the
            // batches that were read still show.
            Err(_) if failures.iter().any(|(failed, _)| *failed == index) => {}
            Err(err) => {
                tracing::warn!(namespace = %ns, code = %err.code, "entity evidence packages soft-failed");
                failures.push((index, err));
            }
        }
    }
    (out, failures)
}

/// The tool definition, built by the registry's `entry`.
pub(crate) fn tool_entry(
    entry: impl Fn(ToolKind, &'static str, &str, &'static str, Value, Value) -> ToolEntry,
) -> ToolEntry {
    entry(
        ToolKind::EntitySearch,
        "kg_entity_search",
        "Find entities by name",
        DESCRIPTION,
        input_schema(),
        output_schema(),
    )
}

const DESCRIPTION: &str = "Named-entity entry: find entities by name or alias, by text and/or vector similarity, then read the chunks that mention them. \
mode: text (full-text over entity names and aliases; an exact name or alias ranks first), vector (entities of the chunks nearest in meaning: finds an entity from a paraphrase), \
hybrid (both fused; the default when embeddings are configured, else text). trace.namespaces[].mode is the mode that answered: hybrid reports text or vector when one side failed, and sides[] says why; trace.namespaces[].evidence says when a namespace's evidence packages could not be read (its hits keep evidenceTruncated). \
Each hit has entityKey, name, typeId, typeLabels, degree (how many chunks you may read mention it), role and evidence: the first mentioning chunks as chunk packages, so answers stay citation-backed. \
role: bridge (at most 25 mentioning chunks: specific enough to connect the question to evidence), filter (26-250: narrows a question, does not connect chunks), ignore (over 250: too common to connect anything). \
total counts the matching entities with a mention you may read and truncated says more matched than limit returned. \
tokenBudget caps the evidence text as in kg_search, in hit order, reported in trace.tokenBudget; trace.missingOffsets lists evidence files indexed before character offsets existed. \
Only entities mentioned by a chunk you may read are returned. Continue with kg_open {entityKey} for more mentions or kg_hop from the entityKey.";

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "description": "The entity name or alias to look up."},
            "namespaces": {"type": "array", "items": namespace_input(), "minItems": 1, "maxItems": MAX_NAMESPACES,
                           "description": "Namespaces to search; omit for every namespace you may read."},
            "limit": {"type": "integer", "minimum": 1, "maximum": ENTITY_LIMIT.1, "default": ENTITY_LIMIT.0, "description": "Most entities to return (hard max 32)."},
            "evidenceLimit": {"type": "integer", "minimum": 0, "maximum": EVIDENCE_LIMIT.1, "default": EVIDENCE_LIMIT.0,
                              "description": "Evidence packages per entity (hard max 8)."},
            "caps": caps_input(),
            "mode": {"type": "string", "enum": MODES,
                     "description": "text, vector or hybrid; omit for hybrid when embeddings are configured, else text. vector without embeddings is an error."},
            "tokenBudget": token_budget_input(),
        },
        "required": ["text"],
        "additionalProperties": false
    })
}

fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "hits": {"type": "array", "items": {"type": "object", "properties": {
                "namespace": {"type": "string"}, "entityKey": {"type": "string"}, "name": {"type": "string"},
                "typeId": {"type": "string"}, "typeLabels": {"type": "array", "items": {"type": "string"}},
                "degree": {"type": "integer"}, "role": {"type": "string", "enum": ["bridge", "filter", "ignore"]},
                "score": {"type": "number"}, "evidence": {"type": "array", "items": package_schema()},
                "evidenceTruncated": {"type": "boolean"}
            }, "required": ["namespace", "entityKey", "name", "degree", "role", "evidence"]}},
            "total": {"type": "integer", "description": "Matching entities with a mention you may read, across the namespaces that answered."},
            "truncated": {"type": "boolean", "description": "More entities matched than limit returned."},
            "trace": {"type": "object", "properties": {
                "namespaces": {"type": "array", "items": {"type": "object", "properties": {
                    "namespace": {"type": "string"}, "ok": {"type": "boolean"}, "errorCode": {"type": "string"},
                    "mode": {"type": "string", "enum": MODES},
                    "evidence": {"type": "object", "properties": {
                        "ok": {"type": "boolean"}, "errorCode": {"type": "string"}
                    }, "required": ["ok", "errorCode"]},
                    "sides": {"type": "array", "items": {"type": "object", "properties": {
                        "side": {"type": "string", "enum": ["text", "vector"]}, "ok": {"type": "boolean"},
                        "candidates": {"type": "integer"}, "errorCode": {"type": "string"}, "message": {"type": "string"}
                    }, "required": ["side", "ok"]}}
                }, "required": ["namespace", "ok"]}},
                "tokenBudget": token_budget_output(),
                "missingOffsets": missing_offsets_output()
            }, "required": ["namespaces"]}
        },
        "required": ["hits", "total", "truncated", "trace"]
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::GroundedEntity;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn failed_evidence_is_traced_and_names_are_sanitised() {
        let namespaces = vec!["a".to_owned(), "b".to_owned()];
        let hit = |key: &str, name: &str| EntityHit {
            entity_key: key.into(),
            name: name.into(),
            type_id: "org".into(),
            type_labels: vec!["Org\u{202E}anisation".into()],
            degree: 2,
            role: "bridge".into(),
            score: 0.5,
            evidence_chunk_keys: vec![format!("{key}#0")],
            ..Default::default()
        };
        let trace = vec![
            json!({"namespace": "a", "ok": true, "mode": "text", "sides": []}),
            json!({"namespace": "b", "ok": true, "mode": "text", "sides": []}),
        ];
        let winners = vec![(0, hit("e1", "Acme\u{1b}[31m")), (1, hit("e2", "Zephyr"))];
        let mut packages = std::collections::HashMap::new();
        packages.insert(
            ("a".to_owned(), "e1#0".to_owned()),
            ChunkPackage {
                namespace: "a".into(),
                chunk_key: "e1#0".into(),
                file_id: "f1".into(),
                path: "a.md".into(),
                ..Default::default()
            },
        );
        let evidence = Evidence {
            packages,
            failures: vec![(1, ClientError::new(kg_common::ErrorCode::Timeout, "slow"))],
            per_hit: 3,
            token_budget: None,
        };
        // Five entities matched; two were returned.
        let result = entity_result(&namespaces, trace, &winners, 5, &evidence);
        assert_eq!(
            (&result["total"], &result["truncated"]),
            (&json!(5), &json!(true))
        );
        assert_eq!(result["hits"][0]["name"], "Acme");
        assert_eq!(result["hits"][0]["typeLabels"], json!(["Organisation"]));
        assert_eq!(result["hits"][0]["evidenceTruncated"], false);
        assert_eq!(result["hits"][1]["evidence"], json!([]));
        assert_eq!(result["hits"][1]["evidenceTruncated"], true);
        assert!(result["trace"]["namespaces"][0].get("evidence").is_none());
        assert_eq!(
            result["trace"]["namespaces"][1]["evidence"],
            json!({"ok": false, "errorCode": "timeout"})
        );
        let schema = output_schema();
        super::super::registry::check_schema(&schema, &result, "$").unwrap();
        assert!(result["trace"].get("tokenBudget").is_none());
        // The evidence package has no position: its file predates offsets.
        assert_eq!(
            result["trace"]["missingOffsets"],
            json!([{"namespace": "a", "fileId": "f1", "path": "a.md", "chunkKeys": ["e1#0"]}])
        );

        // A budget spends on the first hit's evidence first.
        let text = |words: &str| {
            Some(kg_proto::v1::ChunkText {
                text: words.into(),
                ..Default::default()
            })
        };
        let mut packages = std::collections::HashMap::new();
        for (ns, key, words) in [
            ("a", "e1#0", "four words of text"),
            ("b", "e2#0", "more words here"),
        ] {
            packages.insert(
                (ns.to_owned(), key.to_owned()),
                ChunkPackage {
                    chunk_key: key.into(),
                    text: text(words),
                    ..Default::default()
                },
            );
        }
        let evidence = Evidence {
            packages,
            failures: Vec::new(),
            per_hit: 3,
            token_budget: Some(5),
        };
        let trace = vec![
            json!({"namespace": "a", "ok": true}),
            json!({"namespace": "b", "ok": true}),
        ];
        // A total under the hits returned (a namespace that answered without counting) is
        // never shown below them.
        let result = entity_result(&namespaces, trace, &winners, 0, &evidence);
        assert_eq!(
            (&result["total"], &result["truncated"]),
            (&json!(2), &json!(false))
        );
        super::super::registry::check_schema(&schema, &result, "$").unwrap();
        assert_eq!(
            result["hits"][0]["evidence"][0]["text"],
            "four words of text"
        );
        assert_eq!(result["hits"][1]["evidence"][0]["textOmitted"], true);
        assert_eq!(
            result["trace"]["tokenBudget"],
            json!({"budget": 5, "used": 5, "omitted": 1, "truncated": true})
        );
    }

    #[test]
    fn entity_search_arguments_are_checked() {
        let ok =
            entity_search_args(&args(json!({"text": " Acme ", "namespaces": ["a", "a"]}))).unwrap();
        assert_eq!(
            (
                ok.text.as_str(),
                ok.namespaces.len(),
                ok.limit,
                ok.evidence_limit
            ),
            ("Acme", 1, 8, 3)
        );
        assert!(entity_search_args(&args(json!({"text": " "}))).is_err());
        assert!(entity_search_args(&args(json!({"text": "x", "limit": 33}))).is_err());
        assert!(entity_search_args(&args(json!({"text": "x", "evidenceLimit": 9}))).is_err());
        assert!(entity_search_args(&args(json!({"text": "x", "bogus": 1}))).is_err());
        let empty = entity_search_args(&args(json!({"text": "x", "namespaces": []}))).unwrap_err();
        assert!(
            empty
                .message
                .starts_with("namespaces is empty: name at least one"),
            "{}",
            empty.message
        );
        assert_eq!(ok.mode, "");
        let vector = entity_search_args(&args(json!({"text": "x", "mode": " vector "}))).unwrap();
        assert_eq!(vector.mode, "vector");
        let err = entity_search_args(&args(json!({"text": "x", "mode": "fuzzy"}))).unwrap_err();
        assert_eq!(err.code, kg_common::ErrorCode::InvalidArgument);
        assert_eq!(
            err.message,
            "unknown mode `fuzzy`; valid modes: text, vector, hybrid"
        );
        let schema = input_schema();
        assert_eq!(
            schema["properties"]["mode"]["enum"],
            json!(["text", "vector", "hybrid"])
        );
    }

    #[test]
    fn filters_and_grounding_map_to_json() {
        let raw: RawFilters = serde_json::from_value(json!({
            "collections": ["policies"], "dateFrom": "2024-01-01", "effectiveAt": "2024-06-01",
            "folderPrefix": "docs", "relationTypeIds": ["owns"]
        }))
        .unwrap();
        let wire = search_filters(Some(raw)).unwrap();
        assert_eq!(wire.collections, ["policies"]);
        assert_eq!(wire.effective_at.as_deref(), Some("2024-06-01"));
        assert!(search_filters(None).is_none());
        assert!(serde_json::from_value::<RawFilters>(json!({"date": "x"})).is_err());

        let value = grounding_json(&Grounding {
            namespace: "demo".into(),
            entities: vec![GroundedEntity {
                entity_key: "ent:org:acme".into(),
                role: "bridge".into(),
                degree: 2,
                ..Default::default()
            }],
            reason: "too_few_bridges".into(),
            ..Default::default()
        });
        assert_eq!(value["reason"], "too_few_bridges");
        assert_eq!(value["entities"][0]["role"], "bridge");
        assert_eq!(value["directCount"], 0);
    }
}
