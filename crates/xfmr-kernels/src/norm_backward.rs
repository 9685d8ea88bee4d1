//! The backward pass of LayerNorm and RMSNorm over rows ([`norm_rows_backward`]), the
//! gradients of [`norm_rows`](crate::norm_rows) for training: one pass per row where burn's
//! autodiff runs the backward of each of its nine operations over the whole tensor.

use crate::cpu::FloatLevel;
use crate::exp::LANES;
use crate::norm::row_stats;

/// The backward pass of [`norm_rows`](crate::norm_rows): given the rows `x` it normalised and
/// the gradient `grad` of a loss with respect to its output, writes the gradient with respect
/// to `x` over `grad` and adds the gradients with respect to γ and β into `dgamma` and
/// `dbeta`.
///
/// With `x̂ = (x − μ) · r` (`r = 1/√(σ² + ε)`; for RMSNorm, `rms`, `μ = 0` and
/// `r = 1/√(mean(x²) + ε)`), `y = x̂ γ + β`, `n` the width and `h = g γ`, each row gives
///
/// ```text
/// ∂ℓ/∂x = r · (h − mean(h) − x̂ · mean(h x̂))        (RMSNorm: without mean(h))
/// ∂ℓ/∂γ += g x̂,   ∂ℓ/∂β += g
/// ```
///
/// `μ` and `r` are recomputed from `x` as the forward pass computed them (two passes over the
/// row while it sits in L1, instead of a state per row); one more pass takes both means and the
/// parameters' gradients, and one writes `∂ℓ/∂x`. The means sum over 16 lanes as the forward's
/// do, and `dgamma`, `dbeta` accumulate row after row, so the result does not depend on the
/// CPU. For RMSNorm `dbeta` receives `Σ g` all the same (the caller drops it).
///
/// # Panics
/// Unless `x` and `grad` are rows of `gamma.len()` of the same count and `dgamma`, `dbeta` are
/// as long as `gamma`; for zero columns with rows.
pub fn norm_rows_backward(
    x: &[f32],
    grad: &mut [f32],
    gamma: &[f32],
    rms: bool,
    eps: f32,
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    norm_backward_on(
        FloatLevel::detect(),
        x,
        grad,
        gamma,
        rms,
        eps,
        [dgamma, dbeta],
    );
}

/// [`norm_rows_backward`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn norm_backward_on(
    level: FloatLevel,
    x: &[f32],
    grad: &mut [f32],
    gamma: &[f32],
    rms: bool,
    eps: f32,
    params: [&mut [f32]; 2],
) {
    let width = gamma.len();
    assert!(
        (width > 0 || x.is_empty()) && x.len().is_multiple_of(width.max(1)),
        "norm_rows_backward: {} values are not rows of {width}",
        x.len()
    );
    assert_eq!(
        x.len(),
        grad.len(),
        "norm_rows_backward: x and its gradient differ"
    );
    assert!(
        params.iter().all(|p| p.len() == width),
        "norm_rows_backward: the parameters' gradients are not as long as γ"
    );
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { norm_backward_avx512(x, grad, gamma, rms, eps, params) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { norm_backward_avx2(x, grad, gamma, rms, eps, params) },
        _ => norm_backward_portable(x, grad, gamma, rms, eps, params),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn norm_backward_avx512(
    x: &[f32],
    grad: &mut [f32],
    gamma: &[f32],
    rms: bool,
    eps: f32,
    params: [&mut [f32]; 2],
) {
    norm_backward_portable(x, grad, gamma, rms, eps, params);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn norm_backward_avx2(
    x: &[f32],
    grad: &mut [f32],
    gamma: &[f32],
    rms: bool,
    eps: f32,
    params: [&mut [f32]; 2],
) {
    norm_backward_portable(x, grad, gamma, rms, eps, params);
}

#[inline(always)]
fn norm_backward_portable(
    x: &[f32],
    grad: &mut [f32],
    gamma: &[f32],
    rms: bool,
    eps: f32,
    [dgamma, dbeta]: [&mut [f32]; 2],
) {
    let width = gamma.len();
    if width == 0 {
        return;
    }
    let n = width as f32;
    let full = width - width % LANES;
    for (row, g) in x.chunks_exact(width).zip(grad.chunks_exact_mut(width)) {
        let (mean, inv) = row_stats(row, rms, eps);
        // Σ h and Σ h x̂ in 16 lanes (the tail into the first lanes, as `lane_sum`), and the
        // parameters' gradients, in one pass of fixed-width chunks (no bounds checks inside, so
        // the compiler keeps each chunk in vector registers).
        let (mut sum_h, mut sum_hx) = ([0.0f32; LANES], [0.0f32; LANES]);
        let (head, tail) = (full, width - full);
        let chunks = row[..head]
            .chunks_exact(LANES)
            .zip(g[..head].chunks_exact(LANES))
            .zip(gamma[..head].chunks_exact(LANES))
            .zip(dgamma[..head].chunks_exact_mut(LANES))
            .zip(dbeta[..head].chunks_exact_mut(LANES));
        for ((((x, g), gm), dg), db) in chunks {
            accumulate(x, g, gm, [dg, db], (&mut sum_h, &mut sum_hx), (mean, inv));
        }
        if tail > 0 {
            accumulate(
                &row[head..],
                &g[head..],
                &gamma[head..],
                [&mut dgamma[head..], &mut dbeta[head..]],
                (&mut sum_h, &mut sum_hx),
                (mean, inv),
            );
        }
        let mean_h = if rms {
            0.0
        } else {
            sum_h.iter().sum::<f32>() / n
        };
        let mean_hx = sum_hx.iter().sum::<f32>() / n;
        for ((g, &x), &gm) in g.iter_mut().zip(row).zip(gamma) {
            let xhat = (x - mean) * inv;
            *g = inv * (*g * gm - mean_h - xhat * mean_hx);
        }
    }
}

/// One chunk of at most `LANES` values of the backward's accumulating pass: lane `i` of the
/// sums takes the chunk's value `i`, and the parameters' gradients take `g x̂` and `g`.
#[inline(always)]
fn accumulate(
    x: &[f32],
    g: &[f32],
    gamma: &[f32],
    [dgamma, dbeta]: [&mut [f32]; 2],
    (sum_h, sum_hx): (&mut [f32; LANES], &mut [f32; LANES]),
    (mean, inv): (f32, f32),
) {
    for (((((&x, &g), &gm), dg), db), (sh, shx)) in x
        .iter()
        .zip(g)
        .zip(gamma)
        .zip(dgamma.iter_mut())
        .zip(dbeta.iter_mut())
        .zip(sum_h.iter_mut().zip(sum_hx.iter_mut()))
    {
        let xhat = (x - mean) * inv;
        let h = g * gm;
        *sh += h;
        *shx += h * xhat;
        *dg += g * xhat;
        *db += g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::norm::tests::case;

    /// `Σ w · y` in f64 for LayerNorm (`rms` false, with β) or RMSNorm, the formula of
    /// [`norm_rows`] with sequential sums.
    fn weighted_output(x: &[f64], gamma: &[f64], beta: &[f64], w: &[f64], rms: bool) -> f64 {
        let width = gamma.len();
        let n = width as f64;
        let mut total = 0.0;
        for (row, w) in x.chunks(width).zip(w.chunks(width)) {
            let mean = if rms {
                0.0
            } else {
                row.iter().sum::<f64>() / n
            };
            let ms = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            for j in 0..width {
                let shift = if rms { 0.0 } else { beta[j] };
                total += w[j] * ((row[j] - mean) * inv * gamma[j] + shift);
            }
        }
        total
    }

    /// The gradients of [`norm_rows_backward`] (with respect to `x`, γ and β, for an incoming
    /// gradient `w` that is not uniform) against central finite differences of the f64 formula
    /// (`h` = 1e-4: the truncation, ~h² times the third derivative, is near 1e-8): within 2e-5
    /// absolute plus 2e-5 relative, the f32 kernel's rounding on gradients of magnitude ≤ ~10
    /// (rows of 48 and 37 columns, three of them; γ's and β's gradients sum over the rows).
    #[test]
    fn norm_rows_backward_matches_finite_differences_in_f64() {
        for (width, rms) in [(48, false), (37, false), (48, true), (37, true)] {
            let (x, gamma, beta) = case(3, width);
            let w: Vec<f32> = (0..x.len())
                .map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.125)
                .collect();
            let mut dx = w.clone();
            let (mut dgamma, mut dbeta) = (vec![0.0f32; width], vec![0.0f32; width]);
            norm_rows_backward(&x, &mut dx, &gamma, rms, 1e-5, &mut dgamma, &mut dbeta);
            let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
            let (x64, g64, b64, w64) = (wide(&x), wide(&gamma), wide(&beta), wide(&w));
            let h = 1e-4;
            // The derivative of the formula with respect to element `i` of argument `which`
            // (0: x, 1: γ, 2: β).
            let derivative = |which: usize, i: usize| {
                let mut args = [x64.clone(), g64.clone(), b64.clone()];
                args[which][i] += h;
                let up = weighted_output(&args[0], &args[1], &args[2], &w64, rms);
                args[which][i] -= 2.0 * h;
                let down = weighted_output(&args[0], &args[1], &args[2], &w64, rms);
                (up - down) / (2.0 * h)
            };
            let check = |what: &str, got: &[f32], which: usize| {
                for (i, &got) in got.iter().enumerate() {
                    let want = derivative(which, i);
                    assert!(
                        (got as f64 - want).abs() <= 2e-5 + 2e-5 * want.abs(),
                        "rms {rms}, width {width}: ∂/∂{what}[{i}] = {got}, finite differences {want}"
                    );
                }
            };
            check("x", &dx, 0);
            check("γ", &dgamma, 1);
            if !rms {
                check("β", &dbeta, 2);
            }
        }
    }

    /// Every level this CPU has gives the portable loop's gradients bit for bit, both norms,
    /// widths with and without a tail, into parameter gradients that already hold values.
    #[test]
    fn norm_rows_backward_is_the_same_on_every_path() {
        for width in [384, 37, 5] {
            let (x, gamma, _) = case(4, width);
            let w: Vec<f32> = (0..x.len()).map(|i| (i % 11) as f32 * 0.3 - 1.4).collect();
            for rms in [false, true] {
                let run = |level: FloatLevel| {
                    let mut dx = w.clone();
                    let mut dgamma = vec![0.5f32; width];
                    let mut dbeta = vec![-0.25f32; width];
                    let params = [dgamma.as_mut_slice(), dbeta.as_mut_slice()];
                    norm_backward_on(level, &x, &mut dx, &gamma, rms, 1e-12, params);
                    [dx, dgamma, dbeta]
                };
                let portable = run(FloatLevel::Portable);
                for level in FloatLevel::ALL {
                    if !level.available() {
                        eprintln!(
                            "norm_rows_backward: this CPU has no {level:?}, its path is not compared"
                        );
                        continue;
                    }
                    for (got, want) in run(level).iter().zip(&portable) {
                        assert!(
                            got.iter()
                                .zip(want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{level:?} rms {rms} width {width}"
                        );
                    }
                }
            }
        }
    }
}
