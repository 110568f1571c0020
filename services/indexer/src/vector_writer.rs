//! Writes one file version's vectors: a point per chunk (embedding of its context
//! header and text) and a file point (the normalised mean of its chunk vectors, for
//! `similarFiles`), with the payload the vector index defines. The new points are
//! written before the file's others are removed, so a search never finds the file
//! without points while a version replaces the last, and removed chunks vanish.

use kg_common::error::{ErrorCode, ErrorExt};
use kg_embed::{EmbedError, SharedEmbedder, normalized_mean};
use kg_stores::chunk_text::{embed_hash, text_hash};
use kg_stores::vector::{PointKind, VectorError, VectorIndex, VectorPoint};

use crate::pipeline::IndexedDocument;

/// The vector lane of the indexer: where vectors go and what makes them.
#[derive(Debug, Clone)]
pub struct Vectors {
    /// The index (embedded qdrant-edge or a Qdrant server).
    pub index: VectorIndex,
    /// The embedder; its dimension must be the index's.
    pub embedder: SharedEmbedder,
}

/// Why the vectors of a file were not written.
#[derive(Debug, thiserror::Error)]
pub enum VectorWriteError {
    /// The embedder failed (after its own retries).
    #[error(transparent)]
    Embed(#[from] EmbedError),
    /// The index refused or failed.
    #[error(transparent)]
    Index(#[from] VectorError),
    /// The embedder returned something the index cannot hold.
    #[error("embedder returned {got} vectors for {want} texts")]
    Mismatch {
        /// Vectors returned.
        got: usize,
        /// Texts sent.
        want: usize,
    },
}

impl ErrorExt for VectorWriteError {
    fn code(&self) -> ErrorCode {
        match self {
            VectorWriteError::Embed(e) => e.code(),
            VectorWriteError::Index(e) => e.code(),
            VectorWriteError::Mismatch { .. } => ErrorCode::Internal,
        }
    }
}

impl Vectors {
    /// Checks that the embedder and the index agree on the dimension.
    pub fn new(index: VectorIndex, embedder: SharedEmbedder) -> Result<Self, VectorWriteError> {
        if index.dimension() != embedder.dims() {
            return Err(VectorWriteError::Index(VectorError::Incompatible {
                existing: format!("dimension {} (Cosine)", index.dimension()),
                wanted: format!(
                    "dimension {} ({} embeddings)",
                    embedder.dims(),
                    embedder.model_id()
                ),
            }));
        }
        Ok(Self { index, embedder })
    }
}

/// The text a chunk is embedded from: its context header (document › section trail),
/// then its text, so a chunk that only says "Roll back fast." still knows its topic.
pub fn embedding_text(context_header: &str, text: &str) -> String {
    if context_header.is_empty() {
        text.to_owned()
    } else {
        format!("{context_header}\n\n{text}")
    }
}

/// What writing one version's vectors took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VectorsWritten {
    /// Points written: the chunks, and the file point.
    pub points: usize,
    /// Texts sent to the embedder: the chunks no stored vector of the file fits, each distinct
    /// text once.
    pub embedded: usize,
    /// Chunks given a stored vector of the same text and embedder: the file's previous
    /// points', or another file's of the namespace.
    pub reused: usize,
}

/// Embeds the document's chunks and replaces the file's points. A chunk whose embedded
/// text (context header and text) a stored point of the namespace already holds under this
/// embedder's identity takes that vector: an edit embeds only the chunks it changed, a
/// reindex of unchanged files nothing, and a copy or a moved file nothing.
pub async fn write_vectors(
    vectors: &Vectors,
    doc: &IndexedDocument,
) -> Result<VectorsWritten, VectorWriteError> {
    let file = &doc.file;
    let identity = vectors.embedder.identity();
    let texts: Vec<String> = doc
        .chunks
        .iter()
        .map(|c| embedding_text(&c.context_header, &c.text))
        .collect();
    let hashes: Vec<String> = texts
        .iter()
        .map(|text| embed_hash(&identity, text))
        .collect();
    let mut known = vectors
        .index
        .stored_chunk_vectors(&file.namespace, &file.file_id)
        .await?;
    // What the file's own points lack may be stored under another file of the namespace:
    // a copy, or this file under its old path.
    let mut elsewhere: Vec<String> = hashes
        .iter()
        .filter(|h| !known.contains_key(*h))
        .cloned()
        .collect();
    elsewhere.sort_unstable();
    elsewhere.dedup();
    if !elsewhere.is_empty() {
        known.extend(
            vectors
                .index
                .stored_vectors_by_hash(&file.namespace, &elsewhere)
                .await?,
        );
    }
    let reused = hashes.iter().filter(|h| known.contains_key(*h)).count();
    // Each distinct missing text once: a file repeating a paragraph embeds it once.
    let mut asked = std::collections::HashSet::new();
    let mut missing: Vec<(String, String)> = Vec::new();
    for (hash, text) in hashes.iter().zip(texts) {
        if !known.contains_key(hash) && asked.insert(hash) {
            missing.push((hash.clone(), text));
        }
    }
    let embedded = missing.len();
    if !missing.is_empty() {
        let (missing_hashes, missing_texts): (Vec<String>, Vec<String>) =
            missing.into_iter().unzip();
        let fresh = vectors.embedder.embed(missing_texts).await?;
        if fresh.len() != missing_hashes.len() {
            return Err(VectorWriteError::Mismatch {
                got: fresh.len(),
                want: missing_hashes.len(),
            });
        }
        known.extend(missing_hashes.into_iter().zip(fresh));
    }
    let chunk_vectors: Vec<Vec<f32>> = hashes
        .iter()
        .map(|hash| known.get(hash).cloned().unwrap_or_default())
        .collect();
    let point = |kind: PointKind, chunk_key: String, hashes: Option<(String, String)>, vector| {
        let (text_hash, embed_hash) = hashes.unzip();
        VectorPoint {
            namespace: file.namespace.clone(),
            kind,
            chunk_key,
            file_id: file.file_id.clone(),
            path: file.path.clone(),
            enabled: file.enabled,
            hidden: file.hidden,
            collections: doc.meta.collections.clone(),
            document_date: file.document_date.clone(),
            vector,
            text_hash,
            embed_hash,
        }
    };
    let mut points: Vec<VectorPoint> = Vec::with_capacity(doc.chunks.len() + 1);
    if let Some(mean) = normalized_mean(&chunk_vectors) {
        points.push(point(PointKind::File, String::new(), None, mean));
    }
    points.extend(doc.chunks.iter().zip(hashes).zip(chunk_vectors).map(
        |((chunk, embed_hash), vector)| {
            point(
                PointKind::Chunk,
                chunk.chunk_key.clone(),
                Some((text_hash(&chunk.text), embed_hash)),
                vector,
            )
        },
    ));
    let written = points.len();
    vectors
        .index
        .replace_file(&file.namespace, &file.file_id, points)
        .await?;
    let metrics = kg_common::metrics::metrics();
    metrics.chunks_embedded.inc_by(embedded as u64);
    metrics.chunk_vectors_reused.inc_by(reused as u64);
    Ok(VectorsWritten {
        points: written,
        embedded,
        reused,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Arc;

    use kg_embed::HashingEmbedder;
    use kg_proto::v1::AccessFilter;
    use kg_stores::vector::{EdgeIndex, Scope};

    use super::*;
    use crate::document::ChunkOptions;
    use crate::pipeline::{FileMeta, index_document};

    /// Three sections, a chunk each at the tests' chunk size.
    const RUNBOOK: &str = "# Deploy\n\nThe blue-green cutover moves traffic to the new pods in one step.\n\n\
                           ## Rollback\n\nRoll back fast by pointing the service at the old pods again.\n\n\
                           ## Checks\n\nWatch error rates and latency for ten minutes after the cutover.\n";

    fn doc(version: &str, text: &str) -> IndexedDocument {
        file_doc(("demo", "f1", "ops/runbook.md"), version, text)
    }

    /// A version of the file `(namespace, file id, path)`.
    fn file_doc(file: (&str, &str, &str), version: &str, text: &str) -> IndexedDocument {
        let (namespace, file_id, path) = file;
        let meta = FileMeta {
            namespace: namespace.into(),
            file_id: file_id.into(),
            version_id: version.into(),
            path: path.into(),
            mime: "text/markdown".into(),
            enabled: true,
            hidden: false,
        };
        let options = ChunkOptions {
            target_tokens: 16,
            ..ChunkOptions::default()
        };
        index_document(&meta, text.as_bytes(), &options).unwrap()
    }

    fn everything() -> AccessFilter {
        AccessFilter {
            namespace: "demo".into(),
            allow_prefixes: vec![String::new()],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_new_version_replaces_the_files_points() {
        let dir = tempfile::tempdir().unwrap();
        let index: VectorIndex = EdgeIndex::open(dir.path(), 64).await.unwrap().into();
        let vectors = Vectors::new(index.clone(), Arc::new(HashingEmbedder::new(64))).unwrap();
        let first = doc("v1", RUNBOOK);
        assert!(first.chunks.len() >= 2, "{}", first.chunks.len());
        let written = write_vectors(&vectors, &first).await.unwrap();
        assert_eq!(written.points, first.chunks.len() + 1);
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            first.chunks.len() as u64
        );
        assert_eq!(
            index.count(&everything(), &Scope::files()).await.unwrap(),
            1
        );

        // The chunk embeds its context header: a query for the section finds it.
        let hashing = HashingEmbedder::new(64);
        let hits = index
            .search(
                &everything(),
                &Scope::chunks(),
                hashing.vector("Deploy Rollback roll back old pods"),
                1,
            )
            .await
            .unwrap();
        let rollback = first
            .chunks
            .iter()
            .find(|c| c.text.contains("Roll back"))
            .unwrap();
        assert_eq!(
            hits[0].chunk_key.as_deref(),
            Some(rollback.chunk_key.as_str())
        );

        // A shorter version: old chunk points disappear, the file point is replaced.
        let second = doc("v2", "# Deploy\n\nOnly one short paragraph now.\n");
        write_vectors(&vectors, &second).await.unwrap();
        assert_eq!(
            index.count(&everything(), &Scope::chunks()).await.unwrap(),
            second.chunks.len() as u64
        );
        assert_eq!(
            index.count(&everything(), &Scope::files()).await.unwrap(),
            1
        );

        // A disabled file disappears from filtered reads at once.
        index
            .set_file_flags("demo", "f1", false, false)
            .await
            .unwrap();
        let enabled_only = AccessFilter {
            enabled_only: true,
            ..everything()
        };
        assert_eq!(
            index.count(&enabled_only, &Scope::chunks()).await.unwrap(),
            0
        );
    }

    /// The test embedder under a chosen model name, keeping every text it was sent.
    #[derive(Debug)]
    struct Recording {
        model: &'static str,
        inner: HashingEmbedder,
        sent: std::sync::Mutex<Vec<String>>,
    }

    impl Recording {
        fn new(model: &'static str) -> Arc<Self> {
            Arc::new(Recording {
                model,
                inner: HashingEmbedder::new(64),
                sent: std::sync::Mutex::default(),
            })
        }

        fn take_sent(&self) -> Vec<String> {
            std::mem::take(&mut *self.sent.lock().unwrap())
        }
    }

    #[async_trait::async_trait]
    impl kg_embed::Embedder for Recording {
        fn model_id(&self) -> &str {
            self.model
        }
        fn dims(&self) -> usize {
            64
        }
        async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.sent.lock().unwrap().extend(texts.iter().cloned());
            self.inner.embed(texts).await
        }
    }

    fn embedded_texts(doc: &IndexedDocument) -> Vec<String> {
        doc.chunks
            .iter()
            .map(|c| embedding_text(&c.context_header, &c.text))
            .collect()
    }

    /// Every chunk point of the file holds the vector embedding its text afresh would give.
    async fn assert_vectors_are_fresh(index: &VectorIndex, doc: &IndexedDocument) {
        let hashing = HashingEmbedder::new(64);
        for (chunk, text) in doc.chunks.iter().zip(embedded_texts(doc)) {
            let hits = index
                .search(&everything(), &Scope::chunks(), hashing.vector(&text), 1)
                .await
                .unwrap();
            assert_eq!(hits[0].chunk_key.as_deref(), Some(chunk.chunk_key.as_str()));
            assert!(hits[0].score > 0.999, "{text:?} scores {}", hits[0].score);
        }
        let stored = index.stored_chunk_vectors("demo", "f1").await.unwrap();
        assert_eq!(
            stored.len(),
            doc.chunks.len(),
            "one stored vector per distinct text"
        );
    }

    /// An empty index in a temp dir, fed by a recording embedder named `model-a`.
    async fn recorded_index() -> (tempfile::TempDir, VectorIndex, Arc<Recording>, Vectors) {
        let dir = tempfile::tempdir().unwrap();
        let index: VectorIndex = EdgeIndex::open(dir.path(), 64).await.unwrap().into();
        let recording = Recording::new("model-a");
        let vectors = Vectors::new(index.clone(), recording.clone()).unwrap();
        (dir, index, recording, vectors)
    }

    #[tokio::test]
    async fn an_edit_embeds_only_the_chunks_it_changed() {
        let (_dir, index, recording, vectors) = recorded_index().await;
        let original = RUNBOOK;
        let first = doc("v1", original);
        assert!(first.chunks.len() >= 3, "{}", first.chunks.len());
        let written = write_vectors(&vectors, &first).await.unwrap();
        assert_eq!((written.embedded, written.reused), (first.chunks.len(), 0));
        assert_eq!(recording.take_sent(), embedded_texts(&first));

        // The same version again (a reindex): nothing embedded, the same vectors.
        let again = write_vectors(&vectors, &first).await.unwrap();
        assert_eq!((again.embedded, again.reused), (0, first.chunks.len()));
        assert!(recording.take_sent().is_empty());
        assert_vectors_are_fresh(&index, &first).await;

        // One paragraph rewritten and one added before the rest: every later chunk moved, so
        // its key changed, but its text did not. Only the new and the rewritten are embedded.
        let edited = original
            .replace(
                "# Deploy\n\n",
                "# Deploy\n\nRead the checklist before you start.\n\n",
            )
            .replace("Roll back fast", "Roll back at once");
        let second = doc("v2", &edited);
        let changed: Vec<String> = embedded_texts(&second)
            .into_iter()
            .filter(|text| !embedded_texts(&first).contains(text))
            .collect();
        let checks_key = |doc: &IndexedDocument| {
            let checks = doc
                .chunks
                .iter()
                .find(|c| c.text.contains("Watch error rates"));
            checks.unwrap().chunk_key.clone()
        };
        assert_ne!(
            checks_key(&first),
            checks_key(&second),
            "the last chunk moved"
        );
        assert!(
            changed
                .iter()
                .all(|text| !text.contains("Watch error rates"))
        );
        let written = write_vectors(&vectors, &second).await.unwrap();
        assert_eq!(recording.take_sent(), changed);
        assert_eq!(
            (written.embedded, written.reused),
            (changed.len(), second.chunks.len() - changed.len())
        );
        assert!(written.reused >= 1, "{written:?}");
        assert_vectors_are_fresh(&index, &second).await;

        // A renamed heading changes what its chunk is embedded from, though not its text.
        let renamed = doc("v3", &edited.replace("## Checks", "## Verification"));
        write_vectors(&vectors, &renamed).await.unwrap();
        let sent = recording.take_sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(sent[0].contains("Verification") && sent[0].contains("Watch error rates"));

        // Another model of the same size reuses nothing.
        let other = Recording::new("model-b");
        let vectors = Vectors::new(index.clone(), other.clone()).unwrap();
        let written = write_vectors(&vectors, &renamed).await.unwrap();
        assert_eq!(
            (written.embedded, written.reused),
            (renamed.chunks.len(), 0)
        );
        assert_eq!(other.take_sent(), embedded_texts(&renamed));
    }

    #[tokio::test]
    async fn a_copy_or_a_moved_file_takes_the_namespaces_stored_vectors() {
        let (_dir, index, recording, vectors) = recorded_index().await;
        let original = doc("v1", RUNBOOK);
        write_vectors(&vectors, &original).await.unwrap();
        recording.take_sent();

        // The same text under another file id and path: nothing embedded, the same vectors.
        let copy = file_doc(("demo", "f2", "archive/runbook.md"), "v1", RUNBOOK);
        let written = write_vectors(&vectors, &copy).await.unwrap();
        assert_eq!((written.embedded, written.reused), (0, copy.chunks.len()));
        assert!(recording.take_sent().is_empty());
        assert_eq!(
            index.stored_chunk_vectors("demo", "f2").await.unwrap(),
            index.stored_chunk_vectors("demo", "f1").await.unwrap()
        );

        // A copy with one paragraph changed embeds that paragraph only.
        let edited = RUNBOOK.replace("Roll back fast", "Roll back at once");
        let changed = file_doc(("demo", "f3", "drafts/runbook.md"), "v1", &edited);
        write_vectors(&vectors, &changed).await.unwrap();
        let sent = recording.take_sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(sent[0].contains("Roll back at once"), "{sent:?}");

        // Another namespace's vectors are never taken.
        let elsewhere = file_doc(("other", "f1", "ops/runbook.md"), "v1", RUNBOOK);
        let written = write_vectors(&vectors, &elsewhere).await.unwrap();
        assert_eq!(
            (written.embedded, written.reused),
            (elsewhere.chunks.len(), 0)
        );
        assert_eq!(recording.take_sent(), embedded_texts(&elsewhere));
    }

    #[tokio::test]
    async fn a_text_repeated_in_a_file_is_embedded_once() {
        let (_dir, _index, recording, vectors) = recorded_index().await;
        let note = "Keep the old pods for an hour after every cutover, in case of a rollback.";
        let repeated = doc("v1", &format!("{note}\n\n{note}\n\n{note}\n"));
        let texts = embedded_texts(&repeated);
        assert!(
            texts.len() >= 2 && texts.iter().all(|t| *t == texts[0]),
            "{texts:?}"
        );
        let written = write_vectors(&vectors, &repeated).await.unwrap();
        assert_eq!((written.embedded, written.reused), (1, 0));
        assert_eq!(recording.take_sent(), [texts[0].clone()]);
        assert_eq!(written.points, texts.len() + 1);
    }

    #[test]
    fn the_embedded_text_leads_with_the_context_header() {
        assert_eq!(
            embedding_text("Doc › Setup", "Run it."),
            "Doc › Setup\n\nRun it."
        );
        assert_eq!(embedding_text("", "Run it."), "Run it.");
    }

    #[tokio::test]
    async fn an_embedder_of_another_dimension_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let index: VectorIndex = EdgeIndex::open(dir.path(), 32).await.unwrap().into();
        let err = Vectors::new(index, Arc::new(HashingEmbedder::new(64))).unwrap_err();
        assert!(err.to_string().contains("64"), "{err}");
    }
}
