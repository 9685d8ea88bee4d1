//! Scaled dot-product attention (paper §3.2.1):
//!
//! ```text
//! Attention(Q, K, V) = softmax(Q Kᵀ · s + M + A) V,    s = 1/√d_k by default
//! ```
//!
//! where `M` is `-∞` at ignored positions of the mask ([`AttnMask`], `true` = ignored) and `A` an
//! optional additive bias (ALiBi, relative positions).
//!
//! Two paths compute it:
//! - [`attention_reference`] materialises the weights with a masked softmax written out in plain
//!   tensor ops. It is the slow, obviously-correct path, and the one used whenever weights are
//!   requested or attention dropout is active.
//! - [`attention_fused`] calls burn's fused `burn::tensor::module::attention` (a flash-style
//!   kernel on backends that have one, e.g. `flex` and the GPU backends) and never materialises
//!   the weights.
//!
//! [`scaled_dot_product_attention`] picks the fused path whenever it can. Both give a **zero row**
//! for a query whose keys are all ignored (never NaN and never a uniform average).

use burn::nn::DropoutConfig;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{backend::Backend, Tensor};

use crate::mask::check_broadcast;
use crate::{AttentionError, AttnMask};

/// Options of [`scaled_dot_product_attention`]. Build with [`Default`] and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct AttentionOptions<B: Backend> {
    /// Ignored positions (`true` = ignored), broadcastable to `[batch, heads, seq_q, seq_k]`.
    pub mask: Option<AttnMask<B>>,
    /// Additive bias on the scaled scores, broadcastable to `[batch, heads, seq_q, seq_k]`
    /// (key dimension exact).
    pub bias: Option<Tensor<B, 4>>,
    /// Scale of `QKᵀ`. Default: `1/√d_k` (paper).
    pub scale: Option<f64>,
    /// Dropout probability on the attention weights *after* the softmax (as in the paper's
    /// reference implementation). Active only on an autodiff backend. Default: 0.
    pub dropout: f64,
    /// Return the attention weights `[batch, heads, seq_q, seq_k]`. Forces the reference path.
    pub need_weights: bool,
}

impl<B: Backend> Default for AttentionOptions<B> {
    fn default() -> Self {
        Self {
            mask: None,
            bias: None,
            scale: None,
            dropout: 0.0,
            need_weights: false,
        }
    }
}

impl<B: Backend> AttentionOptions<B> {
    /// Sets the mask (`true` = ignored).
    pub fn with_mask(mut self, mask: AttnMask<B>) -> Self {
        self.mask = Some(mask);
        self
    }
    /// Sets an optional mask (`true` = ignored).
    pub fn with_optional_mask(mut self, mask: Option<AttnMask<B>>) -> Self {
        self.mask = mask;
        self
    }
    /// Sets the additive bias.
    pub fn with_bias(mut self, bias: Tensor<B, 4>) -> Self {
        self.bias = Some(bias);
        self
    }
    /// Sets a custom scale of `QKᵀ` (default `1/√d_k`).
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }
    /// Sets the dropout probability on the weights.
    pub fn with_dropout(mut self, prob: f64) -> Self {
        self.dropout = prob;
        self
    }
    /// Requests the attention weights in the output.
    pub fn with_weights(mut self, need_weights: bool) -> Self {
        self.need_weights = need_weights;
        self
    }
}

/// Result of an attention call.
#[derive(Debug, Clone)]
pub struct AttentionOutput<B: Backend, const D: usize = 4> {
    /// The attended values: `[batch, heads, seq_q, d_v]` from [`scaled_dot_product_attention`],
    /// `[batch, seq_q, d_model]` from multi-head attention.
    pub context: Tensor<B, D>,
    /// The weights after softmax (and dropout) `[batch, heads, seq_q, seq_k]`, when requested.
    pub weights: Option<Tensor<B, 4>>,
}

/// Scaled dot-product attention, choosing the fused path when neither weights nor active dropout
/// are requested, else the reference path.
///
/// # Shapes
/// - `query`: `[batch, heads, seq_q, d_k]`
/// - `key`: `[batch, heads, seq_k, d_k]`
/// - `value`: `[batch, heads, seq_k, d_v]`
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
        Ok(reference_unchecked(query, key, value, options))
    } else {
        let context = fused_unchecked(query, key, value, options, scores);
        Ok(AttentionOutput {
            context,
            weights: None,
        })
    }
}

/// The reference path: materialises `softmax(QKᵀ·s + M + A)`, applies dropout to it, multiplies
/// by `V`. Always returns the weights.
///
/// The softmax is the usual max-shifted one, with the row maximum clamped to a finite value and
/// the denominator clamped away from zero, so that fully ignored rows give zero weights.
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
    if [kb, kh, kd] != [batch, heads, d_k] {
        return Err(AttentionError::InputShape {
            what: "key",
            actual: key.dims().to_vec(),
            expected: format!("[{batch}, {heads}, seq_k, {d_k}] to match query {:?}", query.dims()),
        });
    }
    if [vb, vh, vs] != [batch, heads, seq_k] {
        return Err(AttentionError::InputShape {
            what: "value",
            actual: value.dims().to_vec(),
            expected: format!("[{batch}, {heads}, {seq_k}, d_v] to match key {:?}", key.dims()),
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

fn reference_unchecked<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
) -> AttentionOutput<B> {
    let [_, _, _, d_k] = query.dims();
    let scale = options.scale.unwrap_or(1.0 / (d_k as f64).sqrt());
    // (B, h, Tq, d_k) @ (B, h, d_k, Tk) -> (B, h, Tq, Tk)
    let mut scores = query.matmul(key.swap_dims(2, 3)).mul_scalar(scale);
    if let Some(mask) = options.mask {
        let shape = scores.dims();
        scores = scores.mask_fill(mask.into_tensor().expand(shape), f32::NEG_INFINITY);
    }
    if let Some(bias) = options.bias {
        let shape = scores.dims();
        scores = scores + bias.expand(shape);
    }
    let weights = masked_softmax(scores);
    let weights = DropoutConfig::new(options.dropout)
        .init()
        .forward(weights);
    // (B, h, Tq, Tk) @ (B, h, Tk, d_v) -> (B, h, Tq, d_v)
    let context = weights.clone().matmul(value);
    AttentionOutput {
        context,
        weights: Some(weights),
    }
}

/// Softmax over the last dimension that maps a row of `-∞` to zeros instead of NaN.
fn masked_softmax<B: Backend>(scores: Tensor<B, 4>) -> Tensor<B, 4> {
    // Clamp the max so that an all -inf row subtracts a finite value (-inf - -inf = NaN).
    let max = scores.clone().max_dim(3).clamp_min(f32::MIN).detach();
    let numerator = (scores - max).exp();
    // An all-ignored row sums to 0: clamp so that 0 / tiny = 0.
    let denominator = numerator.clone().sum_dim(3).clamp_min(f32::MIN_POSITIVE);
    numerator / denominator
}

fn fused_unchecked<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    options: AttentionOptions<B>,
    scores: [usize; 4],
) -> Tensor<B, 4> {
    let [_, _, _, d_k] = query.dims();
    // Leave the scale unset when it is the default: some kernels only take the fast path then.
    let scale = options
        .scale
        .filter(|s| (s - 1.0 / (d_k as f64).sqrt()).abs() > f64::EPSILON);
    let mask = options.mask.map(|m| m.expand_for(scores));
    // Query rows whose keys are all ignored: [batch, heads|1, seq_q, 1].
    let fully_ignored = mask.as_ref().map(|m| m.clone().all_dim(3));
    let bias = options.bias.map(|b| b.expand(scores));
    let mut attn_options = AttentionModuleOptions::default();
    attn_options.scale = scale;
    let context = attention(query, key, value, mask, bias, attn_options);
    match fully_ignored {
        Some(rows) => {
            let shape = context.dims();
            context.mask_fill(rows.expand(shape), 0.0)
        }
        None => context,
    }
}
