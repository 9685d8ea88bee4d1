//! The label-smoothed cross-entropy of one row of logits and its gradient in closed form, in
//! place ([`smoothed_cross_entropy_row`]): what a training step's loss needs, in three passes
//! over a row that stays in cache, where the same loss composed from whole-tensor operations
//! makes about a dozen passes over the `[tokens, vocab]` logits.
//!
//! With `z` the row's logits, `y` its target, `p = softmax(z)`, `log Z = m + log Σ_v exp(z_v − m)`
//! (`m` the row maximum) and `s = ε / |S|`:
//!
//! ```text
//! L   = −(1 − ε) · (z_y − log Z) − s · (Σ_{v ∈ S} z_v − |S| · log Z)
//! NLL = −(z_y − log Z)
//! ∂L/∂z_v = p_v − q_v,   q_v = s on S, plus 1 − ε at y
//! ```
//!
//! `S` is every token but the target and padding (`q_pad = 0`), or the whole vocabulary
//! ([`Smoothing::excludes_target_and_pad`]), the two masses of `xfmr-models`' loss.

use crate::cpu::FloatLevel;
use crate::exp::{exp_shifted_portable, LANES};

/// The loss's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Smoothing {
    /// The padding id: a row whose target it is scores 0 (and its gradient is 0).
    pub pad: u32,
    /// `ε`, in `[0, 1)`.
    pub epsilon: f32,
    /// `S` = the `V − 2` tokens that are neither the target nor padding (true), or all `V`
    /// (false: PyTorch's `label_smoothing`).
    pub excludes_target_and_pad: bool,
}

impl Smoothing {
    /// `|S|` for a vocabulary of `vocab`.
    fn set_size(&self, vocab: usize) -> usize {
        if self.excludes_target_and_pad {
            vocab - 2
        } else {
            vocab
        }
    }
}

/// The loss `L` and the `NLL` of one row (module docs), in f64; `(0, 0)` for a padding target.
/// With `weight` `Some(w)`, the row is overwritten by `w · ∂L/∂z` (zeros for a padding
/// target); without, it holds `exp(z − m)` afterwards (or is untouched for padding).
///
/// The row maximum, `Σ z` and `exp(z − m)` with its sum
/// ([`exp_shifted`](crate::exp_shifted)) are each one pass over 16 lanes, compiled for
/// AVX-512 or AVX2 when the CPU has them (the same result on every level).
///
/// A row holding a NaN or an infinity scores NaN, and its gradient is NaN.
///
/// # Panics
/// If `target` is not padding and not below the row's length; with
/// [`Smoothing::excludes_target_and_pad`], if the row is shorter than 3 or does not hold the
/// padding column.
pub fn smoothed_cross_entropy_row(
    row: &mut [f32],
    target: u32,
    smoothing: Smoothing,
    weight: Option<f32>,
) -> (f64, f64) {
    row_on(FloatLevel::detect(), row, target, smoothing, weight)
}

/// [`smoothed_cross_entropy_row`] on `level`, which must be available (asserted in all
/// builds).
#[allow(unsafe_code)]
fn row_on(
    level: FloatLevel,
    row: &mut [f32],
    target: u32,
    smoothing: Smoothing,
    weight: Option<f32>,
) -> (f64, f64) {
    let vocab = row.len();
    assert!(
        !smoothing.excludes_target_and_pad || (vocab >= 3 && (smoothing.pad as usize) < vocab),
        "smoothed_cross_entropy_row: a row of {vocab} logits for padding id {} (the smoothing \
         set excludes the target and the padding column)",
        smoothing.pad
    );
    if target == smoothing.pad {
        if weight.is_some() {
            row.fill(0.0);
        }
        return (0.0, 0.0);
    }
    assert!(
        (target as usize) < vocab,
        "smoothed_cross_entropy_row: target {target} ≥ vocabulary {vocab}"
    );
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above): the CPU has AVX-512F, the only
        // feature the copy is compiled for.
        FloatLevel::Avx512 => unsafe { row_avx512(row, target, smoothing, weight) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2.
        FloatLevel::Avx2 => unsafe { row_avx2(row, target, smoothing, weight) },
        _ => row_portable(row, target, smoothing, weight),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn row_avx512(
    row: &mut [f32],
    target: u32,
    smoothing: Smoothing,
    weight: Option<f32>,
) -> (f64, f64) {
    row_portable(row, target, smoothing, weight)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn row_avx2(row: &mut [f32], target: u32, smoothing: Smoothing, weight: Option<f32>) -> (f64, f64) {
    row_portable(row, target, smoothing, weight)
}

/// [`row_on`]'s work once the target is known to be a real token in the row: the three passes,
/// compiled whole for each level.
#[inline(always)]
fn row_portable(
    row: &mut [f32],
    target: u32,
    smoothing: Smoothing,
    weight: Option<f32>,
) -> (f64, f64) {
    let vocab = row.len();
    let (max, sum) = max_and_sum(row);
    if !(max.is_finite() && sum.is_finite()) {
        // A NaN or an infinity among the logits (the maximum skips NaN; the sum does not):
        // NaN for the loss and the whole gradient row, as the tensor formula gives, rather
        // than an exponential that silently drops the entry.
        if weight.is_some() {
            row.fill(f32::NAN);
        }
        return (f64::NAN, f64::NAN);
    }
    let z_target = row[target as usize];
    let set_sum = if smoothing.excludes_target_and_pad {
        f64::from(sum) - f64::from(z_target) - f64::from(row[smoothing.pad as usize])
    } else {
        f64::from(sum)
    };
    let sum_exp = exp_shifted_portable(row, max);
    let log_z = f64::from(max) + f64::from(sum_exp).ln();
    let set_size = smoothing.set_size(vocab) as f64;
    let epsilon = f64::from(smoothing.epsilon);
    let smooth = epsilon / set_size;
    let target_lp = f64::from(z_target) - log_z;
    let loss = -(1.0 - epsilon) * target_lp - smooth * (set_sum - set_size * log_z);
    if let Some(w) = weight {
        let scale = w / sum_exp;
        let shift = (smooth * f64::from(w)) as f32;
        affine(row, scale, shift);
        // q_y = 1 − ε (+ s on the whole vocabulary, already taken off above), q_pad = 0.
        let at_target = if smoothing.excludes_target_and_pad {
            row[smoothing.pad as usize] += shift;
            (1.0 - epsilon - smooth) * f64::from(w)
        } else {
            (1.0 - epsilon) * f64::from(w)
        };
        row[target as usize] -= at_target as f32;
    }
    (loss, -target_lp)
}

/// The row's maximum and sum, in 16 lanes (the tail into the first lanes), then across them.
#[inline(always)]
fn max_and_sum(row: &[f32]) -> (f32, f32) {
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let mut sums = [0.0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for ((m, s), &x) in maxes.iter_mut().zip(sums.iter_mut()).zip(chunk) {
            *m = m.max(x);
            *s += x;
        }
    }
    for ((m, s), &x) in maxes
        .iter_mut()
        .zip(sums.iter_mut())
        .zip(chunks.remainder())
    {
        *m = m.max(x);
        *s += x;
    }
    (
        maxes.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        sums.iter().sum(),
    )
}

/// `x ← x · scale − shift`.
#[inline(always)]
fn affine(row: &mut [f32], scale: f32, shift: f32) {
    for x in row {
        *x = *x * scale - shift;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of `vocab` logits with a spread of magnitudes.
    fn logits(vocab: usize, seed: usize) -> Vec<f32> {
        (0..vocab)
            .map(|v| (((v + seed) * 7_919 % 1_013) as f32 - 506.0) * 0.013 + (v % 5) as f32)
            .collect()
    }

    /// The loss, the NLL and `w · ∂L/∂z` of the module docs in f64, straight from `p` and `q`.
    fn reference(z: &[f32], y: usize, s: Smoothing, w: f64) -> (f64, f64, Vec<f64>) {
        let z: Vec<f64> = z.iter().map(|&x| f64::from(x)).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let log_z = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        let in_set = |v: usize| !s.excludes_target_and_pad || (v != y && v != s.pad as usize);
        let smooth = f64::from(s.epsilon) / s.set_size(z.len()) as f64;
        let q: Vec<f64> = (0..z.len())
            .map(|v| {
                let on_target = if v == y {
                    1.0 - f64::from(s.epsilon)
                } else {
                    0.0
                };
                on_target + if in_set(v) { smooth } else { 0.0 }
            })
            .collect();
        let loss = -(0..z.len()).map(|v| q[v] * (z[v] - log_z)).sum::<f64>();
        let gradient = (0..z.len())
            .map(|v| w * ((z[v] - log_z).exp() - q[v]))
            .collect();
        (loss, log_z - z[y], gradient)
    }

    /// Both masses, targets at the start, the end, the padding column's neighbour and one
    /// holding the row's maximum, vocabularies with and without a tail past 16 lanes: the loss
    /// and NLL within 1e-5 relative (plus 1e-6) of the f64 formula, the gradient within 1e-6 · w per entry;
    /// a padding target scores 0 and zeroes its row; a NaN or an infinity makes the loss and
    /// the row's gradient NaN; the whole-vocabulary set allows a padding id past it.
    #[test]
    fn smoothed_cross_entropy_row_matches_the_formula_in_f64() {
        for excludes in [true, false] {
            let s = Smoothing {
                pad: 1,
                epsilon: 0.1,
                excludes_target_and_pad: excludes,
            };
            for vocab in [3, 37, 4_000] {
                for (seed, y) in [
                    (0, 0),
                    (1, vocab - 1),
                    (2, 2 % vocab),
                    (3, (vocab / 2).max(2)),
                ] {
                    let mut z = logits(vocab, seed);
                    if seed == 3 {
                        z[y] = 12.0; // the target holds the row's maximum
                    }
                    let w = 0.01;
                    let (loss, nll, gradient) = reference(&z, y, s, w);
                    let mut row = z.clone();
                    let got = smoothed_cross_entropy_row(&mut row, y as u32, s, Some(w as f32));
                    let ctx = format!("vocab {vocab}, target {y}, excludes {excludes}");
                    // 1e-6 absolute besides: log Z's f32 sum of exponentials.
                    assert!(
                        (got.0 - loss).abs() <= 1e-5 * loss.abs() + 1e-6,
                        "{ctx}: {got:?}"
                    );
                    assert!(
                        (got.1 - nll).abs() <= 1e-5 * nll.abs() + 1e-6,
                        "{ctx}: {got:?}"
                    );
                    for (v, (g, want)) in row.iter().zip(&gradient).enumerate() {
                        assert!(
                            (f64::from(*g) - want).abs() <= 1e-6 * w,
                            "{ctx}: ∂L/∂z_{v} = {g}, the f64 formula gives {want}"
                        );
                    }
                    let mut plain = z.clone();
                    assert_eq!(
                        smoothed_cross_entropy_row(&mut plain, y as u32, s, None),
                        got
                    );
                }
            }
            let mut row = logits(37, 4);
            assert_eq!(
                smoothed_cross_entropy_row(&mut row, 1, s, Some(0.5)),
                (0.0, 0.0)
            );
            assert!(row.iter().all(|&g| g == 0.0));
            for bad in [f32::NAN, f32::INFINITY] {
                let mut row = logits(37, 5);
                row[9] = bad;
                let (loss, nll) = smoothed_cross_entropy_row(&mut row, 3, s, Some(0.5));
                assert!(loss.is_nan() && nll.is_nan(), "a row holding {bad}");
                assert!(row.iter().all(|g| g.is_nan()), "a row holding {bad}");
            }
        }
        // The whole vocabulary as the set: a padding id past the vocabulary is allowed, as in
        // the tensor formula (it is never read).
        let s = Smoothing {
            pad: 99,
            epsilon: 0.1,
            excludes_target_and_pad: false,
        };
        let z = logits(37, 6);
        let (loss, nll, _) = reference(&z, 4, s, 1.0);
        let got = smoothed_cross_entropy_row(&mut z.clone(), 4, s, Some(1.0));
        assert!((got.0 - loss).abs() <= 1e-5 * loss && (got.1 - nll).abs() <= 1e-5 * nll);
    }

    /// Every level this CPU has gives the portable path's loss and gradient bit for bit.
    #[test]
    fn smoothed_cross_entropy_row_is_the_same_on_every_path() {
        let s = Smoothing {
            pad: 0,
            epsilon: 0.1,
            excludes_target_and_pad: true,
        };
        let z = logits(1_003, 7);
        let mut portable = z.clone();
        let want = row_on(FloatLevel::Portable, &mut portable, 500, s, Some(0.25));
        for level in FloatLevel::ALL {
            if !level.available() {
                eprintln!("smoothed_cross_entropy_row: this CPU has no {level:?}, not compared");
                continue;
            }
            let mut row = z.clone();
            assert_eq!(
                row_on(level, &mut row, 500, s, Some(0.25)),
                want,
                "{level:?}"
            );
            assert!(
                row.iter()
                    .zip(&portable)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?}"
            );
        }
    }
}
