//! [`HeadCache`]: one key/value head's cache, grown a position at a time, in the layout
//! [`attend_cached`](super::attend_cached) reads, in the [`CachePrecision`] chosen.

use super::{CacheElement, CachePrecision, CachedHead, HeadView, KEY_BLOCK};
use half::f16;

/// One key/value head's cached keys and values, `d_k` wide, in the layout of [`CachedHead`]:
/// keys in blocks of [`KEY_BLOCK`] positions, each block transposed (`[d_k, 16]`), values as
/// rows (`[len, d_k]`), as `f16` or `f32` ([`CachePrecision`]: `f16` halves the bytes that
/// attention reads, at a relative error of at most 2⁻¹¹ per element in its normal range). A
/// decoder keeps one per
/// layer and key/value head of each sequence and [`push`](Self::push)es each new position's
/// key and value.
///
/// The keys always hold whole blocks (`⌈len/16⌉·16·d_k` elements; the lanes of the last block
/// past `len` are zeros, so that two caches of the same positions are equal).
///
/// ```
/// use xfmr_kernels::{attend_cached, CachePrecision, HeadCache};
///
/// let mut cache = HeadCache::with_capacity(2, 8, CachePrecision::F16);
/// cache.push(&[1.0, 0.0], &[10.0, 20.0]);
/// cache.push(&[0.0, 1.0], &[30.0, 40.0]);
/// assert_eq!(cache.key(1), vec![0.0, 1.0]);
/// assert_eq!(cache.value(0), vec![10.0, 20.0]);
/// assert_eq!(cache.bytes(), (16 + 2) * 2 * 2, "a block of 16 keys, 2 values, 2 bytes each");
/// // One query head that matches the first key far more than the second.
/// let (mut scores, mut out) = (Vec::new(), [0.0; 2]);
/// attend_cached(&[20.0, 0.0], cache.view(2), 1.0, &mut scores, &mut out);
/// assert!((out[0] - 10.0).abs() < 1e-3 && (out[1] - 20.0).abs() < 1e-3);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HeadCache {
    store: Store,
    d_k: usize,
    len: usize,
}

/// The elements, in the precision chosen.
#[derive(Debug, Clone, PartialEq)]
enum Store {
    F32(Rows<f32>),
    F16(Rows<f16>),
}

/// Runs `$body` with `$rows` bound to the [`Rows`] of `$store`, whichever its element type.
macro_rules! each {
    ($store:expr, $rows:ident => $body:expr) => {
        match $store {
            Store::F32($rows) => $body,
            Store::F16($rows) => $body,
        }
    };
}

/// Keys in blocks and values in rows, of one element type.
#[derive(Debug, Clone, PartialEq)]
struct Rows<E> {
    keys: Vec<E>,
    values: Vec<E>,
}

impl<E: CacheElement> Rows<E> {
    fn with_capacity(d_k: usize, positions: usize) -> Self {
        Self {
            keys: Vec::with_capacity(positions.div_ceil(KEY_BLOCK) * KEY_BLOCK * d_k),
            values: Vec::with_capacity(positions * d_k),
        }
    }

    fn copy_reserved(&self) -> Self {
        let copy = |v: &Vec<E>| {
            let mut out = Vec::with_capacity(v.capacity());
            out.extend_from_slice(v);
            out
        };
        Self {
            keys: copy(&self.keys),
            values: copy(&self.values),
        }
    }

    fn capacity(&self, d_k: usize) -> usize {
        (self.keys.capacity() / (KEY_BLOCK * d_k) * KEY_BLOCK).min(self.values.capacity() / d_k)
    }

    /// Appends position `len`'s key and value (checked by the caller).
    fn push(&mut self, len: usize, key: &[f32], value: &[f32]) {
        let d_k = key.len();
        let (block, lane) = (len / KEY_BLOCK, len % KEY_BLOCK);
        if lane == 0 {
            self.keys
                .resize((block + 1) * KEY_BLOCK * d_k, E::default());
        }
        // Converted by slices (`vcvtps2ph` for `f16` where the CPU has F16C: one conversion
        // per element was 5% of a long prompt), then spread over the block's rows.
        let at = block * KEY_BLOCK * d_k + lane;
        let mut narrow = [E::default(); 64];
        for (i, chunk) in key.chunks(64).enumerate() {
            let narrow = &mut narrow[..chunk.len()];
            E::store(narrow, chunk);
            for (c, &k) in narrow.iter().enumerate() {
                self.keys[at + (64 * i + c) * KEY_BLOCK] = k;
            }
        }
        let start = self.values.len();
        self.values.resize(start + d_k, E::default());
        E::store(&mut self.values[start..], value);
    }

    /// Keeps `len` positions' elements (the keys' last block whole).
    fn truncate(&mut self, d_k: usize, len: usize) {
        self.keys
            .truncate(len.div_ceil(KEY_BLOCK) * KEY_BLOCK * d_k);
        self.values.truncate(len * d_k);
    }

    /// Zeros the lanes of the last block past `len` (the keys of dropped positions).
    fn zero_tail(&mut self, d_k: usize, len: usize) {
        let lane = len % KEY_BLOCK;
        if lane > 0 {
            let block = len / KEY_BLOCK * KEY_BLOCK * d_k;
            for row in self.keys[block..].chunks_exact_mut(KEY_BLOCK) {
                row[lane..].fill(E::default());
            }
        }
    }

    fn copy_prefix(&mut self, other: &Self, d_k: usize, len: usize) {
        self.keys.clear();
        self.keys
            .extend_from_slice(&other.keys[..len.div_ceil(KEY_BLOCK) * KEY_BLOCK * d_k]);
        self.values.clear();
        self.values.extend_from_slice(&other.values[..len * d_k]);
    }

    fn key(&self, d_k: usize, t: usize) -> Vec<f32> {
        let at = t / KEY_BLOCK * KEY_BLOCK * d_k + t % KEY_BLOCK;
        (0..d_k)
            .map(|c| self.keys[at + c * KEY_BLOCK].to_f32())
            .collect()
    }

    fn value(&self, d_k: usize, t: usize) -> Vec<f32> {
        self.values[t * d_k..(t + 1) * d_k]
            .iter()
            .map(|v| v.to_f32())
            .collect()
    }

    fn view(&self, d_k: usize, len: usize) -> CachedHead<'_, E> {
        CachedHead {
            keys: &self.keys,
            values: &self.values,
            d_k,
            len,
        }
    }
}

impl HeadCache {
    /// An empty cache of heads `d_k` wide, its elements in `precision`, with room for
    /// `positions` without reallocating.
    ///
    /// # Panics
    /// If `d_k` is 0.
    pub fn with_capacity(d_k: usize, positions: usize, precision: CachePrecision) -> Self {
        assert!(d_k > 0, "HeadCache: a head of width 0");
        let store = match precision {
            CachePrecision::F32 => Store::F32(Rows::with_capacity(d_k, positions)),
            CachePrecision::F16 => Store::F16(Rows::with_capacity(d_k, positions)),
        };
        Self { store, d_k, len: 0 }
    }

    /// A copy that keeps this cache's room for positions (`clone` keeps only what is held),
    /// so that the copy grows without reallocating either (beams that fork).
    pub fn copy_reserved(&self) -> Self {
        let store = match &self.store {
            Store::F32(rows) => Store::F32(rows.copy_reserved()),
            Store::F16(rows) => Store::F16(rows.copy_reserved()),
        };
        Self { store, ..*self }
    }

    /// The number type the keys and values are kept in.
    pub fn precision(&self) -> CachePrecision {
        match self.store {
            Store::F32(_) => CachePrecision::F32,
            Store::F16(_) => CachePrecision::F16,
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
        each!(&self.store, rows => rows.capacity(self.d_k))
    }

    /// Bytes of keys and values held (the keys' last block counted whole).
    pub fn bytes(&self) -> usize {
        let elements = each!(&self.store, rows => rows.keys.len() + rows.values.len());
        elements * self.precision().bytes()
    }

    /// Appends one position's key and value (`d_k` each), rounded to the cache's precision.
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
        each!(&mut self.store, rows => rows.push(self.len, key, value));
        self.len += 1;
    }

    /// Keeps the first `len` positions (none dropped when `len ≥ self.len()`).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.len = len;
            each!(&mut self.store, rows => {
                rows.truncate(self.d_k, len);
                rows.zero_tail(self.d_k, len);
            });
        }
    }

    /// Replaces what this cache holds with the first `len` positions of `other` (all of them
    /// when it holds fewer), keeping this cache's room.
    ///
    /// # Panics
    /// If the heads' widths or precisions differ.
    pub fn copy_prefix(&mut self, other: &HeadCache, len: usize) {
        assert_eq!(self.d_k, other.d_k, "HeadCache::copy_prefix: heads' widths");
        let len = len.min(other.len);
        let d_k = self.d_k;
        match (&mut self.store, &other.store) {
            (Store::F32(to), Store::F32(from)) => {
                to.copy_prefix(from, d_k, len);
                to.zero_tail(d_k, len);
            }
            (Store::F16(to), Store::F16(from)) => {
                to.copy_prefix(from, d_k, len);
                to.zero_tail(d_k, len);
            }
            _ => panic!(
                "HeadCache::copy_prefix: a cache of {:?} from one of {:?}",
                self.precision(),
                other.precision()
            ),
        }
        self.len = len;
    }

    /// Position `t`'s key as cached (gathered from its block, widened to `f32`).
    ///
    /// # Panics
    /// If `t ≥ len`.
    pub fn key(&self, t: usize) -> Vec<f32> {
        assert!(t < self.len, "HeadCache::key: position {t} of {}", self.len);
        each!(&self.store, rows => rows.key(self.d_k, t))
    }

    /// Position `t`'s value as cached (widened to `f32`).
    ///
    /// # Panics
    /// If `t ≥ len`.
    pub fn value(&self, t: usize) -> Vec<f32> {
        assert!(
            t < self.len,
            "HeadCache::value: position {t} of {}",
            self.len
        );
        each!(&self.store, rows => rows.value(self.d_k, t))
    }

    /// The first `len` positions, as [`attend_cached`](super::attend_cached) reads them.
    ///
    /// # Panics
    /// If `len` is 0 or more than the positions held.
    pub fn view(&self, len: usize) -> HeadView<'_> {
        assert!(
            len > 0 && len <= self.len,
            "HeadCache::view: {len} positions of {}",
            self.len
        );
        match &self.store {
            Store::F32(rows) => HeadView::F32(rows.view(self.d_k, len)),
            Store::F16(rows) => HeadView::F16(rows.view(self.d_k, len)),
        }
    }
}
