//! Deleting a namespace, which the gateway orchestrates across the services that hold a part
//! of it (services never call each other for request work):
//!
//! 1. auth retires it: from then on no token reaches it, and its grants and denies are gone;
//! 2. files removes its registry rows and asks the indexer to remove its graph and vectors;
//! 3. ontology removes its TBox (drafts, versions and the bus's copy);
//! 4. auth forgets it.
//!
//! Each step is idempotent, and step 1 answers a namespace already retired, so a deletion that
//! stopped halfway (a service down) is finished by sending it again. Sent again once auth has
//! forgotten the namespace but before the indexer reported its part, steps 2 and 3 run again,
//! which asks the indexer again. The indexer's removal is asynchronous:
//! `GET /api/v1/namespaces/{ns}/purge` reports it, and creating the namespace again is refused
//! until it is done, so a new namespace of the same name never meets the old one's graph.

use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::routing::{delete, get};
use kg_common::ErrorCode;
use kg_proto::v1::{
    DeleteNamespaceRequest, GetNamespacePurgeRequest, NamespacePurge, PurgeNamespaceRequest,
    PurgeTboxRequest, RetireNamespaceRequest,
};
use serde_json::json;

use super::admin::{ApiError, ApiResult, backend, ok, valid_namespace};
use crate::error::ClientError;
use crate::state::{Caller, GatewayState};

/// The namespace routes beside the admin API's; the bearer middleware is added by the caller.
pub(crate) fn routes(state: GatewayState) -> Router {
    Router::new()
        .route("/api/v1/namespaces/{ns}", delete(delete_namespace))
        .route("/api/v1/namespaces/{ns}/purge", get(purge_status))
        .with_state(state)
}

fn purge_json(purge: &NamespacePurge) -> serde_json::Value {
    json!({
        "requestedAtMs": purge.requested_at_ms,
        "purgedAtMs": purge.purged_at_ms,
        "done": purge.purged_at_ms != 0,
    })
}

async fn delete_namespace(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let answer = state
        .backends
        .auth
        .clone()
        .retire_namespace(caller.request(RetireNamespaceRequest { name: ns.clone() }))
        .await;
    let retired = match answer {
        Ok(retired) => Some(retired.into_inner()),
        // Auth forgot it already, but the indexer has not reported its part: the steps after
        // auth's run again, which asks the indexer again.
        Err(status)
            if status.code() == tonic::Code::NotFound
                && purge_of(&state, &caller, &ns)
                    .await
                    .is_some_and(|purge| purge.purged_at_ms == 0) =>
        {
            None
        }
        Err(status) => return Err(backend("auth")(status)),
    };
    let purge = state
        .backends
        .files
        .clone()
        .purge_namespace(caller.request(PurgeNamespaceRequest {
            namespace: ns.clone(),
        }))
        .await
        .map_err(backend("files"))?
        .into_inner();
    let tbox = match super::tbox::ontology_client(&state) {
        Some(mut ontology) => {
            let purged = ontology
                .purge_tbox(caller.request(PurgeTboxRequest {
                    namespace: ns.clone(),
                }))
                .await
                .map_err(backend("ontology"))?
                .into_inner();
            json!({
                "versionsRemoved": purged.versions_removed,
                "draftRemoved": purged.draft_removed,
            })
        }
        // No ontology service, no TBox to remove: publishing one goes through it.
        None => json!({"skipped": "no ontology service is configured for this gateway"}),
    };
    let retired = retired.unwrap_or_default();
    if retired.namespace.is_some() {
        state
            .backends
            .auth
            .clone()
            .delete_namespace(caller.request(DeleteNamespaceRequest { name: ns.clone() }))
            .await
            .map_err(backend("auth"))?;
    }
    Ok(ok(json!({
        "namespace": ns,
        "retiredAtMs": retired.retired_at_ms,
        "grantsRemoved": retired.grants_removed,
        "deniesRemoved": retired.denies_removed,
        "filesRemoved": purge.files_removed,
        "versionsRemoved": purge.versions_removed,
        "branchesRemoved": purge.branches_removed,
        "releasesRemoved": purge.releases_removed,
        "environmentsRemoved": purge.environments_removed,
        "tbox": tbox,
        "purge": purge_json(&purge),
    })))
}

async fn purge_status(
    State(state): State<GatewayState>,
    Extension(caller): Extension<Caller>,
    Path(ns): Path<String>,
) -> ApiResult {
    valid_namespace(&ns)?;
    let purge = last_purge(&state, &caller, &ns)
        .await
        .map_err(backend("files"))?;
    let mut body = purge_json(&purge);
    body["namespace"] = json!(ns);
    Ok(ok(body))
}

/// The namespace's last purge, as files answers this caller.
async fn last_purge(
    state: &GatewayState,
    caller: &Caller,
    ns: &str,
) -> Result<NamespacePurge, tonic::Status> {
    state
        .backends
        .files
        .clone()
        .get_namespace_purge(caller.request(GetNamespacePurgeRequest {
            namespace: ns.to_owned(),
        }))
        .await
        .map(tonic::Response::into_inner)
}

/// The namespace's last purge, when files has one to show this caller.
async fn purge_of(state: &GatewayState, caller: &Caller, ns: &str) -> Option<NamespacePurge> {
    last_purge(state, caller, ns).await.ok()
}

/// Refuses to create `ns` while the indexer is still removing a deleted namespace of that
/// name. A caller files refuses to tell (not an admin) goes on to auth, which refuses it with
/// the right words.
pub(crate) async fn refuse_while_purging(
    state: &GatewayState,
    caller: &Caller,
    ns: &str,
) -> Result<(), ApiError> {
    match last_purge(state, caller, ns).await {
        Ok(purge) if purge.purged_at_ms == 0 => Err(ApiError::from(ClientError::new(
            ErrorCode::FailedPrecondition,
            format!(
                "namespace `{ns}` was deleted and the indexer is still removing its graph and \
                 vectors; create it again once `GET /api/v1/namespaces/{ns}/purge` says done \
                 (`kgmesh ns delete` waits for it)"
            ),
        ))),
        Ok(_) => Ok(()),
        Err(status)
            if matches!(
                status.code(),
                tonic::Code::NotFound | tonic::Code::PermissionDenied
            ) =>
        {
            Ok(())
        }
        Err(status) => Err(backend("files")(status)),
    }
}
