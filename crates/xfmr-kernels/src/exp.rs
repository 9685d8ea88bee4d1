//! A vectorised `exp` for the rows of a softmax: [`exp_shifted`] (`x ← exp(x - max)` and the
//! row's sum) over [`exp_nonpositive`].

use crate::cpu::FloatLevel;

/// Lanes of the vectorised loops (an AVX-512 register of f32).
pub(crate) const LANES: usize = 16;

/// `x ← exp(x - max)` over `row`, returning the sum. `max` is the row's (finite) maximum, so every
/// argument is `≤ 0`; arguments below `-87` (and `-∞`, ignored keys) give exactly 0.
///
/// `exp(t) = 2ⁿ · p(r)` with `n = round(t / ln 2)`, `r = t - n ln 2` (in two parts, Cody and
/// Waite) and `p` Cephes' polynomial for `expf` on `|r| ≤ ln 2 / 2`: within 1 ulp of the
/// correctly rounded value (measured over every f32 in `[-87, 0]`: at most 0.99 ulp, a
/// relative error of at most 0.70·2⁻²³; the test checks 1 ulp on a grid). Written without
/// branches over lanes of 16 and compiled for AVX-512 or AVX2 when the CPU has them (the
/// [`FloatLevel`] probed at run time; the same operations in the same order on every level, so
/// the result does not depend on the CPU), because a scalar libm `expf` per score is slow
/// (docs/benchmarks.md).
pub fn exp_shifted(row: &mut [f32], max: f32) -> f32 {
    exp_shifted_on(FloatLevel::detect(), row, max)
}

/// [`exp_shifted`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn exp_shifted_on(level: FloatLevel, row: &mut [f32], max: f32) -> f32 {
    debug_assert!(
        row.iter().all(|&x| x <= max || x.is_nan()),
        "exp_shifted: {max} is not the row's maximum"
    );
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { exp_shifted_avx512(row, max) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { exp_shifted_avx2(row, max) },
        _ => exp_shifted_portable(row, max),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_shifted_avx512(row: &mut [f32], max: f32) -> f32 {
    exp_shifted_portable(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_shifted_avx2(row: &mut [f32], max: f32) -> f32 {
    exp_shifted_portable(row, max)
}

/// [`exp_shifted`]'s loop, inlined into its callers' copies per level (here and in the loss's
/// row kernel, compiled whole per level).
#[inline(always)]
pub(crate) fn exp_shifted_portable(row: &mut [f32], max: f32) -> f32 {
    let mut sums = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (x, sum) in chunk.iter_mut().zip(sums.iter_mut()) {
            *x = exp_nonpositive(*x - max);
            *sum += *x;
        }
    }
    for (x, sum) in chunks.into_remainder().iter_mut().zip(sums.iter_mut()) {
        *x = exp_nonpositive(*x - max);
        *sum += *x;
    }
    sums.iter().sum()
}

/// `x ← exp(min(x − lse, 0))` over `row`: a softmax's probabilities recomputed from its scores
/// and saved log-sum-exp (the attention's backward pass), in the same SIMD copies as
/// [`exp_shifted`] (elementwise, so every level gives the same bits).
#[cfg_attr(not(feature = "flex"), allow(dead_code))] // flex's attention backward alone
pub(crate) fn exp_from_lse(row: &mut [f32], lse: f32) {
    exp_from_lse_on(FloatLevel::detect(), row, lse);
}

/// [`exp_from_lse`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn exp_from_lse_on(level: FloatLevel, row: &mut [f32], lse: f32) {
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { exp_from_lse_avx512(row, lse) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { exp_from_lse_avx2(row, lse) },
        _ => exp_from_lse_portable(row, lse),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_from_lse_avx512(row: &mut [f32], lse: f32) {
    exp_from_lse_portable(row, lse);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_from_lse_avx2(row: &mut [f32], lse: f32) {
    exp_from_lse_portable(row, lse);
}

#[inline(always)]
fn exp_from_lse_portable(row: &mut [f32], lse: f32) {
    row.iter_mut()
        .for_each(|s| *s = exp_nonpositive((*s - lse).min(0.0)));
}

/// `exp(t)` for `t ≤ 0` (see [`exp_shifted`]); 0 below -87, where `2ⁿ` would be subnormal.
/// Integer and bit operations only, so that it vectorises (no saturating casts, no branches).
/// Within 1 ulp of the correctly rounded `exp(t)` (see [`exp_shifted`]).
#[inline(always)]
pub fn exp_nonpositive(t: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to the nearest integer (|t·log₂e| < 2²²), which then sits in the
    // low mantissa bits: ROUND's bits are 0x4B40_0000.
    const ROUND: f32 = 12_582_912.0;
    let clamped = if t > -87.0 { t } else { -87.0 };
    let shifted = clamped * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes' 5.0000001201e-1, which rounds to 0.5 in f32
    let e = p * r * r + r + 1.0;
    // 2ⁿ from the exponent bits: n is in [-126, 0] here.
    let n_bits = shifted.to_bits().wrapping_sub(0x4B40_0000);
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    // All ones where t ≥ -87, zero below (and for -∞): the result or exactly 0.
    let keep = 0u32.wrapping_sub((t >= -87.0) as u32);
    f32::from_bits((e * two_n).to_bits() & keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of one unit in the last place of the f32 nearest to `x`.
    fn ulp(x: f64) -> f64 {
        let w = x as f32;
        (f32::from_bits(w.to_bits() + 1) - w) as f64
    }

    /// The vectorised exponential against std's f64 `exp` over its whole domain (a step of 1e-3
    /// from -90 to 0): within 1 ulp of the correctly rounded value, as documented; exact 0
    /// below -87.
    #[test]
    fn exp_shifted_matches_std_exp() {
        let xs: Vec<f32> = (0..=90_000).map(|i| -(i as f32) * 1e-3).collect();
        let mut row = xs.clone();
        let sum = exp_shifted(&mut row, 0.0);
        let mut expected_sum = 0.0f64;
        for (x, got) in xs.iter().zip(&row) {
            if *x < -87.0 {
                assert_eq!(*got, 0.0, "exp({x})");
                continue;
            }
            let want = (*x as f64).exp();
            expected_sum += want;
            let ulps = (*got as f64 - want).abs() / ulp(want);
            assert!(ulps <= 1.0, "exp({x}) = {got}, want {want}: {ulps} ulp");
        }
        assert!(((sum as f64 - expected_sum) / expected_sum).abs() < 1e-5);
        let mut ignored = [f32::NEG_INFINITY, 0.0];
        assert_eq!(exp_shifted(&mut ignored, 0.0), 1.0);
        assert_eq!(ignored, [0.0, 1.0]);
    }

    /// Every level this CPU has (AVX-512F, AVX2) gives the portable loop's values and sum, bit
    /// for bit, on a row with a tail past the last 16 lanes, ignored keys and arguments below
    /// -87.
    #[test]
    fn exp_shifted_is_the_same_on_every_path() {
        let row: Vec<f32> = (0..1_000)
            .map(|i| match i % 97 {
                0 => f32::NEG_INFINITY,
                1 => -90.0,
                _ => -((i * 37 % 1_001) as f32) * 0.0871,
            })
            .collect();
        let mut portable = row.clone();
        let sum = exp_shifted_on(FloatLevel::Portable, &mut portable, 0.0);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("exp_shifted: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let mut got = row.clone();
            assert_eq!(
                exp_shifted_on(level, &mut got, 0.0).to_bits(),
                sum.to_bits(),
                "{level:?}"
            );
            assert!(
                got.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }

    /// [`exp_from_lse`] on every level this CPU has gives the portable loop's values bit for
    /// bit (scores above the log-sum-exp by rounding, far below it, ignored keys, a tail).
    #[test]
    fn exp_from_lse_is_the_same_on_every_path() {
        let row: Vec<f32> = (0..1_003)
            .map(|i| match i % 89 {
                0 => f32::NEG_INFINITY,
                1 => 3.5 + 1e-6,
                2 => -200.0,
                _ => 3.5 - ((i * 41 % 1_009) as f32) * 0.0917,
            })
            .collect();
        let mut portable = row.clone();
        exp_from_lse_on(FloatLevel::Portable, &mut portable, 3.5);
        assert_eq!(
            portable[1], 1.0,
            "a score above the log-sum-exp by rounding gives 1"
        );
        assert_eq!(portable[0], 0.0);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("exp_from_lse: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let mut got = row.clone();
            exp_from_lse_on(level, &mut got, 3.5);
            assert!(
                got.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }
}
