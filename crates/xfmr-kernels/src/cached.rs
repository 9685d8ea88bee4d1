//! Attention of one query position over a key/value cache, for the query heads that share a
//! key/value head (grouped-query attention): the inner loop of decoding with a cache
//! ([`attend_cached`], [`cached_probabilities`]).
//!
//! For each query head `j` of the group, with the cached keys `K` and values `V` of the shared
//! head over the `len` positions the query sees (`[len, d_k]` each) and the scale `s`:
//!
//! ```text
//! p_j = softmax(s · K q_j)        (len probabilities)
//! o_j = p_jᵀ V                    (d_k values)
//! ```
//!
//! Tiled for up to four heads at a time: a key row is read once for the heads of the tile
//! (each head's dot product in eight lanes), and the weighted sum of values runs 64 columns
//! at a time (then 16) with the tile's sums kept in local accumulators across all positions
//! (registers on AVX-512; AVX2's sixteen registers spill some of four heads' 64 columns to
//! the stack), instead of adding into the output in memory once per position, so that each
//! position's values are read in one pass: a cache streamed from memory (decoding, where the
//! weights evict it from the caches between layers) costs one pass over its rows, not one per
//! 16 columns. The arithmetic is the plain loops' in the same order: each dot product sums eight lane-wise partial sums (lane `l` takes columns
//! `l, l + 8, …`), then the lanes left to right, then the products of the columns past the last
//! whole eight (`d_k` not a multiple of 8); each output column sums `p_t · v_t` over
//! positions in order from zero. The exponentials are [`exp_shifted`]'s. Compiled for
//! AVX-512 or AVX2 when the CPU has it (the [`FloatLevel`] probed at run time; the same
//! operations in the same order on every level, so the result does not depend on the CPU).

use crate::cpu::FloatLevel;
use crate::exp::exp_shifted;

/// Lanes of the partial sums (an AVX2 register of f32).
const LANES: usize = 8;
/// The most query heads of one tile.
const TILE: usize = 4;

/// One key/value head of a cache over the positions a query sees: position `t`'s key is
/// `keys[t·stride + offset..][..d_k]`, its value the same slice of `values` (a cache laid out
/// `[positions, key/value heads · d_k]` has `stride = heads · d_k` and `offset = head · d_k`).
#[derive(Clone, Copy, Debug)]
pub struct CachedHead<'a> {
    /// The cached keys, rows of `stride`.
    pub keys: &'a [f32],
    /// The cached values, laid out as the keys.
    pub values: &'a [f32],
    /// Floats from one position's row to the next.
    pub stride: usize,
    /// Where this head starts in a row.
    pub offset: usize,
    /// The head's width.
    pub d_k: usize,
    /// How many positions the query sees (`≥ 1`): rows `0..len`.
    pub len: usize,
}

impl CachedHead<'_> {
    /// Panics unless every row the kernel reads is inside `keys` and `values` (all builds).
    fn check(&self) {
        assert!(
            self.d_k > 0 && self.len > 0,
            "attend_cached: d_k and len must be positive"
        );
        assert!(
            self.offset + self.d_k <= self.stride,
            "attend_cached: the head (offset {}, width {}) overflows its row of {}",
            self.offset,
            self.d_k,
            self.stride
        );
        let needed = (self.len - 1) * self.stride + self.offset + self.d_k;
        assert!(
            self.keys.len() >= needed && self.values.len() >= needed,
            "attend_cached: {} positions need {needed} floats, the cache has {} keys and {} values",
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
    head: CachedHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    head.check();
    assert!(
        queries.len().is_multiple_of(head.d_k) && out.len() == queries.len(),
        "attend_cached: queries of {} floats and an output of {} are not [group, {}]",
        queries.len(),
        out.len(),
        head.d_k
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
    head: CachedHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
) {
    head.check();
    assert!(
        queries.len().is_multiple_of(head.d_k),
        "cached_probabilities: queries of {} floats are not [group, {}]",
        queries.len(),
        head.d_k
    );
    attend_on(FloatLevel::detect(), queries, head, scale, scores, None);
}

/// The kernel on `level`, which must be available (asserted in all builds; the callers
/// checked the shapes): the AVX-512 or AVX2 copy, or the portable loops.
#[allow(unsafe_code)]
fn attend_on(
    level: FloatLevel,
    queries: &[f32],
    head: CachedHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { attend_avx512(queries, head, scale, scores, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { attend_avx2(queries, head, scale, scores, out) },
        _ => attend_portable(queries, head, scale, scores, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_avx2(
    queries: &[f32],
    head: CachedHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    attend_portable(queries, head, scale, scores, out);
}

/// The same loops compiled for AVX-512: the values' sixteen columns in one register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn attend_avx512(
    queries: &[f32],
    head: CachedHead<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: Option<&mut [f32]>,
) {
    attend_portable(queries, head, scale, scores, out);
}

/// The kernel, in tiles of up to [`TILE`] heads (the callers checked the shapes).
#[inline(always)]
fn attend_portable(
    queries: &[f32],
    head: CachedHead<'_>,
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
            4 => tile::<4>(q, head, scale, p, o),
            3 => tile::<3>(q, head, scale, p, o),
            2 => tile::<2>(q, head, scale, p, o),
            _ => tile::<1>(q, head, scale, p, o),
        }
        first += g;
    }
}

/// `G` heads: their probabilities into `p` (`[G, len]`) and, given `out`, their outputs.
#[inline(always)]
fn tile<const G: usize>(
    q: &[f32],
    head: CachedHead<'_>,
    scale: f32,
    p: &mut [f32],
    out: Option<&mut [f32]>,
) {
    let CachedHead {
        keys,
        values,
        stride,
        offset,
        d_k,
        len,
    } = head;
    let q: [(&[[f32; LANES]], &[f32]); G] =
        std::array::from_fn(|j| q[j * d_k..(j + 1) * d_k].as_chunks::<LANES>());
    // Scores: each key row once for the G heads.
    for t in 0..len {
        let (k, k_tail) = keys[t * stride + offset..t * stride + offset + d_k].as_chunks::<LANES>();
        for (j, (q, q_tail)) in q.iter().enumerate() {
            let mut acc = [0f32; LANES];
            for (a, b) in q.iter().zip(k) {
                for l in 0..LANES {
                    acc[l] += a[l] * b[l];
                }
            }
            let tail: f32 = q_tail.iter().zip(k_tail).map(|(a, b)| a * b).sum();
            p[j * len + t] = (acc.iter().sum::<f32>() + tail) * scale;
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
    while c + 8 * LANES <= d_k {
        weigh_values::<G, { 8 * LANES }>(head, p, c, out);
        c += 8 * LANES;
    }
    while c + 2 * LANES <= d_k {
        weigh_values::<G, { 2 * LANES }>(head, p, c, out);
        c += 2 * LANES;
    }
    for c in c..d_k {
        for j in 0..G {
            let mut sum = 0.0f32;
            for t in 0..len {
                sum += p[j * len + t] * values[t * stride + offset + c];
            }
            out[j * d_k + c] = sum;
        }
    }
}

/// Columns `first..first + W` of the `G` heads' outputs: `Σ_t p_jt · v_t`, positions in order
/// from zero, the sums kept in local accumulators over all positions.
#[inline(always)]
fn weigh_values<const G: usize, const W: usize>(
    head: CachedHead<'_>,
    p: &[f32],
    first: usize,
    out: &mut [f32],
) {
    let (len, d_k) = (head.len, head.d_k);
    let mut acc = [[0f32; W]; G];
    for t in 0..len {
        let at = t * head.stride + head.offset + first;
        let v: &[f32; W] = head.values[at..at + W].try_into().unwrap();
        for (j, acc) in acc.iter_mut().enumerate() {
            let w = p[j * len + t];
            for l in 0..W {
                acc[l] += w * v[l];
            }
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        out[j * d_k + first..j * d_k + first + W].copy_from_slice(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The formula in f64, one head at a time.
    fn reference(queries: &[f32], head: CachedHead<'_>, scale: f32) -> (Vec<f64>, Vec<f64>) {
        let d_k = head.d_k;
        let (mut probs, mut outs) = (Vec::new(), Vec::new());
        for q in queries.chunks_exact(d_k) {
            let row = |data: &[f32], t: usize| {
                data[t * head.stride + head.offset..][..d_k]
                    .iter()
                    .map(|&v| v as f64)
                    .collect::<Vec<_>>()
            };
            let s: Vec<f64> = (0..head.len)
                .map(|t| {
                    let k = row(head.keys, t);
                    q.iter().zip(&k).map(|(&a, b)| a as f64 * b).sum::<f64>() * scale as f64
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
            let total: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|v| v / total).collect();
            for c in 0..d_k {
                outs.push(
                    (0..head.len)
                        .map(|t| p[t] * row(head.values, t)[c])
                        .sum::<f64>(),
                );
            }
            probs.extend(p);
        }
        (probs, outs)
    }

    /// Every group size a tile split meets (1–9 heads), widths with and without a tail of
    /// columns (88: one block of 64, one of 16 and a tail of 8), one and many positions, a
    /// head inside a wider row: within 1e-5 of the f64 formula (f32 sums of at most 88
    /// products of values below 1 in magnitude, then
    /// probabilities below 1), and [`cached_probabilities`] equal to the probabilities
    /// [`attend_cached`] used, bit for bit.
    #[test]
    fn attend_cached_matches_the_formula() {
        for (group, d_k, len, heads, head) in [
            (1, 8, 1, 1, 0),
            (3, 64, 37, 3, 1),
            (4, 16, 5, 2, 1),
            (5, 12, 9, 1, 0),
            (9, 64, 70, 2, 0),
            (2, 3, 4, 4, 3),
            (2, 88, 7, 2, 1),
        ] {
            let stride = heads * d_k;
            let keys = values(len * stride, 1);
            let vals = values(len * stride, 2);
            let queries = values(group * d_k, 3);
            let cache = CachedHead {
                keys: &keys,
                values: &vals,
                stride,
                offset: head * d_k,
                d_k,
                len,
            };
            let scale = 1.0 / (d_k as f32).sqrt();
            let (mut scores, mut out) = (Vec::new(), vec![f32::NAN; group * d_k]);
            attend_cached(&queries, cache, scale, &mut scores, &mut out);
            let (probs, outs) = reference(&queries, cache, scale);
            let case = format!("group {group}, d_k {d_k}, len {len}");
            for (got, want) in scores.iter().zip(&probs).chain(out.iter().zip(&outs)) {
                assert!((*got as f64 - want).abs() < 1e-5, "{case}: {got} vs {want}");
            }
            let mut alone = Vec::new();
            cached_probabilities(&queries, cache, scale, &mut alone);
            assert_eq!(alone, scores, "{case}");
        }
    }

    /// The AVX-512 and AVX2 paths equal the portable one bit for bit (where the CPU has them).
    #[test]
    fn attend_cached_is_the_same_on_every_path() {
        let (group, d_k, len, stride) = (3, 64, 50, 192);
        let keys = values(len * stride, 4);
        let vals = values(len * stride, 5);
        let queries = values(group * d_k, 6);
        let cache = CachedHead {
            keys: &keys,
            values: &vals,
            stride,
            offset: 64,
            d_k,
            len,
        };
        let (mut s1, mut s2) = (Vec::new(), Vec::new());
        let (mut o1, mut o2) = (vec![0.0; group * d_k], vec![0.0; group * d_k]);
        attend_cached(&queries, cache, 0.125, &mut s1, &mut o1);
        attend_portable(&queries, cache, 0.125, &mut s2, Some(&mut o2));
        assert_eq!(s1, s2);
        assert_eq!(o1, o2);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("attend_cached: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let (mut s3, mut o3) = (Vec::new(), vec![0.0; group * d_k]);
            attend_on(level, &queries, cache, 0.125, &mut s3, Some(&mut o3));
            assert_eq!(s3, s2, "{level:?}");
            assert_eq!(o3, o2, "{level:?}");
        }
    }

    /// A cache shorter than the head claims is refused before anything is read.
    #[test]
    #[should_panic(expected = "positions need")]
    fn attend_cached_checks_the_cache() {
        let keys = vec![0.0; 10];
        let cache = CachedHead {
            keys: &keys,
            values: &keys,
            stride: 4,
            offset: 0,
            d_k: 4,
            len: 3,
        };
        attend_cached(&[0.0; 4], cache, 1.0, &mut Vec::new(), &mut [0.0; 4]);
    }
}
