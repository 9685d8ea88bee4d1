//! The rows of `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` blocks read in place (no unpacking), times
//! activation blocks: one weight row by one activation row (`blocks_*`) or by four
//! (`blocks4_*`), four weight rows by one activation row (`rows4_*`).

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{half, hsum, q5_0_signed};
use crate::quant::dot::ActBlock;
use crate::quant::formats::BlockFormat;

/// The blocks of one row of `Q4_0`, `Q4_1`, `Q5_0` or `Q8_0` multiplied with activation blocks:
/// `$dot(q, x)` is eight `i32` sums of four `u8 × i8` products each, with `q ≤ 128` (so
/// that AVX2's saturating `vpmaddubsw` cannot saturate). Nibbles are split with a mask
/// and a shift; `Q8_0`'s signed quants go in as `|w|` with their signs moved onto `x`, and so
/// do `Q5_0`'s, made signed first (`q5_0_signed`).
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
            BlockFormat::Q5_0 => each_block!(22, |block, a, xq| {
                let w = q5_0_signed(block.as_ptr());
                let p = $dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w));
                (p, half(block[0], block[1]), 0.0)
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
            BlockFormat::Q5_0 => each_block!(
                22,
                |block| (q5_0_signed(block.as_ptr()), half(block[0], block[1]), 0.0),
                |w, xq, a| $dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w))
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
            BlockFormat::Q5_0 => each_block!(
                22,
                |block, xq| {
                    let w = q5_0_signed(block.as_ptr());
                    $dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xq, w))
                },
                (half(block[0], block[1]), 0.0)
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

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; each row holds `x.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn rows4_avx512vnni(
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
pub(in crate::quant::dot) unsafe fn rows4_avxvnni(
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
pub(in crate::quant::dot) unsafe fn rows4_avx2(
    format: BlockFormat,
    rows: [&[u8]; 4],
    x: &[ActBlock],
) -> [f32; 4] {
    rows4_body!(format, rows, x, |q, xq| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), _mm256_set1_epi16(1))
    })
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn blocks_avx512vnni(
    format: BlockFormat,
    row: &[u8],
    x: &[ActBlock],
) -> f32 {
    blocks_body!(format, row, x, |q, xq| _mm256_dpbusd_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX-VNNI, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avxvnni,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn blocks_avxvnni(
    format: BlockFormat,
    row: &[u8],
    x: &[ActBlock],
) -> f32 {
    blocks_body!(format, row, x, |q, xq| _mm256_dpbusd_avx_epi32(
        _mm256_setzero_si256(),
        q,
        xq
    ))
}

/// # Safety
/// The CPU has AVX-512 VNNI, AVX-512 VL, FMA and F16C; `row` holds `x.len()` blocks.
#[target_feature(enable = "avx512vnni,avx512vl,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn blocks4_avx512vnni(
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
pub(in crate::quant::dot) unsafe fn blocks4_avxvnni(
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
pub(in crate::quant::dot) unsafe fn blocks4_avx2(
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
pub(in crate::quant::dot) unsafe fn blocks_avx2(
    format: BlockFormat,
    row: &[u8],
    x: &[ActBlock],
) -> f32 {
    blocks_body!(format, row, x, |q, xq| {
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, xq), _mm256_set1_epi16(1))
    })
}
