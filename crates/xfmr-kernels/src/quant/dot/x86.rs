//! The x86 SIMD products of [`super`]: `#[target_feature]` functions, each called only for a
//! [`Path`](super::Path) whose features the CPU was checked to have (the SAFETY inventory in
//! the crate docs).

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{ActBlock, BlockFormat, PanelBlock, Sub32, PANEL};

/// The blocks of one row of `Q4_0`, `Q4_1` or `Q8_0` multiplied with activation blocks:
/// `$dot(q, x)` is eight `i32` sums of four `u8 × i8` products each, with `q ≤ 128` (so
/// that AVX2's saturating `vpmaddubsw` cannot saturate). Nibbles are split with a mask
/// and a shift; `Q8_0`'s signed quants go in as `|w|` with their signs moved onto `x`.
/// One loop per format (no dispatch inside), two accumulators.
macro_rules! blocks_body {
    ($format:expr, $row:expr, $x:expr, $dot:expr) => {{
        let (format, row, x): (BlockFormat, &[u8], &[ActBlock]) = ($format, $row, $x);
        let low = _mm_set1_epi8(0x0f);
        let nibbles = |qs: *const u8| {
            let raw = _mm_loadu_si128(qs.cast());
            let lo = _mm_and_si128(raw, low);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
            _mm256_set_m128i(hi, lo)
        };
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut bias0, mut bias1) = (0f32, 0f32);
        // `$body` gives (products, weight scale, bias term) of block `i`; blocks in pairs
        // on two accumulators.
        macro_rules! each_block {
            ($size:literal, |$block:ident, $a:ident, $xq:ident| $body:expr) => {{
                let nb = x.len();
                assert_eq!(row.len(), nb * $size);
                let one = |i: usize| {
                    let $block: &[u8; $size] = row[i * $size..(i + 1) * $size].try_into().unwrap();
                    let $a = &x[i];
                    let $xq = _mm256_loadu_si256($a.q.as_ptr().cast());
                    let (p, scale, bias): (__m256i, f32, f32) = $body;
                    (_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale * $a.d), bias)
                };
                let mut i = 0;
                while i + 1 < nb {
                    let (p0, s0, b0) = one(i);
                    let (p1, s1, b1) = one(i + 1);
                    acc0 = _mm256_fmadd_ps(p0, s0, acc0);
                    acc1 = _mm256_fmadd_ps(p1, s1, acc1);
                    bias0 += b0;
                    bias1 += b1;
                    i += 2;
                }
                if i < nb {
                    let (p0, s0, b0) = one(i);
                    acc0 = _mm256_fmadd_ps(p0, s0, acc0);
                    bias0 += b0;
                }
            }};
        }
        match format {
            BlockFormat::Q4_0 => each_block!(18, |block, a, xq| {
                let d = half(block[0], block[1]);
                let q = nibbles(block.as_ptr().add(2));
                ($dot(q, xq), d, -8.0 * d * (a.sum[0] + a.sum[1]))
            }),
            BlockFormat::Q4_1 => each_block!(20, |block, a, xq| {
                let m = half(block[2], block[3]);
                let q = nibbles(block.as_ptr().add(4));
                (
                    $dot(q, xq),
                    half(block[0], block[1]),
                    m * (a.sum[0] + a.sum[1]),
                )
            }),
            _ => each_block!(34, |block, a, xq| {
                let w = _mm256_loadu_si256(block.as_ptr().add(2).cast());
                let p = $dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
                (p, half(block[0], block[1]), 0.0)
            }),
        }
        hsum(_mm256_add_ps(acc0, acc1)) + (bias0 + bias1)
    }};
}

/// As `blocks_body` for four activation rows at once: each weight block is loaded and
/// split once and multiplied with the four rows' blocks (four accumulators).
macro_rules! blocks4_body {
    ($format:expr, $row:expr, $xs:expr, $dot:expr) => {{
        let (format, row, xs): (BlockFormat, &[u8], [&[ActBlock]; 4]) = ($format, $row, $xs);
        let low = _mm_set1_epi8(0x0f);
        let nibbles = |qs: *const u8| {
            let raw = _mm_loadu_si128(qs.cast());
            let lo = _mm_and_si128(raw, low);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
            _mm256_set_m128i(hi, lo)
        };
        let nb = xs[0].len();
        assert!(xs.iter().all(|x| x.len() == nb));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut bias = [0f32; 4];
        macro_rules! each_block {
            ($size:literal, |$block:ident| $weights:expr, |$w:ident, $xq:ident, $a:ident| $body:expr) => {{
                assert_eq!(row.len(), nb * $size);
                for i in 0..nb {
                    let $block: &[u8; $size] = row[i * $size..(i + 1) * $size].try_into().unwrap();
                    let ($w, d, m): (__m256i, f32, f32) = $weights;
                    for r in 0..4 {
                        let $a = &xs[r][i];
                        let $xq = _mm256_loadu_si256($a.q.as_ptr().cast());
                        let p: __m256i = $body;
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * $a.d), acc[r]);
                        bias[r] += m * ($a.sum[0] + $a.sum[1]);
                    }
                }
            }};
        }
        match format {
            BlockFormat::Q4_0 => each_block!(
                18,
                |block| {
                    let d = half(block[0], block[1]);
                    (nibbles(block.as_ptr().add(2)), d, -8.0 * d)
                },
                |q, xq, a| $dot(q, xq)
            ),
            BlockFormat::Q4_1 => each_block!(
                20,
                |block| (nibbles(block.as_ptr().add(4)), half(block[0], block[1]), half(block[2], block[3])),
                |q, xq, a| $dot(q, xq)
            ),
            _ => each_block!(
                34,
                |block| (_mm256_loadu_si256(block.as_ptr().add(2).cast()), half(block[0], block[1]), 0.0),
                |w, xq, a| $dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w))
            ),
        }
        [0, 1, 2, 3].map(|r| hsum(acc[r]) + bias[r])
    }};
}

/// As `blocks_body` for four weight rows and one activation row: each activation block is
/// loaded once and multiplied with the four rows' blocks (four accumulators).
macro_rules! rows4_body {
    ($format:expr, $rows:expr, $x:expr, $dot:expr) => {{
        let (format, rows, x): (BlockFormat, [&[u8]; 4], &[ActBlock]) = ($format, $rows, $x);
        let low = _mm_set1_epi8(0x0f);
        let nibbles = |qs: *const u8| {
            let raw = _mm_loadu_si128(qs.cast());
            let lo = _mm_and_si128(raw, low);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
            _mm256_set_m128i(hi, lo)
        };
        let nb = x.len();
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut bias = [0f32; 4];
        macro_rules! each_block {
            ($size:literal, |$block:ident, $xq:ident| $product:expr, $scales:expr) => {{
                assert!(rows.iter().all(|r| r.len() == nb * $size));
                for i in 0..nb {
                    let a = &x[i];
                    let $xq = _mm256_loadu_si256(a.q.as_ptr().cast());
                    let xsum = a.sum[0] + a.sum[1];
                    for r in 0..4 {
                        let $block: &[u8; $size] =
                            rows[r][i * $size..(i + 1) * $size].try_into().unwrap();
                        let p: __m256i = $product;
                        let (d, m): (f32, f32) = $scales;
                        acc[r] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a.d), acc[r]);
                        bias[r] += m * xsum;
                    }
                }
            }};
        }
        match format {
            BlockFormat::Q4_0 => {
                each_block!(18, |block, xq| $dot(nibbles(block.as_ptr().add(2)), xq), {
                    let d = half(block[0], block[1]);
                    (d, -8.0 * d)
                })
            }
            BlockFormat::Q4_1 => each_block!(
                20,
                |block, xq| $dot(nibbles(block.as_ptr().add(4)), xq),
                (half(block[0], block[1]), half(block[2], block[3]))
            ),
            _ => each_block!(
                34,
                |block, xq| {
                    let w = _mm256_loadu_si256(block.as_ptr().add(2).cast());
                    $dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w))
                },
                (half(block[0], block[1]), 0.0)
            ),
        }
        [0, 1, 2, 3].map(|r| hsum(acc[r]) + bias[r])
    }};
}

/// Four weight rows of `Q4_0`, `Q4_1` or `Q8_0` times a panel of eight activation rows: each
/// dword of a weight block (four quants) is broadcast to every lane and `$nibble(p, w, x)`
/// adds to lane `c` of `p` the four `u8 × i8` products of `w` (nibbles, `w ≤ 15`) with
/// activation row `c`'s four quants, `$nibble_sum` making the block's eight `i32` sums.
/// `Q8_0`'s signed quants go through `$q8(p, w, x)`, which adds `Σ (w + $q8_offset)·x`:
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
pub(super) unsafe fn panel_avx512vnni(
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
pub(super) unsafe fn panel_avxvnni(
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
pub(super) unsafe fn panel_avx2(
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

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; each row holds `x.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn rows4_avx512vnni(
    format: BlockFormat,
    rows: [&[u8]; 4],
    x: &[ActBlock],
) -> [f32; 4] {
    rows4_body!(format, rows, x, |q, xq| _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C; each row holds `x.len()` blocks.
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(super) unsafe fn rows4_avxvnni(
    format: BlockFormat,
    rows: [&[u8]; 4],
    x: &[ActBlock],
) -> [f32; 4] {
    rows4_body!(format, rows, x, |q, xq| _mm256_dpbusd_avx_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; each row holds `x.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows4_avx2(format: BlockFormat, rows: [&[u8]; 4], x: &[ActBlock]) -> [f32; 4] {
    rows4_body!(format, rows, x, |q, xq| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), _mm256_set1_epi16(1))
    })
}

/// The little-endian `f16` of two bytes (F16C).
#[inline(always)]
unsafe fn half(lo: u8, hi: u8) -> f32 {
    let bits = u16::from_le_bytes([lo, hi]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn blocks_avx512vnni(format: BlockFormat, row: &[u8], x: &[ActBlock]) -> f32 {
    blocks_body!(format, row, x, |q, xq| _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(super) unsafe fn blocks_avxvnni(format: BlockFormat, row: &[u8], x: &[ActBlock]) -> f32 {
    blocks_body!(format, row, x, |q, xq| _mm256_dpbusd_avx_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn blocks4_avx512vnni(
    format: BlockFormat,
    row: &[u8],
    xs: [&[ActBlock]; 4],
) -> [f32; 4] {
    blocks4_body!(format, row, xs, |q, xq| _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(super) unsafe fn blocks4_avxvnni(
    format: BlockFormat,
    row: &[u8],
    xs: [&[ActBlock]; 4],
) -> [f32; 4] {
    blocks4_body!(format, row, xs, |q, xq| _mm256_dpbusd_avx_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn blocks4_avx2(
    format: BlockFormat,
    row: &[u8],
    xs: [&[ActBlock]; 4],
) -> [f32; 4] {
    blocks4_body!(format, row, xs, |q, xq| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), _mm256_set1_epi16(1))
    })
}

/// # Safety
/// The CPU has AVX2, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn blocks_avx2(format: BlockFormat, row: &[u8], x: &[ActBlock]) -> f32 {
    blocks_body!(format, row, x, |q, xq| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), _mm256_set1_epi16(1))
    })
}

/// `[s0·d ×4, s1·d ×4]`: the lanes of a `vpdpbusd` result hold 4 elements' sums each,
/// lanes 0–3 from the first half, 4–7 from the second.
#[inline(always)]
unsafe fn lane_scales(s: &Sub32, d: f32) -> __m256 {
    _mm256_set_m128(_mm_set1_ps(s.scale[1] * d), _mm_set1_ps(s.scale[0] * d))
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL and FMA.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma")]
pub(super) unsafe fn products_avx512vnni(w: &[Sub32], x: &[ActBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (s, a) in w.iter().zip(x) {
        // SAFETY: both arrays are 32 bytes; unaligned loads.
        let q = _mm256_loadu_si256(s.q.as_ptr().cast());
        let xq = _mm256_loadu_si256(a.q.as_ptr().cast());
        let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), lane_scales(s, a.d), acc);
    }
    hsum(acc)
}

/// # Safety
/// The CPU has AVX-VNNI and FMA.
#[target_feature(enable = "avxvnni,avx2,fma")]
pub(super) unsafe fn products_avxvnni(w: &[Sub32], x: &[ActBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (s, a) in w.iter().zip(x) {
        // SAFETY: both arrays are 32 bytes; unaligned loads.
        let q = _mm256_loadu_si256(s.q.as_ptr().cast());
        let xq = _mm256_loadu_si256(a.q.as_ptr().cast());
        let p = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, xq);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), lane_scales(s, a.d), acc);
    }
    hsum(acc)
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn products_avx2(w: &[Sub32], x: &[ActBlock]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (s, a) in w.iter().zip(x) {
        // SAFETY: both arrays are 32 bytes; unaligned loads of 16 at a time.
        let q0 = _mm_loadu_si128(s.q.as_ptr().cast());
        let q1 = _mm_loadu_si128(s.q.as_ptr().add(16).cast());
        let x0 = _mm_loadu_si128(a.q.as_ptr().cast());
        let x1 = _mm_loadu_si128(a.q.as_ptr().add(16).cast());
        // u8 and i8 widened to i16: the products and pair sums are exact in i32.
        let p0 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(q0), _mm256_cvtepi8_epi16(x0));
        let p1 = _mm256_madd_epi16(_mm256_cvtepu8_epi16(q1), _mm256_cvtepi8_epi16(x1));
        acc = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(p0),
            _mm256_set1_ps(s.scale[0] * a.d),
            acc,
        );
        acc = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(p1),
            _mm256_set1_ps(s.scale[1] * a.d),
            acc,
        );
    }
    hsum(acc)
}
