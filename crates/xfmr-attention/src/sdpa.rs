//! Scaled dot-product attention (paper §3.2.1):
//!
//! ```text
//! Attention(Q, K, V) = softmax(Q Kᵀ · s + M + A) V,    s = 1/√d_k by default
//! ```
//!
//! where `M` is `-∞` at ignored positions of the mask ([`AttnMask`], `true` = ignored) and `A` an
//! optional additive bias (ALiBi, relative positions).
//!
//! Three paths compute it:
//! - [`attention_reference`] materialises the normalised weights: scores filled at ignored keys,
//!   burn's `softmax`, fully ignored rows zeroed, grouped heads selected per query head. It shares
//!   no helper with the fast paths but the default scale (so tests comparing them check each
//!   path's masking and grouping independently); it is the
//!   slow, obviously-correct path, and the one used whenever weights are requested or attention
//!   dropout is active.
//! - [`attention_fused`] calls burn's fused `burn::tensor::module::attention` (a flash-style
//!   kernel on backends that have one, e.g. `flex` and the GPU backends) and never materialises
//!   the weights.
//! - [`attention_decomposed`] is the reference path reordered for speed: the softmax denominator
//!   is applied *after* the product with `V`, `(exp(S - m) V) / Σ exp(S - m)`, so one full
//!   `[seq_q, seq_k]` pass becomes a `[seq_q, d_v]` one. Measured faster than burn's fused op
//!   on the ndarray and flex backends for moderate lengths (docs/benchmarks.md).
//!
//! On the `flex` backend (with this crate's `flex` feature) a fourth path, xfmr's own host kernel
//! ([`AttentionKernel::Flex`], in the internal `xfmr-kernels` crate), computes the whole of it per block of query rows without
//! materialising the scores, reading the head-split views in place. Under burn's autodiff on
//! flex (`Autodiff<Flex>`, training on the CPU) the same kernel runs as one operation of the
//! graph with a backward kernel of its own (`xfmr_kernels::attention_autodiff`: FlashAttention-2's
//! backward from each row's saved log-sum-exp), where no additive bias is given.
//!
//! Under burn's autodiff on a GPU backend (`Autodiff<Wgpu>`, `Autodiff<Cuda>` and their unfused
//! `CubeBackend`s, f32; this crate's `wgpu` or `cuda` feature), where burn's fused attention
//! falls back to the decomposed operations, [`AttentionKernel::Auto`] runs attention as one
//! operation of the graph with the same FlashAttention-2 backward
//! (`xfmr_kernels::gpu_attention_autodiff`, written with the inner backend's tensor
//! operations): it saves the output and each row's log-sum-exp, no `[seq_q, seq_k]`
//! intermediate, and recomputes the weights in the backward pass. Again only without an
//! additive bias.
//!
//! [`scaled_dot_product_attention`] uses the reference path when it must and otherwise the
//! [`AttentionKernel`] chosen in the options ([`AttentionKernel::Auto`] by default). All paths give
//! a **zero row** for a query whose keys are all ignored (never NaN and never a uniform average).
//!
//! **Grouped-query attention** (Ainslie et al., 2023; not in the paper): keys and values may
//! have fewer heads than the queries, `h_kv` dividing `h`; query head `j` then attends with
//! key/value head `j / (h / h_kv)`. The reference and decomposed paths never copy the keys and
//! values for it: the `h / h_kv` query heads that share a key/value head are stacked into one
//! `[(h / h_kv)·seq_q, d_k]` matrix, so each key/value head takes part in one matrix product
//! (during decoding, when the cache is long and `seq_q` is 1, this is what keeps a step's cost
//! independent of the number of query heads). The fused path repeats them, as burn's kernel
//! wants equal head counts.

use burn::nn::DropoutConfig;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use crate::mask::check_broadcast;
use crate::options::{AttentionKernel, AttentionOptions, AttentionOutput};
use crate::{AttentionError, AttnMask};

/// Scaled dot-product attention: the reference path when weights or active dropout are
/// requested, else the [`AttentionKernel`] of the options.
///
/// # Shapes
/// - `query`: `[batch, heads, seq_q, d_k]`
/// - `key`: `[batch, heads_kv, seq_k, d_k]`, `heads_kv` dividing `heads` (equal: plain
///   multi-head attention; fewer: grouped-query attention, see the module docs)
/// - `value`: `[batch, heads_kv, seq_k, d_v]`
/// - output `context`: `[batch, heads, seq_q, d_v]`; `weights`: `[batch, heads, seq_q, seq_k]`
///
/// # Errors
/// [`AttentionError::MaskShape`] if the mask or bias does not broadcast to the scores, and
/// [`AttentionError::InputShape`] if `query`, `key` and `value` disagree.
///
/// # Example
/// ```
/// use burn::backend::NdArray;
/// use burn::tensor::Tensor;
/// use xfmr_attention::{scaled_dot_product_attention, AttentionOptions, AttnMask};
///
/// let device = Default::default();
/// let q = Tensor::<NdArray, 4>::ones([1, 1, 2, 4], &device);
/// let k = Tensor::<NdArray, 4>::ones([1, 1, 3, 4], &device);
/// let v = Tensor::<NdArray, 1>::from_floats([1.0, 2.0, 3.0], &device).reshape([1, 1, 3, 1]);
/// // The last key is padding: equal scores over the first two keys average their values.
/// let mask = AttnMask::padding_from_lengths(&[2], 3, &device).unwrap();
/// let out = scaled_dot_product_attention(q, k, v, AttentionOptions::default().with_mask(mask))
///     .unwrap();
/// let ctx: Vec<f32> = out.context.into_data().to_vec().unwrap();
/// assert!((ctx[0] - 1.5).abs() < 1e-6 && (ctx[1] - 1.5).abs() < 1e-6);
/// ```
pub fn scaled_dot_product_attention<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Result<AttentionOutput<B>, AttentionError> {
    let scores = check_inputs(&query, &key, &value, &options)?;
    let dropout_active = options.dropout > 0.0 && B::ad_enabled(&query.device());
    if options.need_weights || dropout_active {
        return Ok(reference_unchecked(query, key, value, options));
    }
    #[cfg(feature = "flex")]
    if matches!(
        options.kernel,
        AttentionKernel::Auto | AttentionKernel::Flex
    ) && xfmr_kernels::runs_on::<B>(query.dtype())
    {
        let scale = scale_or_default(options.scale, query.dims()[3]) as f32;
        let mask = options.mask.map(AttnMask::into_tensor);
        let context = xfmr_kernels::attention(query, key, value, mask, options.bias, scale);
        return Ok(AttentionOutput {
            context,
            weights: None,
        });
    }
    #[cfg(feature = "flex")]
    if matches!(
        options.kernel,
        AttentionKernel::Auto | AttentionKernel::Flex
    ) && options.bias.is_none()
        && xfmr_kernels::runs_on_autodiff::<B>(query.dtype())
        && query.dims()[1] * query.dims()[3] * value.dims()[3] > 0
    {
        // Training on flex: the kernel as one operation of the autodiff graph, with its own
        // backward (no dropout on the weights here: that took the reference path above; no
        // zero widths or head counts, which its backward does not take).
        let scale = scale_or_default(options.scale, query.dims()[3]) as f32;
        let mask = options.mask.map(AttnMask::into_tensor);
        let context = xfmr_kernels::attention_autodiff(query, key, value, mask, scale);
        return Ok(AttentionOutput {
            context,
            weights: None,
        });
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if matches!(
        options.kernel,
        AttentionKernel::Auto | AttentionKernel::Flex
    ) && options.bias.is_none()
        && xfmr_kernels::runs_on_gpu_autodiff::<B>(query.dtype())
        && scores.iter().product::<usize>() * query.dims()[3] * value.dims()[3] > 0
    {
        // Training on a GPU backend: attention as one operation of the autodiff graph with its
        // own backward (no dropout on the weights: that took the reference path above; no zero
        // sizes, which burn's generic path handles).
        let scale = scale_or_default(options.scale, query.dims()[3]) as f32;
        let mask = options.mask.map(AttnMask::into_tensor);
        let context = xfmr_kernels::gpu_attention_autodiff(query, key, value, mask, scale);
        return Ok(AttentionOutput {
            context,
            weights: None,
        });
    }
    let [_, _, seq_q, seq_k] = scores;
    let context = match options.kernel.resolve(seq_q, seq_k) {
        AttentionKernel::Fused => fused_unchecked(query, key, value, options, scores),
        _ => decomposed_unchecked(query, key, value, options),
    };
    Ok(AttentionOutput {
        context,
        weights: None,
    })
}

/// The reference path: materialises `softmax(QKᵀ·s + M + A)`, applies dropout to it, multiplies
/// by `V`. Always returns the weights.
///
/// Written independently of the other paths (their tests compare against it): grouped
/// key/value heads are selected per query head, ignored scores are filled with `-∞`, burn's
/// `softmax` normalises, and the rows with no finite score (every key ignored) are set to zero.
///
/// # Shapes
/// As [`scaled_dot_product_attention`].
///
/// # Errors
/// As [`scaled_dot_product_attention`].
pub fn attention_reference<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Result<AttentionOutput<B>, AttentionError> {
    check_inputs(&query, &key, &value, &options)?;
    Ok(reference_unchecked(query, key, value, options))
}

/// The fused path through burn's `module::attention`; no weights, no dropout (the option is
/// ignored). Fully ignored query rows are set to zero explicitly, whatever the backend kernel
/// does with them.
///
/// # Shapes
/// As [`scaled_dot_product_attention`]; returns the context only.
///
/// # Errors
/// As [`scaled_dot_product_attention`].
pub fn attention_fused<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Result<Tensor<B, 4>, AttentionError> {
    let scores = check_inputs(&query, &key, &value, &options)?;
    Ok(fused_unchecked(query, key, value, options, scores))
}

/// The decomposed path: `(exp(S - m) V) / Σ_k exp(S - m)` with `S = QKᵀ·s + M + A` and `m` the
/// (finite-clamped) row maximum. No weights, no dropout (the option is ignored). A fully ignored
/// row has `exp(S - m) = 0` everywhere, so its numerator is zero and its clamped denominator keeps
/// it at zero.
///
/// # Shapes
/// As [`scaled_dot_product_attention`]; returns the context only.
///
/// # Errors
/// As [`scaled_dot_product_attention`].
pub fn attention_decomposed<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Result<Tensor<B, 4>, AttentionError> {
    check_inputs(&query, &key, &value, &options)?;
    Ok(decomposed_unchecked(query, key, value, options))
}

/// Validates shapes; returns the scores' shape `[batch, heads, seq_q, seq_k]`.
fn check_inputs<B: Backend>(
    query: &Tensor<B, 4>,
    key: &Tensor<B, 4>,
    value: &Tensor<B, 4>,
    options: &AttentionOptions<B>,
) -> Result<[usize; 4], AttentionError> {
    let [batch, heads, seq_q, d_k] = query.dims();
    let [kb, kh, seq_k, kd] = key.dims();
    let [vb, vh, vs, _d_v] = value.dims();
    if [kb, kd] != [batch, d_k] || kh == 0 || heads % kh != 0 {
        return Err(AttentionError::InputShape {
            what: "key",
            actual: key.dims().to_vec(),
            expected: format!(
                "[{batch}, heads_kv, seq_k, {d_k}] with heads_kv dividing {heads}, to match \
                 query {:?}",
                query.dims()
            ),
        });
    }
    if [vb, vh, vs] != [batch, kh, seq_k] {
        return Err(AttentionError::InputShape {
            what: "value",
            actual: value.dims().to_vec(),
            expected: format!(
                "[{batch}, {kh}, {seq_k}, d_v] to match key {:?}",
                key.dims()
            ),
        });
    }
    let scores = [batch, heads, seq_q, seq_k];
    if let Some(mask) = &options.mask {
        mask.check(scores)?;
    }
    if let Some(bias) = &options.bias {
        check_broadcast("bias", bias.dims(), scores)?;
    }
    Ok(scores)
}

/// The reference path, built independently of the fast ones (it shares no helper with them but
/// the one-line default scale): grouped key/value heads selected per query head, the ignored
/// scores filled with `-∞`, burn's own `softmax`, and rows without any finite score (every key
/// ignored, or biased to `-∞`) zeroed. Its agreement with the other paths therefore checks their
/// masking, grouping and normalisation, not a restatement of them.
fn reference_unchecked<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> AttentionOutput<B> {
    let [_, heads, _, d_k] = query.dims();
    let heads_kv = key.dims()[1];
    let (key, value) = if heads_kv == heads {
        (key, value)
    } else {
        // Query head j reads key/value head j / (heads / heads_kv).
        let shared: Vec<i64> = (0..heads)
            .map(|j| (j / (heads / heads_kv)) as i64)
            .collect();
        let shared =
            Tensor::<B, 1, Int>::from_data(TensorData::new(shared, [heads]), &query.device());
        (key.select(1, shared.clone()), value.select(1, shared))
    };
    let scale = scale_or_default(options.scale, d_k);
    let mut scores = query.matmul(key.swap_dims(2, 3)).mul_scalar(scale);
    let shape = scores.dims();
    if let Some(bias) = options.bias {
        scores = scores + bias.expand(shape);
    }
    if let Some(mask) = options.mask {
        scores = scores.mask_fill(mask.into_tensor().expand(shape), f32::NEG_INFINITY);
    }
    // Rows with no finite score: softmax would give NaN; they get zeros instead. Their maximum
    // is -∞, or f32::MIN on the GPU backends (cubecl's maximum reduction starts from f32::MIN).
    let empty = scores
        .clone()
        .max_dim(3)
        .lower_equal_elem(f32::MIN)
        .expand(shape);
    let weights = softmax(scores.mask_fill(empty.clone(), 0.0), 3).mask_fill(empty, 0.0);
    let weights = crate::dropout(&DropoutConfig::new(options.dropout).init(), weights);
    AttentionOutput {
        context: weights.clone().matmul(value),
        weights: Some(weights),
    }
}

/// The scale of `QKᵀ`: the one given, or the paper's `1/√d_k`.
fn scale_or_default(scale: Option<f64>, d_k: usize) -> f64 {
    scale.unwrap_or(1.0 / (d_k as f64).sqrt())
}

/// Masked, biased, scaled scores `QKᵀ·s + M + A` `[batch, heads, seq_q, seq_k]`.
fn scores<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    mask: Option<AttnMask<B>>,
    bias: Option<Tensor<B, 4>>,
    scale: Option<f64>,
) -> Tensor<B, 4> {
    let [_, _, _, d_k] = query.dims();
    let scale = scale_or_default(scale, d_k);
    // (B, h, Tq, d_k) @ (B, h_kv, d_k, Tk) -> (B, h, Tq, Tk)
    let mut scores = grouped_matmul(query, key.swap_dims(2, 3)).mul_scalar(scale);
    if let Some(mask) = mask {
        let shape = scores.dims();
        scores = scores.mask_fill(mask.into_tensor().expand(shape), f32::NEG_INFINITY);
    }
    if let Some(bias) = bias {
        let shape = scores.dims();
        scores = scores + bias.expand(shape);
    }
    scores
}

/// `(exp(S - m), Σ_k exp(S - m))`: the unnormalised softmax of `S` over its last dimension and
/// its denominator `[.., 1]`, clamped away from zero. The row maximum `m` is clamped to a finite
/// value so that an all `-∞` row (every key ignored) gives zeros instead of NaN.
fn softmax_parts<B: Backend>(scores: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let max = scores.clone().max_dim(3).clamp_min(f32::MIN).detach();
    let numerator = (scores - max).exp();
    let denominator = numerator.clone().sum_dim(3).clamp_min(f32::MIN_POSITIVE);
    (numerator, denominator)
}

fn decomposed_unchecked<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> Tensor<B, 4> {
    let scores = scores(query, key, options.mask, options.bias, options.scale);
    let (numerator, denominator) = softmax_parts(scores);
    // (B, h, Tq, Tk) @ (B, h_kv, Tk, d_v) -> (B, h, Tq, d_v), normalised per query row.
    grouped_matmul(numerator, value) / denominator
}

/// `lhs @ rhs` where `rhs` has `h_kv` heads shared by groups of `h / h_kv` consecutive heads of
/// `lhs`: `[batch, h, m, k] @ [batch, h_kv, k, n] -> [batch, h, m, n]`. Each group's rows are
/// stacked into one `[(h / h_kv)·m, k]` matrix, so `rhs` is never copied.
fn grouped_matmul<B: Backend>(lhs: Tensor<B, 4>, rhs: Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, heads, m, k] = lhs.dims();
    let [_, heads_kv, _, n] = rhs.dims();
    if heads == heads_kv {
        return lhs.matmul(rhs);
    }
    let group = heads / heads_kv;
    lhs.reshape([batch, heads_kv, group * m, k])
        .matmul(rhs)
        .reshape([batch, heads, m, n])
}

/// Repeats each of the `h_kv` heads of `x` for the `heads / h_kv` query heads that share it:
/// `[batch, h_kv, seq, d]` → `[batch, heads, seq, d]` (query head `j` gets head `j / g`).
fn repeat_heads<B: Backend>(x: Tensor<B, 4>, heads: usize) -> Tensor<B, 4> {
    let [batch, heads_kv, seq, d] = x.dims();
    if heads == heads_kv {
        return x;
    }
    let group = heads / heads_kv;
    x
        // (B, h_kv, T, d) -> (B, h_kv, 1, T, d) -> (B, h_kv, g, T, d) -> (B, h_kv·g, T, d)
        .unsqueeze_dim::<5>(2)
        .expand([batch, heads_kv, group, seq, d])
        .reshape([batch, heads, seq, d])
}

fn fused_unchecked<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
    scores: [usize; 4],
) -> Tensor<B, 4> {
    let [_, heads, _, d_k] = query.dims();
    // burn's kernel wants as many key/value heads as query heads.
    let key = repeat_heads(key, heads);
    let value = repeat_heads(value, heads);
    // Leave the scale unset when it is the default: some kernels only take the fast path then.
    let scale = options
        .scale
        .filter(|s| (s - scale_or_default(None, d_k)).abs() > f64::EPSILON);
    let mask = options.mask.map(|m| m.expand_for(scores));
    // Query rows whose keys are all ignored: [batch, heads|1, seq_q, 1].
    let fully_ignored = mask.as_ref().map(|m| m.clone().all_dim(3));
    let bias = options.bias.map(|b| b.expand(scores));
    let attn_options = AttentionModuleOptions {
        scale,
        ..Default::default()
    };
    let context = attention(query, key, value, mask, bias, attn_options);
    match fully_ignored {
        Some(rows) => {
            let shape = context.dims();
            context.mask_fill(rows.expand(shape), 0.0)
        }
        None => context,
    }
}
