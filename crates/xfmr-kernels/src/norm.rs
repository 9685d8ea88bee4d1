//! LayerNorm and RMSNorm over the rows of a matrix, one row at a time in place
//! ([`norm_rows`]): burn composes them from nine whole-tensor operations (two means, a
//! subtraction, a square, a square root, a division, the scale and the shift), each a pass
//! over the tensor and a new buffer.

use crate::cpu::FloatLevel;
use crate::exp::LANES;

/// Which normalisation [`norm_rows`] applies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowNorm<'a> {
    /// LayerNorm: `(x − mean) / √(var + ε) · γ + β`, the biased variance (as PyTorch); no shift
    /// where `beta` is `None`.
    Layer {
        /// The shift β, one per column, if any.
        beta: Option<&'a [f32]>,
    },
    /// RMSNorm: `x / √(mean(x²) + ε) · γ`.
    Rms,
}

/// Normalises each row of `rows` (row-major, `gamma.len()` columns) in place:
/// `y = (x − μ) / √(σ² + ε) · γ + β` for [`RowNorm::Layer`], with `μ` and `σ²` the row's mean
/// and biased variance; `y = x / √(mean(x²) + ε) · γ` for [`RowNorm::Rms`].
///
/// Each row is read three times while it sits in L1 (the mean, the variance about it, the
/// output) instead of nine passes over the whole tensor. The sums run over 16 lanes, then
/// across them, in the same order on every [`FloatLevel`] (compiled for AVX-512 or AVX2 when
/// the CPU has them), so the result does not depend on the CPU; it differs from a sequential
/// sum by rounding only.
///
/// # Panics
/// Unless `rows.len()` is a multiple of `gamma.len()` and `beta` (if any) is as long as
/// `gamma`; for zero columns with rows.
pub fn norm_rows(rows: &mut [f32], gamma: &[f32], norm: RowNorm<'_>, eps: f32) {
    norm_on(FloatLevel::detect(), rows, gamma, norm, eps);
}

/// [`norm_rows`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn norm_on(level: FloatLevel, rows: &mut [f32], gamma: &[f32], norm: RowNorm<'_>, eps: f32) {
    let width = gamma.len();
    assert!(
        (width > 0 || rows.is_empty()) && rows.len().is_multiple_of(width.max(1)),
        "norm_rows: {} values are not rows of {width}",
        rows.len()
    );
    if let RowNorm::Layer { beta: Some(beta) } = norm {
        assert_eq!(beta.len(), width, "norm_rows: β and γ differ in length");
    }
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { norm_avx512(rows, gamma, norm, eps) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { norm_avx2(rows, gamma, norm, eps) },
        _ => norm_portable(rows, gamma, norm, eps),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn norm_avx512(rows: &mut [f32], gamma: &[f32], norm: RowNorm<'_>, eps: f32) {
    norm_portable(rows, gamma, norm, eps);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn norm_avx2(rows: &mut [f32], gamma: &[f32], norm: RowNorm<'_>, eps: f32) {
    norm_portable(rows, gamma, norm, eps);
}

#[inline(always)]
fn norm_portable(rows: &mut [f32], gamma: &[f32], norm: RowNorm<'_>, eps: f32) {
    let width = gamma.len();
    if width == 0 {
        return;
    }
    let rms = norm == RowNorm::Rms;
    for row in rows.chunks_exact_mut(width) {
        let (mean, inv) = row_stats(row, rms, eps);
        match norm {
            RowNorm::Layer { beta: Some(beta) } => {
                for ((x, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                    *x = (*x - mean) * inv * g + b;
                }
            }
            RowNorm::Layer { beta: None } => {
                for (x, g) in row.iter_mut().zip(gamma) {
                    *x = (*x - mean) * inv * g;
                }
            }
            RowNorm::Rms => {
                for (x, g) in row.iter_mut().zip(gamma) {
                    *x = *x * inv * g;
                }
            }
        }
    }
}

/// A row's centre and inverse spread: `(μ, 1/√(σ² + ε))` for LayerNorm, `(0, 1/√(mean(x²) +
/// ε))` for RMSNorm (`rms`). The forward and the backward pass both take them from here, so
/// the backward's `x̂ = (x − μ) · inv` is the forward's bit for bit.
#[inline(always)]
pub(crate) fn row_stats(row: &[f32], rms: bool, eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    if rms {
        (0.0, 1.0 / (lane_sum(row, |x| x * x) / n + eps).sqrt())
    } else {
        let mean = lane_sum(row, |x| x) / n;
        let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n;
        (mean, 1.0 / (var + eps).sqrt())
    }
}

/// `Σ f(x)` over `row`, in 16 lanes (the tail into the first lanes), then across them.
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut sums = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (sum, &x) in sums.iter_mut().zip(chunk) {
            *sum += f(x);
        }
    }
    for (sum, &x) in sums.iter_mut().zip(chunks.remainder()) {
        *sum += f(x);
    }
    sums.iter().sum()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `rows` × `width` values with a spread of magnitudes and an offset per row (LayerNorm's
    /// centring matters), and γ, β that are not 1 and 0.
    pub(crate) fn case(rows: usize, width: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let x = (0..rows * width)
            .map(|i| ((i * 7_919 % 1_013) as f32 - 506.0) * 0.01 + (i / width) as f32)
            .collect();
        let gamma = (0..width).map(|j| 0.5 + (j % 7) as f32 * 0.25).collect();
        let beta = (0..width).map(|j| (j % 5) as f32 * 0.1 - 0.2).collect();
        (x, gamma, beta)
    }

    /// Both norms against the formulas in f64, sequential sums (a row of 384, MiniLM's width,
    /// and one of 37, a tail past the last 16 lanes): within 1e-5 absolute plus 1e-5 relative
    /// (the f32 sums' rounding on outputs of magnitude ≤ ~5).
    #[test]
    fn norm_rows_matches_the_formulas_in_f64() {
        for width in [384, 37] {
            let (x, gamma, beta) = case(3, width);
            let eps = 1e-5f32;
            for (norm, centre) in [
                (RowNorm::Layer { beta: Some(&beta) }, true),
                (RowNorm::Layer { beta: None }, true),
                (RowNorm::Rms, false),
            ] {
                let mut got = x.clone();
                norm_rows(&mut got, &gamma, norm, eps);
                for (r, (row, out)) in x.chunks(width).zip(got.chunks(width)).enumerate() {
                    let n = width as f64;
                    let mean = if centre {
                        row.iter().map(|&v| v as f64).sum::<f64>() / n
                    } else {
                        0.0
                    };
                    let ms = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
                    let inv = 1.0 / (ms + eps as f64).sqrt();
                    for j in 0..width {
                        let shift = match norm {
                            RowNorm::Layer { beta: Some(b) } => b[j] as f64,
                            _ => 0.0,
                        };
                        let want = (row[j] as f64 - mean) * inv * gamma[j] as f64 + shift;
                        let err = (out[j] as f64 - want).abs();
                        assert!(
                            err <= 1e-5 + 1e-5 * want.abs(),
                            "{norm:?} row {r} column {j}: {} against {want}",
                            out[j]
                        );
                    }
                }
            }
        }
    }

    /// Every level this CPU has (AVX-512F, AVX2) gives the portable loop's values bit for bit,
    /// both norms, widths with and without a tail.
    #[test]
    fn norm_rows_is_the_same_on_every_path() {
        for width in [384, 37, 5] {
            let (x, gamma, beta) = case(4, width);
            for norm in [
                RowNorm::Layer { beta: Some(&beta) },
                RowNorm::Layer { beta: None },
                RowNorm::Rms,
            ] {
                let mut portable = x.clone();
                norm_on(FloatLevel::Portable, &mut portable, &gamma, norm, 1e-12);
                for level in FloatLevel::ALL {
                    if !level.available() {
                        eprintln!("norm_rows: this CPU has no {level:?}, its path is not compared");
                        continue;
                    }
                    let mut got = x.clone();
                    norm_on(level, &mut got, &gamma, norm, 1e-12);
                    assert!(
                        got.iter()
                            .zip(&portable)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{level:?} {norm:?} width {width}"
                    );
                }
            }
        }
    }

    /// A constant row has zero variance: LayerNorm gives β exactly (ε keeps it finite).
    #[test]
    fn norm_rows_of_a_constant_row_is_beta() {
        let gamma = [2.0f32; 20];
        let beta: Vec<f32> = (0..20).map(|j| j as f32).collect();
        let mut row = [3.25f32; 20];
        norm_rows(&mut row, &gamma, RowNorm::Layer { beta: Some(&beta) }, 1e-5);
        assert_eq!(row.to_vec(), beta);
    }
}
