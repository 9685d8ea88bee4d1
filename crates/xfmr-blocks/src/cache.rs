//! The decoding state of the stacks: per-layer key/value caches, and the encoder memory
//! projected once for cross-attention.

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use xfmr_attention::{AttnMask, KvCache, ProjectedMemory};

/// An index tensor on `device`.
fn index_tensor<B: Backend>(indices: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let values: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(values, [indices.len()]), device)
}

/// Reorders every non-empty cache's batch by `indices`.
fn reorder_caches<B: Backend>(layers: &mut [KvCache<B>], indices: &[usize]) {
    let Some(device) = layers.iter().find_map(|c| c.keys().map(|k| k.device())) else {
        return; // nothing cached yet: nothing to reorder
    };
    let idx = index_tensor::<B>(indices, &device);
    for layer in layers {
        layer.reorder(idx.clone());
    }
}

/// Key/value caches of a [`CausalDecoder`](crate::CausalDecoder), one per layer
/// (from [`CausalDecoder::start`](crate::CausalDecoder::start)).
///
/// # Shapes
/// - each layer's keys/values: `[batch, n_kv_heads, len, d_k]` (grouped heads are stored once)
#[derive(Debug, Clone)]
pub struct CausalCache<B: Backend> {
    /// One per layer.
    pub layers: Vec<KvCache<B>>,
}

impl<B: Backend> CausalCache<B> {
    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reorders (or repeats) the batch: row `i` becomes old row `indices[i]` (beam search).
    pub fn reorder(&mut self, indices: &[usize]) {
        reorder_caches(&mut self.layers, indices);
    }

    /// Bytes held by the cached keys and values of all layers.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .filter_map(|c| Some((c.keys()?, c.values()?)))
            .map(|(k, v)| (k.shape().num_elements() + v.shape().num_elements()) * k.dtype().size())
            .sum()
    }
}

/// The encoder memory as every decoder layer's cross-attention sees it: keys and values
/// projected once when decoding starts, with the memory's padding mask.
///
/// Beam search reorders rows among the hypotheses of one source sentence, whose memory rows
/// are identical: the cache remembers which source row each batch row reads and only gathers
/// when that changes (the first expansion to `batch · beam` rows).
#[derive(Debug, Clone)]
pub struct CrossAttentionCache<B: Backend> {
    /// Projected keys/values of each layer, `[batch, n_kv_heads, seq_src, d_k]`.
    pub layers: Vec<ProjectedMemory<B>>,
    /// Source padding (`true` = ignored), broadcastable to `[batch, heads, 1, seq_src]`.
    pub mask: Option<AttnMask<B>>,
    sources: Vec<usize>,
}

impl<B: Backend> CrossAttentionCache<B> {
    pub(crate) fn new(
        layers: Vec<ProjectedMemory<B>>,
        mask: Option<AttnMask<B>>,
        batch: usize,
    ) -> Self {
        Self {
            layers,
            mask,
            sources: (0..batch).collect(),
        }
    }

    /// For each batch row, the row of the memory given to `start` that it reads.
    pub fn sources(&self) -> &[usize] {
        &self.sources
    }

    fn reorder(&mut self, indices: &[usize]) {
        let sources: Vec<usize> = indices.iter().map(|&i| self.sources[i]).collect();
        if sources == self.sources {
            return; // every row still reads the same memory row: nothing to move
        }
        self.sources = sources;
        // A decoder has at least one layer (`StackConfig` refuses zero).
        let Some(device) = self.layers.first().map(|m| m.keys().device()) else {
            return;
        };
        let idx = index_tensor::<B>(indices, &device);
        for layer in &mut self.layers {
            layer.reorder(idx.clone());
        }
        if let Some(mask) = self.mask.take() {
            self.mask = Some(mask.select_batch(idx));
        }
    }
}

/// The decoding state of a [`Decoder`](crate::Decoder) (from
/// [`Decoder::start`](crate::Decoder::start)): each layer's self-attention cache and the
/// projected memory.
#[derive(Debug, Clone)]
pub struct DecoderCache<B: Backend> {
    /// Self-attention keys/values of each layer, one entry per decoded position.
    pub self_attn: Vec<KvCache<B>>,
    /// The encoder memory, projected for each layer's cross-attention.
    pub cross: CrossAttentionCache<B>,
}

impl<B: Backend> DecoderCache<B> {
    /// Number of decoded positions.
    pub fn len(&self) -> usize {
        self.self_attn.first().map_or(0, KvCache::len)
    }

    /// Whether nothing was decoded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reorders (or repeats) the batch: row `i` becomes old row `indices[i]` (beam search).
    /// The projected memory moves only when a row changes source sentence.
    pub fn reorder(&mut self, indices: &[usize]) {
        reorder_caches(&mut self.self_attn, indices);
        self.cross.reorder(indices);
    }
}
