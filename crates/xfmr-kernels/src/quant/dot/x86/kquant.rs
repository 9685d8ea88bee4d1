//! The rows of `Q4_K`, `Q5_K` and `Q6_K` super-blocks read in place (no unpacking to
//! [`Sub32`](crate::quant::formats::Sub32)): a tile of `R` weight rows by `C` activation
//! rows (`ktile_*`), or four weight rows by every panel of eight (`kpanels_*`, for prompts), one
//! sub-block of 32 at a time, as llama.cpp's `ggml_vec_dot_q4_K_q8_K` (`q5_K`, `q6_K`) read
//! them (here against the `Q8_0`-style activation blocks the
//! other kernels read, one per sub-block).
//!
//! Per super-block of 256 and weight row, the sub-blocks' scales (and `Q4_K`'s and `Q5_K`'s
//! minimums) are decoded once into `f32` (exact: an `f16` times a 6- or 8-bit integer); per
//! sub-block the 32 quants are made unsigned bytes (`Q4_K`: nibbles `≤ 15`; `Q5_K`: `≤ 31`;
//! `Q6_K`: `q ≤ 63`, its offset 32 taken out with the activations' half sums) in a few vector
//! operations and multiplied with each activation block in one `vpdpbusd` (AVX2:
//! `vpmaddubsw`, exact as `q ≤ 63` and `|x| ≤ 127`). Lanes 0–3 of a product hold elements
//! 0–15 and lanes 4–7 elements 16–31, so `Q6_K`'s two scales of a sub-block are one vector of
//! lane scales.

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{half, hsum, prefetch};
use crate::quant::dot::{ActBlock, PanelBlock, PANEL};
use crate::quant::formats::{scale_min_k4, BlockFormat};

/// Sub-blocks of 32 per super-block.
const SUBS: usize = 8;

/// One super-block's sub-blocks, decoded for the products: `scale[s]` the scales of the two
/// halves of sub-block `s`, `coef[s]` what multiplies the activations' half sums
/// (`Q4_K`, `Q5_K`: the minimum `−dmin·m`; `Q6_K`: `−32·scale`).
struct Decoded {
    scale: [[f32; 2]; SUBS],
    coef: [[f32; 2]; SUBS],
}

/// Decodes the scales of one `Q4_K` (`{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`),
/// `Q5_K` (the same with `u8 qh[32]` before `qs`) or `Q6_K` (`{ u8 ql[128]; u8 qh[64];
/// i8 scales[16]; f16 d }`) block.
///
/// # Safety
/// F16C; `block` is one block of `format` (`Q4_K`, `Q5_K` or `Q6_K`).
#[inline(always)]
unsafe fn decode(format: BlockFormat, block: &[u8]) -> Decoded {
    let mut out = Decoded {
        scale: [[0.0; 2]; SUBS],
        coef: [[0.0; 2]; SUBS],
    };
    if format != BlockFormat::Q6K {
        let (d, dmin) = (half(block[0], block[1]), half(block[2], block[3]));
        for s in 0..SUBS {
            let (sc, m) = scale_min_k4(s, &block[4..16]);
            let (scale, min) = (d * f32::from(sc), -(dmin * f32::from(m)));
            out.scale[s] = [scale; 2];
            out.coef[s] = [min; 2];
        }
    } else {
        let d = half(block[208], block[209]);
        for s in 0..SUBS {
            for h in 0..2 {
                let scale = d * f32::from(block[192 + 2 * s + h] as i8);
                out.scale[s][h] = scale;
                out.coef[s][h] = -32.0 * scale;
            }
        }
    }
    out
}

/// The 32 quants of sub-block `s` of a `Q4_K`, `Q5_K` or `Q6_K` block as unsigned bytes
/// (`≤ 63`), in element order (the layouts: `formats.rs`'s `q45_k` and `q6_k`).
///
/// # Safety
/// AVX2; `block` is one block of `format` (`Q4_K`, `Q5_K` or `Q6_K`), `s < 8`.
#[inline(always)]
unsafe fn quants(format: BlockFormat, block: &[u8], s: usize) -> __m256i {
    let low4 = _mm256_set1_epi8(0x0f);
    let load = |at: usize| _mm256_loadu_si256(block[at..at + 32].as_ptr().cast());
    let shift = |v: __m256i, by: i32| _mm256_srl_epi16(v, _mm_cvtsi32_si128(by));
    if format == BlockFormat::Q4K {
        // Sub-block 2c is the low nibbles of qs[32c..32c + 32], 2c + 1 their high ones.
        _mm256_and_si256(shift(load(16 + 32 * (s / 2)), 4 * (s % 2) as i32), low4)
    } else if format == BlockFormat::Q5K {
        // As `Q4_K` (its qs from byte 48), the fifth bit of element j bit s of qh[j].
        let nibbles = _mm256_and_si256(shift(load(48 + 32 * (s / 2)), 4 * (s % 2) as i32), low4);
        let fifth = _mm256_and_si256(shift(load(16), s as i32), _mm256_set1_epi8(1));
        _mm256_or_si256(nibbles, _mm256_slli_epi16(fifth, 4))
    } else {
        // Half n = s / 4, k = s % 4: the low nibble from ql[64n + 32(k & 1) + l] (its low or
        // high nibble for k < 2 or k ≥ 2), the two high bits from bits 2k of qh[32n + l].
        let (n, k) = (s / 4, s % 4);
        let low = shift(load(64 * n + 32 * (k & 1)), 4 * (k / 2) as i32);
        let high = _mm256_and_si256(shift(load(128 + 32 * n), 2 * k as i32), _mm256_set1_epi8(3));
        _mm256_or_si256(_mm256_and_si256(low, low4), _mm256_slli_epi16(high, 4))
    }
}

/// `out[c][r] = Σ_j w_rj·x_cj` for the `R` weight rows `rows[r]` (whole `Q4_K`, `Q5_K` or `Q6_K`
/// blocks) and the `C` activation rows `xs[c]` (one block per sub-block): `$dot(q, x)` is
/// eight `i32` sums of four `u8 × i8` products each. Per sub-block and pair of rows: one
/// product, one multiply-add of it by the lane scales times `d_x`, and the half sums'
/// term in a scalar accumulator.
macro_rules! ktile_body {
    ($format:expr, $rows:expr, $xs:expr, $dot:expr) => {{
        let (format, rows, xs): (BlockFormat, [&[u8]; R], [&[ActBlock]; C]) = ($format, $rows, $xs);
        let nb = xs.first().map_or(0, |x| x.len());
        let size = format.block_bytes();
        assert!(
            matches!(
                format,
                BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K
            ) && nb % SUBS == 0
                && xs.iter().all(|x| x.len() == nb)
                && rows.iter().all(|r| r.len() == nb / SUBS * size),
            "ktile: {format:?} rows of {:?} bytes, {nb} activation blocks",
            rows.map(|r| r.len())
        );
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        let mut bias = [[0f32; R]; C];
        let row_bytes = nb / SUBS * size;
        for b in 0..nb / SUBS {
            for r in 0..R {
                let block = &rows[r][b * size..(b + 1) * size];
                // The same block of the row `R` rows on (the next tile's, when the rows lie
                // one after another as ggml stores them), hinted as `group_avx512vnni` hints
                // its next tiles (a hint: never read, so any address will do).
                prefetch(block.as_ptr().wrapping_add(R * row_bytes), size);
                let decoded = decode(format, block);
                for s in 0..SUBS {
                    let q = quants(format, block, s);
                    let [s0, s1] = decoded.scale[s];
                    let lanes = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
                    let [c0, c1] = decoded.coef[s];
                    for c in 0..C {
                        let a = &xs[c][b * SUBS + s];
                        let xq = _mm256_loadu_si256(a.q.as_ptr().cast());
                        let p = _mm256_cvtepi32_ps($dot(q, xq));
                        let scale = _mm256_mul_ps(lanes, _mm256_set1_ps(a.d));
                        acc[c][r] = _mm256_fmadd_ps(p, scale, acc[c][r]);
                        bias[c][r] += c0 * a.sum[0] + c1 * a.sum[1];
                    }
                }
            }
        }
        let mut out = [[0f32; R]; C];
        for c in 0..C {
            for r in 0..R {
                out[c][r] = hsum(acc[c][r]) + bias[c][r];
            }
        }
        out
    }};
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C (the shapes are asserted).
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn ktile_avx512vnni<const R: usize, const C: usize>(
    format: BlockFormat,
    rows: [&[u8]; R],
    xs: [&[ActBlock]; C],
) -> [[f32; R]; C] {
    ktile_body!(format, rows, xs, |q, x| _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        q,
        x
    ))
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C (the shapes are asserted).
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn ktile_avxvnni<const R: usize, const C: usize>(
    format: BlockFormat,
    rows: [&[u8]; R],
    xs: [&[ActBlock]; C],
) -> [[f32; R]; C] {
    ktile_body!(format, rows, xs, |q, x| _mm256_dpbusd_avx_epi32(
        _mm256_setzero_si256(),
        q,
        x
    ))
}

/// # Safety
/// The CPU has AVX2, FMA and F16C (the shapes are asserted).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn ktile_avx2<const R: usize, const C: usize>(
    format: BlockFormat,
    rows: [&[u8]; R],
    xs: [&[ActBlock]; C],
) -> [[f32; R]; C] {
    ktile_body!(format, rows, xs, |q, x| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), _mm256_set1_epi16(1))
    })
}

/// Four weight rows of `Q4_K`, `Q5_K` or `Q6_K` blocks times every panel of eight activation rows
/// (`panels`: panel after panel, one [`PanelBlock`] per sub-block), as `panel.rs` does for the
/// legacy formats one panel at a time: per sub-block and weight row, its scales are decoded
/// and its quants made bytes once (`decode`, `quants`), each dword `k` of them broadcast to
/// every lane once (`vpermd`), then for every panel `$dot(p, w, x)` adds their products with
/// the eight rows' dwords `k`; the two halves' sums apart (`Q6_K` has a scale per half), each
/// scaled by the half's scale times the rows' `d_x`, and the half sums' terms (`first` and
/// `sum − first`) added by two multiply-adds, all lanes at once. `out[p][r][c]`: weight row
/// `r` times row `c` of panel `p`.
macro_rules! kpanels_body {
    ($format:expr, $rows:expr, $panels:expr, $out:expr, $dot:expr) => {{
        let (format, rows, panels, out): (
            BlockFormat,
            [&[u8]; 4],
            &[PanelBlock],
            &mut [[[f32; PANEL]; 4]],
        ) = ($format, $rows, $panels, $out);
        let size = format.block_bytes();
        let np = out.len();
        let nb = rows[0].len() / size * SUBS;
        assert!(
            matches!(
                format,
                BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K
            ) && panels.len() == np * nb
                && rows.iter().all(|r| r.len() == nb / SUBS * size),
            "kpanels: {format:?} rows of {:?} bytes, {} panel blocks for {np} panels",
            rows.map(|r| r.len()),
            panels.len()
        );
        // SAFETY (of the aligned loads): `PanelBlock` is 32-byte aligned and `q[k]`, `d`,
        // `sum` and `first` lie at multiples of 32 bytes in it.
        let xq = |pb: &PanelBlock, k: usize| _mm256_load_si256(pb.q[k].as_ptr().cast());
        for o in out.iter_mut() {
            *o = [[0.0; PANEL]; 4];
        }
        for b in 0..nb / SUBS {
            for r in 0..4 {
                let block = &rows[r][b * size..(b + 1) * size];
                let decoded = decode(format, block);
                for s in 0..SUBS {
                    let q = quants(format, block, s);
                    let mut w = [_mm256_setzero_si256(); 8];
                    for k in 0..8 {
                        w[k] = _mm256_permutevar8x32_epi32(q, _mm256_set1_epi32(k as i32));
                    }
                    let [s0, s1] = decoded.scale[s].map(|v| _mm256_set1_ps(v));
                    let [c0, c1] = decoded.coef[s].map(|v| _mm256_set1_ps(v));
                    for (p, o) in out.iter_mut().enumerate() {
                        let pb = &panels[p * nb + b * SUBS + s];
                        let (mut p0, mut p1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                        for k in 0..4 {
                            p0 = $dot(p0, w[k], xq(pb, k));
                            p1 = $dot(p1, w[4 + k], xq(pb, 4 + k));
                        }
                        let dx = _mm256_load_ps(pb.d.as_ptr());
                        let first = _mm256_load_ps(pb.first.as_ptr());
                        let second = _mm256_sub_ps(_mm256_load_ps(pb.sum.as_ptr()), first);
                        let a = _mm256_loadu_ps(o[r].as_ptr());
                        let a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(dx, s0), a);
                        let a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(dx, s1), a);
                        let a = _mm256_fmadd_ps(c0, first, a);
                        let a = _mm256_fmadd_ps(c1, second, a);
                        _mm256_storeu_ps(o[r].as_mut_ptr(), a);
                    }
                }
            }
        }
    }};
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C (the shapes are asserted).
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn kpanels_avx512vnni(
    format: BlockFormat,
    rows: [&[u8]; 4],
    panels: &[PanelBlock],
    out: &mut [[[f32; PANEL]; 4]],
) {
    kpanels_body!(format, rows, panels, out, |p, w, x| _mm256_dpbusd_epi32(
        p, w, x
    ))
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C (the shapes are asserted).
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn kpanels_avxvnni(
    format: BlockFormat,
    rows: [&[u8]; 4],
    panels: &[PanelBlock],
    out: &mut [[[f32; PANEL]; 4]],
) {
    kpanels_body!(
        format,
        rows,
        panels,
        out,
        |p, w, x| _mm256_dpbusd_avx_epi32(p, w, x)
    )
}

/// # Safety
/// The CPU has AVX2, FMA and F16C (the shapes are asserted). `vpmaddubsw`'s pair sums
/// (`q ≤ 63`, `|x| ≤ 127`: within ±16,002) are widened at once, as four of them could
/// overflow `i16`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn kpanels_avx2(
    format: BlockFormat,
    rows: [&[u8]; 4],
    panels: &[PanelBlock],
    out: &mut [[[f32; PANEL]; 4]],
) {
    let ones = _mm256_set1_epi16(1);
    kpanels_body!(format, rows, panels, out, |p, w, x| _mm256_add_epi32(
        p,
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones)
    ))
}
