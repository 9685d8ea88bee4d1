//! What attention keeps across decoding steps: the self-attention [`KvCache`], which grows by
//! the new tokens at every step, and the cross-attention [`ProjectedMemory`], the encoder memory
//! projected once.

use burn::tensor::{backend::Backend, Int, Tensor};

use crate::AttentionError;

/// Projected keys and values of one self-attention layer, kept across decoding steps
/// ([`crate::MultiHeadAttention::forward_cached`]): each step appends the new tokens' keys and
/// values; the past is never recomputed, so step `t` costs `O(t)` attention work (one query row
/// against `t` keys) plus the `O(t)` copy of the append. (Cross-attention's keys and values do
/// not grow: they are a [`ProjectedMemory`].)
///
/// Entries are stored per key/value head, *before* grouped-query heads are repeated.
///
/// # Shapes
/// - `keys`, `values`: `[batch, n_kv_heads, len, d_k]`
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    entries: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
}

impl<B: Backend> Default for KvCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> KvCache<B> {
    /// An empty cache.
    pub fn new() -> Self {
        Self { entries: None }
    }

    /// Number of cached positions (0 when empty).
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch size of the cached entries, if any.
    pub fn batch_size(&self) -> Option<usize> {
        self.entries.as_ref().map(|(k, _)| k.dims()[0])
    }

    /// Cached keys `[batch, n_kv_heads, len, d_k]`, if any.
    pub fn keys(&self) -> Option<&Tensor<B, 4>> {
        self.entries.as_ref().map(|(k, _)| k)
    }

    /// Cached values `[batch, n_kv_heads, len, d_v]`, if any.
    pub fn values(&self) -> Option<&Tensor<B, 4>> {
        self.entries.as_ref().map(|(_, v)| v)
    }

    /// Appends new keys/values `[batch, n_kv_heads, new, d_k]` along the length and returns the
    /// full keys and values.
    pub(crate) fn append(
        &mut self,
        keys: Tensor<B, 4>,
        values: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (keys, values) = match self.entries.take() {
            None => (keys, values),
            Some((past_k, past_v)) => (
                Tensor::cat(vec![past_k, keys], 2),
                Tensor::cat(vec![past_v, values], 2),
            ),
        };
        self.entries = Some((keys.clone(), values.clone()));
        (keys, values)
    }

    /// Reorders (or repeats) the batch: entry `i` of the result is entry `indices[i]` now. Beam
    /// search uses this to follow the surviving hypotheses. The batch size becomes
    /// `indices.dims()[0]`.
    ///
    /// # Shapes
    /// - `indices`: `[new_batch]`, values in `0..batch`
    pub fn reorder(&mut self, indices: Tensor<B, 1, Int>) {
        if let Some((k, v)) = self.entries.take() {
            self.entries = Some((k.select(0, indices.clone()), v.select(0, indices)));
        }
    }

    /// Keeps only the first `len` positions (to roll back speculative or rejected steps).
    ///
    /// # Errors
    /// [`AttentionError::CacheTruncate`] if `len` exceeds the cached length.
    pub fn truncate(&mut self, len: usize) -> Result<(), AttentionError> {
        let current = self.len();
        if len > current {
            return Err(AttentionError::CacheTruncate {
                len: current,
                requested: len,
            });
        }
        if len == 0 {
            self.entries = None;
        } else if let Some((k, v)) = self.entries.take() {
            self.entries = Some((k.narrow(2, 0, len), v.narrow(2, 0, len)));
        }
        Ok(())
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        self.entries = None;
    }
}

/// The encoder memory projected once into one cross-attention layer's keys and values
/// ([`crate::MultiHeadAttention::project_memory`]), attended by every decoding step through
/// [`crate::MhaInput::cross_projected`]. Unlike a [`KvCache`] it never grows.
///
/// # Shapes
/// - `keys`, `values`: `[batch, n_kv_heads, seq_src, d_k]`
#[derive(Debug, Clone)]
pub struct ProjectedMemory<B: Backend> {
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
}

impl<B: Backend> ProjectedMemory<B> {
    /// Projected keys and values `[batch, n_kv_heads, seq_src, d_k]`.
    ///
    /// # Panics
    /// If `keys` and `values` differ in batch, heads or length.
    pub fn new(keys: Tensor<B, 4>, values: Tensor<B, 4>) -> Self {
        assert_pair("ProjectedMemory", &keys, &values);
        Self { keys, values }
    }

    /// Number of source positions.
    pub fn len(&self) -> usize {
        self.keys.dims()[2]
    }

    /// Whether the memory has no positions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The batch size.
    pub fn batch_size(&self) -> usize {
        self.keys.dims()[0]
    }

    /// Keys `[batch, n_kv_heads, seq_src, d_k]`.
    pub fn keys(&self) -> &Tensor<B, 4> {
        &self.keys
    }

    /// Values `[batch, n_kv_heads, seq_src, d_k]`.
    pub fn values(&self) -> &Tensor<B, 4> {
        &self.values
    }

    /// Reorders (or repeats) the batch: row `i` of the result is row `indices[i]` now (beam
    /// search).
    ///
    /// # Shapes
    /// - `indices`: `[new_batch]`, values in `0..batch`
    pub fn reorder(&mut self, indices: Tensor<B, 1, Int>) {
        self.keys = self.keys.clone().select(0, indices.clone());
        self.values = self.values.clone().select(0, indices);
    }
}

/// Keys and values `[batch, heads, len, d]` agree in batch, heads and length.
fn assert_pair<B: Backend>(what: &str, keys: &Tensor<B, 4>, values: &Tensor<B, 4>) {
    let [kb, kh, kl, _] = keys.dims();
    let [vb, vh, vl, _] = values.dims();
    assert_eq!(
        [kb, kh, kl],
        [vb, vh, vl],
        "{what}: keys {:?} and values {:?} disagree",
        keys.dims(),
        values.dims()
    );
}
