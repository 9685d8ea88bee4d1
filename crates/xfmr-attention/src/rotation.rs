//! A hook for position-dependent transforms of projected queries and keys.

use std::fmt::Debug;

use burn::tensor::{backend::Backend, Tensor};

/// A position-dependent transform applied to queries and keys after their projection and before
/// the scores are computed: rotary position embeddings (RoPE, implemented in `xfmr-position`).
///
/// [`crate::MultiHeadAttention`] calls it with the absolute position of the first row: 0 for a
/// full pass, the cache length for a step of incremental decoding, so cached keys keep the
/// transform of their own positions.
pub trait QkRotation<B: Backend>: Send + Sync + Debug {
    /// Transforms `x` whose row `i` sits at absolute position `offset + i`.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, d_k]`
    /// - output: `[batch, heads, seq, d_k]`
    fn rotate(&self, x: Tensor<B, 4>, offset: usize) -> Tensor<B, 4>;
}
