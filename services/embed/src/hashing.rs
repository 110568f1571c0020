//! [`HashingEmbedder`]: a deterministic bag-of-words embedder for tests only.
//! Each lowercase word adds ±1 to a bucket chosen by its SHA-256; the sum is
//! normalised. Texts sharing words are close, so search tests have meaning.

use sha2::{Digest, Sha256};

use crate::{EmbedError, Embedder, l2_normalize};

/// The test embedder. Never selectable in configuration.
#[derive(Debug, Clone)]
pub struct HashingEmbedder {
    dims: usize,
}

impl HashingEmbedder {
    /// An embedder of `dims`-long vectors (at least 1).
    pub fn new(dims: usize) -> Self {
        Self { dims: dims.max(1) }
    }

    /// The vector of one text.
    pub fn vector(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dims];
        for word in text
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let digest = Sha256::digest(word.to_lowercase().as_bytes());
            let bucket = u64::from_le_bytes([
                digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6],
                digest[7],
            ]);
            let index = usize::try_from(bucket % self.dims as u64).unwrap_or(0);
            v[index] += if digest[8] & 1 == 0 { 1.0 } else { -1.0 };
        }
        if v.iter().all(|x| *x == 0.0) {
            // Empty text: a fixed unit vector, so it is still a valid point.
            v[0] = 1.0;
        }
        l2_normalize(&mut v);
        v
    }
}

#[async_trait::async_trait]
impl Embedder for HashingEmbedder {
    fn model_id(&self) -> &str {
        "test/hashing"
    }

    fn dims(&self) -> usize {
        self.dims
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.vector(t)).collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::cosine;

    #[tokio::test]
    async fn shared_words_are_closer_and_output_is_stable() {
        let e = HashingEmbedder::new(64);
        let v = e
            .embed(vec![
                "blue green deploy".into(),
                "deploy blue green now".into(),
                "quarterly tax filing".into(),
            ])
            .await
            .unwrap();
        assert!(cosine(&v[0], &v[1]) > cosine(&v[0], &v[2]));
        assert_eq!(v[0], e.vector("Blue green deploy"));
        assert!((v[0].iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
    }
}
