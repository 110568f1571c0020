//! `[embedding]`: which provider embeds chunks and queries, and how.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::minilm::{MINILM_DIMS, MINILM_MAX_TOKENS, MINILM_MIN_TOKENS, MiniLm, MiniLmOptions};
use crate::openai::{OpenAiEmbedder, OpenAiOptions};
use crate::{EmbedError, SharedEmbedder};

/// Largest batch accepted (OpenAI's own limit is 2048 inputs per request).
const MAX_BATCH: usize = 2048;

/// Which embedder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// all-MiniLM-L6-v2 in-process (candle).
    #[default]
    Minilm,
    /// An OpenAI-compatible `/v1/embeddings` endpoint.
    Openai,
    /// No embeddings: no vector writes, no vector search.
    None,
}

/// The `[embedding]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// `minilm` (default), `openai` or `none`.
    pub provider: Provider,
    /// openai: base URL such as `http://localhost:8081/v1`.
    pub endpoint: Option<String>,
    /// openai: the model name sent with each request.
    pub model: Option<String>,
    /// Texts per forward pass or request.
    pub batch_size: usize,
    /// openai: the environment variable that holds the API key.
    pub api_key_env: Option<String>,
    /// Vector length: checked for minilm (384); for openai, asked from the endpoint when unset.
    pub dims: Option<usize>,
    /// minilm: the wheel's model.zip; found in the virtualenv when unset.
    pub model_zip: Option<PathBuf>,
    /// minilm: word pieces embedded per chunk or query (8 to 256, the model's own cap).
    /// Embedding time grows with it, so a lower cap ingests long chunks faster and embeds
    /// less of each; chunks indexed under another cap should be reprocessed.
    pub max_tokens: usize,
    /// Forward passes or requests at once.
    pub concurrency: usize,
    /// openai: seconds before one request times out.
    pub timeout_secs: u64,
    /// openai: retries after the first try (429, 5xx, timeouts).
    pub max_retries: u32,
    /// openai over https: a PEM bundle of extra CAs to trust (a private CA), on top of
    /// the operating system's trust store.
    pub ca_file: Option<PathBuf>,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        Self {
            provider: Provider::Minilm,
            endpoint: None,
            model: None,
            batch_size: 32,
            api_key_env: None,
            dims: None,
            model_zip: None,
            max_tokens: MINILM_MAX_TOKENS,
            concurrency: 1,
            timeout_secs: 60,
            max_retries: 4,
            ca_file: None,
        }
    }
}

impl EmbeddingConfig {
    /// Every problem with the section, each prefixed with its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.batch_size == 0 || self.batch_size > MAX_BATCH {
            problems.push(format!(
                "embedding.batch_size: expected 1..={MAX_BATCH}, got {}",
                self.batch_size
            ));
        }
        if self.concurrency == 0 || self.concurrency > 64 {
            problems.push(format!(
                "embedding.concurrency: expected 1..=64, got {}",
                self.concurrency
            ));
        }
        match self.provider {
            Provider::Minilm => {
                if !(MINILM_MIN_TOKENS..=MINILM_MAX_TOKENS).contains(&self.max_tokens) {
                    problems.push(format!(
                        "embedding.max_tokens: expected {MINILM_MIN_TOKENS}..={MINILM_MAX_TOKENS} (all-MiniLM-L6-v2 embeds at most {MINILM_MAX_TOKENS} word pieces), got {}",
                        self.max_tokens
                    ));
                }
                if let Some(dims) = self.dims
                    && dims != MINILM_DIMS
                {
                    problems.push(format!(
                        "embedding.dims: all-MiniLM-L6-v2 makes {MINILM_DIMS}-dimensional vectors, not {dims}"
                    ));
                }
            }
            Provider::Openai => {
                match &self.endpoint {
                    Some(url) if url.starts_with("http://") || url.starts_with("https://") => {}
                    Some(_) => problems.push(
                        "embedding.endpoint: expected http://HOST/v1 or https://HOST/v1".to_owned(),
                    ),
                    None => {
                        problems.push("embedding.endpoint: required for provider openai".to_owned())
                    }
                }
                if self.model.as_deref().is_none_or(str::is_empty) {
                    problems.push("embedding.model: required for provider openai".to_owned());
                }
                if self.dims == Some(0) {
                    problems.push("embedding.dims: must be at least 1".to_owned());
                }
                if self.timeout_secs == 0 {
                    problems.push("embedding.timeout_secs: must be at least 1".to_owned());
                }
                if let Some(path) = &self.ca_file
                    && !path.is_file()
                {
                    problems.push(format!(
                        "embedding.ca_file: `{}` is not a readable file",
                        path.display()
                    ));
                }
            }
            Provider::None => {}
        }
        problems
    }
}

/// Builds the configured embedder; `None` for provider `none`.
pub async fn build(config: &EmbeddingConfig) -> Result<Option<SharedEmbedder>, EmbedError> {
    let problems = config.problems();
    if !problems.is_empty() {
        return Err(EmbedError::Config(problems.join("; ")));
    }
    match config.provider {
        Provider::None => Ok(None),
        Provider::Minilm => {
            let model = MiniLm::load(MiniLmOptions {
                model_zip: config.model_zip.clone(),
                batch_size: config.batch_size,
                concurrency: config.concurrency,
                max_tokens: config.max_tokens,
            })
            .await?;
            Ok(Some(Arc::new(model)))
        }
        Provider::Openai => {
            let mut options = OpenAiOptions::new(
                config.endpoint.clone().unwrap_or_default(),
                config.model.clone().unwrap_or_default(),
            );
            options.api_key_env = config.api_key_env.clone();
            options.dims = config.dims;
            options.batch_size = config.batch_size;
            options.concurrency = config.concurrency;
            options.timeout = Duration::from_secs(config.timeout_secs);
            options.max_retries = config.max_retries;
            options.ca_file = config.ca_file.clone();
            Ok(Some(Arc::new(OpenAiEmbedder::connect(options).await?)))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_keys() {
        assert!(EmbeddingConfig::default().problems().is_empty());
        let bad = EmbeddingConfig {
            provider: Provider::Openai,
            batch_size: 0,
            ..Default::default()
        };
        let problems = bad.problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("embedding.endpoint")));
        let wrong_dims = EmbeddingConfig {
            dims: Some(768),
            ..Default::default()
        };
        assert!(wrong_dims.problems()[0].contains("384"));
        for max_tokens in [0, 7, 257] {
            let bad_cap = EmbeddingConfig {
                max_tokens,
                ..Default::default()
            };
            let problems = bad_cap.problems();
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].starts_with("embedding.max_tokens: expected 8..=256"));
        }
        let low_cap = EmbeddingConfig {
            max_tokens: 8,
            ..Default::default()
        };
        assert!(low_cap.problems().is_empty());
    }

    #[test]
    fn the_section_parses_from_toml_names() {
        let config: EmbeddingConfig = serde_json::from_value(serde_json::json!({
            "provider": "openai", "endpoint": "http://localhost:1/v1", "model": "m",
            "api_key_env": "KEY", "batch_size": 8
        }))
        .unwrap();
        assert_eq!(config.provider, Provider::Openai);
        assert_eq!(config.batch_size, 8);
        assert!(config.problems().is_empty());
        assert!(
            serde_json::from_value::<EmbeddingConfig>(serde_json::json!({"provider": "hashing"}))
                .is_err()
        );
    }

    #[tokio::test]
    async fn provider_none_builds_nothing() {
        let config = EmbeddingConfig {
            provider: Provider::None,
            ..Default::default()
        };
        assert!(build(&config).await.unwrap().is_none());
    }
}
