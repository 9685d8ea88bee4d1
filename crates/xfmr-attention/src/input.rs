//! The input of [`MultiHeadAttention`](crate::MultiHeadAttention): what attends to what,
//! under which mask, built with chained methods.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};

use crate::{AttnMask, QkRotation};

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
    pub(crate) memory: Option<Tensor<B, 3>>,
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
            memory: None,
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
            memory: Some(memory),
            ..Self::self_attn(query)
        }
    }

    /// Adds a mask (`true` = ignored); combined with any mask already set.
    pub fn mask(mut self, mask: AttnMask<B>) -> Self {
        self.mask = Some(match self.mask {
            Some(existing) => existing.union(mask),
            None => mask,
        });
        self
    }

    /// Adds an optional mask (`true` = ignored).
    pub fn mask_opt(self, mask: Option<AttnMask<B>>) -> Self {
        match mask {
            Some(mask) => self.mask(mask),
            None => self,
        }
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
