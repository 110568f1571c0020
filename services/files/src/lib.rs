//! kg-files: the file registry, blobs, ingest events and the agent's file tools.
//!
//! Owns the registry tables in SQL and the blob store: an upload stores the blob, registers a
//! content-addressed version and publishes `kg.files.v1.<ns>.changed`; a durable consumer of
//! `kg.index.v1.*.indexed` records indexing status and each version's metadata and links, and
//! the registry is replayed into `KG_FILES` when NATS lost that stream. Blobs no version needs
//! any more are swept away, and so are the registry rows of versions nothing names.
//! `FindFiles` (kg_files) and `QueryFile` (kg_file: SQL over CSV/TSV on DataFusion, text,
//! JSONPath, JSONata, Jinja) read blobs under the caller's access filter, applied in SQL like
//! every lookup. Never touches the graph.

mod blob_sweep;
mod error;
mod find;
mod grpc;
mod knowledge_graph;
mod limits;
mod links;
mod purge;
mod query;
mod replay;
mod service;
mod store;
mod version_prune;
mod versions;

use std::time::Duration;

use kg_common::caller::{CallerContextLayer, ContextVerifier};
use kg_proto::v1::FileIndexed;
use kg_stores::consumer::{self, ConsumerSpec, Handled};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use blob_sweep::{BlobSweep, MIN_BLOB_SWEEP_GRACE, run_blob_sweep};
pub use error::{FilesError, Result};
pub use knowledge_graph::{
    DEFAULT_GRAPH_DEPTH, DEFAULT_GRAPH_LIMIT, MAX_GRAPH_BYTES, MAX_GRAPH_DEPTH, MAX_GRAPH_LIMIT,
    MAX_GRAPH_LINKS,
};
pub use limits::{MAX_RESULT_BYTES, QueryLimits};
pub use links::{
    LinkKind, LinkResolution, LinkSyntax, LivePaths, VersionLinkRecord, VersionLinks,
    VersionMetadata,
};
pub use replay::{Replay, STREAM_CHECK_EVERY, run_stream_check};
pub use service::FilesService;
pub use version_prune::PrunedVersions;

/// Serves the files gRPC API on `listener` until `shutdown`; its health answers
/// NOT_SERVING for `kg.v1.Files` while the registry's database is unreachable.
pub async fn serve(
    service: FilesService,
    verifier: ContextVerifier,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), kg_common::grpc::ServeError> {
    let probe = service.store_probe();
    let routes = tonic::service::Routes::new(
        kg_proto::v1::files_server::FilesServer::new(service)
            .max_decoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(kg_common::grpc::MAX_MESSAGE_BYTES),
    );
    kg_common::grpc::serve_probed(
        listener,
        CallerContextLayer::new(verifier, &[]),
        routes,
        &["kg.v1.Files"],
        Some(probe),
        shutdown,
    )
    .await
}

/// How long an indexing outcome delivered to a files process that died waits to be delivered
/// again (a slow handler is kept in progress meanwhile): how long a searchable file may read
/// `pending` after a crash of the files service.
pub(crate) const STATUS_ACK_WAIT: Duration = Duration::from_secs(10);

/// Records indexing outcomes from `kg.index.v1.*.indexed`, and the indexer's reports on
/// deleted namespaces from `kg.index.v1.*.purged`, until `shutdown`.
pub async fn run_status_consumer(
    service: FilesService,
    jetstream: async_nats::jetstream::Context,
    shutdown: CancellationToken,
) -> Result<()> {
    let spec = ConsumerSpec {
        stream: kg_stores::events::INDEX_STREAM.to_owned(),
        durable: "files-status".to_owned(),
        filter_subject: "kg.index.v1.*.indexed".to_owned(),
        max_deliver: 20,
        ack_wait: STATUS_ACK_WAIT,
    };
    let outcomes = {
        let service = service.clone();
        let jetstream = jetstream.clone();
        let shutdown = shutdown.clone();
        async move {
            consumer::run(&jetstream, &spec, shutdown, |delivery| {
                let service = service.clone();
                let payload = delivery.payload.to_vec();
                async move {
                    let Ok(event) = FileIndexed::decode(payload.as_slice()) else {
                        tracing::warn!("dropping undecodable index event");
                        return Handled::Ack;
                    };
                    match service.apply_indexed(&event).await {
                        Ok(_) => Handled::Ack,
                        Err(err) => Handled::Retry(err.to_string()),
                    }
                }
            })
            .await
            .map_err(FilesError::from)
        }
    };
    tokio::try_join!(
        outcomes,
        purge::run_purge_consumer(service, jetstream, shutdown)
    )?;
    Ok(())
}
