//! Running a rewritten statement: one at a time per FalkorDB server, waiting in line for as
//! long as the call's deadline leaves room for the statement itself, `GRAPH.RO_QUERY` with a
//! server-side timeout, and rows shaped for a model.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use kg_common::sanitize::sanitize_text;
use kg_proto::v1::{CallerContext, CypherRequest, CypherResponse};
use kg_stores::StoreError;
use kg_stores::graph::Params;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use super::AccessGuard;
use super::core::{self, Column};
use crate::error::{GraphError, Result};
use crate::service::GraphService;

/// Server-side limit on one statement.
pub const QUERY_TIMEOUT_MS: u64 = 2_000;
/// Most rows returned (the final LIMIT is at most this too).
pub const ROW_CAP: usize = 50;
/// Longest string value returned, in characters.
pub const TEXT_CAP: usize = 4_000;
/// Largest `params_json` accepted, in bytes.
const MAX_PARAMS_BYTES: usize = 64 * 1024;
/// Client-side guard over the server timeout (network and queueing slack).
const CLIENT_SLACK_MS: u64 = 1_000;

// One semaphore per FalkorDB server: statements queue here rather than inside FalkorDB.
static GATES: LazyLock<Mutex<HashMap<String, Arc<Semaphore>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// How long a statement may wait for its turn in a call allowed `allowed`: the call's working
/// time less the statement's own run (server timeout and slack). Parallel calls wait in line;
/// `busy` only when the line is longer than the caller's deadline.
pub fn turn_wait(allowed: Duration) -> Duration {
    kg_common::grpc::work_budget(allowed)
        .saturating_sub(Duration::from_millis(QUERY_TIMEOUT_MS + CLIENT_SLACK_MS))
}

fn gate_for(server: &str) -> Arc<Semaphore> {
    let mut gates = GATES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    gates
        .entry(server.to_owned())
        .or_insert_with(|| Arc::new(Semaphore::new(1)))
        .clone()
}

impl GraphService {
    /// The gate kg_cypher statements queue on for this service's FalkorDB (one permit).
    pub fn cypher_gate(&self) -> Arc<Semaphore> {
        gate_for(self.store.server_identity())
    }

    /// Validates, rewrites and runs one kg_cypher statement for `caller`, within the server's
    /// longest request time.
    pub async fn cypher_for(
        &self,
        caller: &CallerContext,
        request: CypherRequest,
    ) -> Result<CypherResponse> {
        self.cypher_within(caller, request, kg_common::grpc::REQUEST_TIMEOUT)
            .await
    }

    /// [`Self::cypher_for`] in a call allowed `allowed` (its gRPC deadline): the statement
    /// waits its turn for [`turn_wait`] of it.
    pub async fn cypher_within(
        &self,
        caller: &CallerContext,
        request: CypherRequest,
        allowed: Duration,
    ) -> Result<CypherResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let guard = AccessGuard::new(scope.access);
        let rewritten = core::rewrite(&request.statement, &guard).map_err(GraphError::Refused)?;
        let mut params = user_params(&request.params_json, &rewritten.params)?;
        params.extend(guard.params());

        let gate = self.cypher_gate();
        let wait = turn_wait(allowed);
        let permit = tokio::time::timeout(wait, gate.acquire_owned())
            .await
            .ok()
            .and_then(|acquired| acquired.ok())
            .ok_or_else(|| {
                GraphError::Busy(format!(
                    "kg_cypher statements ahead of this one held the graph for {} ms, as long as this call could wait; retry shortly",
                    wait.as_millis()
                ))
            })?;
        let started = Instant::now();
        let outcome = tokio::time::timeout(
            Duration::from_millis(QUERY_TIMEOUT_MS + CLIENT_SLACK_MS),
            self.store
                .ro_query(scope.namespace, &rewritten.text, &params, QUERY_TIMEOUT_MS),
        )
        .await;
        drop(permit);
        let millis = started.elapsed().as_secs_f64() * 1_000.0;
        let rows = match outcome {
            Err(_) | Ok(Err(StoreError::Timeout { .. })) => {
                return Err(GraphError::Timeout(format!(
                    "the statement ran longer than {QUERY_TIMEOUT_MS} ms; narrow the MATCH (a known path, a chunk key, a smaller LIMIT)"
                )));
            }
            Ok(Err(StoreError::GraphQuery { detail })) => {
                tracing::info!(%detail, "FalkorDB refused a kg_cypher statement");
                return Err(GraphError::invalid(
                    "the graph store could not run the statement (for example a type mismatch, an aggregate mixed with a non-grouped value in ORDER BY, or a duplicate column name); check the types and the WITH/RETURN items",
                ));
            }
            Ok(other) => other?,
        };
        let rows_json = rows
            .rows
            .into_iter()
            .take(ROW_CAP)
            .map(|row| shape_row(row, &rewritten.columns))
            .collect::<Result<Vec<_>>>()?;
        Ok(CypherResponse {
            columns: rewritten.columns.iter().map(|c| c.name.clone()).collect(),
            rows_json,
            rewritten_statement: rewritten.text,
            millis,
        })
    }
}

/// The parameters the statement uses, from the request's JSON object.
fn user_params(json: &str, used: &[String]) -> Result<Params> {
    let mut given: Map<String, Value> = if json.trim().is_empty() {
        Map::new()
    } else {
        if json.len() > MAX_PARAMS_BYTES {
            return Err(GraphError::invalid(format!(
                "params is {} bytes; the limit is {MAX_PARAMS_BYTES}",
                json.len()
            )));
        }
        match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Err(GraphError::invalid(
                    "params must be a JSON object such as {\"afterId\": 42}",
                ));
            }
        }
    };
    let mut params = Params::new();
    for name in used {
        match given.remove(name) {
            Some(value) => {
                params.insert(name.clone(), value);
            }
            None => {
                return Err(GraphError::invalid(format!(
                    "the statement uses ${name} but params has no \"{name}\"; pass it, e.g. params: {{\"{name}\": ...}}"
                )));
            }
        }
    }
    Ok(params)
}

fn shape_row(row: Vec<Value>, columns: &[Column]) -> Result<String> {
    let values: Vec<Value> = row
        .into_iter()
        .enumerate()
        .map(|(i, value)| {
            let mut value = sanitize(value);
            if let (
                Some(Column {
                    label: Some(label), ..
                }),
                Value::Object(map),
            ) = (columns.get(i), &mut value)
            {
                map.insert("_label".to_owned(), Value::String((*label).to_owned()));
            }
            value
        })
        .collect();
    serde_json::to_string(&values).map_err(|err| GraphError::UnexpectedReply(err.to_string()))
}

/// Cleans and caps every string (keys included): file text reaches a model from here.
fn sanitize(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(sanitize_text(&s, TEXT_CAP)),
        Value::Array(items) => Value::Array(items.into_iter().map(sanitize).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (sanitize_text(&k, 200), sanitize(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_must_cover_the_statement() {
        let used = vec!["afterId".to_owned()];
        let p = user_params(r#"{"afterId": 3, "extra": 1}"#, &used).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p["afterId"], json!(3));
        assert!(user_params("", &used).is_err());
        assert!(user_params("[1]", &used).is_err());
        assert!(user_params("", &[]).unwrap().is_empty());
    }

    #[test]
    fn node_columns_carry_their_label_and_strings_are_capped() {
        let columns = vec![
            Column {
                name: "c".into(),
                label: Some("Chunk"),
            },
            Column {
                name: "t".into(),
                label: None,
            },
        ];
        let long = "x".repeat(TEXT_CAP + 10);
        let row = vec![json!({"text": "a\u{202e}b"}), json!(long)];
        let shaped: Vec<Value> = serde_json::from_str(&shape_row(row, &columns).unwrap()).unwrap();
        assert_eq!(shaped[0], json!({"text": "ab", "_label": "Chunk"}));
        assert_eq!(shaped[1].as_str().unwrap().chars().count(), TEXT_CAP + 1);
    }
}
