//! Exact GELU over a slice and its derivative, vectorised ([`gelu_in_place`],
//! [`gelu_backward_in_place`]): burn computes GELU with one scalar libm `erff` call per
//! element, and under autodiff composes its gradient from several whole-tensor passes.

use std::mem::MaybeUninit;

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

/// [`gelu_in_place`] from `src` into `dst`, which need not be initialised: **writes every
/// element of `dst`** (a new buffer is then neither zeroed nor a copy of `src` first, two
/// passes over megabytes saved in a training step's forward).
///
/// # Panics
/// If `src` and `dst` differ in length.
// Used by the flex kernels (and this file's tests) only.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
pub(crate) fn gelu_into(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    gelu_into_on(FloatLevel::detect(), src, dst);
}

/// [`gelu_into`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn gelu_into_on(level: FloatLevel, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    assert_eq!(src.len(), dst.len(), "gelu_into: lengths differ");
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { gelu_into_avx512(src, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { gelu_into_avx2(src, dst) },
        _ => gelu_into_portable(src, dst),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gelu_into_avx512(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    gelu_into_portable(src, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gelu_into_avx2(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    gelu_into_portable(src, dst);
}

#[inline(always)]
fn gelu_into_portable(src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(gelu_scalar(x));
    }
}

/// `½ x (1 + erf(x / √2))`, branch-free so that it vectorises.
#[inline(always)]
fn gelu_scalar(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let (erf_abs, _) = erf_abs_and_gauss(z.abs());
    let erf = erf_abs.copysign(z);
    0.5 * x * (1.0 + erf)
}

/// `(erf(a), exp(−a²))` for `a ≥ 0`: Abramowitz and Stegun's 7.1.26, whose Gaussian factor is
/// also GELU's density up to a constant, so the derivative costs no second `exp`.
#[inline(always)]
fn erf_abs_and_gauss(a: f32) -> (f32, f32) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let t = 1.0 / (1.0 + P * a);
    let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
    let gauss = exp_nonpositive(-a * a);
    (1.0 - poly * gauss, gauss)
}

/// `g ← g · GELU′(x)` element by element, with `GELU′(x) = Φ(x) + x φ(x)`: the exact GELU's
/// derivative (`Φ`, `φ` the standard normal's distribution and density), `Φ` through the same
/// `erf` as [`gelu_in_place`] (absolute error ≤ 1.5e-7) and `φ` through the same `exp`. What
/// one operation's backward pass needs: one read of `x`, one read and write of `g`, where
/// burn's autodiff of `x · ½(1 + erf(x/√2))` makes about a dozen whole-tensor passes.
///
/// Compiled for AVX-512 or AVX2 when the CPU has them, like [`gelu_in_place`] (the same
/// result on every level). At `x = ±∞` the derivative is 1 or 0 (not `∞ · 0`).
///
/// # Panics
/// If `x` and `grad` differ in length.
pub fn gelu_backward_in_place(x: &[f32], grad: &mut [f32]) {
    gelu_backward_on(FloatLevel::detect(), x, grad);
}

/// [`gelu_backward_in_place`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn gelu_backward_on(level: FloatLevel, x: &[f32], grad: &mut [f32]) {
    assert_eq!(
        x.len(),
        grad.len(),
        "gelu_backward_in_place: {} inputs, {} gradients",
        x.len(),
        grad.len()
    );
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { gelu_backward_avx512(x, grad) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { gelu_backward_avx2(x, grad) },
        _ => gelu_backward_portable(x, grad),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gelu_backward_avx512(x: &[f32], grad: &mut [f32]) {
    gelu_backward_portable(x, grad);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn gelu_backward_avx2(x: &[f32], grad: &mut [f32]) {
    gelu_backward_portable(x, grad);
}

#[inline(always)]
fn gelu_backward_portable(x: &[f32], grad: &mut [f32]) {
    for (g, &x) in grad.iter_mut().zip(x) {
        *g *= gelu_derivative(x);
    }
}

/// `Φ(x) + x φ(x)`, branch-free so that it vectorises.
#[inline(always)]
fn gelu_derivative(x: f32) -> f32 {
    /// `1 / √(2π)`.
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let (erf_abs, gauss) = erf_abs_and_gauss(z.abs());
    let cdf = 0.5 * (1.0 + erf_abs.copysign(z));
    // φ(x) = exp(−x²/2) / √(2π) = exp(−z²) / √(2π); 0 (a select, not a branch) where it
    // underflows, so that x = ±∞ gives Φ(x) and not ∞ · 0.
    let x_pdf = if gauss == 0.0 {
        0.0
    } else {
        x * gauss * INV_SQRT_2PI
    };
    cdf + x_pdf
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

    /// `gelu_into` writes every element of an uninitialised buffer with `gelu_in_place`'s
    /// values bit for bit, on every level this CPU has (a tail past the last 16 lanes, ±0,
    /// ±∞, subnormals).
    #[test]
    fn gelu_into_equals_gelu_in_place_on_every_path() {
        let mut xs: Vec<f32> = (0..1_003).map(|i| (i as f32 - 501.0) * 0.0173).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-40]);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("gelu_into: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let mut want = xs.clone();
            gelu_on(level, &mut want);
            // Started from a sentinel rather than `uninit()`, so that a missed element would
            // fail the comparison rather than be read uninitialised.
            let mut buffer = vec![MaybeUninit::new(f32::from_bits(0x7fc0_dead)); xs.len()];
            gelu_into_on(level, &xs, &mut buffer);
            let got: Vec<u32> = buffer
                .iter()
                .map(|v| {
                    #[allow(unsafe_code)]
                    // SAFETY: `gelu_into_on` wrote every element of `buffer`.
                    unsafe { v.assume_init_read() }.to_bits()
                })
                .collect();
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{level:?}");
        }
    }

    /// GELU′ in f64: `Φ(x) + x φ(x)` with `erf` from its Maclaurin series (enough terms for
    /// `|x| ≤ 6`, where the series' cancellation costs less than 1e-8).
    fn gelu_derivative_f64(x: f64) -> f64 {
        let z = x / std::f64::consts::SQRT_2;
        let (mut term, mut erf) = (z, 0.0);
        for n in 0..200 {
            erf += term / (2 * n + 1) as f64;
            term *= -z * z / (n + 1) as f64;
        }
        erf *= 2.0 / std::f64::consts::PI.sqrt();
        0.5 * (1.0 + erf) + x * (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt()
    }

    /// The derivative against the f64 formula every 1e-3 over [-6, 6], times a gradient that
    /// is not 1: within 1e-6 absolute (the `erf`'s 1.5e-7 halved, plus f32 rounding); at ±∞,
    /// 1 and 0.
    #[test]
    fn gelu_backward_matches_the_derivative_in_f64() {
        let xs: Vec<f32> = (-6_000..=6_000).map(|i| i as f32 * 1e-3).collect();
        let mut grad: Vec<f32> = xs.iter().map(|x| 1.5 - x.abs() * 0.1).collect();
        let upstream = grad.clone();
        gelu_backward_in_place(&xs, &mut grad);
        for ((x, g), u) in xs.iter().zip(&grad).zip(&upstream) {
            let want = f64::from(*u) * gelu_derivative_f64(f64::from(*x));
            assert!(
                (f64::from(*g) - want).abs() <= 1e-6,
                "GELU′({x}) · {u} = {g}, the f64 formula gives {want}"
            );
        }
        let mut ends = [2.0f32, 2.0];
        gelu_backward_in_place(&[f32::INFINITY, f32::NEG_INFINITY], &mut ends);
        assert_eq!(ends, [2.0, 0.0]);
    }

    /// Every level this CPU has gives the portable loop's values bit for bit, on a slice with
    /// a tail past the last 16 lanes, infinities, zeros and subnormals.
    #[test]
    fn gelu_backward_is_the_same_on_every_path() {
        let mut xs: Vec<f32> = (0..1_003)
            .map(|i| ((i * 37 % 1_009) as f32 - 504.0) * 0.0213)
            .collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            -1e-40,
            9.5,
        ]);
        let grad: Vec<f32> = (0..xs.len()).map(|i| (i % 13) as f32 * 0.3 - 1.7).collect();
        let mut portable = grad.clone();
        gelu_backward_on(FloatLevel::Portable, &xs, &mut portable);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("gelu_backward: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let mut got = grad.clone();
            gelu_backward_on(level, &xs, &mut got);
            assert!(
                got.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }
}
