//! [`HeadCache`]: one key/value head's cache, grown a position at a time, in the layout
//! [`attend_cached`](super::attend_cached) reads.

use super::{CachedHead, KEY_BLOCK};

/// One key/value head's cached keys and values, `d_k` wide, in the layout of [`CachedHead`]:
/// keys in blocks of [`KEY_BLOCK`] positions, each block transposed (`[d_k, 16]`), values as
/// rows (`[len, d_k]`). A decoder keeps one per layer and key/value head of each sequence and
/// [`push`](Self::push)es each new position's key and value.
///
/// The keys always hold whole blocks (`⌈len/16⌉·16·d_k` floats; the lanes of the last block
/// past `len` are zeros, so that two caches of the same positions are equal).
///
/// ```
/// use xfmr_kernels::{attend_cached, HeadCache};
///
/// let mut cache = HeadCache::with_capacity(2, 8);
/// cache.push(&[1.0, 0.0], &[10.0, 20.0]);
/// cache.push(&[0.0, 1.0], &[30.0, 40.0]);
/// assert_eq!(cache.key(1), vec![0.0, 1.0]);
/// assert_eq!(cache.value(0), &[10.0, 20.0]);
/// // One query head that matches the first key far more than the second.
/// let (mut scores, mut out) = (Vec::new(), [0.0; 2]);
/// attend_cached(&[20.0, 0.0], cache.view(2), 1.0, &mut scores, &mut out);
/// assert!((out[0] - 10.0).abs() < 1e-3 && (out[1] - 20.0).abs() < 1e-3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HeadCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    d_k: usize,
    len: usize,
}

impl HeadCache {
    /// An empty cache of heads `d_k` wide with room for `positions` without reallocating.
    ///
    /// # Panics
    /// If `d_k` is 0.
    pub fn with_capacity(d_k: usize, positions: usize) -> Self {
        assert!(d_k > 0, "HeadCache: a head of width 0");
        Self {
            keys: Vec::with_capacity(positions.div_ceil(KEY_BLOCK) * KEY_BLOCK * d_k),
            values: Vec::with_capacity(positions * d_k),
            d_k,
            len: 0,
        }
    }

    /// A copy that keeps this cache's room for positions (`clone` keeps only what is held),
    /// so that the copy grows without reallocating either (beams that fork).
    pub fn copy_reserved(&self) -> Self {
        let copy = |v: &Vec<f32>| {
            let mut out = Vec::with_capacity(v.capacity());
            out.extend_from_slice(v);
            out
        };
        Self {
            keys: copy(&self.keys),
            values: copy(&self.values),
            d_k: self.d_k,
            len: self.len,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The head's width.
    pub fn d_k(&self) -> usize {
        self.d_k
    }

    /// Positions the cache holds room for without reallocating.
    pub fn capacity(&self) -> usize {
        (self.keys.capacity() / (KEY_BLOCK * self.d_k) * KEY_BLOCK)
            .min(self.values.capacity() / self.d_k)
    }

    /// Bytes of keys and values held (the keys' last block counted whole).
    pub fn bytes(&self) -> usize {
        (self.keys.len() + self.values.len()) * std::mem::size_of::<f32>()
    }

    /// Appends one position's key and value (`d_k` each).
    ///
    /// # Panics
    /// If `key` or `value` is not `d_k` long.
    pub fn push(&mut self, key: &[f32], value: &[f32]) {
        let d_k = self.d_k;
        assert!(
            key.len() == d_k && value.len() == d_k,
            "HeadCache::push: a key of {} and a value of {} for a head of {d_k}",
            key.len(),
            value.len()
        );
        let (block, lane) = (self.len / KEY_BLOCK, self.len % KEY_BLOCK);
        if lane == 0 {
            self.keys.resize((block + 1) * KEY_BLOCK * d_k, 0.0);
        }
        let at = block * KEY_BLOCK * d_k + lane;
        for (c, &k) in key.iter().enumerate() {
            self.keys[at + c * KEY_BLOCK] = k;
        }
        self.values.extend_from_slice(value);
        self.len += 1;
    }

    /// Keeps the first `len` positions (none dropped when `len ≥ self.len()`).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            self.keys
                .truncate(len.div_ceil(KEY_BLOCK) * KEY_BLOCK * self.d_k);
            self.values.truncate(len * self.d_k);
            self.zero_tail();
        }
    }

    /// Zeros the lanes of the last block past `len` (the keys of dropped positions).
    fn zero_tail(&mut self) {
        let lane = self.len % KEY_BLOCK;
        if lane > 0 {
            let block = self.len / KEY_BLOCK * KEY_BLOCK * self.d_k;
            for row in self.keys[block..].chunks_exact_mut(KEY_BLOCK) {
                row[lane..].fill(0.0);
            }
        }
    }

    /// Replaces what this cache holds with the first `len` positions of `other` (all of them
    /// when it holds fewer), keeping this cache's room.
    ///
    /// # Panics
    /// If the heads' widths differ.
    pub fn copy_prefix(&mut self, other: &HeadCache, len: usize) {
        assert_eq!(self.d_k, other.d_k, "HeadCache::copy_prefix: heads' widths");
        let len = len.min(other.len);
        let d_k = self.d_k;
        self.keys.clear();
        self.keys
            .extend_from_slice(&other.keys[..len.div_ceil(KEY_BLOCK) * KEY_BLOCK * d_k]);
        self.values.clear();
        self.values.extend_from_slice(&other.values[..len * d_k]);
        self.len = len;
        self.zero_tail();
    }

    /// Position `t`'s key (gathered from its block).
    ///
    /// # Panics
    /// If `t ≥ len`.
    pub fn key(&self, t: usize) -> Vec<f32> {
        assert!(t < self.len, "HeadCache::key: position {t} of {}", self.len);
        let at = t / KEY_BLOCK * KEY_BLOCK * self.d_k + t % KEY_BLOCK;
        (0..self.d_k)
            .map(|c| self.keys[at + c * KEY_BLOCK])
            .collect()
    }

    /// Position `t`'s value.
    ///
    /// # Panics
    /// If `t ≥ len`.
    pub fn value(&self, t: usize) -> &[f32] {
        assert!(
            t < self.len,
            "HeadCache::value: position {t} of {}",
            self.len
        );
        &self.values[t * self.d_k..(t + 1) * self.d_k]
    }

    /// The first `len` positions, as [`attend_cached`](super::attend_cached) reads them.
    ///
    /// # Panics
    /// If `len` is 0 or more than the positions held.
    pub fn view(&self, len: usize) -> CachedHead<'_> {
        assert!(
            len > 0 && len <= self.len,
            "HeadCache::view: {len} positions of {}",
            self.len
        );
        CachedHead {
            keys: &self.keys,
            values: &self.values,
            d_k: self.d_k,
            len,
        }
    }
}
