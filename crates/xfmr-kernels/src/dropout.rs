//! Dropout masks for training on the CPU: [`dropout_mask`].
//!
//! burn's `Dropout` draws a Bernoulli tensor through `TensorData::random`, one element at a time
//! from a ChaCha generator behind a distribution sampler, then multiplies twice (by the mask,
//! then by `1/keep`): 8% of a CPU training step (docs/benchmarks.md). Here each element is a
//! hash of its index under a per-chunk key (a counter-based generator, as Philox is for
//! cuRAND and PyTorch's CUDA dropout), the chunks fill in parallel, and the mask already holds
//! `1/keep`, so dropout is one product.

use rayon::prelude::*;

use crate::cpu::FloatLevel;

/// Elements per chunk: one key and one rayon task each.
const CHUNK: usize = 1 << 14;

/// A dropout mask of `len` elements: each is `1/keep` with probability `keep` and 0 otherwise,
/// independently (to the quality of the hash below), as a function of `seed` alone: the same
/// seed gives the same mask on any number of threads.
///
/// Element `i` of chunk `c` (chunks of 16,384) is kept when the top 24 bits of
/// `lowbias32(lowbias32(i ⊕ lo_c) ⊕ hi_c)` are below `round(keep · 2²⁴)`, where `lo_c`, `hi_c`
/// are the low and high halves of the chunk's 64-bit key (the SplitMix64 finaliser of
/// `seed ⊕ c·φ`, φ = 0x9E37_79B9_7F4A_7C15) and `lowbias32` is Chris Wellons' 32-bit integer
/// hash (a bijection with low bias; its multiplies vectorise). Both halves enter: with the low
/// half alone, two chunks whose keys agree in their top 18 bits would draw permutations of one
/// mask.
///
/// # Panics
/// If `keep` is not in `(0, 1]`.
pub fn dropout_mask(len: usize, keep: f32, seed: u64) -> Vec<f32> {
    dropout_mask_on(FloatLevel::detect(), len, keep, seed)
}

/// [`dropout_mask`] on `level`, which must be available (asserted in all builds). The hash is
/// integer arithmetic, so every level gives the same mask bit for bit; the AVX-512 copy hashes
/// 16 indices per instruction where the baseline x86-64 build (SSE2, no 32-bit vector
/// multiply) hashed one.
fn dropout_mask_on(level: FloatLevel, len: usize, keep: f32, seed: u64) -> Vec<f32> {
    assert!(
        keep > 0.0 && keep <= 1.0,
        "dropout_mask: the keep probability {keep} is outside (0, 1]"
    );
    level.assert_available();
    let scale = 1.0 / keep;
    let threshold = (f64::from(keep) * 16_777_216.0).round() as u32;
    let mut mask = vec![0.0f32; len];
    mask.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(c, chunk)| {
            // The first value of the SplitMix64 stream from this state.
            let key =
                crate::splitmix64(&mut (seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            fill_on(level, chunk, key, threshold, scale);
        });
    mask
}

/// One chunk of the mask on `level`, which must be available (asserted: a cached probe, once
/// per 16,384 elements).
#[allow(unsafe_code)]
fn fill_on(level: FloatLevel, chunk: &mut [f32], key: u64, threshold: u32, scale: f32) {
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { fill_avx512(chunk, key, threshold, scale) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { fill_avx2(chunk, key, threshold, scale) },
        _ => fill_portable(chunk, key, threshold, scale),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fill_avx512(chunk: &mut [f32], key: u64, threshold: u32, scale: f32) {
    fill_portable(chunk, key, threshold, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn fill_avx2(chunk: &mut [f32], key: u64, threshold: u32, scale: f32) {
    fill_portable(chunk, key, threshold, scale);
}

#[inline(always)]
fn fill_portable(chunk: &mut [f32], key: u64, threshold: u32, scale: f32) {
    let (lo, hi) = (key as u32, (key >> 32) as u32);
    for (i, m) in chunk.iter_mut().enumerate() {
        let kept = lowbias32(lowbias32(i as u32 ^ lo) ^ hi) >> 8 < threshold;
        *m = if kept { scale } else { 0.0 };
    }
}

/// Chris Wellons' `lowbias32` integer hash (hash-prospector).
#[inline(always)]
fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^ (x >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values are 0 or `1/keep`; the kept fraction is within 5 standard deviations of `keep`
    /// (binomial); a seed gives one mask whatever the thread count; seeds give different masks;
    /// neighbouring elements are not correlated (the fraction of kept pairs `(i, i+1)` within
    /// 5σ of `keep²`).
    #[test]
    fn dropout_mask_has_the_asked_statistics() {
        let len = 1_000_003;
        for keep in [0.9f32, 0.5, 0.1, 1.0] {
            let mask = dropout_mask(len, keep, 7);
            let kept = mask.iter().filter(|&&m| m != 0.0).count();
            assert!(mask.iter().all(|&m| m == 0.0 || m == 1.0 / keep));
            let p = f64::from(keep);
            let sigma = (len as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (kept as f64 - len as f64 * p).abs() <= 5.0 * sigma + 1.0,
                "keep {keep}: {kept} of {len} kept"
            );
            let pairs = mask
                .windows(2)
                .filter(|w| w[0] != 0.0 && w[1] != 0.0)
                .count() as f64;
            let n = (len - 1) as f64;
            let sigma = (n * p * p * (1.0 - p * p)).sqrt() * 2.0; // pairs overlap: a loose σ
            assert!(
                (pairs - n * p * p).abs() <= 5.0 * sigma + 1.0,
                "keep {keep}: {pairs} kept pairs of {n}"
            );
        }
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| dropout_mask(100_000, 0.9, 3));
        assert_eq!(one, dropout_mask(100_000, 0.9, 3));
        assert_ne!(dropout_mask(100_000, 0.9, 3), dropout_mask(100_000, 0.9, 4));
    }

    /// Every level this CPU has (AVX-512F, AVX2) gives the portable loop's mask bit for bit,
    /// over a length that ends inside a chunk and inside a vector of 16.
    #[test]
    fn dropout_mask_is_the_same_on_every_path() {
        let len = 2 * CHUNK + 1_000 + 7;
        let portable = dropout_mask_on(FloatLevel::Portable, len, 0.9, 11);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("dropout_mask: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let got = dropout_mask_on(level, len, 0.9, 11);
            assert!(
                got.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }
}
