//! A stopping ontology server ends its WatchCompiled streams. The gateway holds one open for as
//! long as both run, and a server stopping gracefully waits for its open streams: before, every
//! SIGTERM took the whole 10 s grace, and calls sent meanwhile on the draining connection failed.
use std::time::{Duration, Instant};

use kg_common::caller::{ContextSigner, ContextVerifier};
use kg_ontology::{OntologyConfig, OntologyService};
use kg_proto::v1::WatchCompiledRequest;
use kg_proto::v1::ontology_client::OntologyClient;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_ends_its_watches_and_stops_at_once() {
    let service = OntologyService::new(
        OntologyConfig {
            project_dir: None,
            warehouse_url: None,
            approval_addr: None,
            allow_auto_effects: false,
        },
        None,
    )
    .await
    .unwrap();
    let verifier = ContextVerifier::new(vec![ContextSigner::generate().public_key()]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(kg_ontology::serve(
        service,
        verifier,
        listener,
        shutdown.clone(),
    ));

    let mut client = OntologyClient::new(kg_common::grpc::channel(&addr).unwrap());
    let mut watch = client
        .watch_compiled(WatchCompiledRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.compiled_version, 0, "no project loaded");

    let stopping = Instant::now();
    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(3), watch.message())
        .await
        .expect("the watch stayed open after the server was told to stop");
    assert!(matches!(ended, Ok(None)), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(3), served)
        .await
        .expect("the server waited for its watch")
        .unwrap()
        .unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(3));
}
