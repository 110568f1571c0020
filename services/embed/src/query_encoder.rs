//! One short text through all-MiniLM-L6-v2 on the calling thread: the query path.
//!
//! candle runs a forward pass as ~150 tensor ops, each allocating its output and splitting
//! its matrix product across the matmul threads. For a query of a dozen word pieces that
//! bookkeeping, not arithmetic, is most of the time, and the threads spinning on it take
//! the second core from the stores a search waits on. Here the same weights (the tensors
//! candle's model holds, shared, not copied) run through plain loops: each weight row is
//! read once per matrix product and multiplied into every token at once, vectorised for
//! the CPU found at run time (pulp: AVX2/FMA or AVX-512 on x86-64, NEON on aarch64, else
//! scalar). The arithmetic is BERT's as candle runs it, so vectors agree to rounding.

use std::collections::HashMap;

use candle_core::{DType, Storage, Tensor};
use candle_transformers::models::bert::Config;
use pulp::{Arch, Simd, WithSimd};

use crate::EmbedError;

/// Longest text, in word pieces with the specials, that goes through this encoder. Each
/// piece costs it about 0.3-0.5 ms on one core (`cargo run --release -p kg-embed --example
/// query_embedding` on this 2-core machine, p50: 6 words 5.4-6.2 ms, 12 words 7.1-8.1 ms, 24
/// words 10.3-12.5 ms); candle's blocked products on two cores took 11.0 / 14.3 / 18.6 ms
/// there and caught up with an earlier, slower form of this encoder near 30 pieces, hence the
/// cap. Longer texts go to candle.
pub(crate) const QUERY_ENCODER_MAX_PIECES: usize = 32;

fn weight_err(err: impl std::fmt::Display) -> EmbedError {
    EmbedError::Model(format!("weights: {err}"))
}

/// A dense layer `y = x Wᵀ + b`, W stored `[out, in]` as in the checkpoint.
struct Dense {
    weight: Tensor,
    bias: Tensor,
    inputs: usize,
    outputs: usize,
}

/// LayerNorm's scale and shift.
struct Norm {
    weight: Tensor,
    bias: Tensor,
}

struct Layer {
    query: Dense,
    key: Dense,
    value: Dense,
    attention_out: Dense,
    attention_norm: Norm,
    intermediate: Dense,
    output: Dense,
    output_norm: Norm,
}

/// The encoder; cheap to share (its tensors are reference-counted).
pub(crate) struct QueryEncoder {
    word_embeddings: Tensor,
    position_embeddings: Tensor,
    token_type_embeddings: Tensor,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    eps: f32,
    vocab: usize,
    positions: usize,
}

impl QueryEncoder {
    /// Takes BERT's tensors from `tensors` (the checkpoint as loaded for candle's model), with
    /// or without the `bert.` prefix, checking every shape against `config`.
    pub(crate) fn new(
        tensors: &HashMap<String, Tensor>,
        config: &Config,
    ) -> Result<Self, EmbedError> {
        let prefix = if tensors.contains_key("embeddings.word_embeddings.weight") {
            ""
        } else {
            "bert."
        };
        let get = |name: &str, shape: &[usize]| -> Result<Tensor, EmbedError> {
            let full = format!("{prefix}{name}");
            let tensor = tensors
                .get(&full)
                .ok_or_else(|| weight_err(format!("the checkpoint has no {full}")))?;
            if tensor.dims() != shape {
                return Err(weight_err(format!(
                    "{full} is {:?}, expected {shape:?}",
                    tensor.dims()
                )));
            }
            tensor.to_dtype(DType::F32).map_err(weight_err)
        };
        let hidden = config.hidden_size;
        let inner = config.intermediate_size;
        if config.type_vocab_size == 0 {
            return Err(weight_err("the checkpoint has no token type embeddings"));
        }
        if config.num_attention_heads == 0 || !hidden.is_multiple_of(config.num_attention_heads) {
            return Err(weight_err(format!(
                "hidden size {hidden} does not split into {} heads",
                config.num_attention_heads
            )));
        }
        let dense = |name: &str, inputs: usize, outputs: usize| -> Result<Dense, EmbedError> {
            Ok(Dense {
                weight: get(&format!("{name}.weight"), &[outputs, inputs])?,
                bias: get(&format!("{name}.bias"), &[outputs])?,
                inputs,
                outputs,
            })
        };
        let norm = |name: &str| -> Result<Norm, EmbedError> {
            let pick = |names: [&str; 2]| {
                let found = names
                    .iter()
                    .find(|n| tensors.contains_key(&format!("{prefix}{name}.{n}")))
                    .unwrap_or(&names[0]);
                get(&format!("{name}.{found}"), &[hidden])
            };
            Ok(Norm {
                weight: pick(["weight", "gamma"])?,
                bias: pick(["bias", "beta"])?,
            })
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let at = |part: &str| format!("encoder.layer.{i}.{part}");
                Ok(Layer {
                    query: dense(&at("attention.self.query"), hidden, hidden)?,
                    key: dense(&at("attention.self.key"), hidden, hidden)?,
                    value: dense(&at("attention.self.value"), hidden, hidden)?,
                    attention_out: dense(&at("attention.output.dense"), hidden, hidden)?,
                    attention_norm: norm(&at("attention.output.LayerNorm"))?,
                    intermediate: dense(&at("intermediate.dense"), hidden, inner)?,
                    output: dense(&at("output.dense"), inner, hidden)?,
                    output_norm: norm(&at("output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>, EmbedError>>()?;
        Ok(Self {
            word_embeddings: get(
                "embeddings.word_embeddings.weight",
                &[config.vocab_size, hidden],
            )?,
            position_embeddings: get(
                "embeddings.position_embeddings.weight",
                &[config.max_position_embeddings, hidden],
            )?,
            token_type_embeddings: get(
                "embeddings.token_type_embeddings.weight",
                &[config.type_vocab_size, hidden],
            )?,
            embedding_norm: norm("embeddings.LayerNorm")?,
            layers,
            hidden,
            heads: config.num_attention_heads,
            eps: config.layer_norm_eps as f32,
            vocab: config.vocab_size,
            positions: config.max_position_embeddings,
        })
    }

    /// The text's token states, mean-pooled (every piece counts: one text has no padding),
    /// not yet normalised.
    pub(crate) fn mean_pooled(&self, ids: &[u32]) -> Result<Vec<f32>, EmbedError> {
        let n = ids.len();
        let h = self.hidden;
        if n == 0 || n > self.positions {
            return Err(EmbedError::Inference(format!(
                "{n} word pieces; the encoder takes 1 to {}",
                self.positions
            )));
        }
        let arch = Arch::new();

        // Embeddings: word + position + token type 0, then LayerNorm.
        let mut x = vec![0f32; n * h];
        values(&self.word_embeddings, |words| {
            values(&self.position_embeddings, |positions| {
                values(&self.token_type_embeddings, |types| {
                    for (t, (&id, row)) in ids.iter().zip(x.chunks_exact_mut(h)).enumerate() {
                        let id = id as usize;
                        if id >= self.vocab {
                            return Err(EmbedError::Inference(format!(
                                "word piece id {id} is outside the vocabulary"
                            )));
                        }
                        let word = &words[id * h..(id + 1) * h];
                        let position = &positions[t * h..(t + 1) * h];
                        for (((out, w), p), ty) in
                            row.iter_mut().zip(word).zip(position).zip(&types[..h])
                        {
                            *out = w + p + ty;
                        }
                    }
                    Ok(())
                })
            })
        })?;
        self.embedding_norm.apply(&mut x, h, self.eps)?;

        let inner = self.layers.first().map_or(0, |l| l.intermediate.outputs);
        let mut q = vec![0f32; n * h];
        let mut k = vec![0f32; n * h];
        let mut v = vec![0f32; n * h];
        let mut context = vec![0f32; n * h];
        let mut projected = vec![0f32; n * h];
        let mut intermediate = vec![0f32; n * inner];
        let mut scores = vec![0f32; n];
        let head = h / self.heads;
        let scale = 1.0 / (head as f32).sqrt();
        for layer in &self.layers {
            layer.query.apply(arch, &x, n, &mut q)?;
            layer.key.apply(arch, &x, n, &mut k)?;
            layer.value.apply(arch, &x, n, &mut v)?;
            for hd in 0..self.heads {
                let span = hd * head..(hd + 1) * head;
                for i in 0..n {
                    let qi = &q[i * h..][span.clone()];
                    for (j, score) in scores.iter_mut().enumerate() {
                        let kj = &k[j * h..][span.clone()];
                        *score = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    }
                    softmax(&mut scores);
                    let out = &mut context[i * h..][span.clone()];
                    out.fill(0.0);
                    for (j, &p) in scores.iter().enumerate() {
                        let vj = &v[j * h..][span.clone()];
                        for (o, &vv) in out.iter_mut().zip(vj) {
                            *o += p * vv;
                        }
                    }
                }
            }
            layer
                .attention_out
                .apply(arch, &context, n, &mut projected)?;
            add_into(&mut x, &projected);
            layer.attention_norm.apply(&mut x, h, self.eps)?;

            layer.intermediate.apply(arch, &x, n, &mut intermediate)?;
            arch.dispatch(Gelu(&mut intermediate));
            layer.output.apply(arch, &intermediate, n, &mut projected)?;
            add_into(&mut x, &projected);
            layer.output_norm.apply(&mut x, h, self.eps)?;
        }

        let mut pooled = vec![0f32; h];
        for row in x.chunks_exact(h) {
            add_into(&mut pooled, row);
        }
        let count = n as f32;
        pooled.iter_mut().for_each(|p| *p /= count);
        Ok(pooled)
    }
}

impl Dense {
    /// `y[rows × outputs] = x[rows × inputs] Wᵀ + b`.
    fn apply(&self, arch: Arch, x: &[f32], rows: usize, y: &mut [f32]) -> Result<(), EmbedError> {
        if x.len() != rows * self.inputs || y.len() != rows * self.outputs {
            return Err(EmbedError::Inference(format!(
                "dense layer {}x{} given {} inputs and {} outputs for {rows} rows",
                self.outputs,
                self.inputs,
                x.len(),
                y.len()
            )));
        }
        values(&self.weight, |weight| {
            values(&self.bias, |bias| {
                arch.dispatch(Product {
                    x,
                    rows,
                    weight,
                    bias,
                    y,
                });
                Ok(())
            })
        })
    }
}

/// The vectorised matrix product behind [`Dense::apply`], in tiles of tokens by weight
/// rows: four tokens by three rows where four tokens are left (each step loads three weight
/// vectors and four token vectors for twelve multiply-adds into twelve accumulators, so the
/// FMA units, not the loads, set the pace, and the tokens are read from cache once per three
/// weight rows), and wider tiles of the last one to three tokens, so that a query's leftover
/// tokens keep enough independent sums in flight instead of one multiply-add chain per output.
struct Product<'a> {
    x: &'a [f32],
    rows: usize,
    weight: &'a [f32],
    bias: &'a [f32],
    y: &'a mut [f32],
}

impl WithSimd for Product<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Product {
            x,
            rows,
            weight,
            bias,
            y,
        } = self;
        let outputs = bias.len();
        let whole = rows - rows % 4;
        // A block of weight rows stays in cache while every token tile passes over it, so
        // the weights stream from memory once per product, not once per token tile.
        let mut block = 0;
        while block < outputs {
            let end = (block + OUTPUT_BLOCK).min(outputs);
            let mut i = 0;
            while i < whole {
                tiles::<S, 4, 3>(simd, x, i, weight, bias, block..end, y);
                i += 4;
            }
            match rows - whole {
                1 => tiles::<S, 1, 8>(simd, x, i, weight, bias, block..end, y),
                2 => tiles::<S, 2, 6>(simd, x, i, weight, bias, block..end, y),
                3 => tiles::<S, 3, 4>(simd, x, i, weight, bias, block..end, y),
                _ => {}
            }
            block = end;
        }
    }
}

/// Weight rows per block: a multiple of every tile width (3, 8, 6, 4), and 24 rows of 384
/// inputs (37 KB) fit in L1.
const OUTPUT_BLOCK: usize = 24;

/// Rows `first..first + R` of `y = x Wᵀ + b` over the outputs in `span`, in tiles of `R`
/// tokens by `C` weight rows; the outputs past the last whole tile one at a time.
#[inline(always)]
fn tiles<S: Simd, const R: usize, const C: usize>(
    simd: S,
    x: &[f32],
    first: usize,
    weight: &[f32],
    bias: &[f32],
    span: std::ops::Range<usize>,
    y: &mut [f32],
) {
    let outputs = bias.len();
    let inputs = weight.len() / outputs.max(1);
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[(first + r) * inputs..][..inputs]);
    let xv = xs.map(|x| S::as_simd_f32s(x).0);
    let lanes = xv[0].len();
    let head = inputs - S::as_simd_f32s(xs[0]).1.len();
    let zero = simd.splat_f32s(0.0);
    let outputs_end = span.end;
    let mut j = span.start;
    while j < outputs_end {
        if outputs_end - j >= C {
            let w: [&[f32]; C] = std::array::from_fn(|c| &weight[(j + c) * inputs..][..inputs]);
            let wv = w.map(|w| S::as_simd_f32s(w).0);
            let mut acc = [[zero; C]; R];
            for step in 0..lanes {
                let wk: [S::f32s; C] = std::array::from_fn(|c| wv[c][step]);
                for (acc_row, x_row) in acc.iter_mut().zip(&xv) {
                    let xk = x_row[step];
                    for (a, &wc) in acc_row.iter_mut().zip(&wk) {
                        *a = simd.mul_add_e_f32s(xk, wc, *a);
                    }
                }
            }
            for (r, acc_row) in acc.iter().enumerate() {
                for (c, &a) in acc_row.iter().enumerate() {
                    // Elements past the last whole vector, if `inputs` is not a multiple of one.
                    let tail: f32 = xs[r][head..]
                        .iter()
                        .zip(&w[c][head..])
                        .map(|(p, q)| p * q)
                        .sum();
                    y[(first + r) * outputs + j + c] = simd.reduce_sum_f32s(a) + tail + bias[j + c];
                }
            }
            j += C;
        } else {
            let wr = &weight[j * inputs..][..inputs];
            let (w_head, w_tail) = S::as_simd_f32s(wr);
            for (r, xr) in xs.iter().enumerate() {
                let (x_head, x_tail) = S::as_simd_f32s(xr);
                let mut acc = zero;
                for (&a, &b) in x_head.iter().zip(w_head) {
                    acc = simd.mul_add_e_f32s(a, b, acc);
                }
                let tail: f32 = x_tail.iter().zip(w_tail).map(|(p, q)| p * q).sum();
                y[(first + r) * outputs + j] = simd.reduce_sum_f32s(acc) + tail + bias[j];
            }
            j += 1;
        }
    }
}

impl Norm {
    /// LayerNorm over each row of `x` in place.
    fn apply(&self, x: &mut [f32], width: usize, eps: f32) -> Result<(), EmbedError> {
        values(&self.weight, |weight| {
            values(&self.bias, |bias| {
                for row in x.chunks_exact_mut(width) {
                    let count = width as f32;
                    let mean = row.iter().sum::<f32>() / count;
                    let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / count;
                    let inv = 1.0 / (variance + eps).sqrt();
                    for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
                        *v = (*v - mean) * inv * w + b;
                    }
                }
                Ok(())
            })
        })
    }
}

/// Runs `f` on a tensor's f32 values, read in place (a read lock on storage candle's model
/// shares; nothing writes weights).
fn values<R>(
    tensor: &Tensor,
    f: impl FnOnce(&[f32]) -> Result<R, EmbedError>,
) -> Result<R, EmbedError> {
    let (storage, layout) = tensor.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(weight_err(
            "the query encoder reads weights on the CPU only",
        ));
    };
    let all = cpu.as_slice::<f32>().map_err(weight_err)?;
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| weight_err("a weight tensor is not contiguous"))?;
    let slice = all
        .get(start..end)
        .ok_or_else(|| weight_err("a weight tensor's layout is outside its storage"))?;
    f(slice)
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Softmax in place, max-subtracted as candle's.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// GELU with the erf, as BERT's `gelu` and candle's `gelu_erf`, over a whole layer's
/// intermediate values at once. The erf is a rational function of x² on [-4, 4] (the one
/// XLA and Eigen vectorise; within 4e-7 of libm's `erff` there, see the test), so it
/// vectorises without branches: libm's branchy scalar `erff` was ~17% of a query's time.
struct Gelu<'a>(&'a mut [f32]);

/// Numerator and denominator of the erf's rational approximation, highest power first.
const ERF_ALPHA: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_6e-3,
    -1.609_603_3e-2,
];
const ERF_BETA: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329e-3,
    -1.426_474e-2,
];
/// Beyond this the erf is ±1 in f32.
const ERF_CLAMP: f32 = 4.0;

impl WithSimd for Gelu<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (head, tail) = S::as_mut_simd_f32s(self.0);
        let half = simd.splat_f32s(0.5);
        let one = simd.splat_f32s(1.0);
        let scale = simd.splat_f32s(std::f32::consts::FRAC_1_SQRT_2);
        let low = simd.splat_f32s(-ERF_CLAMP);
        let high = simd.splat_f32s(ERF_CLAMP);
        for v in head {
            let x = simd.min_f32s(simd.max_f32s(simd.mul_f32s(*v, scale), low), high);
            let x2 = simd.mul_f32s(x, x);
            let mut p = simd.splat_f32s(ERF_ALPHA[0]);
            for &a in &ERF_ALPHA[1..] {
                p = simd.mul_add_e_f32s(p, x2, simd.splat_f32s(a));
            }
            let mut q = simd.splat_f32s(ERF_BETA[0]);
            for &b in &ERF_BETA[1..] {
                q = simd.mul_add_e_f32s(q, x2, simd.splat_f32s(b));
            }
            let erf = simd.div_f32s(simd.mul_f32s(x, p), q);
            *v = simd.mul_f32s(simd.mul_f32s(simd.add_f32s(erf, one), half), *v);
        }
        for v in tail {
            *v = (erf(*v * std::f32::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * *v;
        }
    }
}

/// The scalar form of [`Gelu`]'s erf, for the values past the last whole vector.
fn erf(x: f32) -> f32 {
    let x = x.clamp(-ERF_CLAMP, ERF_CLAMP);
    let x2 = x * x;
    let p = ERF_ALPHA[1..]
        .iter()
        .fold(ERF_ALPHA[0], |p, &a| p.mul_add(x2, a));
    let q = ERF_BETA[1..]
        .iter()
        .fold(ERF_BETA[0], |q, &b| q.mul_add(x2, b));
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The erf the query encoder's GELU uses, against libm's (candle's) on a fine grid
    /// across and past the clamp, both through the vector path and the scalar tail.
    #[test]
    fn the_gelu_erf_agrees_with_libm() {
        let inputs: Vec<f32> = (-60_000..=60_000).map(|i| i as f32 * 1e-4).collect();
        let mut vectorised = inputs.clone();
        Arch::new().dispatch(Gelu(&mut vectorised));
        let mut worst_erf = 0f32;
        let mut worst_gelu = 0f32;
        for (&v, &g) in inputs.iter().zip(&vectorised) {
            let exact = candle_core::cpu::erf::erf_f32(v);
            worst_erf = worst_erf.max((erf(v) - exact).abs());
            let exact_gelu = (candle_core::cpu::erf::erf_f32(v * std::f32::consts::FRAC_1_SQRT_2)
                + 1.0)
                * 0.5
                * v;
            worst_gelu = worst_gelu.max((g - exact_gelu).abs());
        }
        assert!(worst_erf < 1e-6, "erf off by {worst_erf}");
        assert!(worst_gelu < 4e-6, "gelu off by {worst_gelu}");
    }
}
