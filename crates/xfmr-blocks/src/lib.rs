//! # xfmr-blocks
//!
//! The pieces of the Transformer between attention and whole models, generic over burn
//! backends, each reusable on its own:
//!
//! - [`TokenEmbedding`]: embeddings scaled by √d_model (paper §3.4), usable as the tied output
//!   projection.
//! - [`FeedForward`]: the position-wise network (§3.3) with ReLU (paper), GELU or SwiGLU.
//! - [`Norm`]: LayerNorm or RMSNorm; [`NormPosition`]: post-norm (paper) or pre-norm.
//! - [`LayerConfig`]: the one layer configuration every stack and model shares (widths, heads
//!   and grouped key/value heads, dropout, activation, norm kind and placement, projection
//!   biases); [`StackConfig`] builds the stacks from it, with the RoPE or ALiBi its layers
//!   apply ([`PositionEncoding`]: the models choose where positions enter). [`limits`]: the
//!   largest sizes a configuration may ask for, checked by [`LayerConfig::validate`] before
//!   anything is allocated.
//! - [`Encoder`] (bidirectional, [`SelfAttentionLayer`]), [`Decoder`] (cross-attending,
//!   [`DecoderLayer`]) and [`CausalDecoder`] (decoder-only: encoder layers under a look-ahead
//!   mask), with residual dropout on each sublayer output before the add (§3.1). Inputs are
//!   built with chained methods: [`SelfAttentionInput`], [`DecoderInput`] (a teacher-forced
//!   pass, memory included) and [`DecoderStepInput`] (a cached step). Every mask given to an
//!   input is added to the ones already set, never replaces them (the workspace's one mask
//!   rule, [`AttnMask::add_to`](xfmr_attention::AttnMask::add_to)).
//! - Incremental decoding: [`Decoder::start`] projects the encoder memory once
//!   ([`CrossAttentionCache`], one [`ProjectedMemory`](xfmr_attention::ProjectedMemory) per
//!   layer); [`Decoder::step`] and [`CausalDecoder::step`] take only the new positions, through
//!   [`DecoderCache`] / [`CausalCache`]. "Memory" always names the encoder's output.
//! - [`Positions`] (sinusoidal or learned vectors added to embeddings) and
//!   [`AttentionPositions`] (RoPE, ALiBi inside self-attention), both from one
//!   [`PositionEncoding`].
//! - [`dropout()`]: burn's dropout, with a faster mask when training on flex; the blocks and
//!   models apply their residual, feed-forward and embedding dropout through it.
//! - [`StateDict`] and `load_torch` on the stacks: PyTorch `nn.Transformer` weights by name.
//!
//! Departures from the paper, all opt-in: pre-norm, RMSNorm, GELU/SwiGLU, grouped key/value
//! heads, RoPE/ALiBi, projections without bias, a final norm after a stack (PyTorch's
//! `nn.Transformer` always has one), dropout inside the feed-forward network (PyTorch's; off
//! by default).
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::Tensor;
//! use xfmr_attention::AttnMask;
//! use xfmr_blocks::{
//!     DecoderInput, DecoderStepInput, LayerConfig, NormPosition, SelfAttentionInput, StackConfig,
//! };
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
//! let memory = encoder.forward(SelfAttentionInput::new(src).mask(src_pad.clone()));
//!
//! // Teacher forcing over the whole target ...
//! let tgt = Tensor::<NdArray, 3>::zeros([2, 5, 16], &device);
//! let full = decoder.forward(DecoderInput::new(tgt.clone(), &memory).memory_mask(src_pad.clone()));
//! // ... or one position at a time: the memory is projected once, by `start`.
//! let mut cache = decoder.start(&memory, Some(src_pad));
//! let first = decoder.step(DecoderStepInput::new(tgt.narrow(1, 0, 1)), &mut cache);
//! assert_eq!(full.dims(), [2, 5, 16]);
//! assert_eq!(first.hidden.dims(), [2, 1, 16]);
//! ```

#![warn(missing_docs)]

mod cache;
mod causal;
mod config;
mod decoder;
mod embedding;
mod encoder;
mod error;
mod ffn;
pub mod limits;
mod norm;
mod positions;
mod torch;

pub use cache::{CausalCache, CrossAttentionCache, DecoderCache};
pub use causal::CausalDecoder;
pub use config::{LayerConfig, StackConfig};
pub use decoder::{Decoder, DecoderInput, DecoderLayer, DecoderOutput, DecoderStepInput};
pub use embedding::{TokenEmbedding, TokenEmbeddingConfig};
pub use encoder::{Encoder, SelfAttentionInput, SelfAttentionLayer};
pub use error::{BlockError, ImportReport};
pub use ffn::{exact_gelu, Activation, FeedForward, FeedForwardConfig};
pub use norm::{Norm, NormConfig, NormKind, NormPosition};
pub use positions::{add_positions, AttentionPositions, PositionEncoding, Positions};
pub use torch::{StateDict, StateDictImporter};
pub use xfmr_attention::dropout;
pub use xfmr_position::RotaryLayout;
