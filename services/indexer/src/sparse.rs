//! Writes one file version's sparse BM25 vectors (the `qdrant_sparse` full-text backend):
//! a point per chunk whose weights are BM25's term-frequency part,
//! `tf·(k1+1) / (tf + k1·(1 − b + b·len/avgLen))`; the index multiplies in the idf at
//! query time (see `kg_stores::vector::sparse`). Independent of embeddings: it runs when
//! the embedder is `none` too.
//!
//! `avgLen` is a fixed configured estimate ([`Bm25Params::avg_len`]), not a corpus
//! statistic: a running mean would change the weights of every chunk written before it
//! moved, and chunks are cut to a target size, so their lengths stay close to it. The
//! default, 120 tokens, is the mean measured on the docs-qa set (117 tokens of context
//! header and text per chunk, 1,661 chunks); 100-300 changed nDCG@10 there by < 0.01.

use kg_stores::chunk_text::text_hash;
use kg_stores::vector::VectorError;
use kg_stores::vector::sparse::{SparseIndex, SparsePoint, SparseVector, term_counts};

use crate::pipeline::IndexedDocument;

/// BM25 constants of the document side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25Params {
    /// Term-frequency saturation (Lucene's default 1.2).
    pub k1: f32,
    /// Length normalisation (0 = none, 1 = full; Lucene's default 0.75).
    pub b: f32,
    /// Assumed average chunk length in tokens.
    pub avg_len: f32,
}

impl Default for Bm25Params {
    fn default() -> Self {
        Self {
            k1: 1.2,
            b: 0.75,
            avg_len: 120.0,
        }
    }
}

/// The sparse lane of the indexer.
#[derive(Debug, Clone)]
pub struct SparseTerms {
    /// Where the sparse vectors go.
    pub index: SparseIndex,
    /// Document-side BM25 constants.
    pub params: Bm25Params,
}

impl SparseTerms {
    /// Default BM25 constants over `index`.
    pub fn new(index: SparseIndex) -> Self {
        Self {
            index,
            params: Bm25Params::default(),
        }
    }
}

/// The text a chunk's terms come from: its context header (document › section trail) and
/// its text, so a chunk is found by the title and headings it sits under.
pub fn sparse_text(context_header: &str, text: &str) -> String {
    crate::vector_writer::embedding_text(context_header, text)
}

/// The BM25 term weights of a text (without idf).
pub fn document_vector(text: &str, params: &Bm25Params) -> SparseVector {
    let counts = term_counts(text);
    let len: u32 = counts.values().sum();
    let norm = params.k1 * (1.0 - params.b + params.b * len as f32 / params.avg_len.max(1.0));
    SparseVector::from_sorted(counts.into_iter().map(|(id, tf)| {
        let tf = tf as f32;
        (id, tf * (params.k1 + 1.0) / (tf + norm))
    }))
}

/// Replaces the file's sparse points with one per chunk of this version. Returns the
/// number of chunks sent (chunks without a word are skipped by the index).
pub async fn write_sparse(
    sparse: &SparseTerms,
    doc: &IndexedDocument,
) -> Result<usize, VectorError> {
    let file = &doc.file;
    let points: Vec<SparsePoint> = doc
        .chunks
        .iter()
        .map(|chunk| SparsePoint {
            namespace: file.namespace.clone(),
            chunk_key: chunk.chunk_key.clone(),
            file_id: file.file_id.clone(),
            path: file.path.clone(),
            enabled: file.enabled,
            hidden: file.hidden,
            collections: doc.meta.collections.clone(),
            document_date: file.document_date.clone(),
            vector: document_vector(
                &sparse_text(&chunk.context_header, &chunk.text),
                &sparse.params,
            ),
            text_hash: Some(text_hash(&chunk.text)),
        })
        .collect();
    let written = points.len();
    sparse
        .index
        .replace_file(&file.namespace, &file.file_id, points)
        .await?;
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use kg_proto::v1::AccessFilter;
    use kg_stores::vector::Scope;
    use kg_stores::vector::sparse::{term_id, tokenize};

    use super::*;
    use crate::document::ChunkOptions;
    use crate::pipeline::{FileMeta, index_document};

    fn doc(file_id: &str, path: &str, version: &str, text: &str) -> IndexedDocument {
        let meta = FileMeta {
            namespace: "demo".into(),
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

    #[test]
    fn weights_saturate_with_tf_and_fall_with_length() {
        let p = Bm25Params::default();
        let weight = |text: &str, term: &str| {
            let v = document_vector(text, &p);
            let i = v.indices.iter().position(|&i| i == term_id(term)).unwrap();
            v.values[i]
        };
        let once = weight("vault", "vault");
        let twice = weight("vault vault", "vault");
        assert!(twice > once && twice < 2.0 * once, "{once} {twice}");
        let long = format!("vault {}", "word ".repeat(400));
        assert!(weight(&long, "vault") < once);
        // At the average length with tf 1 the weight is exactly 1 (the BM25 fixed point).
        let avg = format!("vault {}", "x ".repeat(p.avg_len as usize - 1));
        assert!((weight(&avg, "vault") - 1.0).abs() < 1e-6);
        assert!(document_vector("— …", &p).is_empty());
    }

    #[tokio::test]
    async fn sparse_vectors_need_no_embedder_and_a_new_version_replaces_them() {
        let dir = tempfile::tempdir().unwrap();
        let sparse = SparseTerms::new(SparseIndex::open_edge(dir.path()).await.unwrap());
        let runbook = doc(
            "f1",
            "ops/runbook.md",
            "v1",
            "# Deploy\n\nThe blue-green cutover moves traffic to the new pods in one step.\n\n\
             ## Rollback\n\nRoll back fast by pointing the service at the old pods again.\n",
        );
        assert!(runbook.chunks.len() >= 2);
        let written = write_sparse(&sparse, &runbook).await.unwrap();
        assert_eq!(written, runbook.chunks.len());
        let other = doc(
            "f2",
            "ops/other.md",
            "v1",
            "# Pods\n\nThe pods run in one step.\n",
        );
        write_sparse(&sparse, &other).await.unwrap();

        // The context header is part of the terms: a header word missing from the text
        // (the document title above this section) still reaches the chunk.
        let rollback = runbook
            .chunks
            .iter()
            .find(|c| c.text.contains("Roll back"))
            .unwrap();
        let body = tokenize(&rollback.text);
        let from_header: Vec<String> = tokenize(&rollback.context_header)
            .into_iter()
            .filter(|t| !body.contains(t))
            .collect();
        assert!(!from_header.is_empty(), "{:?}", rollback.context_header);
        let terms = document_vector(
            &sparse_text(&rollback.context_header, &rollback.text),
            &sparse.params,
        );
        assert!(
            from_header
                .iter()
                .all(|t| terms.indices.contains(&term_id(t)))
        );
        assert_eq!(
            sparse
                .index
                .count(&everything(), &Scope::chunks())
                .await
                .unwrap(),
            (runbook.chunks.len() + other.chunks.len()) as u64
        );

        let short = doc("f1", "ops/runbook.md", "v2", "# Deploy\n\nOnly one line.\n");
        write_sparse(&sparse, &short).await.unwrap();
        let only_f1 = AccessFilter {
            deny_file_ids: vec!["f2".into()],
            ..everything()
        };
        assert_eq!(
            sparse
                .index
                .count(&only_f1, &Scope::chunks())
                .await
                .unwrap(),
            short.chunks.len() as u64
        );
    }
}
