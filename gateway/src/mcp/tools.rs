//! What each tool does: validate, check the caller's namespaces, call the
//! backends with the signed context, shape the JSON result.

use std::collections::HashMap;

use futures::future::join_all;
use kg_common::ErrorCode;
use kg_proto::v1::{
    CallerContext, ChunkPackage, Grounding, OpenRequest, OutlineRequest, OutlineResponse,
    PackagesRequest, PackagesResponse, SearchHit, SearchRequest, SearchResponse,
};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::args::{self, SearchArgs};
use super::package::{
    PackageJson, missing_offsets, number, package_json, permission_name, section_json,
};
use super::registry::ToolKind;
use super::search::{apply_token_budget, interleave};
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// What one tool call produced, and the namespaces it touched or asked for
/// (for the audit trail).
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The result as JSON text: it goes out as both structuredContent and the text block.
    pub(crate) result: Result<Box<RawValue>, ClientError>,
    pub(crate) namespaces: Vec<String>,
}

/// Runs one tool for an authorized caller.
pub(crate) async fn run(
    state: &GatewayState,
    caller: &Caller,
    kind: ToolKind,
    args: &Map<String, Value>,
) -> Outcome {
    let mut namespaces = requested_namespaces(args);
    if let Err(err) = args::no_nul_characters(args) {
        return Outcome {
            result: Err(err),
            namespaces,
        };
    }
    let value = match kind {
        // The largest answers, serialized straight from the backends' messages.
        ToolKind::Search => {
            let result = match args::search_args(args) {
                Ok(args) => {
                    // No namespaces asked for: the search covers every readable one.
                    if args.namespaces.is_empty()
                        && let Ok(all) = resolve_namespaces(caller.context(), &[])
                    {
                        namespaces = all;
                    }
                    search(state, caller, args).await
                }
                Err(err) => Err(err),
            };
            return Outcome { result, namespaces };
        }
        ToolKind::Namespaces => {
            args::namespaces_args(args).map(|()| self::namespaces(caller.context()))
        }
        ToolKind::Open => match args::open_args(args) {
            Ok(args) => open(state, caller, args).await,
            Err(err) => Err(err),
        },
        ToolKind::Outline => match args::outline_args(args) {
            Ok(args) => outline(state, caller, args).await,
            Err(err) => Err(err),
        },
        ToolKind::Files => match args::files_args(args) {
            Ok(args) => super::files::find_files(state, caller, args).await,
            Err(err) => Err(err),
        },
        ToolKind::File => match args::file_args(args) {
            Ok(args) => super::files::query_file(state, caller, args).await,
            Err(err) => Err(err),
        },
        ToolKind::Hop | ToolKind::Ontology | ToolKind::FileEntities | ToolKind::FileTriples => {
            super::navigation::run(state, caller, kind, args).await
        }
        ToolKind::Cypher => super::cypher::run(state, caller, args).await,
        ToolKind::KnowledgeGraph => {
            super::knowledge_graph::run(state, caller, args, Some(super::MAX_RESULT_BYTES)).await
        }
        ToolKind::EntitySearch => super::entity_search::run(state, caller, args).await,
    };
    Outcome {
        result: value.and_then(|value| json_text(&value)),
        namespaces,
    }
}

/// `value` as JSON text. Failing would be a bug (every map key here is a string), so the
/// caller gets an internal error and the log a line.
pub(crate) fn json_text<T: Serialize>(value: &T) -> Result<Box<RawValue>, ClientError> {
    serde_json::value::to_raw_value(value).map_err(|err| {
        tracing::error!(error = %err, "a tool result did not serialize");
        ClientError::new(ErrorCode::Internal, "")
    })
}

/// The namespaces named in raw arguments (`namespace`, `namespaces`), even
/// when other arguments are invalid. Only well-formed names are kept, so no
/// other argument text can reach the audit log.
pub(crate) fn requested_namespaces(args: &Map<String, Value>) -> Vec<String> {
    // get_knowledge_graph names its namespace `project_reference`.
    let single = args
        .get("namespace")
        .or_else(|| args.get("project_reference"))
        .and_then(Value::as_str);
    let many = args
        .get("namespaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str);
    let mut out: Vec<String> = Vec::new();
    for ns in single.into_iter().chain(many) {
        if out.len() >= args::MAX_NAMESPACES {
            break;
        }
        if kg_common::access::validate_namespace(ns).is_ok() && !out.iter().any(|o| o == ns) {
            out.push(ns.to_owned());
        }
    }
    out
}

fn namespaces(context: &CallerContext) -> Value {
    let list: Vec<Value> = context
        .access
        .iter()
        .map(|a| json!({"name": a.namespace, "permission": permission_name(a.permission())}))
        .collect();
    json!({ "namespaces": list })
}

fn denied(namespace: &str) -> ClientError {
    ClientError::new(
        ErrorCode::PermissionDenied,
        format!(
            "namespace `{namespace}` is not readable by this caller; call kg_namespaces for the ones you may read"
        ),
    )
}

/// The namespaces a search covers: those asked for, all readable, else an error
/// naming the first unreadable one; when none are asked for, every readable one.
pub(crate) fn resolve_namespaces(
    context: &CallerContext,
    requested: &[String],
) -> Result<Vec<String>, ClientError> {
    let readable = |ns: &str| context.access.iter().any(|a| a.namespace == ns);
    if requested.is_empty() {
        let all: Vec<String> = context.access.iter().map(|a| a.namespace.clone()).collect();
        if all.is_empty() {
            return Err(ClientError::new(
                ErrorCode::PermissionDenied,
                "this caller may read no namespace; ask an admin for a read grant",
            ));
        }
        return Ok(all);
    }
    if let Some(first) = requested.iter().find(|ns| !readable(ns)) {
        return Err(denied(first));
    }
    Ok(requested.to_vec())
}

pub(crate) fn require_readable(
    context: &CallerContext,
    namespace: &str,
) -> Result<(), ClientError> {
    resolve_namespaces(context, &[namespace.to_owned()]).map(|_| ())
}

/// How one namespace fared in a search.
#[derive(Debug)]
struct NamespaceOutcome {
    namespace: String,
    hits: Vec<SearchHit>,
    total: u64,
    /// The code, the stage it failed at, and the client-safe message.
    error: Option<(ErrorCode, &'static str, String)>,
}

/// The first round of a search: per-namespace outcomes and the lane trace.
#[derive(Debug)]
struct SearchRound {
    outcomes: Vec<NamespaceOutcome>,
    lanes: Vec<Value>,
    /// co_annotation grounding per namespace, for the answer's `grounding`.
    grounding: Vec<Value>,
    /// Vector-lane pool widening per namespace, for trace.vectorWidening.
    vector_widening: Vec<Value>,
    /// Chunks folded into a hit with the same text, per namespace that folded any, for
    /// trace.duplicatesCollapsed.
    duplicates_collapsed: Vec<Value>,
}

impl SearchRound {
    /// The namespaces' hits interleaved by rank (never by raw score) up to `top_k`, each
    /// with the index of its namespace; the hits move out of the outcomes.
    fn winners(&mut self, top_k: usize) -> Vec<(usize, SearchHit)> {
        let lists = self
            .outcomes
            .iter_mut()
            .map(|o| std::mem::take(&mut o.hits))
            .collect();
        interleave(lists, top_k)
    }

    /// When co_annotation was asked for, every namespace has its grounding entry, in
    /// namespace order: one whose search failed gets an empty one whose reason is the
    /// failure's code, so a caller can tell "no evidence" from "not searched".
    fn ground_failed_namespaces(&mut self, lanes: &[String]) {
        if !lanes.iter().any(|lane| lane == "co_annotation") {
            return;
        }
        let mut reported = std::mem::take(&mut self.grounding);
        for outcome in &self.outcomes {
            if let Some(at) = reported
                .iter()
                .position(|g| g["namespace"] == outcome.namespace.as_str())
            {
                self.grounding.push(reported.swap_remove(at));
            } else if let Some((code, _, _)) = &outcome.error {
                self.grounding
                    .push(super::entity_search::grounding_json(&Grounding {
                        namespace: outcome.namespace.clone(),
                        reason: code.as_str().to_owned(),
                        ..Default::default()
                    }));
            }
        }
        // Entries for namespaces no outcome names (none today) are kept, not dropped.
        self.grounding.append(&mut reported);
    }
}

/// Folds per-namespace Search answers: a failed namespace soft-fails (empty,
/// recorded); when every namespace failed the first error is the answer.
fn collect_searches(
    namespaces: &[String],
    responses: Vec<Result<SearchResponse, ClientError>>,
) -> Result<SearchRound, ClientError> {
    let mut lanes = Vec::new();
    let mut grounding = Vec::new();
    let mut vector_widening = Vec::new();
    let mut duplicates_collapsed = Vec::new();
    let mut outcomes = Vec::new();
    let mut first_error = None;
    for (ns, response) in namespaces.iter().zip(responses) {
        match response {
            Ok(response) => {
                for lane in &response.lanes {
                    let mut entry = json!({
                        "namespace": ns, "lane": lane.lane, "ok": lane.ok, "hits": lane.hits, "millis": number(lane.millis),
                    });
                    if !lane.ok && !lane.error_code.is_empty() {
                        entry["errorCode"] = json!(lane.error_code);
                    }
                    if !lane.ok && !lane.message.is_empty() {
                        entry["message"] = json!(lane.message);
                    }
                    lanes.push(entry);
                }
                if let Some(report) = &response.grounding {
                    grounding.push(super::entity_search::grounding_json(report));
                }
                if let Some(w) = &response.vector_widening {
                    vector_widening.push(json!({
                        "namespace": ns, "pool": w.pool, "rounds": w.rounds, "capReached": w.cap_reached,
                    }));
                }
                if response.duplicates_collapsed > 0 {
                    duplicates_collapsed
                        .push(json!({"namespace": ns, "chunks": response.duplicates_collapsed}));
                }
                outcomes.push(NamespaceOutcome {
                    namespace: ns.clone(),
                    hits: response.hits,
                    total: response.total_candidates,
                    error: None,
                });
            }
            Err(err) if is_caller_error(&err) => return Err(err),
            Err(err) => {
                tracing::warn!(namespace = %ns, code = %err.code, "namespace search soft-failed");
                outcomes.push(NamespaceOutcome {
                    namespace: ns.clone(),
                    hits: Vec::new(),
                    total: 0,
                    error: Some((err.code, "search", err.message.clone())),
                });
                first_error.get_or_insert(err);
            }
        }
    }
    // Soft-fail means "continue with the others"; with nothing left it is an error.
    match first_error {
        Some(err) if outcomes.iter().all(|o| o.error.is_some()) => Err(err),
        _ => Ok(SearchRound {
            outcomes,
            lanes,
            grounding,
            vector_widening,
            duplicates_collapsed,
        }),
    }
}

/// Whether a backend refused the caller rather than failing for one namespace: the signed
/// context was not accepted, so the call fails closed with that error instead of answering
/// with whatever other namespaces returned.
pub(super) fn is_caller_error(err: &ClientError) -> bool {
    err.code == ErrorCode::Unauthenticated
}

/// Builds the kg_search result from the winners (in interleaved order) and the
/// packages each namespace returned for them. Fails when the caller was refused, or when
/// every namespace holding a winner failed to return its packages.
fn assemble(
    round: SearchRound,
    winners: &[(usize, SearchHit)],
    package_lists: Vec<Result<Vec<ChunkPackage>, ClientError>>,
    token_budget: Option<u32>,
) -> Result<Box<RawValue>, ClientError> {
    let SearchRound {
        mut outcomes,
        lanes,
        grounding,
        vector_widening,
        duplicates_collapsed,
    } = round;
    let mut packages: Vec<HashMap<String, ChunkPackage>> = Vec::with_capacity(outcomes.len());
    let mut first_error = None;
    for (outcome, result) in outcomes.iter_mut().zip(package_lists) {
        match result {
            Ok(list) => packages.push(list.into_iter().map(|p| (p.chunk_key.clone(), p)).collect()),
            Err(err) if is_caller_error(&err) => return Err(err),
            Err(err) => {
                tracing::warn!(namespace = %outcome.namespace, code = %err.code, "namespace packages soft-failed");
                outcome.error = Some((err.code, "packages", err.message.clone()));
                packages.push(HashMap::new());
                first_error.get_or_insert(err);
            }
        }
    }
    // Hits were found but none could be read: an error, not an empty answer.
    if let Some(err) = first_error
        && !winners.is_empty()
        && winners.iter().all(|(index, _)| {
            outcomes
                .get(*index)
                .is_some_and(|outcome| outcome.error.is_some())
        })
    {
        return Err(err);
    }
    // Keep the interleaved order; a chunk that became unreadable meanwhile drops out.
    let mut result_hits: Vec<&SearchHit> = Vec::with_capacity(winners.len());
    let mut results: Vec<ChunkPackage> = winners
        .iter()
        .filter_map(|(index, hit)| {
            let mut package = packages.get_mut(*index)?.remove(&hit.chunk_key)?;
            package.score = Some(hit.display_score);
            result_hits.push(hit);
            Some(package)
        })
        .collect();
    let missing_offsets = missing_offsets(&results);
    let budget = token_budget.map(|b| apply_token_budget(&mut results, b));

    let namespace_trace: Vec<Value> = outcomes
        .iter()
        .map(|o| match o.error {
            None => json!({"namespace": o.namespace, "ok": true}),
            Some((code, stage, ref message)) => json!({
                "namespace": o.namespace, "ok": false, "errorCode": code.as_str(), "stage": stage,
                "message": message,
            }),
        })
        .collect();
    let mut trace = json!({"lanes": lanes, "namespaces": namespace_trace});
    if let Some(report) = budget {
        trace["tokenBudget"] = json!(report);
    }
    if !vector_widening.is_empty() {
        trace["vectorWidening"] = json!(vector_widening);
    }
    if !duplicates_collapsed.is_empty() {
        trace["duplicatesCollapsed"] = json!(duplicates_collapsed);
    }
    if !missing_offsets.is_empty() {
        trace["missingOffsets"] = json!(missing_offsets);
    }
    let total: u64 = outcomes
        .iter()
        .filter(|o| o.error.is_none())
        .map(|o| o.total)
        .sum();
    let returned = results.len() as u64;
    json_text(&SearchAnswer {
        results: results
            .iter()
            .zip(result_hits)
            .map(|(package, hit)| PackageJson::of_hit(package, hit))
            .collect(),
        total: total.max(returned),
        truncated: total > returned,
        grounding: (!grounding.is_empty()).then_some(grounding),
        trace,
    })
}

/// The kg_search answer.
#[derive(Serialize)]
struct SearchAnswer<'a> {
    results: Vec<PackageJson<'a>>,
    total: u64,
    truncated: bool,
    /// One entry per namespace when co_annotation ran; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    grounding: Option<Vec<Value>>,
    trace: Value,
}

async fn search(
    state: &GatewayState,
    caller: &Caller,
    args: SearchArgs,
) -> Result<Box<RawValue>, ClientError> {
    let namespaces = resolve_namespaces(caller.context(), &args.namespaces)?;
    let calls = namespaces.iter().map(|ns| {
        let mut client = state.backends.retrieval.clone();
        let request = caller.request(SearchRequest {
            namespace: ns.clone(),
            query: args.query.clone(),
            lanes: args.lanes.clone(),
            top_k: args.top_k,
            filters: args.filters.clone(),
            ranking: args.ranking.clone(),
        });
        async move {
            client
                .search(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| ClientError::from_status("retrieval", &status))
        }
    });
    let mut round = collect_searches(&namespaces, join_all(calls).await)?;
    round.ground_failed_namespaces(&args.lanes);
    let winners = round.winners(args.top_k as usize);

    // Packages per namespace, in parallel, for that namespace's winners.
    let mut keys_by_ns: Vec<Vec<String>> = vec![Vec::new(); round.outcomes.len()];
    for (index, hit) in &winners {
        keys_by_ns[*index].push(hit.chunk_key.clone());
    }
    let calls = round
        .outcomes
        .iter()
        .zip(keys_by_ns)
        .map(|(outcome, chunk_keys)| {
            let mut client = state.backends.graph.clone();
            let empty = chunk_keys.is_empty();
            let request = caller.request(PackagesRequest {
                namespace: outcome.namespace.clone(),
                chunk_keys,
                caps: Some(args.caps),
            });
            async move {
                if empty {
                    return Ok(Vec::new());
                }
                client
                    .packages(request)
                    .await
                    .map(|r| r.into_inner().packages)
                    .map_err(|status| ClientError::from_status("graph", &status))
            }
        });
    let package_lists = join_all(calls).await;
    assemble(round, &winners, package_lists, args.token_budget)
}

async fn open(
    state: &GatewayState,
    caller: &Caller,
    args: args::OpenArgs,
) -> Result<Value, ClientError> {
    require_readable(caller.context(), &args.namespace)?;
    let file_id = match &args.key {
        kg_proto::v1::open_request::Key::FileId(id) => Some(id.clone()),
        _ => None,
    };
    let namespace = args.namespace.clone();
    let request = caller.request(OpenRequest {
        namespace: args.namespace,
        key: Some(args.key),
        limit: args.limit,
        caps: Some(args.caps),
    });
    let response = match state.backends.graph.clone().open(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let err = ClientError::from_status("graph", &status);
            return Err(match file_id {
                Some(id) => explain_unindexed(state, caller, &namespace, &id, err).await,
                None => err,
            });
        }
    };
    Ok(packages_result(response, args.token_budget))
}

/// A file the graph holds no chunks of is "not found" to it. When the caller may read the
/// file (the files service checks, under the caller's own access), the file is there and
/// only not indexed: say why, so an agent neither concludes it does not exist nor retries a
/// file that will never have chunks. Anything else keeps the graph's answer, so a file the
/// caller may not read stays exactly as not found as a missing one.
async fn explain_unindexed(
    state: &GatewayState,
    caller: &Caller,
    namespace: &str,
    file_id: &str,
    err: ClientError,
) -> ClientError {
    use kg_proto::v1::FileStatus;
    if err.code != ErrorCode::NotFound {
        return err;
    }
    let request = caller.request(kg_proto::v1::QueryFileRequest {
        namespace: namespace.to_owned(),
        selector: Some(kg_proto::v1::query_file_request::Selector::FileId(
            file_id.to_owned(),
        )),
        ..Default::default()
    });
    let Ok(response) = state.backends.files.clone().query_file(request).await else {
        return err;
    };
    let Some(file) = response.into_inner().file else {
        return err;
    };
    let path = kg_common::sanitize::sanitize_text(&file.path, 1024);
    let reason = kg_common::sanitize::sanitize_text(&file.status_reason, 1024);
    let why = match file.status() {
        FileStatus::Pending => {
            "is not indexed yet (status pending): retry shortly; kg_file reads it now".to_owned()
        }
        FileStatus::Failed => {
            format!("could not be indexed (status failed: {reason}); kg_file reads what is stored")
        }
        FileStatus::Stored => format!(
            "is stored without indexing (status stored: {reason}): it has no chunks or \
             outline; kg_file gives its size and type"
        ),
        _ => return err,
    };
    ClientError::new(
        ErrorCode::FailedPrecondition,
        format!("file `{file_id}` ({path}) {why}"),
    )
}

/// The `{packages, total, truncated}` result of kg_open and kg_hop, with `tokenBudget` when
/// the caller set one and `trace.missingOffsets` when a package's file predates offsets.
pub(crate) fn packages_result(mut response: PackagesResponse, token_budget: Option<u32>) -> Value {
    let returned = response.packages.len() as u64;
    let budget = token_budget.map(|b| apply_token_budget(&mut response.packages, b));
    let missing_offsets = missing_offsets(&response.packages);
    let mut result = json!({
        "packages": response.packages.iter().map(package_json).collect::<Vec<_>>(),
        "total": response.total.max(returned),
        "truncated": response.truncated,
    });
    if let Some(report) = budget {
        result["tokenBudget"] = json!(report);
    }
    if !missing_offsets.is_empty() {
        result["trace"] = json!({"missingOffsets": missing_offsets});
    }
    result
}

async fn outline(
    state: &GatewayState,
    caller: &Caller,
    args: args::OutlineArgs,
) -> Result<Value, ClientError> {
    require_readable(caller.context(), &args.namespace)?;
    let (namespace, file_id) = (args.namespace.clone(), args.file_id.clone());
    let request = caller.request(OutlineRequest {
        namespace: args.namespace,
        file_id: args.file_id,
        limit: args.limit,
        cursor: args.cursor,
        max_depth: args.max_depth,
    });
    let response = match state.backends.graph.clone().outline(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            let err = ClientError::from_status("graph", &status);
            return Err(explain_unindexed(state, caller, &namespace, &file_id, err).await);
        }
    };
    Ok(outline_result(response))
}

fn outline_result(response: OutlineResponse) -> Value {
    let next_cursor = if response.next_cursor.is_empty() {
        Value::Null
    } else {
        Value::String(response.next_cursor)
    };
    json!({
        "fileId": kg_common::sanitize::sanitize_text(&response.file_id, 1024),
        "path": kg_common::sanitize::sanitize_text(&response.path, 1024),
        "sections": response.sections.iter().map(section_json).collect::<Vec<_>>(),
        "nextCursor": next_cursor,
        "total": response.total,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_proto::v1::{AccessFilter, Permission};

    /// The kg_search answer as the client reads it.
    fn assembled(
        round: SearchRound,
        winners: &[(usize, SearchHit)],
        package_lists: Vec<Result<Vec<ChunkPackage>, ClientError>>,
        token_budget: Option<u32>,
    ) -> Value {
        let text = assemble(round, winners, package_lists, token_budget).unwrap();
        serde_json::from_str(text.get()).unwrap()
    }

    fn context(namespaces: &[(&str, Permission)]) -> CallerContext {
        CallerContext {
            principal_id: "p1".into(),
            access: namespaces
                .iter()
                .map(|(ns, perm)| AccessFilter {
                    namespace: (*ns).into(),
                    allow_prefixes: vec![String::new()],
                    permission: *perm as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn hit(key: &str, score: f64) -> SearchHit {
        SearchHit {
            chunk_key: key.into(),
            display_score: score,
            ..Default::default()
        }
    }

    fn packages(keys: &[&str]) -> Vec<ChunkPackage> {
        keys.iter()
            .map(|k| ChunkPackage {
                chunk_key: (*k).into(),
                text: Some(kg_proto::v1::ChunkText {
                    text: format!("text of {k}"),
                    ..Default::default()
                }),
                position: Some(kg_proto::v1::Position {
                    token_count: 10,
                    char_start: Some(0),
                    char_end: Some(10),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    }

    fn response(hits: Vec<SearchHit>, total: u64) -> SearchResponse {
        SearchResponse {
            hits,
            total_candidates: total,
            lanes: vec![kg_proto::v1::LaneTrace {
                lane: "fulltext".into(),
                ok: true,
                hits: 2,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn keys(result: &Value) -> Vec<String> {
        result["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["chunkKey"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn search_interleaves_soft_fails_and_keeps_order() {
        let namespaces = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let round = collect_searches(
            &namespaces,
            vec![
                Ok(response(
                    vec![hit("a1", 0.9), hit("a2", 0.8), hit("a3", 0.7)],
                    10,
                )),
                Err(ClientError::new(ErrorCode::Unavailable, "down")),
                // Higher raw scores in c do not jump the queue.
                Ok(response(vec![hit("c1", 0.99), hit("c2", 0.98)], 2)),
            ],
        )
        .unwrap();
        let mut round = round;
        let winners = round.winners(4);
        let result = assembled(
            round,
            &winners,
            vec![
                Ok(packages(&["a2", "a1"])),
                Ok(Vec::new()),
                Ok(packages(&["c1", "c2"])),
            ],
            None,
        );
        assert_eq!(keys(&result), ["a1", "c1", "a2", "c2"]);
        assert_eq!(result["results"][1]["score"], 0.99);
        assert_eq!(result["total"], 12);
        assert_eq!(result["truncated"], true);
        assert_eq!(
            result["trace"]["namespaces"],
            json!([
                {"namespace": "a", "ok": true},
                {"namespace": "b", "ok": false, "errorCode": "unavailable", "stage": "search", "message": "down"},
                {"namespace": "c", "ok": true}
            ])
        );
        assert_eq!(result["trace"]["lanes"].as_array().unwrap().len(), 2);
        assert!(result["trace"].get("tokenBudget").is_none());
        assert!(result.get("grounding").is_none());
    }

    #[test]
    fn co_annotation_grounding_is_part_of_the_answer() {
        let mut grounded = response(Vec::new(), 0);
        grounded.grounding = Some(kg_proto::v1::Grounding {
            namespace: "a".into(),
            reason: "too_few_bridges".into(),
            ..Default::default()
        });
        let round = collect_searches(
            &["a".to_owned(), "b".to_owned()],
            vec![Ok(grounded), Ok(response(Vec::new(), 0))],
        )
        .unwrap();
        let result = assembled(round, &[], vec![Ok(Vec::new()), Ok(Vec::new())], None);
        assert!(result["trace"].get("grounding").is_none());
        assert_eq!(
            result["grounding"],
            json!([{"namespace": "a", "entities": [], "pair": [], "directCount": 0,
                    "bridgeCount": 0, "reason": "too_few_bridges"}])
        );
    }

    #[test]
    fn a_namespace_that_failed_still_has_its_grounding_entry() {
        let grounded = |ns: &str| {
            let mut answer = response(Vec::new(), 0);
            answer.grounding = Some(kg_proto::v1::Grounding {
                namespace: ns.into(),
                reason: "too_few_bridges".into(),
                ..Default::default()
            });
            answer
        };
        let namespaces = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let lanes = ["co_annotation".to_owned()];
        let mut round = collect_searches(
            &namespaces,
            vec![
                Ok(grounded("a")),
                Err(ClientError::new(ErrorCode::FailedPrecondition, "no index")),
                Ok(grounded("c")),
            ],
        )
        .unwrap();
        round.ground_failed_namespaces(&lanes);
        let reasons: Vec<(Value, Value)> = round
            .grounding
            .iter()
            .map(|g| (g["namespace"].clone(), g["reason"].clone()))
            .collect();
        assert_eq!(
            reasons,
            [
                (json!("a"), json!("too_few_bridges")),
                (json!("b"), json!("failed_precondition")),
                (json!("c"), json!("too_few_bridges")),
            ]
        );
        let result = assembled(
            round,
            &[],
            vec![Ok(Vec::new()), Ok(Vec::new()), Ok(Vec::new())],
            None,
        );
        conforms("kg_search", &result);

        // Without co_annotation nothing is added.
        let mut round = collect_searches(
            &namespaces[..2],
            vec![
                Ok(response(Vec::new(), 0)),
                Err(ClientError::new(ErrorCode::Timeout, "slow")),
            ],
        )
        .unwrap();
        round.ground_failed_namespaces(&["fulltext".to_owned()]);
        assert!(round.grounding.is_empty());
    }

    #[test]
    fn missing_offsets_come_from_the_returned_packages_per_namespace() {
        let namespaces = vec!["a".to_owned(), "b".to_owned()];
        let mut round = collect_searches(
            &namespaces,
            vec![
                Ok(response(vec![hit("a1", 0.9)], 1)),
                Ok(response(
                    vec![
                        hit("f1#2", 0.8),
                        hit("g1#0", 0.7),
                        hit("f1#0", 0.6),
                        hit("b9", 0.5),
                    ],
                    4,
                )),
            ],
        )
        .unwrap();
        let winners = round.winners(4);
        let legacy = |key: &str, file: &str, path: &str| {
            let mut package = packages(&[key]).remove(0);
            package.namespace = "b".into();
            package.file_id = file.into();
            package.path = path.into();
            if let Some(position) = package.position.as_mut() {
                position.char_start = None;
                position.char_end = None;
            }
            package
        };
        let b_packages = vec![
            legacy("f1#2", "f1", "legacy/notes.md"),
            legacy("g1#0", "g1", "archive/a.md"),
            legacy("f1#0", "f1", "legacy/notes.md"),
            packages(&["b9"]).remove(0),
        ];
        let result = assembled(
            round,
            &winners,
            vec![Ok(packages(&["a1"])), Ok(b_packages)],
            None,
        );
        // b9 has offsets and interleaving cut it: neither is reported. Files in path
        // order, chunks in result order.
        assert_eq!(
            result["trace"]["missingOffsets"],
            json!([
                {"namespace": "b", "fileId": "g1", "path": "archive/a.md", "chunkKeys": ["g1#0"]},
                {"namespace": "b", "fileId": "f1", "path": "legacy/notes.md", "chunkKeys": ["f1#2", "f1#0"]}
            ])
        );
        conforms("kg_search", &result);
        // Nothing to report: the key is absent.
        let round = collect_searches(
            &["a".to_owned()],
            vec![Ok(response(vec![hit("a1", 0.9)], 1))],
        )
        .unwrap();
        let winners = vec![(0, hit("a1", 0.9))];
        let result = assembled(round, &winners, vec![Ok(packages(&["a1"]))], None);
        assert_eq!(keys(&result), ["a1"]);
        assert!(result["trace"].get("missingOffsets").is_none());
    }

    /// Namespaces `a` and `b` searched, one hit each (`a1`, `b1`).
    fn one_hit_in_a_and_b() -> SearchRound {
        collect_searches(
            &["a".to_owned(), "b".to_owned()],
            vec![
                Ok(response(vec![hit("a1", 0.5)], 1)),
                Ok(response(vec![hit("b1", 0.5)], 1)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn failed_packages_drop_that_namespace_and_budget_is_reported() {
        let mut round = one_hit_in_a_and_b();
        let winners = round.winners(8);
        let result = assembled(
            round,
            &winners,
            vec![
                Ok(packages(&["a1"])),
                Err(ClientError::new(ErrorCode::Timeout, "slow")),
            ],
            Some(5),
        );
        assert_eq!(keys(&result), ["a1"]);
        assert_eq!(result["trace"]["namespaces"][1]["stage"], "packages");
        assert_eq!(result["total"], 1);
        assert_eq!(result["truncated"], false);
        assert_eq!(
            result["trace"]["tokenBudget"],
            json!({"budget": 5, "used": 5, "omitted": 0, "truncated": true})
        );
        assert_eq!(result["results"][0]["textTruncated"], true);
    }

    #[test]
    fn a_refused_caller_fails_the_search_and_unreadable_winners_are_not_an_empty_answer() {
        let namespaces = vec!["a".to_owned(), "b".to_owned()];
        // The context expired between the search and the packages: the auth error, even
        // though the other namespace answered.
        let mut round = one_hit_in_a_and_b();
        let winners = round.winners(8);
        let err = assemble(
            round,
            &winners,
            vec![
                Ok(packages(&["a1"])),
                Err(ClientError::new(ErrorCode::Unauthenticated, "expired")),
            ],
            None,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthenticated);
        // Every namespace with a winner failed its packages: the error, not `results: []`.
        let mut round = one_hit_in_a_and_b();
        let winners = round.winners(8);
        let err = assemble(
            round,
            &winners,
            vec![
                Err(ClientError::new(ErrorCode::Unavailable, "graph down")),
                Err(ClientError::new(ErrorCode::Timeout, "slow")),
            ],
            None,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unavailable);
        // At the search stage too: one namespace refusing the caller fails the call.
        let err = collect_searches(
            &namespaces,
            vec![
                Ok(response(vec![hit("a1", 0.5)], 1)),
                Err(ClientError::new(ErrorCode::Unauthenticated, "expired")),
            ],
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthenticated);
    }

    #[test]
    fn search_fails_only_when_every_namespace_failed() {
        let namespaces = vec!["a".to_owned(), "b".to_owned()];
        let err = collect_searches(
            &namespaces,
            vec![
                Err(ClientError::new(ErrorCode::Unauthenticated, "expired")),
                Err(ClientError::new(ErrorCode::Unavailable, "down")),
            ],
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::Unauthenticated);
    }

    fn output_schema(tool: &str) -> Value {
        let registry = super::super::registry::ToolRegistry::builtin();
        let schema = registry
            .get(tool)
            .unwrap()
            .tool
            .output_schema
            .clone()
            .unwrap();
        Value::Object((*schema).clone())
    }

    fn conforms(tool: &str, value: &Value) {
        if let Err(err) = super::super::registry::check_schema(&output_schema(tool), value, "$") {
            panic!("{tool} result does not match its outputSchema: {err}\n{value:#}");
        }
    }

    /// A package with every optional part filled in.
    fn full_package() -> ChunkPackage {
        use kg_proto::v1::*;
        let r = |k: &str| OutlineRef {
            outline_key: k.into(),
            title: format!("Title {k}"),
            depth: 2,
            order: 1,
        };
        ChunkPackage {
            namespace: "demo".into(),
            chunk_key: "c1".into(),
            file_id: "f1".into(),
            path: "a.md".into(),
            text: Some(ChunkText {
                text: "body".into(),
                context_header: "A › B".into(),
                citation: "demo/a.md › B (pp. 1–2)".into(),
                text_truncated: true,
                text_omitted: false,
            }),
            position: Some(Position {
                chunk_index: 0,
                char_start: Some(0),
                char_end: Some(4),
                page_start: Some(1),
                page_end: Some(2),
                line_start: Some(1),
                line_end: Some(1),
                token_count: 1,
                prev_chunk_key: Some("c0".into()),
                next_chunk_key: Some("c2".into()),
            }),
            outline: Some(OutlineContext {
                section: Some(r("o1")),
                ancestors: vec![r("o0")],
                siblings: vec![r("o2")],
                children: vec![r("o3")],
            }),
            mentions: vec![Mention {
                entity_key: "e1".into(),
                name: "Ada".into(),
                char_start: Some(3),
                ..Default::default()
            }],
            rel_neighbors: vec![RelNeighbor::default()],
            dates: Some(Dates {
                document_date: Some("2024-01-01".into()),
                effective_from: Some("2024-01-01".into()),
                effective_to: None,
                collections: vec!["policies".into()],
            }),
            similar_files: vec![SimilarFile {
                file_id: "f2".into(),
                path: "b.md".into(),
                score: f64::NAN,
            }],
            score: Some(0.7),
            counts: Some(ListCounts {
                lists: vec![ListCount {
                    list: "mentions".into(),
                    total: 40,
                    truncated: true,
                }],
            }),
        }
    }

    #[test]
    fn results_match_their_output_schemas() {
        conforms(
            "kg_namespaces",
            &namespaces(&context(&[("demo", Permission::Write)])),
        );

        let namespaces = vec!["a".to_owned(), "b".to_owned()];
        let mut failed = response(vec![hit("c1", 0.5)], 3);
        failed.lanes[0].ok = false;
        failed.lanes[0].error_code = "unavailable".into();
        let mut round = collect_searches(
            &namespaces,
            vec![
                Ok(failed),
                Err(ClientError::new(ErrorCode::Unavailable, "down")),
            ],
        )
        .unwrap();
        let winners = round.winners(8);
        let result = assembled(
            round,
            &winners,
            vec![Ok(vec![full_package()]), Ok(Vec::new())],
            Some(3),
        );
        assert_eq!(result["results"][0]["similarFiles"][0]["score"], 0.0);
        conforms("kg_search", &result);

        let minimal = ChunkPackage {
            chunk_key: "c9".into(),
            ..Default::default()
        };
        let long = ChunkPackage {
            chunk_key: "c10".into(),
            text: Some(kg_proto::v1::ChunkText {
                text: "one two three four five six seven eight".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let opened = PackagesResponse {
            packages: vec![full_package(), minimal, long],
            total: 5,
            truncated: true,
        };
        let unbudgeted = packages_result(opened.clone(), None);
        conforms("kg_open", &unbudgeted);
        assert!(unbudgeted.get("tokenBudget").is_none());
        // The two bare packages have no position, as a file indexed before offsets existed.
        assert_eq!(
            unbudgeted["trace"]["missingOffsets"],
            json!([{"namespace": "", "fileId": "", "path": "", "chunkKeys": ["c9", "c10"]}])
        );
        let with_offsets = PackagesResponse {
            packages: vec![full_package()],
            total: 1,
            truncated: false,
        };
        assert!(packages_result(with_offsets, None).get("trace").is_none());
        // The first text fits the one-token budget; the next loses its text, as in kg_search.
        let budgeted = packages_result(opened, Some(1));
        conforms("kg_hop", &budgeted);
        assert_eq!(
            budgeted["tokenBudget"],
            json!({"budget": 1, "used": 1, "omitted": 1, "truncated": true})
        );
        assert_eq!(budgeted["packages"][0]["text"], "body");
        assert_eq!(budgeted["packages"][2]["textOmitted"], true);

        let outline = OutlineResponse {
            file_id: "f1".into(),
            path: "a.md".into(),
            sections: vec![
                kg_proto::v1::OutlineSection {
                    outline_key: "o1".into(),
                    title: "Intro".into(),
                    depth: 1,
                    order: 0,
                    parent_key: None,
                    page_start: None,
                    page_end: None,
                    line_start: Some(1),
                    chunk_count: 2,
                },
                kg_proto::v1::OutlineSection {
                    outline_key: "o2".into(),
                    parent_key: Some("o1".into()),
                    page_start: Some(3),
                    page_end: Some(4),
                    ..Default::default()
                },
            ],
            next_cursor: String::new(),
            total: 2,
        };
        let value = outline_result(outline.clone());
        assert_eq!(value["nextCursor"], Value::Null);
        conforms("kg_outline", &value);
        let value = outline_result(OutlineResponse {
            next_cursor: "o2".into(),
            ..outline
        });
        assert_eq!(value["nextCursor"], "o2");
        conforms("kg_outline", &value);
    }

    #[test]
    fn namespaces_lists_the_access_entries() {
        let ctx = context(&[("demo", Permission::Read), ("ops", Permission::Admin)]);
        assert_eq!(
            namespaces(&ctx),
            json!({"namespaces": [{"name": "demo", "permission": "read"}, {"name": "ops", "permission": "admin"}]})
        );
    }

    #[test]
    fn audited_namespaces_are_well_formed_names_only() {
        let args = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            requested_namespaces(&args(json!({"namespace": "demo", "query": "secret words"}))),
            ["demo"]
        );
        assert_eq!(
            requested_namespaces(&args(
                json!({"namespaces": ["a", "a", "Not A Namespace", 7, "b"], "topK": 99})
            )),
            ["a", "b"]
        );
        assert!(requested_namespaces(&args(json!({"namespace": "../etc/passwd"}))).is_empty());
        let many: Vec<String> = (0..100).map(|i| format!("ns{i}")).collect();
        assert_eq!(
            requested_namespaces(&args(json!({ "namespaces": many }))).len(),
            args::MAX_NAMESPACES
        );
    }

    #[test]
    fn requested_namespaces_must_all_be_readable() {
        let ctx = context(&[("demo", Permission::Read), ("ops", Permission::Write)]);
        assert_eq!(resolve_namespaces(&ctx, &[]).unwrap(), ["demo", "ops"]);
        assert_eq!(resolve_namespaces(&ctx, &["ops".into()]).unwrap(), ["ops"]);
        let err = resolve_namespaces(&ctx, &["demo".into(), "secret".into(), "other".into()])
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::PermissionDenied);
        assert!(err.message.contains("`secret`"), "{}", err.message);
        let err = resolve_namespaces(&context(&[]), &[]).unwrap_err();
        assert_eq!(err.code, ErrorCode::PermissionDenied);
    }
}
