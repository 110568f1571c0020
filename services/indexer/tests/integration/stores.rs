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

/// An indexer with `config` on these stores, until the token is cancelled; its task.
pub fn spawn_indexer(
    stores: &Stores,
    config: kg_indexer::IndexerConfig,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), kg_indexer::IndexerError>>,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(kg_indexer::run(
        config,
        stores.graph.clone(),
        stores.blobs.clone(),
        stores.js.clone(),
        stop.clone(),
    ));
    (stop, worker)
}

/// The value of a series on `/metrics` (process-wide: other tests in the process add to it).
pub fn metric(series: &str) -> u64 {
    let text = kg_common::metrics::encode_text();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} is not on /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The payloads on `subject` of `stream`, oldest first: what a reader of the stream finds.
pub async fn payloads_on(
    js: &async_nats::jetstream::Context,
    stream: &str,
    subject: &str,
) -> Vec<Vec<u8>> {
    use futures::StreamExt as _;
    let stream = js.get_stream(stream).await.unwrap();
    let reader = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: subject.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = reader.messages().await.unwrap();
    let mut found = Vec::new();
    while let Ok(Some(message)) =
        tokio::time::timeout(std::time::Duration::from_millis(500), messages.next()).await
    {
        found.push(message.unwrap().payload.to_vec());
    }
    found
}

/// Embeds any batch with `marker` in a text `delay` late, like a large file, and the rest at
/// once (hashing embeddings).
#[derive(Debug)]
pub struct SlowOn {
    pub marker: &'static str,
    pub delay: std::time::Duration,
    pub inner: kg_embed::HashingEmbedder,
}

#[async_trait::async_trait]
impl kg_embed::Embedder for SlowOn {
    fn model_id(&self) -> &str {
        "test-hashing"
    }
    fn dims(&self) -> usize {
        self.inner.dims()
    }
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, kg_embed::EmbedError> {
        if texts.iter().any(|t| t.contains(self.marker)) {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.embed(texts).await
    }
}
