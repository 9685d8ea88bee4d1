//! # xfmr-attention
//!
//! The attention layer of *Attention Is All You Need* (Vaswani et al., 2017), generic over burn
//! backends (`B: Backend`): it runs on ndarray, flex, wgpu and under `Autodiff<B>`.
//!
//! - [`AttnMask`]: padding, causal and combined masks. **One polarity everywhere: `true` means
//!   ignored** (burn's and PyTorch's convention); [`AttnMask::from_keep_mask`] converts Hugging
//!   Face's `attention_mask` (1 = attend).
//! - [`scaled_dot_product_attention`]: `softmax(QKᵀ/√d_k + M + A) V` through burn's fused op
//!   ([`attention_fused`]), a faster decomposition ([`attention_decomposed`]) or the reference path
//!   that materialises the weights ([`attention_reference`]); [`AttentionKernel`] chooses. A query
//!   whose keys are all ignored yields a zero row, never NaN.
//! - [`MultiHeadAttention`]: self- and cross-attention, grouped key/value heads, per-projection
//!   bias switches, optional weights, PyTorch import ([`MultiHeadAttention::load_torch`]).
//! - [`dropout()`]: burn's dropout, with a faster mask when training on flex: on the attention
//!   weights here, and the blocks' and models' residual, feed-forward and embedding dropout.
//! - [`MatmulPrecision`] and [`with_matmul_precision`]: `bf16` products permitted for the
//!   projections ([`linear`], which every `Linear` of the xfmr crates goes through) where the
//!   backend and CPU make them faster, as PyTorch's `set_float32_matmul_precision("medium")`,
//!   in inference and (under `Autodiff<Flex>`) training; [`project`] for other weights.
//! - [`KvCache`]: self-attention keys/values kept across incremental decoding steps;
//!   reorderable along the batch (beam search) and truncatable. [`ProjectedMemory`]: the encoder
//!   memory projected once for a decoding step's cross-attention.
//! - Inputs ([`MhaInput`]) follow **one mask rule**: every mask given is added to those already
//!   set (their union); none replaces another. The blocks' inputs follow it too.
//!
//! This crate knows nothing of positions, blocks or models: the higher xfmr crates build on it.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::Tensor;
//! use xfmr_attention::{AttnMask, KvCache, MhaInput, MultiHeadAttentionConfig};
//!
//! let device = Default::default();
//! let mha = MultiHeadAttentionConfig::new(16, 4).init::<NdArray>(&device).unwrap();
//! let x = Tensor::<NdArray, 3>::random([2, 3, 16], burn::tensor::Distribution::Default, &device);
//!
//! // One causal pass over the sequence...
//! let full = mha.forward(MhaInput::self_attn(x.clone()).causal()).context;
//! // ...equals decoding it step by step through the cache.
//! let mut cache = KvCache::new();
//! let steps: Vec<_> = (0..3)
//!     .map(|t| mha.forward_cached(MhaInput::self_attn(x.clone().narrow(1, t, 1)), &mut cache).context)
//!     .collect();
//! let stepped = Tensor::cat(steps, 1);
//! let diff: f32 = (full - stepped).abs().max().into_scalar();
//! assert!(diff < 1e-5);
//! ```

#![warn(missing_docs)]

mod cache;
mod dropout;
mod error;
mod input;
mod mask;
mod mha;
mod options;
mod precision;
mod rotation;
mod sdpa;
mod torch;

pub use cache::{KvCache, ProjectedMemory};
pub use dropout::{dropout, with_dropout_seed};
pub use error::{AttentionError, InvalidConfig};
pub use input::MhaInput;
pub use mask::AttnMask;
pub use mha::{MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig};
pub use options::{AttentionKernel, AttentionOptions, AttentionOutput};
pub use precision::{
    linear, matmul_precision, project, takes_bf16_products, with_matmul_precision, MatmulPrecision,
    BF16_MIN_ROWS,
};
pub use rotation::QkRotation;
pub use sdpa::{
    attention_decomposed, attention_fused, attention_reference, scaled_dot_product_attention,
};
pub use torch::{linear_from_torch, load_linear_torch, TorchMhaWeights};
