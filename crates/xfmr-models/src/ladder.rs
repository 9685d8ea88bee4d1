//! Batch shapes that compile once: token-count batches padded to a small ladder of sequence
//! lengths, each length with one row count.
//!
//! burn's GPU backends (wgpu, CUDA) compile, and autotune, kernels for every new tensor shape:
//! batches padded to their own longest sequence meet a new shape at almost every step, and each
//! costs a compilation (195 s of the first step of a CUDA run). With a [`LengthLadder`] every
//! sequence of a batch is padded to the smallest *rung* that holds the batch's longest one
//! (16, 24, 32, 48, 64, 96, 128, … tokens: each rung 1.5× or 1.33× the one below), and a batch of
//! rung `L` always has `max(1, max_tokens / L)` rows, the last batch of a rung filled with rows
//! that predict nothing. Training and validation thus meet at most one shape per rung: 7 for
//! sequences of up to 128 tokens ([`LengthLadder::shapes`]).
//!
//! **What padding does not change.** The added positions are the padding id, which every model
//! masks as a key and every loss leaves out; a filler row holds one real token (the framing of
//! an empty sequence: the start token, and for the encoders the end token) and predicts none, so
//! it adds nothing to the loss or to the gradient. The loss of the real tokens is the same, up
//! to the order of float additions (tested: `bucketed_batches_*`).
//!
//! **Decoding.** [`SourceBatches`] pads the source batches of `xfmr_translate::translate`
//! the same way (the rung of the batch's longest source; rows filled with copies of the batch's
//! own sources, which end when their originals do, so the search takes no extra step). The
//! cached decoding steps are not bounded: step `t` attends over a cache of `t` keys, so a
//! translation of up to `T` tokens meets `T` key lengths (the cache would have to be
//! preallocated at a fixed length and masked, in `xfmr-attention`).
//!
//! Off by default in the library (`xfmr_train::TrainConfig::ladder` `None`);
//! `xfmr train` turns it on for the GPU backends.

use std::collections::BTreeSet;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A ladder of padded sequence lengths (see the module docs): rungs `min_len · {1, 1.5}·2^k`,
/// rounded up to whole tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LengthLadder {
    /// The first rung, the shortest padded length. Default: 16.
    pub min_len: usize,
}

impl Default for LengthLadder {
    fn default() -> Self {
        Self { min_len: 16 }
    }
}

/// The padded shape of a batch: `[rows, len]` (for translation, both the source and the
/// target sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchShape {
    /// Rows, filler rows included.
    pub rows: usize,
    /// Tokens per row, padding included.
    pub len: usize,
}

impl LengthLadder {
    /// A ladder whose first rung is `min_len` tokens (at least 1).
    pub fn new(min_len: usize) -> Self {
        Self {
            min_len: min_len.max(1),
        }
    }

    /// Rung `k`: `min_len · 2^(k/2)` for even `k`, `1.5 ×` that for odd `k`, rounded up.
    fn rung_at(&self, k: u32) -> usize {
        let base = self
            .min_len
            .max(1)
            .saturating_mul(1usize << (k / 2).min(40));
        if k.is_multiple_of(2) {
            base
        } else {
            base.saturating_mul(3).div_ceil(2)
        }
    }

    /// The length a sequence of `len` tokens is padded to: the smallest rung that holds it, but
    /// at most `cap` (the model's learned position table, `xfmr_train::Objective::max_positions`);
    /// never less than `len`.
    pub fn rung(&self, len: usize, cap: Option<usize>) -> usize {
        let rung = (0..)
            .map(|k| self.rung_at(k))
            .find(|&r| r >= len || r == usize::MAX)
            .unwrap_or(len);
        cap.map_or(rung, |cap| rung.min(cap)).max(len)
    }

    /// Rows of a batch of padded length `len`: as many as `max_tokens` holds, at least 1.
    pub fn rows(&self, len: usize, max_tokens: usize) -> usize {
        (max_tokens / len.max(1)).max(1)
    }

    /// The shape of a batch whose longest sequence has `longest` tokens.
    pub fn shape(&self, longest: usize, max_tokens: usize, cap: Option<usize>) -> BatchShape {
        let len = self.rung(longest, cap);
        BatchShape {
            rows: self.rows(len, max_tokens),
            len,
        }
    }

    /// Token-count batches on the ladder: each example goes to the rung of its longer side
    /// (`lengths`: `(input, output)` tokens per example), the examples of a rung are sorted by
    /// length and cut into batches of [`LengthLadder::rows`] rows (the last one shorter). Every
    /// example is in exactly one batch; batches come by rung, shortest first (shuffle them per
    /// epoch with `xfmr_train::data::shuffled`). Returns indices into `lengths`.
    pub fn batches(
        &self,
        lengths: &[(usize, usize)],
        max_tokens: usize,
        cap: Option<usize>,
    ) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..lengths.len()).collect();
        let rung = |i: usize| self.rung(lengths[i].0.max(lengths[i].1), cap);
        order.sort_by_key(|&i| (rung(i), lengths[i].1, lengths[i].0, i));
        let mut batches: Vec<Vec<usize>> = Vec::new();
        let mut current = (0, 0);
        for i in order {
            let len = rung(i);
            let rows = self.rows(len, max_tokens);
            match batches.last_mut() {
                Some(batch) if current == (len, rows) && batch.len() < rows => batch.push(i),
                _ => {
                    batches.push(vec![i]);
                    current = (len, rows);
                }
            }
        }
        batches
    }

    /// The distinct shapes of `batches` (of examples with `lengths`), sorted: what a run meets.
    pub fn shapes(
        &self,
        batches: &[Vec<usize>],
        lengths: &[(usize, usize)],
        max_tokens: usize,
        cap: Option<usize>,
    ) -> Vec<BatchShape> {
        let mut shapes: Vec<BatchShape> = batches
            .iter()
            .map(|b| self.shape(longest(b, lengths), max_tokens, cap))
            .collect();
        shapes.sort();
        shapes.dedup();
        shapes
    }
}

/// The longest side of the longest example of `batch`.
pub(crate) fn longest(batch: &[usize], lengths: &[(usize, usize)]) -> usize {
    batch
        .iter()
        .map(|&i| lengths[i].0.max(lengths[i].1))
        .max()
        .unwrap_or(0)
}

/// `rows` right-padded with `pad` to `len` tokens each, and `filler` rows appended until there
/// are `shape.rows` (none without a shape). Rows longer than `shape.len` are left as they are.
pub fn fill(rows: &mut Vec<Vec<u32>>, pad: u32, filler: &[u32], shape: Option<BatchShape>) {
    let Some(shape) = shape else { return };
    while rows.len() < shape.rows {
        rows.push(filler.to_vec());
    }
    for row in rows.iter_mut() {
        if row.len() < shape.len {
            row.resize(shape.len, pad);
        }
    }
}

/// How `xfmr_translate::translate` batches its sources: `rows` sentences at a
/// time, and with a ladder every batch padded to `rows` rows (copies of its own sources) and to
/// the rung of its longest source (see the module docs). `usize` converts into it (no ladder),
/// so `translate(.., 32)` reads as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceBatches {
    /// Sentences per batch (at least 1).
    pub rows: usize,
    /// The ladder the sources are padded to; `None`: each batch to its longest source.
    pub ladder: Option<LengthLadder>,
    /// The model's learned position table, which caps the padded length (`None`: no cap).
    pub cap: Option<usize>,
}

impl SourceBatches {
    /// `rows` sentences a batch, no ladder.
    pub fn new(rows: usize) -> Self {
        Self {
            rows: rows.max(1),
            ladder: None,
            cap: None,
        }
    }

    /// The same batches padded to `ladder` (`None`: not padded), at most `cap` tokens.
    pub fn with_ladder(self, ladder: Option<LengthLadder>, cap: Option<usize>) -> Self {
        Self {
            ladder,
            cap,
            ..self
        }
    }

    /// `batch` (framed sources) padded to its shape: rows filled with copies of its own rows
    /// (in turn), each row right-padded with `pad` to the rung of the longest. Without a ladder,
    /// `batch` as it is.
    pub fn pad(&self, mut batch: Vec<Vec<u32>>, pad: u32) -> Vec<Vec<u32>> {
        let Some(ladder) = self.ladder else {
            return batch;
        };
        let real = batch.len();
        for i in real..self.rows.max(real) {
            let copy = batch[i % real].clone();
            batch.push(copy);
        }
        let len = ladder.rung(batch.iter().map(Vec::len).max().unwrap_or(0), self.cap);
        for row in &mut batch {
            row.resize(len, pad);
        }
        batch
    }
}

impl From<usize> for SourceBatches {
    fn from(rows: usize) -> Self {
        Self::new(rows)
    }
}

/// Every distinct batch shape the objectives' losses and `xfmr_translate::translate` have
/// padded in this process, with what padded it (a diagnostic: `xfmr train` prints their
/// count; each is a set of kernels a GPU backend compiles).
static SEEN: Mutex<BTreeSet<(&'static str, [usize; 3])>> = Mutex::new(BTreeSet::new());

/// Records a padded batch shape (`what`: `"translation"`, `"lm"`, `"mlm"` or `"decoding"`;
/// `dims`: rows and the two sides' lengths, the second 0 for decoding's sources).
pub fn record_shape(what: &'static str, dims: [usize; 3]) {
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((what, dims));
}

/// The distinct batch shapes padded in this process so far (recorded by [`record_shape`]), sorted.
pub fn shapes_seen() -> Vec<(&'static str, [usize; 3])> {
    let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    seen.iter().copied().collect()
}
