//! Attention masks with one polarity for the whole workspace: **`true` means ignored**.
//!
//! This is burn's convention and PyTorch's (`key_padding_mask`, boolean `attn_mask`); it is the
//! *opposite* of Hugging Face's `attention_mask` (1 = attend), which
//! [`AttnMask::from_keep_mask`] converts. Use the named constructors and never build the bool
//! tensor by hand.
//!
//! A mask is stored as a rank-4 bool tensor that broadcasts to the attention scores
//! `[batch, heads, seq_q, seq_k]`: every dimension but `seq_k` may be 1.
//!
//! | constructor | stored shape |
//! |---|---|
//! | [`AttnMask::padding_from_lengths`], [`AttnMask::padding_from_ids`], [`AttnMask::from_keep_mask`], [`AttnMask::from_key_padding`] | `[batch, 1, 1, seq_k]` |
//! | [`AttnMask::causal`], [`AttnMask::from_attn_mask`] | `[1, 1, seq_q, seq_k]` |
//! | [`AttnMask::from_tensor`] | as given |
//!
//! Masks combine with [`AttnMask::union`] (a key is ignored if either mask ignores it), follow a
//! reordered batch with [`AttnMask::select_batch`] and shrink to a key prefix with
//! [`AttnMask::narrow_keys`].
//! A query row whose keys are *all* ignored gets a zero context vector and zero weights: see
//! [`crate::scaled_dot_product_attention`].

use burn::tensor::{backend::Backend, Bool, Int, Tensor, TensorData};

use crate::AttentionError;

/// A boolean attention mask, **`true` = ignored** (burn's and PyTorch's polarity), broadcastable to
/// the scores `[batch, heads, seq_q, seq_k]`.
#[derive(Debug, Clone)]
pub struct AttnMask<B: Backend> {
    ignored: Tensor<B, 4, Bool>,
}

impl<B: Backend> AttnMask<B> {
    /// Key padding from sequence lengths: in row `b`, keys at positions `>= lengths[b]` are
    /// ignored. Shape `[batch, 1, 1, seq_k]` with `batch = lengths.len()`.
    ///
    /// # Errors
    /// [`AttentionError::LengthTooLong`] if a length exceeds `seq_k`.
    pub fn padding_from_lengths(
        lengths: &[usize],
        seq_k: usize,
        device: &B::Device,
    ) -> Result<Self, AttentionError> {
        if let Some((index, &length)) = lengths.iter().enumerate().find(|(_, &l)| l > seq_k) {
            return Err(AttentionError::LengthTooLong {
                index,
                length,
                seq_len: seq_k,
            });
        }
        let values: Vec<bool> = lengths
            .iter()
            .flat_map(|&len| (0..seq_k).map(move |k| k >= len))
            .collect();
        let ignored = Tensor::<B, 4, Bool>::from_data(
            TensorData::new(values, [lengths.len(), 1, 1, seq_k]),
            device,
        );
        Ok(Self { ignored })
    }

    /// Key padding from token ids: positions holding `pad_id` are ignored.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq_k]`
    /// - stored mask: `[batch, 1, 1, seq_k]`
    pub fn padding_from_ids(ids: Tensor<B, 2, Int>, pad_id: u32) -> Self {
        let [batch, seq_k] = ids.dims();
        Self {
            ignored: ids
                .equal_elem(i64::from(pad_id))
                .reshape([batch, 1, 1, seq_k]),
        }
    }

    /// From a Hugging Face style keep-mask (`attention_mask`): **1 = attend, 0 = padding**.
    /// Every zero becomes an ignored key.
    ///
    /// # Shapes
    /// - `keep`: `[batch, seq_k]`
    /// - stored mask: `[batch, 1, 1, seq_k]`
    pub fn from_keep_mask(keep: Tensor<B, 2, Int>) -> Self {
        let [batch, seq_k] = keep.dims();
        Self {
            ignored: keep.equal_elem(0).reshape([batch, 1, 1, seq_k]),
        }
    }

    /// From a key padding mask already in our polarity (**`true` = ignored**), as PyTorch's
    /// `key_padding_mask`.
    ///
    /// # Shapes
    /// - `ignored`: `[batch, seq_k]`
    /// - stored mask: `[batch, 1, 1, seq_k]`
    pub fn from_key_padding(ignored: Tensor<B, 2, Bool>) -> Self {
        let [batch, seq_k] = ignored.dims();
        Self {
            ignored: ignored.reshape([batch, 1, 1, seq_k]),
        }
    }

    /// The causal (look-ahead) mask: query `i` ignores every key after it.
    ///
    /// Queries are aligned to the *end* of the keys: query `i` sits at absolute position
    /// `seq_k - seq_q + i` and may attend keys `0..=seq_k - seq_q + i`. With `seq_q == seq_k` this
    /// is the usual lower-triangular mask; with `seq_q < seq_k` it is the mask of the last
    /// `seq_q` steps of incremental decoding over a key/value cache. With `seq_q > seq_k` the
    /// first `seq_q - seq_k` queries see no key (and get zero outputs).
    ///
    /// Stored shape `[1, 1, seq_q, seq_k]`.
    pub fn causal(seq_q: usize, seq_k: usize, device: &B::Device) -> Self {
        let offset = seq_k as i64 - seq_q as i64;
        // tril_mask is `true` strictly above the (offset) diagonal: exactly the future keys.
        let ignored = Tensor::<B, 2, Bool>::tril_mask([seq_q, seq_k], offset, device);
        Self {
            ignored: ignored.reshape([1, 1, seq_q, seq_k]),
        }
    }

    /// From a per-position mask shared by the batch, **`true` = ignored** (PyTorch's boolean
    /// `attn_mask`).
    ///
    /// # Shapes
    /// - `ignored`: `[seq_q, seq_k]`
    /// - stored mask: `[1, 1, seq_q, seq_k]`
    pub fn from_attn_mask(ignored: Tensor<B, 2, Bool>) -> Self {
        let [seq_q, seq_k] = ignored.dims();
        Self {
            ignored: ignored.reshape([1, 1, seq_q, seq_k]),
        }
    }

    /// From any rank-4 bool tensor, **`true` = ignored**, broadcastable to
    /// `[batch, heads, seq_q, seq_k]` (each leading dimension equal or 1).
    pub fn from_tensor(ignored: Tensor<B, 4, Bool>) -> Self {
        Self { ignored }
    }

    /// The union of two masks: a key is ignored if *either* mask ignores it (padding combined
    /// with causal, say). The result has the broadcast shape of both.
    ///
    /// # Panics
    /// If the shapes do not broadcast together (a dimension differs and neither is 1).
    pub fn union(self, other: Self) -> Self {
        let a = self.ignored.dims();
        let b = other.ignored.dims();
        let mut shape = [0usize; 4];
        for i in 0..4 {
            assert!(
                a[i] == b[i] || a[i] == 1 || b[i] == 1,
                "AttnMask::union: shapes {a:?} and {b:?} do not broadcast (dimension {i})"
            );
            shape[i] = a[i].max(b[i]);
        }
        Self {
            ignored: self
                .ignored
                .expand(shape)
                .bool_or(other.ignored.expand(shape)),
        }
    }

    /// Adds `mask` to the optional mask in `slot`: their union, or `mask` when the slot is
    /// empty. Every input type of the workspace (attention options, multi-head attention, the
    /// blocks' stacks) adds masks through this, **the one mask rule**: a mask given never
    /// replaces one set before.
    ///
    /// # Panics
    /// As [`union`](Self::union): if the two masks' shapes do not broadcast together (a mask
    /// alone is checked against the scores by the attention call, which returns the error).
    pub fn add_to(slot: &mut Option<Self>, mask: Self) {
        *slot = Some(match slot.take() {
            Some(existing) => existing.union(mask),
            None => mask,
        });
    }

    /// Keeps (or repeats) rows along the batch: row `i` of the result is row `indices[i]` of
    /// this mask (beam search following its surviving hypotheses). A mask shared by the batch
    /// (stored batch 1) is returned as it is.
    ///
    /// # Shapes
    /// - `indices`: `[new_batch]`, values in `0..batch`
    /// - stored mask: `[new_batch, heads, seq_q, seq_k]` (or unchanged for a shared mask)
    pub fn select_batch(self, indices: Tensor<B, 1, Int>) -> Self {
        if self.dims()[0] == 1 {
            return self;
        }
        Self {
            ignored: self.ignored.select(0, indices),
        }
    }

    /// The keys `start..start + len` only (the prefix of a padding mask that the first
    /// `start + len` steps of incremental decoding see, say).
    ///
    /// # Panics
    /// If `start + len` exceeds the stored key length.
    pub fn narrow_keys(self, start: usize, len: usize) -> Self {
        let seq_k = self.dims()[3];
        assert!(
            start + len <= seq_k,
            "AttnMask::narrow_keys: keys {start}..{} of a mask over {seq_k} keys",
            start + len
        );
        Self {
            ignored: self.ignored.narrow(3, start, len),
        }
    }

    /// Stored shape (broadcastable to `[batch, heads, seq_q, seq_k]`).
    pub fn dims(&self) -> [usize; 4] {
        self.ignored.dims()
    }

    /// The stored bool tensor, `true` = ignored.
    pub fn tensor(&self) -> &Tensor<B, 4, Bool> {
        &self.ignored
    }

    /// Consumes the mask and returns its bool tensor, `true` = ignored.
    pub fn into_tensor(self) -> Tensor<B, 4, Bool> {
        self.ignored
    }

    /// Checks that the mask broadcasts to scores of shape `[batch, heads, seq_q, seq_k]`.
    ///
    /// # Errors
    /// [`AttentionError::MaskShape`] naming both shapes.
    pub fn check(&self, scores: [usize; 4]) -> Result<(), AttentionError> {
        check_broadcast("mask", self.dims(), scores)
    }

    /// The mask broadcast to `[batch, heads_or_1, seq_q, seq_k]`: batch and query dimensions are
    /// expanded (a view where the backend allows), the heads dimension is left as stored so that
    /// backends with broadcast-aware kernels need not materialise one copy per head.
    pub(crate) fn expand_for(self, scores: [usize; 4]) -> Tensor<B, 4, Bool> {
        let [batch, _, seq_q, seq_k] = scores;
        let heads = self.dims()[1];
        self.ignored.expand([batch, heads, seq_q, seq_k])
    }
}

/// Checks that a mask or bias of shape `actual` broadcasts to `expected` (every dimension equal or
/// 1; the key dimension must be equal).
pub(crate) fn check_broadcast(
    what: &'static str,
    actual: [usize; 4],
    expected: [usize; 4],
) -> Result<(), AttentionError> {
    let ok = actual[3] == expected[3] && (0..3).all(|i| actual[i] == expected[i] || actual[i] == 1);
    if ok {
        Ok(())
    } else {
        Err(AttentionError::MaskShape {
            what,
            actual: actual.to_vec(),
            expected: expected.to_vec(),
        })
    }
}
