//! # xfmr-blocks
//!
//! The pieces of the Transformer between attention and whole models, generic over burn
//! backends, each reusable on its own:
//!
//! - [`TokenEmbedding`]: embeddings scaled by √d_model (paper §3.4), usable as the tied output
//!   projection.
//! - [`FeedForward`]: the position-wise network (§3.3) with ReLU (paper), GELU or SwiGLU.
//! - [`Norm`]: LayerNorm or RMSNorm; [`NormPosition`]: post-norm (paper) or pre-norm.
//! - [`EncoderLayer`], [`DecoderLayer`] and their stacks [`Encoder`], [`Decoder`] (§3.1), with
//!   residual dropout on each sublayer output before the add, padding, causal and memory masks,
//!   and incremental decoding through [`DecoderCache`].
//! - [`StateDict`] and `load_torch` on the stacks: PyTorch `nn.Transformer` weights by name.
//!
//! Departures from the paper, all opt-in: pre-norm, RMSNorm, GELU/SwiGLU, grouped key/value
//! heads, a final norm after a stack (PyTorch's `nn.Transformer` always has one), dropout inside
//! the feed-forward network (PyTorch's; off by default).

//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::Tensor;
//! use xfmr_attention::AttnMask;
//! use xfmr_blocks::{DecoderCache, LayerConfig, NormPosition, StackConfig};
//!
//! let device = Default::default();
//! // The paper's layer at toy size: post-norm, ReLU, residual dropout 0.1.
//! let layer = LayerConfig::new(16, 4, 64);
//! let encoder = StackConfig::new(layer.clone(), 2).init_encoder::<NdArray>(&device).unwrap();
//! let decoder = StackConfig::new(layer.with_norm_position(NormPosition::Pre), 2)
//!     .with_final_norm(true)
//!     .init_decoder::<NdArray>(&device)
//!     .unwrap();
//!
//! let src = Tensor::<NdArray, 3>::zeros([2, 7, 16], &device);
//! let src_pad = AttnMask::padding_from_lengths(&[7, 4], 7, &device).unwrap();
//! let memory = encoder.forward(src, Some(&src_pad));
//!
//! // Teacher forcing over the whole target, or one position at a time through the caches.
//! let tgt = Tensor::<NdArray, 3>::zeros([2, 5, 16], &device);
//! let full = decoder.forward(tgt.clone(), memory.clone(), None, Some(&src_pad));
//! let mut cache = DecoderCache::new(2);
//! let first = decoder.forward_cached(tgt.narrow(1, 0, 1), memory, &mut cache, None, Some(&src_pad));
//! assert_eq!(full.dims(), [2, 5, 16]);
//! assert_eq!(first.dims(), [2, 1, 16]);
//! ```

#![warn(missing_docs)]

mod embedding;
mod error;
mod ffn;
mod layer;
mod norm;
mod torch;

pub use embedding::{TokenEmbedding, TokenEmbeddingConfig};
pub use error::{BlockError, ImportReport};
pub use ffn::{exact_gelu, Activation, FeedForward, FeedForwardConfig};
pub use layer::{
    Decoder, DecoderCache, DecoderLayer, DecoderLayerCache, Encoder, EncoderLayer, LayerConfig,
    SelfAttentionCache, StackConfig,
};
pub use norm::{Norm, NormConfig, NormKind, NormPosition};
pub use torch::{StateDict, StateDictImporter};

pub(crate) fn check_dropout(prob: f64) -> Result<(), BlockError> {
    if (0.0..1.0).contains(&prob) {
        Ok(())
    } else {
        Err(BlockError::InvalidDropout { prob })
    }
}
