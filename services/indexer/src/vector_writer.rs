//! Writes one file version's vectors: a point per chunk (embedding of its context
//! header and text) and a file point (the normalised mean of its chunk vectors, for
//! `similarFiles`), with the payload the vector index defines. The file's old points
//! are removed first, so a changed version replaces them and removed chunks vanish.

use kg_common::error::{ErrorCode, ErrorExt};
use kg_embed::{EmbedError, SharedEmbedder, normalized_mean};
use kg_stores::chunk_text::text_hash;
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

/// Embeds the document's chunks and replaces the file's points. Returns the number of
/// points written (chunks + the file point).
pub async fn write_vectors(
    vectors: &Vectors,
    doc: &IndexedDocument,
) -> Result<usize, VectorWriteError> {
    let texts: Vec<String> = doc
        .chunks
        .iter()
        .map(|c| embedding_text(&c.context_header, &c.text))
        .collect();
    let embedded = vectors.embedder.embed(texts).await?;
    if embedded.len() != doc.chunks.len() {
        return Err(VectorWriteError::Mismatch {
            got: embedded.len(),
            want: doc.chunks.len(),
        });
    }
    let file = &doc.file;
    let point =
        |kind: PointKind, chunk_key: String, text_hash: Option<String>, vector| VectorPoint {
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
        };
    let mut points: Vec<VectorPoint> = Vec::with_capacity(doc.chunks.len() + 1);
    if let Some(mean) = normalized_mean(&embedded) {
        points.push(point(PointKind::File, String::new(), None, mean));
    }
    points.extend(doc.chunks.iter().zip(embedded).map(|(chunk, vector)| {
        point(
            PointKind::Chunk,
            chunk.chunk_key.clone(),
            Some(text_hash(&chunk.text)),
            vector,
        )
    }));
    let written = points.len();
    vectors
        .index
        .delete_file(&file.namespace, &file.file_id)
        .await?;
    vectors.index.upsert(points).await?;
    Ok(written)
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

    fn doc(version: &str, text: &str) -> IndexedDocument {
        let meta = FileMeta {
            namespace: "demo".into(),
            file_id: "f1".into(),
            version_id: version.into(),
            path: "ops/runbook.md".into(),
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
        let long = "# Deploy\n\nThe blue-green cutover moves traffic to the new pods in one step.\n\n\
                    ## Rollback\n\nRoll back fast by pointing the service at the old pods again.\n\n\
                    ## Checks\n\nWatch error rates and latency for ten minutes after the cutover.\n";
        let first = doc("v1", long);
        assert!(first.chunks.len() >= 2, "{}", first.chunks.len());
        let written = write_vectors(&vectors, &first).await.unwrap();
        assert_eq!(written, first.chunks.len() + 1);
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
