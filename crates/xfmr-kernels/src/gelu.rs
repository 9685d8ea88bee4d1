//! Exact GELU over a slice, vectorised ([`gelu_in_place`]): burn computes it with one scalar
//! libm `erff` call per element.

use crate::cpu::FloatLevel;
use crate::exp::exp_nonpositive;

/// `x ← ½ x (1 + erf(x / √2))` over `values`, with Abramowitz and Stegun's 7.1.26 for `erf`
/// (absolute error ≤ 1.5e-7, the formula of PyTorch's own vectorised CPU `erf`).
///
/// Branch-free, compiled for AVX-512 or AVX2 when the CPU has them (the [`FloatLevel`] probed
/// at run time) from the same portable code: the same operations in the same order on every
/// level, so the result does not depend on the CPU. The portable copy alone ran on 128-bit
/// registers (the baseline x86-64 target), a tenth of MiniLM's embedding time on Zen 5
/// (docs/benchmarks-log.md).
pub fn gelu_in_place(values: &mut [f32]) {
    gelu_on(FloatLevel::detect(), values);
}

/// [`gelu_in_place`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn gelu_on(level: FloatLevel, values: &mut [f32]) {
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { gelu_avx512(values) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { gelu_avx2(values) },
        _ => gelu_portable(values),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gelu_avx512(values: &mut [f32]) {
    gelu_portable(values);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gelu_avx2(values: &mut [f32]) {
    gelu_portable(values);
}

#[inline(always)]
fn gelu_portable(values: &mut [f32]) {
    for v in values {
        *v = gelu_scalar(*v);
    }
}

/// `½ x (1 + erf(x / √2))`, branch-free so that it vectorises.
#[inline(always)]
fn gelu_scalar(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
    let erf_abs = 1.0 - poly * exp_nonpositive(-a * a);
    let erf = erf_abs.copysign(z);
    0.5 * x * (1.0 + erf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What needs no reference (the values against libm's `erf` are `flex::gelu`'s test):
    /// `GELU(x) − GELU(−x) = x` (the kernel's `erf` is odd by construction), within rounding,
    /// every 1e-3 over [-8, 8]; exact values at 0, ±20 and +∞.
    #[test]
    fn gelu_in_place_has_gelus_identities() {
        let xs: Vec<f32> = (-8_000..=8_000).map(|i| i as f32 * 1e-3).collect();
        let mut got = xs.clone();
        gelu_in_place(&mut got);
        let mut neg: Vec<f32> = xs.iter().map(|x| -x).collect();
        gelu_in_place(&mut neg);
        for ((x, g), n) in xs.iter().zip(&got).zip(&neg) {
            assert!(
                (g - n - x).abs() <= 2e-6 * (1.0 + x.abs()),
                "gelu({x}) − gelu(−{x}) = {}",
                g - n
            );
        }
        let mut ends = [0.0f32, 20.0, -20.0, f32::INFINITY];
        gelu_in_place(&mut ends);
        assert_eq!(ends, [0.0, 20.0, -0.0, f32::INFINITY]);
    }

    /// Every level this CPU has (AVX-512F, AVX2) gives the portable loop's values bit for bit,
    /// on a slice with a tail past the last 16 lanes, infinities, zeros and subnormals.
    #[test]
    fn gelu_is_the_same_on_every_path() {
        let mut xs: Vec<f32> = (0..1_003)
            .map(|i| ((i * 37 % 1_009) as f32 - 504.0) * 0.0213)
            .collect();
        xs.extend([0.0, -0.0, f32::INFINITY, 1e-40, -1e-40, 9.5, -9.5]);
        let mut portable = xs.clone();
        gelu_on(FloatLevel::Portable, &mut portable);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("gelu: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let mut got = xs.clone();
            gelu_on(level, &mut got);
            assert!(
                got.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }
}
