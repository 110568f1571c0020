//! The real stores every indexer test starts: FalkorDB and NATS JetStream (its streams made)
//! from the dev-deps virtualenv, and a blob directory, all under one temp dir.
use kg_stores::blobs::BlobStore;
use kg_stores::embedded::{EmbeddedFalkor, EmbeddedNats, find_venv};
use kg_stores::events;
use kg_stores::graph::GraphStore;

pub struct Stores {
    pub graph: GraphStore,
    pub js: async_nats::jetstream::Context,
    pub blobs: BlobStore,
    // Dropped last: the servers stop before their directories go.
    _falkor: EmbeddedFalkor,
    _nats: EmbeddedNats,
    pub dir: tempfile::TempDir,
}

pub async fn start() -> Stores {
    let venv = find_venv().unwrap_or_else(|err| panic!("{err}"));
    let dir = tempfile::tempdir().unwrap();
    let falkor = EmbeddedFalkor::start(&venv, &dir.path().join("falkor"))
        .await
        .unwrap();
    let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
        .await
        .unwrap();
    let graph = GraphStore::connect(&falkor.url).await.unwrap();
    let js = events::connect(&nats.url).await.unwrap();
    events::ensure_streams(&js).await.unwrap();
    let blobs = BlobStore::new(dir.path().join("blobs"));
    Stores {
        graph,
        js,
        blobs,
        _falkor: falkor,
        _nats: nats,
        dir,
    }
}
