//! The causal (decoder-only, GPT-like) stack: encoder layers under a look-ahead mask, with
//! incremental decoding through a [`CausalCache`].

use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};
use xfmr_attention::KvCache;

use crate::config::{apply_final_norm, check_cache_layers};
use crate::encoder::Attend;
use crate::{CausalCache, Norm, SelfAttentionInput, SelfAttentionLayer};

/// A causal self-attention stack: position `i` attends to positions `≤ i` only. This is the
/// body of decoder-only language models: the paper's decoder without cross-attention, i.e.
/// its encoder layers ([`SelfAttentionLayer`]) under a look-ahead mask.
#[derive(Module, Debug)]
pub struct CausalDecoder<B: Backend> {
    /// The layers.
    pub layers: Vec<SelfAttentionLayer<B>>,
    /// Final norm (pre-norm stacks).
    pub norm: Option<Norm<B>>,
}

impl<B: Backend> CausalDecoder<B> {
    /// Causal pass over whole sequences (training, scoring).
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`; mask broadcastable to `[batch, heads, seq, seq]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, input: SelfAttentionInput<B>) -> Tensor<B, 3> {
        let SelfAttentionInput { x, mask } = input;
        let x = self.layers.iter().fold(x, |x, layer| {
            layer.run(
                SelfAttentionInput {
                    x,
                    mask: mask.clone(),
                },
                Attend::Causal,
            )
        });
        apply_final_norm(self.norm.as_ref(), x)
    }

    /// An empty cache for this stack.
    pub fn start(&self) -> CausalCache<B> {
        CausalCache {
            layers: (0..self.layers.len()).map(|_| KvCache::new()).collect(),
        }
    }

    /// Incremental pass over new positions after the cached ones; equals the matching rows of
    /// [`forward`](Self::forward) over the whole sequence.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, new, d_model]`; mask covers past and new keys: broadcastable to
    ///   `[batch, heads, new, past + new]`
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `cache` belongs to a stack with another number of layers.
    pub fn step(&self, input: SelfAttentionInput<B>, cache: &mut CausalCache<B>) -> Tensor<B, 3> {
        check_cache_layers("CausalCache", cache.layers.len(), self.layers.len());
        let SelfAttentionInput { x, mask } = input;
        let x = self
            .layers
            .iter()
            .zip(&mut cache.layers)
            .fold(x, |x, (layer, cache)| {
                layer.run(
                    SelfAttentionInput {
                        x,
                        mask: mask.clone(),
                    },
                    Attend::Cached(cache),
                )
            });
        apply_final_norm(self.norm.as_ref(), x)
    }
}
