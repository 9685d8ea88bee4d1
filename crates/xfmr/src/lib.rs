//! # xfmr
//!
//! Transformer building blocks from *Attention Is All You Need* (Vaswani et al., 2017) on
//! [burn](https://burn.dev), generic over backends. This facade re-exports the layered crates:
//!
//! - [`attention`] (`xfmr-attention`): masks, scaled dot-product and multi-head attention,
//!   key/value cache.
//! - [`position`] (`xfmr-position`): sinusoidal, learned, rotary (RoPE) and ALiBi positions, and
//!   how they join embeddings.
//! - [`blocks`] (`xfmr-blocks`): embeddings, feed-forward, norms, encoder/decoder layers and
//!   stacks, PyTorch `nn.Transformer` import.
//! - [`models`] (`xfmr-models`): the encoder-decoder Transformer, encoder-only (BERT-like,
//!   with Hugging Face BERT import) and decoder-only (GPT-like) models, generation (greedy,
//!   beam search, sampling) through key/value caches, checkpoints.
//!
//! Backends are chosen by the application; this crate's features (`ndarray` (default), `flex`,
//! `wgpu`, `autodiff`) only switch on burn's corresponding backends for convenience.

#![warn(missing_docs)]

pub use xfmr_attention as attention;
pub use xfmr_blocks as blocks;
pub use xfmr_models as models;
pub use xfmr_position as position;

/// burn itself, re-exported so that users get the exact version xfmr is built against.
pub use burn;

/// The README's Rust examples, compiled and run as doctests (`cargo test -p xfmr --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
