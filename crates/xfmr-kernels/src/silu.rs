//! SwiGLU's gate on the host, vectorised: `silu(g)·u` over rows ([`silu_mul`]), where a libm
//! `expf` call per element was a serial few percent of every decoding step.

use crate::cpu::FloatLevel;
use crate::exp::exp_nonpositive;

/// `out_i = silu(gate_i)·up_i`, `silu(g) = g / (1 + e^(−g))`: the gated linear unit of
/// Llama-family feed-forward layers (Shazeer, 2020).
///
/// Evaluated as `g·s / (1 + e)` with `e = exp(−|g|)` from [`exp_nonpositive`] (within 1 ulp)
/// and `s = 1` for `g ≥ 0`, `s = e` below (the same function: `e^g / (1 + e^g)` for negative
/// `g`), so no argument of `exp` is positive and nothing overflows; branch-free, so that it
/// vectorises. Within 4 ulp of the exact value, relatively (the test checks it over
/// `[-100, 100]`); `g < −87` gives `−0` or `0` (the exact value is below `1e-35`).
///
/// Compiled for AVX-512 or AVX2 when the CPU has them (the [`FloatLevel`] probed at run time)
/// from the same portable code, so the result does not depend on the CPU.
///
/// # Panics
/// Unless the three slices have the same length.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_on(FloatLevel::detect(), gate, up, out);
}

/// [`silu_mul`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn silu_mul_on(level: FloatLevel, gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "silu_mul: gate {}, up {} and out {} differ in length",
        gate.len(),
        up.len(),
        out.len()
    );
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { silu_mul_avx512(gate, up, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { silu_mul_avx2(gate, up, out) },
        _ => silu_mul_portable(gate, up, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn silu_mul_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_portable(gate, up, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_portable(gate, up, out);
}

#[inline(always)]
fn silu_mul_portable(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let e = exp_nonpositive(-g.abs());
        let s = if g >= 0.0 { 1.0 } else { e };
        *o = g * s / (1.0 + e) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the formula in f64 over `[-100, 100]` (a step of 1e-3, `up` 1 and 0.5): within
    /// 4 ulp relatively, or 1e-35 absolutely far below zero.
    #[test]
    fn silu_mul_matches_the_formula() {
        let gate: Vec<f32> = (-100_000..=100_000).map(|i| i as f32 * 1e-3).collect();
        for up in [1.0f32, 0.5] {
            let ups = vec![up; gate.len()];
            let mut out = vec![f32::NAN; gate.len()];
            silu_mul(&gate, &ups, &mut out);
            for (&g, &got) in gate.iter().zip(&out) {
                let want = g as f64 / (1.0 + (-(g as f64)).exp()) * up as f64;
                let err = (got as f64 - want).abs();
                assert!(
                    err <= 4.0 * f32::EPSILON as f64 * want.abs() || err < 1e-35,
                    "silu({g})·{up} = {got}, want {want}"
                );
            }
        }
        let mut out = [1.0f32; 2];
        silu_mul(&[0.0, -1e4], &[1.0; 2], &mut out);
        assert_eq!(out, [0.0, 0.0]);
    }

    /// Every level this CPU has (AVX-512F, AVX2) gives the portable loop's values bit for bit,
    /// on slices with a tail past the last 16 lanes, both signs, zeros and large arguments.
    #[test]
    fn silu_mul_is_the_same_on_every_path() {
        let gate: Vec<f32> = (0..1_003)
            .map(|i| ((i * 37 % 1_009) as f32 - 504.0) * 0.21)
            .chain([0.0, -0.0, 1e4, -1e4, 88.5, -88.5])
            .collect();
        let up: Vec<f32> = (0..gate.len())
            .map(|i| 1.0 - (i % 11) as f32 * 0.17)
            .collect();
        let mut portable = vec![f32::NAN; gate.len()];
        silu_mul_on(FloatLevel::Portable, &gate, &up, &mut portable);
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("silu_mul: this CPU has no {level:?}, its path is not compared");
                continue;
            }
            let mut got = vec![f32::NAN; gate.len()];
            silu_mul_on(level, &gate, &up, &mut got);
            assert!(
                got.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }
}
