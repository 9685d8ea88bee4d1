//! Four weight rows of `Q4_0`, `Q4_1`, `Q5_0` or `Q8_0` blocks (read in place) times a panel of
//! eight activation rows ([`PanelBlock`]s): the kernel of batched decoding and of prompts.

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::q5_0_signed;
use crate::quant::dot::{PanelBlock, PANEL};
use crate::quant::formats::BlockFormat;

/// Four weight rows of `Q4_0`, `Q4_1` or `Q8_0` times a panel of eight activation rows: each
/// dword of a weight block (four quants) is broadcast to every lane and `$nibble(p, w, x)`
/// adds to lane `c` of `p` the four `u8 × i8` products of `w` (nibbles, `w ≤ 15`) with
/// activation row `c`'s four quants, `$nibble_sum` making the block's eight `i32` sums.
/// `Q8_0`'s signed quants (and `Q5_0`'s, made signed by `q5_0_signed`) go through
/// `$q8(p, w, x)`, which adds `Σ (w + $q8_offset)·x`:
/// `$q8_offset = 0` for the sign trick (`|w|·(sign(w)·x)`), 128 for VNNI's one product of
/// `w ⊕ 0x80` (the quant as an unsigned byte, `w + 128`); the offset's share, `128·Σq_x`, is
/// taken away with the minimums' term (`m = −128·d`, as `Q4_0`'s `−8·d`): exact in the integers
/// (no saturation; a block's sum stays below 2²⁴, so its `f32` is exact too), but the offset's
/// share cancels between two differently rounded products, adding up to ~2⁻²³·128·|d·d_x·Σq_x|
/// per block (within the products' tested bound; the VNNI and AVX2 results of `Q8_0` panels
/// need not agree bit for bit). Per block and weight row: the block's scales times the
/// panel's, one multiply-add for the products and one for the offsets and minimums
/// (`m·d_x·Σq_x`), all lanes at once; no horizontal sums.
macro_rules! panel_body {
    (
        $format:expr,
        $rows:expr,
        $panel:expr,
        $nibble:expr,
        $nibble_sum:expr,
        $q8:expr,
        $q8_offset:expr $(,)?
    ) => {{
        let (format, rows, panel): (BlockFormat, [&[u8]; 4], &[PanelBlock]) =
            ($format, $rows, $panel);
        let nb = panel.len();
        let low = _mm256_set1_epi8(0x0f);
        // The little-endian dword at `at` in every lane.
        let dword = |at: *const u8| _mm256_set1_epi32(at.cast::<i32>().read_unaligned());
        // SAFETY (of the aligned loads): `PanelBlock` is 32-byte aligned and `q[k]`, `d` and
        // `sum` lie at multiples of 32 bytes in it.
        let xq = |pb: &PanelBlock, k: usize| _mm256_load_si256(pb.q[k].as_ptr().cast());
        // The 4-bit quants at `qs` (16 bytes: element j in the low nibble of byte j, element
        // 16 + j in the high one) times the panel's rows. `$nibble(p, w, x)` accumulates in
        // the path's own form and `$nibble_sum(p)` turns that into eight `i32` sums.
        let nibbles = |qs: *const u8, pb: &PanelBlock| {
            let mut p = _mm256_setzero_si256();
            for k in 0..4 {
                let w = dword(qs.add(4 * k));
                p = $nibble(p, _mm256_and_si256(w, low), xq(pb, k));
                p = $nibble(
                    p,
                    _mm256_and_si256(_mm256_srli_epi16(w, 4), low),
                    xq(pb, k + 4),
                );
            }
            $nibble_sum(p)
        };
        let mut acc = [_mm256_setzero_ps(); 4];
        // A block's first two `f16` (its scale, then `Q4_1`'s minimum) as `f32` in every lane:
        // `(d, second)`. One conversion of a broadcast dword gives `[d, second, d, second…]`;
        // duplicating its even and odd lanes spreads each (the same exact conversion as one
        // scalar at a time, in fewer operations than converting and broadcasting each).
        let scales = |block: *const u8| {
            let both = _mm256_cvtph_ps(_mm_set1_epi32(block.cast::<i32>().read_unaligned()));
            (_mm256_moveldup_ps(both), _mm256_movehdup_ps(both))
        };
        // `$products` gives the integer sums of block `i` of a row and `$scales` its (d, m)
        // in every lane: the row's contribution is `d·d_x·p + m·d_x·Σq_x`, lane by lane.
        macro_rules! each_block {
            ($size:literal, |$block:ident, $pb:ident| $products:expr, $scales:expr) => {{
                assert!(rows.iter().all(|r| r.len() == nb * $size));
                for i in 0..nb {
                    let $pb = &panel[i];
                    let dx = _mm256_load_ps($pb.d.as_ptr());
                    let sx = _mm256_load_ps($pb.sum.as_ptr());
                    for r in 0..4 {
                        let $block: &[u8; $size] =
                            rows[r][i * $size..(i + 1) * $size].try_into().unwrap();
                        let p: __m256i = $products;
                        let (d, m): (__m256, __m256) = $scales;
                        let scale = _mm256_mul_ps(d, dx);
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r]);
                        acc[r] = _mm256_fmadd_ps(m, sx, acc[r]);
                    }
                }
            }};
        }
        match format {
            BlockFormat::Q4_0 => each_block!(18, |block, pb| nibbles(block.as_ptr().add(2), pb), {
                let (d, _) = scales(block.as_ptr());
                (d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0)))
            }),
            BlockFormat::Q4_1 => each_block!(
                20,
                |block, pb| nibbles(block.as_ptr().add(4), pb),
                scales(block.as_ptr())
            ),
            BlockFormat::Q5_0 => each_block!(
                22,
                |block, pb| {
                    // The signed quants (as `Q8_0`'s) once, then dword `k` in every lane.
                    let w = q5_0_signed(block.as_ptr());
                    let mut p = _mm256_setzero_si256();
                    for k in 0..8 {
                        let wk = _mm256_permutevar8x32_epi32(w, _mm256_set1_epi32(k as i32));
                        p = $q8(p, wk, xq(pb, k));
                    }
                    p
                },
                {
                    let (d, _) = scales(block.as_ptr());
                    (d, _mm256_mul_ps(d, _mm256_set1_ps(-($q8_offset as f32))))
                }
            ),
            _ => each_block!(
                34,
                |block, pb| {
                    let qs = block.as_ptr().add(2);
                    let mut p = _mm256_setzero_si256();
                    for k in 0..8 {
                        p = $q8(p, dword(qs.add(4 * k)), xq(pb, k));
                    }
                    p
                },
                {
                    let (d, _) = scales(block.as_ptr());
                    (d, _mm256_mul_ps(d, _mm256_set1_ps(-($q8_offset as f32))))
                }
            ),
        }
        acc.map(|a| {
            let mut out = [0f32; PANEL];
            _mm256_storeu_ps(out.as_mut_ptr(), a);
            out
        })
    }};
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; each row holds `panel.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn panel_avx512vnni(
    format: BlockFormat,
    rows: [&[u8]; 4],
    panel: &[PanelBlock],
) -> [[f32; PANEL]; 4] {
    panel_body!(
        format,
        rows,
        panel,
        |p, w, x| _mm256_dpbusd_epi32(p, w, x),
        |p| p,
        |p, w, x| _mm256_dpbusd_epi32(p, _mm256_xor_si256(w, _mm256_set1_epi8(-128)), x),
        128,
    )
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C; each row holds `panel.len()` blocks.
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn panel_avxvnni(
    format: BlockFormat,
    rows: [&[u8]; 4],
    panel: &[PanelBlock],
) -> [[f32; PANEL]; 4] {
    panel_body!(
        format,
        rows,
        panel,
        |p, w, x| _mm256_dpbusd_avx_epi32(p, w, x),
        |p| p,
        |p, w, x| _mm256_dpbusd_avx_epi32(p, _mm256_xor_si256(w, _mm256_set1_epi8(-128)), x),
        128,
    )
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; each row holds `panel.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn panel_avx2(
    format: BlockFormat,
    rows: [&[u8]; 4],
    panel: &[PanelBlock],
) -> [[f32; PANEL]; 4] {
    let ones = _mm256_set1_epi16(1);
    // `vpmaddubsw` saturates its i16 pair sums: `|w| ≤ 128` and `|x| ≤ 127` keep them exact.
    // Nibbles (`w ≤ 15`) keep them within ±3,810, so a block's eight add up in i16 (within
    // ±30,480) before one `vpmaddwd` widens them.
    panel_body!(
        format,
        rows,
        panel,
        |p, w, x| _mm256_add_epi16(p, _mm256_maddubs_epi16(w, x)),
        |p| _mm256_madd_epi16(p, ones),
        |p, w, x| {
            let (w_abs, x_signed) = (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
            _mm256_add_epi32(
                p,
                _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, x_signed), ones),
            )
        },
        0,
    )
}
