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
//! - [`io`] (`xfmr-io`): atomic file writes and directories published with a size/hash
//!   manifest (what checkpoints are made of).
//! - [`translate`] (`xfmr-translate`, feature `translate`, on by default): the translation
//!   application without training: corpora, BPE vocabularies, translation (greedy or beam,
//!   batched), the decoding choice, BLEU and chrF.
//! - [`train`] (`xfmr-train`, feature `train`, on by default): training for every model family
//!   (translation, causal and masked language models, or an objective of your own), exact
//!   resume, checkpoint averaging, data parallelism.
//!
//! Backends are chosen by the application; this crate's features (`ndarray` (default), `flex`,
//! `wgpu`, `autodiff`) only switch on burn's corresponding backends for convenience.

#![warn(missing_docs)]

pub use xfmr_attention as attention;
pub use xfmr_blocks as blocks;
pub use xfmr_io as io;
pub use xfmr_models as models;
pub use xfmr_position as position;
#[cfg(feature = "train")]
pub use xfmr_train as train;
#[cfg(feature = "translate")]
pub use xfmr_translate as translate;

/// Backend types beyond burn's own aliases.
#[cfg(feature = "wgpu")]
pub mod backend {
    /// burn's wgpu backend without its kernel fusion (`burn::backend::Wgpu` is
    /// `Fusion<CubeBackend<WgpuRuntime>>`).
    ///
    /// Decode through a key/value cache on this type, not on `Wgpu`: in burn 0.21 fusion with
    /// autotune computes the first cached step after a prompt wrongly (upstream
    /// [tracel-ai/burn#5257](https://github.com/tracel-ai/burn/issues/5257); on a tiny Llama
    /// model the logits are off by ~2), while full passes agree. `xfmr generate`, `translate`,
    /// `eval` and `attention` use this type for `--backend wgpu`; training keeps fusion.
    pub type WgpuUnfused =
        burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;
}

/// burn itself, re-exported so that users get the exact version xfmr is built against.
pub use burn;

/// The README's Rust examples, compiled and run as doctests (`cargo test -p xfmr --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
