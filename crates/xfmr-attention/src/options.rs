//! What [`scaled_dot_product_attention`](crate::scaled_dot_product_attention) and multi-head
//! attention are asked ([`AttentionOptions`], [`AttentionKernel`]) and what they return
//! ([`AttentionOutput`]).

use burn::tensor::{backend::Backend, Tensor};

use crate::AttnMask;

/// Which implementation [`scaled_dot_product_attention`](crate::scaled_dot_product_attention)
/// uses when the weights are not needed and dropout is inactive.
#[derive(burn::config::Config, Debug, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// [`Flex`](Self::Flex) where it runs (the `flex` backend, f32, and `Autodiff<Flex>` without
    /// a bias); under autodiff on a GPU backend (`Autodiff<Wgpu>`, `Autodiff<Cuda>`, f32, no
    /// bias; feature `wgpu` or `cuda`) one operation of the graph with its own backward
    /// (`xfmr_kernels::gpu_attention_autodiff`); elsewhere
    /// [`Decomposed`](Self::Decomposed) while one head's score matrix has at most
    /// [`AttentionKernel::AUTO_FUSED_ABOVE`] elements, [`Fused`](Self::Fused) above, where not
    /// materialising the scores matters more than speed at small sizes.
    Auto,
    /// burn's fused `module::attention` ([`attention_fused`](crate::attention_fused)).
    Fused,
    /// Two matrix products with late normalisation
    /// ([`attention_decomposed`](crate::attention_decomposed)).
    Decomposed,
    /// xfmr's own kernel for burn's `flex` CPU backend (`xfmr_kernels::attention`): per
    /// (batch, block of query rows), head after head, the scores block, a one-pass masked
    /// softmax with a vectorised `exp`, and the product with `V`, on flex's thread pool; the
    /// scores are never materialised whole and the strided head views are read in place. Runs
    /// on the `flex` backend in f32, with the `flex` feature of this crate (the facade's `flex`
    /// turns it on), and under `Autodiff<Flex>` (no bias) as one differentiable operation with
    /// its own backward kernel; elsewhere it resolves as [`Auto`](Self::Auto) does.
    Flex,
}

// Not derived: burn's `Config` derive does not accept the `#[default]` variant attribute.
#[allow(clippy::derivable_impls)]
impl Default for AttentionKernel {
    fn default() -> Self {
        Self::Auto
    }
}

impl AttentionKernel {
    /// `seq_q · seq_k` above which [`AttentionKernel::Auto`] uses the fused kernel: 1024 × 1024.
    pub const AUTO_FUSED_ABOVE: usize = 1 << 20;

    /// The concrete kernel for scores of `seq_q × seq_k` per head, on a backend where
    /// [`Flex`](Self::Flex) does not run.
    pub fn resolve(self, seq_q: usize, seq_k: usize) -> Self {
        match self {
            Self::Auto | Self::Flex if seq_q * seq_k > Self::AUTO_FUSED_ABOVE => Self::Fused,
            Self::Auto | Self::Flex => Self::Decomposed,
            other => other,
        }
    }
}

/// Options of [`scaled_dot_product_attention`](crate::scaled_dot_product_attention). Build with
/// [`Default`] and the `with_*` methods.
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
    /// Implementation used when the reference path is not needed. Default: `Auto`.
    pub kernel: AttentionKernel,
}

impl<B: Backend> Default for AttentionOptions<B> {
    fn default() -> Self {
        Self {
            mask: None,
            bias: None,
            scale: None,
            dropout: 0.0,
            need_weights: false,
            kernel: AttentionKernel::Auto,
        }
    }
}

impl<B: Backend> AttentionOptions<B> {
    /// Adds a mask (`true` = ignored): the union with any mask already set (the crate's one
    /// mask rule).
    pub fn with_mask(mut self, mask: AttnMask<B>) -> Self {
        AttnMask::add_to(&mut self.mask, mask);
        self
    }
    /// Adds an optional mask (`true` = ignored), as [`with_mask`](Self::with_mask) when it is
    /// some.
    pub fn with_optional_mask(self, mask: Option<AttnMask<B>>) -> Self {
        mask.into_iter().fold(self, Self::with_mask)
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
    /// Chooses the implementation used when weights are not requested.
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.kernel = kernel;
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
    /// The attended values: `[batch, heads, seq_q, d_v]` from
    /// [`scaled_dot_product_attention`](crate::scaled_dot_product_attention),
    /// `[batch, seq_q, d_model]` from multi-head attention.
    pub context: Tensor<B, D>,
    /// The weights after softmax (and dropout) `[batch, heads, seq_q, seq_k]`, when requested.
    pub weights: Option<Tensor<B, 4>>,
}
