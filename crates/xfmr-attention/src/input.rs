//! The input of [`MultiHeadAttention`](crate::MultiHeadAttention): what attends to what,
//! under which mask, built with chained methods.
//!
//! **The mask rule** (the same for every input type of the workspace): each mask given to an
//! input is *added*: the positions it ignores are ignored on top of those already ignored
//! (the union of the masks, [`AttnMask::union`]); nothing ever replaces a mask set before.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};

use crate::{AttnMask, ProjectedMemory, QkRotation};

/// Where the keys and values of an [`MhaInput`] come from.
#[derive(Debug, Clone)]
pub(crate) enum Keys<B: Backend> {
    /// From the queries' own sequence (self-attention).
    Own,
    /// Projected from the memory in this call (cross-attention).
    Memory(Tensor<B, 3>),
    /// Projected from the memory before (cross-attention while decoding).
    Projected(ProjectedMemory<B>),
}

/// Input of [`MultiHeadAttention`](crate::MultiHeadAttention): what attends to what, under which mask.
///
/// ```
/// # use burn::backend::NdArray;
/// # use burn::tensor::Tensor;
/// # use xfmr_attention::{AttnMask, MhaInput};
/// # let device = Default::default();
/// # let x = Tensor::<NdArray, 3>::zeros([2, 5, 8], &device);
/// # let memory = Tensor::<NdArray, 3>::zeros([2, 7, 8], &device);
/// let pad = AttnMask::padding_from_lengths(&[5, 3], 5, &device).unwrap();
/// let decoder_self = MhaInput::self_attn(x.clone()).causal().mask(pad);
/// let cross = MhaInput::cross(x, memory).need_weights();
/// ```
#[derive(Debug, Clone)]
pub struct MhaInput<B: Backend> {
    pub(crate) query: Tensor<B, 3>,
    pub(crate) keys: Keys<B>,
    pub(crate) mask: Option<AttnMask<B>>,
    pub(crate) bias: Option<Tensor<B, 4>>,
    pub(crate) rotation: Option<Arc<dyn QkRotation<B>>>,
    pub(crate) causal: bool,
    pub(crate) need_weights: bool,
}

impl<B: Backend> MhaInput<B> {
    /// Self-attention: queries, keys and values all from `x` `[batch, seq, d_model]`.
    pub fn self_attn(x: Tensor<B, 3>) -> Self {
        Self {
            query: x,
            keys: Keys::Own,
            mask: None,
            bias: None,
            rotation: None,
            causal: false,
            need_weights: false,
        }
    }

    /// Cross-attention: queries from `query` `[batch, seq_q, d_model]`, keys and values from
    /// `memory` `[batch, seq_k, d_model]`.
    pub fn cross(query: Tensor<B, 3>, memory: Tensor<B, 3>) -> Self {
        Self {
            keys: Keys::Memory(memory),
            ..Self::self_attn(query)
        }
    }

    /// Cross-attention over a memory projected beforehand
    /// ([`MultiHeadAttention::project_memory`](crate::MultiHeadAttention::project_memory)): the
    /// cross-attention of a decoding step. Queries from `query` `[batch, new, d_model]`, keys
    /// and values from `memory` `[batch, n_kv_heads, seq_src, d_k]`.
    pub fn cross_projected(query: Tensor<B, 3>, memory: ProjectedMemory<B>) -> Self {
        Self {
            keys: Keys::Projected(memory),
            ..Self::self_attn(query)
        }
    }

    /// Adds a mask (`true` = ignored): the union with any mask already set (the mask rule).
    pub fn mask(mut self, mask: AttnMask<B>) -> Self {
        AttnMask::add_to(&mut self.mask, mask);
        self
    }

    /// Adds an optional mask (`true` = ignored), as [`mask`](Self::mask) when it is some.
    pub fn mask_opt(self, mask: Option<AttnMask<B>>) -> Self {
        mask.into_iter().fold(self, Self::mask)
    }

    /// Makes the attention causal (look-ahead mask, see [`AttnMask::causal`]).
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// Adds an additive bias on the scores `[batch|1, n_heads|1, seq_q|1, seq_k]` (ALiBi, ...).
    pub fn bias(mut self, bias: Tensor<B, 4>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Rotates the projected queries and keys by their positions before attention (rotary
    /// position embeddings, e.g. `xfmr_position::RotaryEncoding`). Self-attention only.
    pub fn rotary(mut self, rotation: impl QkRotation<B> + 'static) -> Self {
        self.rotation = Some(Arc::new(rotation));
        self
    }

    /// Requests the per-head attention weights in the output.
    pub fn need_weights(mut self) -> Self {
        self.need_weights = true;
        self
    }
}
