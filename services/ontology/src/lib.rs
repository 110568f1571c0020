//! kg-ontology: ontology projects (YAML objects over warehouse tables) compiled
//! into governed MCP tools — get_/list_/traverse_ read, propose_ only ever
//! proposes — plus CheckAction for the approval service and each namespace's
//! TBox lifecycle (draft, review, publish into `KG_TBOX`).
//! Reads the project's warehouse (SQLite or PostgreSQL) and writes its own
//! TBox tables; calls only the approval service (Submit). Entry: [`serve`].

mod compile;
mod effect;
mod error;
mod exec;
mod expr;
mod grpc;
mod project;
mod service;
mod tbox;
mod warehouse;

use kg_common::caller::{CallerContextLayer, ContextVerifier};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use compile::{
    Compiled, DEFAULT_LIMIT, GeneratedToolDef, MAX_LIMIT, REDACTION_NOTE, ToolTarget,
    action_policy_version, approval_text, check_live, check_static, compile, policy_version,
};
pub use error::{OntologyError, Result, ToolCode, ToolError};
pub use exec::ProposalSink;
pub use kg_proto::v1::ontology_server::{Ontology, OntologyServer};
pub use project::{LoadedProject, PROJECT_FILE, Project, parse as parse_project, project_schema};
pub use service::{Active, Forward, OntologyConfig, OntologyService, load_project, tool_proto};
pub use tbox::TboxStore;
pub use warehouse::{FIELD_CAP, Warehouse};

/// gRPC paths served without a caller context: the compiled version number
/// only (the gateway follows it to send `tools/list_changed`).
pub const UNAUTHENTICATED_PATHS: &[&str] = &["/kg.v1.Ontology/WatchCompiled"];

/// How often the ontology service checks that the bus still holds every published TBox (one
/// key listing). Well inside the indexer's retries of a file whose TBox it cannot read (1 + 2 +
/// 4 + 8 s before the fifth and last of its default deliveries), so a bus that lost its state
/// gets its TBoxes back before a file indexed meanwhile fails.
pub const TBOX_BUS_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the ontology gRPC API on `listener` until `shutdown`; every RPC but
/// WatchCompiled needs a caller context signed by one of `verifier`'s keys. Meanwhile it puts
/// back into the bus any published TBox the bus lost ([`TboxStore::keep_bus_copies`]).
pub async fn serve(
    service: OntologyService,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), kg_common::grpc::ServeError> {
    // The indexers read each published TBox from the bus: keep its copies in step with SQL.
    let bus_copies = service.tbox().cloned().map(|tbox| {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { tbox.keep_bus_copies(TBOX_BUS_CHECK_EVERY, shutdown).await })
    });
    let watches = tokio::spawn({
        let service = service.clone();
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            service.end_watches();
        }
    });
    let routes = tonic::service::Routes::new(
        OntologyServer::new(service)
            .max_decoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES),
    );
    let served = kg_common::grpc::serve(
        listener,
        CallerContextLayer::new(verifier, UNAUTHENTICATED_PATHS),
        routes,
        &["kg.v1.Ontology"],
        shutdown,
    )
    .await;
    if let Some(task) = bus_copies {
        task.abort();
    }
    watches.abort();
    served
}
