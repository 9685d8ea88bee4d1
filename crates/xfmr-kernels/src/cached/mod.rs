//! Attention of one query position over a key/value cache, for the query heads that share a
//! key/value head (grouped-query attention): the inner loop of decoding with a cache
//! ([`attend_cached`], [`cached_probabilities`]), and the cache in the layout it reads
//! ([`HeadCache`]).
//!
//! For each query head `j` of the group, with the cached keys `K` and values `V` of the shared
//! head over the `len` positions the query sees (`[len, d_k]` each) and the scale `s`:
//!
//! ```text
//! p_j = softmax(s · K q_j)        (len probabilities)
//! o_j = p_jᵀ V                    (d_k values)
//! ```
//!
//! The cache holds `f16` or `f32` elements ([`CachePrecision`]: `f16` is half the bytes to
//! read, as llama.cpp keeps its cache), widened to `f32` as they are loaded (exactly); the
//! arithmetic is `f32` either way.
//! The keys are kept in blocks of [`KEY_BLOCK`] positions, each block transposed (`[d_k,
//! 16]`: row `c` holds element `c` of the block's sixteen keys), so that sixteen scores are
//! the sixteen lanes of one vector: `Σ_c q_c · K[c]` is one multiply-add per element with
//! the query's element broadcast, and no dot product ends in a horizontal sum (which cost
//! more than its multiply-adds at `d_k` 64). Each key row of a block is read once for up to
//! four query heads. The values stay rows (`[len, d_k]`): the weighted sum runs 64 columns at
//! a time (then 16), the heads' sums kept in local accumulators across all positions
//! (registers on AVX-512), so that each position's values are read in one pass: a cache
//! streamed from memory (decoding, where the weights evict it from the caches between layers)
//! costs one pass over its rows.
//!
//! The arithmetic is the same on every level: each score is two fused multiply-add chains over
//! the elements (even `c` and odd `c`, in order), added, then scaled; each output column is one
//! fused multiply-add chain over positions in order from zero. The exponentials are
//! [`exp_shifted`]'s. Compiled for AVX-512 or AVX2 (with FMA) when the CPU has it (the
//! [`FloatLevel`] probed at run time); the portable copy's `mul_add` is the same fused
//! operation (a library call where the portable copy runs on x86, a CPU without AVX2 and FMA;
//! one instruction on AArch64), so the result does not depend on the CPU.

mod element;
mod head;
mod scores;

use half::f16;

pub use element::{CacheElement, CachePrecision};
pub use head::HeadCache;

use scores::{block_scores, widen};

use crate::cpu::FloatLevel;
use crate::exp::exp_shifted;

/// Positions per block of the keys' layout ([`CachedHead::keys`]): one AVX-512 register of
/// `f32` scores.
pub const KEY_BLOCK: usize = 16;
/// The most query heads of one tile.
const TILE: usize = 4;
/// Lanes of the values' narrower pass (an AVX-512 register of f32).
const LANES: usize = 16;

/// One key/value head's cache over the positions a query sees, in the layout the kernel reads
/// ([`HeadCache::view`] lends one).
///
/// Keys and values are `f32` or `f16` ([`CacheElement`]; [`CachePrecision`] says why `f16`).
/// Position `t`'s key element `c` is `keys[(t / 16)·16·d_k + c·16 + t % 16]` (blocks of
/// [`KEY_BLOCK`] positions, each `[d_k, 16]`; the lanes of the last block past `len` are
/// read and their scores dropped, so they must exist but may hold anything finite or not);
/// its value is `values[t·d_k..(t + 1)·d_k]`.
#[derive(Clone, Copy, Debug)]
pub struct CachedHead<'a, E: CacheElement = f32> {
    /// The cached keys in blocks of [`KEY_BLOCK`] positions: at least `⌈len/16⌉·16·d_k`.
    pub keys: &'a [E],
    /// The cached values, `[positions, d_k]` row-major: at least `len·d_k`.
    pub values: &'a [E],
    /// The head's width.
    pub d_k: usize,
    /// How many positions the query sees (`≥ 1`): positions `0..len`.
    pub len: usize,
}

/// A [`CachedHead`] of either element type: what [`attend_cached`] and
/// [`cached_probabilities`] read (`CachedHead::into()`, or [`HeadCache::view`]).
#[derive(Clone, Copy, Debug)]
pub enum HeadView<'a> {
    /// `f32` keys and values.
    F32(CachedHead<'a, f32>),
    /// `f16` keys and values.
    F16(CachedHead<'a, f16>),
}

impl<'a> From<CachedHead<'a, f32>> for HeadView<'a> {
    fn from(head: CachedHead<'a, f32>) -> Self {
        Self::F32(head)
    }
}

impl<'a> From<CachedHead<'a, f16>> for HeadView<'a> {
    fn from(head: CachedHead<'a, f16>) -> Self {
        Self::F16(head)
    }
}

impl HeadView<'_> {
    /// The head's width.
    pub fn d_k(&self) -> usize {
        match self {
            Self::F32(h) => h.d_k,
            Self::F16(h) => h.d_k,
        }
    }

    /// How many positions the query sees.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(h) => h.len,
            Self::F16(h) => h.len,
        }
    }

    /// Whether the view has no position (never one [`HeadCache::view`] lends; refused by the
    /// kernel).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Panics unless every key and value the kernel reads is inside the view's slices.
    fn check(&self) {
        match self {
            Self::F32(h) => h.check(),
            Self::F16(h) => h.check(),
        }
    }
}

impl<E: CacheElement> CachedHead<'_, E> {
    /// Panics unless every key and value the kernel reads is inside `keys` and `values`
    /// (all builds).
    fn check(&self) {
        assert!(
            self.d_k > 0 && self.len > 0,
            "attend_cached: d_k and len must be positive"
        );
        let keys = self.len.div_ceil(KEY_BLOCK) * KEY_BLOCK * self.d_k;
        let values = self.len * self.d_k;
        assert!(
            self.keys.len() >= keys && self.values.len() >= values,
            "attend_cached: {} positions need {keys} elements of keys and {values} of values, \
             the cache has {} and {}",
            self.len,
            self.keys.len(),
            self.values.len()
        );
    }
}

/// `out_j = softmax(scale · K q_j)ᵀ V` for each query head `j` of `queries` (`[group, d_k]`,
/// row-major; every head of the group attends over the same cached `head`), written to `out`
/// (`[group, d_k]`). Leaves the probabilities in `scores` (`[group, head.len]`), as
/// [`cached_probabilities`] computes them.
///
/// # Panics
/// When `queries` or `out` is not `[group, d_k]` or the cache is shorter than `head` says.
pub fn attend_cached(
    queries: &[f32],
    head: HeadView<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    head.check();
    assert!(
        queries.len().is_multiple_of(head.d_k()) && out.len() == queries.len(),
        "attend_cached: queries of {} floats and an output of {} are not [group, {}]",
        queries.len(),
        out.len(),
        head.d_k()
    );
    attend_on(
        FloatLevel::detect(),
        queries,
        head,
        scale,
        scores,
        Some(out),
    );
}

/// The probabilities of [`attend_cached`] alone: `scores ← softmax(scale · K q_j)` for each
/// query head `j` of `queries` (`[group, d_k]`), `[group, head.len]`; the same values
/// `attend_cached` weighs the cached values with.
///
/// # Panics
/// When `queries` is not `[group, d_k]` or the cache is shorter than `head` says.
pub fn cached_probabilities(
    queries: &[f32],
    head: HeadView<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
) {
    head.check();
    assert!(
        queries.len().is_multiple_of(head.d_k()),
        "cached_probabilities: queries of {} floats are not [group, {}]",
        queries.len(),
        head.d_k()
    );
    attend_on(FloatLevel::detect(), queries, head, scale, scores, None);
}

/// The kernel on `level`, which must be available (asserted in all builds; the callers
/// checked the shapes), compiled for the view's element type.
fn attend_on(
    level: FloatLevel,
    queries: &[f32],
    head: HeadView<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    match head {
        HeadView::F32(head) => attend_typed(level, queries, head, scale, scores, out),
        HeadView::F16(head) => attend_typed(level, queries, head, scale, scores, out),
    }
}

/// [`attend_on`] for one element type: the AVX-512 or AVX2 copy, or the portable loops.
#[allow(unsafe_code)]
fn attend_typed<E: CacheElement>(
    level: FloatLevel,
    queries: &[f32],
    head: CachedHead<'_, E>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    level.assert_available();
    // The vector copies convert `f16` with F16C's `vcvtph2ps` (every CPU with AVX2 and FMA,
    // or AVX-512F, has it: the check is for form, and what `widen` relies on).
    #[cfg(target_arch = "x86_64")]
    let f16c = crate::cpu::features().f16c;
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F and FMA, the
        // features the copy is compiled for, and F16C (checked).
        FloatLevel::Avx512 if f16c => unsafe { attend_avx512(queries, head, scale, scores, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2 and FMA, and F16C (checked).
        FloatLevel::Avx2 if f16c => unsafe { attend_avx2(queries, head, scale, scores, out) },
        _ => attend_with(FloatLevel::Portable, queries, head, scale, scores, out),
    }
}

/// The same loops compiled for AVX2 (and F16C, the `f16` cache's conversions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn attend_avx2<E: CacheElement>(
    queries: &[f32],
    head: CachedHead<'_, E>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    attend_with(FloatLevel::Avx2, queries, head, scale, scores, out);
}

/// The same loops compiled for AVX-512: sixteen scores, or sixteen columns of values, in one
/// register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
fn attend_avx512<E: CacheElement>(
    queries: &[f32],
    head: CachedHead<'_, E>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    attend_with(FloatLevel::Avx512, queries, head, scale, scores, out);
}

/// The kernel, in tiles of up to [`TILE`] heads, its block scores on `level` (available: the
/// dispatch asserted it; the callers checked the shapes).
#[inline(always)]
fn attend_with<E: CacheElement>(
    level: FloatLevel,
    queries: &[f32],
    head: CachedHead<'_, E>,
    scale: f32,
    scores: &mut Vec<f32>,
    mut out: Option<&mut [f32]>,
) {
    let (d_k, len) = (head.d_k, head.len);
    let group = queries.len() / d_k;
    scores.clear();
    scores.resize(group * len, 0.0);
    let mut first = 0;
    while first < group {
        let g = (group - first).min(TILE);
        let q = &queries[first * d_k..(first + g) * d_k];
        let p = &mut scores[first * len..(first + g) * len];
        let o = out
            .as_deref_mut()
            .map(|o| &mut o[first * d_k..(first + g) * d_k]);
        match g {
            4 => tile::<4, E>(level, q, head, scale, p, o),
            3 => tile::<3, E>(level, q, head, scale, p, o),
            2 => tile::<2, E>(level, q, head, scale, p, o),
            _ => tile::<1, E>(level, q, head, scale, p, o),
        }
        first += g;
    }
}

/// `G` heads: their probabilities into `p` (`[G, len]`) and, given `out`, their outputs.
#[inline(always)]
fn tile<const G: usize, E: CacheElement>(
    level: FloatLevel,
    q: &[f32],
    head: CachedHead<'_, E>,
    scale: f32,
    p: &mut [f32],
    out: Option<&mut [f32]>,
) {
    let CachedHead { keys, d_k, len, .. } = head;
    let q: [&[f32]; G] = std::array::from_fn(|j| &q[j * d_k..(j + 1) * d_k]);
    // Scores, sixteen positions at a time: each key row of a block once for the G heads, two
    // chains per head (even and odd elements) so that the multiply-adds overlap
    // ([`block_scores`]).
    for (b, block) in keys
        .chunks_exact(KEY_BLOCK * d_k)
        .take(len.div_ceil(KEY_BLOCK))
        .enumerate()
    {
        let (rows, _) = block.as_chunks::<KEY_BLOCK>();
        let sums = block_scores(level, &q, rows);
        let first = b * KEY_BLOCK;
        let n = (len - first).min(KEY_BLOCK);
        for (j, sums) in sums.iter().enumerate() {
            for (p, sum) in p[j * len + first..][..n].iter_mut().zip(sums) {
                *p = sum * scale;
            }
        }
    }
    for row in p.chunks_exact_mut(len) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let total = exp_shifted(row, max);
        row.iter_mut().for_each(|v| *v /= total);
    }
    let Some(out) = out else { return };
    // Values: 64 columns at a time (a whole row of a 64-wide head: each position's values
    // read once, in one pass), then 16, the G heads' sums kept over all positions.
    let mut c = 0;
    while c + 4 * LANES <= d_k {
        weigh_values::<G, { 4 * LANES }, E>(level, head, p, c, out);
        c += 4 * LANES;
    }
    while c + LANES <= d_k {
        weigh_values::<G, LANES, E>(level, head, p, c, out);
        c += LANES;
    }
    let values = head.values;
    for c in c..d_k {
        for j in 0..G {
            let mut sum = 0.0f32;
            for t in 0..len {
                sum = p[j * len + t].mul_add(values[t * d_k + c].to_f32(), sum);
            }
            out[j * d_k + c] = sum;
        }
    }
}

/// Columns `first..first + W` of the `G` heads' outputs: `Σ_t p_jt · v_t`, one fused
/// multiply-add per position in order from zero, the sums kept in local accumulators over all
/// positions.
#[inline(always)]
fn weigh_values<const G: usize, const W: usize, E: CacheElement>(
    level: FloatLevel,
    head: CachedHead<'_, E>,
    p: &[f32],
    first: usize,
    out: &mut [f32],
) {
    let (len, d_k) = (head.len, head.d_k);
    let mut acc = [[0f32; W]; G];
    for t in 0..len {
        let at = t * d_k + first;
        let v: &[E; W] = head.values[at..at + W].try_into().unwrap();
        let v = widen(level, v);
        for (j, acc) in acc.iter_mut().enumerate() {
            let w = p[j * len + t];
            for l in 0..W {
                acc[l] = w.mul_add(v[l], acc[l]);
            }
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        out[j * d_k + first..j * d_k + first + W].copy_from_slice(acc);
    }
}

#[cfg(test)]
mod tests;
