//! The x86 SIMD products of [`super`]: `#[target_feature]` functions, each called only for a
//! [`DotLevel`](crate::cpu::DotLevel) whose features the CPU was checked to have (the SAFETY
//! inventory, crates/xfmr-kernels/SAFETY.md). This file: the helpers and the products of
//! unpacked rows ([`Sub32`]); `blocks.rs`: the rows of `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` read in
//! place (one weight row by one or four activation rows, four weight rows by one); `kquant.rs`:
//! the rows of `Q4_K`, `Q5_K` and `Q6_K` read in place (tiles of rows by activation rows, and
//! four rows by every panel of eight activation rows); `panel.rs`: four
//! weight rows by a panel of eight activation rows; `interleaved.rs`: sixteen interleaved
//! weight rows by up to four activation rows.

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::ActBlock;
use crate::quant::formats::Sub32;

mod blocks;
mod interleaved;
mod kquant;
mod panel;

pub(super) use blocks::{
    blocks4_avx2, blocks4_avx512vnni, blocks4_avxvnni, blocks_avx2, blocks_avx512vnni,
    blocks_avxvnni, rows4_avx2, rows4_avx512vnni, rows4_avxvnni,
};
pub(super) use interleaved::group_avx512vnni;
pub(super) use kquant::{
    kpanels_avx2, kpanels_avx512vnni, kpanels_avxvnni, ktile_avx2, ktile_avx512vnni, ktile_avxvnni,
};
pub(super) use panel::{panel_avx2, panel_avx512vnni, panel_avxvnni};

/// Prefetch hints for the `bytes` bytes from `at`, one per cache line: the weights a kernel
/// reads next, asked for while it multiplies the ones it has. Only a hint: the address is
/// never dereferenced and may lie past any allocation (a prefetch does not fault). Compiled
/// for SSE, which every caller's features include, so that it is safe to call from them.
#[inline]
#[target_feature(enable = "sse")]
fn prefetch(at: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast());
    }
}

/// The little-endian `f16` of two bytes (F16C).
#[inline(always)]
unsafe fn half(lo: u8, hi: u8) -> f32 {
    let bits = u16::from_le_bytes([lo, hi]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The 32 quants of a `Q5_0` block (`d`, then the fifth bits `qh` as a little-endian `u32`,
/// then the nibbles as `Q4_0`'s) as signed bytes `q − 16` in element order: the form of
/// `Q8_0`'s quants (`[−16, 15]`), so that every kernel reads `Q5_0` as `Q8_0` with another
/// block size. The fifth bits spread to bytes as llama.cpp's `bytes_from_bits_32` does; a
/// nibble whose fifth bit is clear gets `0xF0` ORed in (`q − 16` in two's complement), one
/// whose bit is set stays `q` (`(q + 16) − 16`).
///
/// # Safety
/// AVX2; `block` points to 22 readable bytes.
#[inline(always)]
unsafe fn q5_0_signed(block: *const u8) -> __m256i {
    let qh = block.add(2).cast::<i32>().read_unaligned();
    let raw = _mm_loadu_si128(block.add(6).cast());
    let low = _mm_set1_epi8(0x0f);
    let q = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16(raw, 4), low),
        _mm_and_si128(raw, low),
    );
    // Byte e of `bytes` is byte e / 8 of `qh`; ORed with all bits but bit e % 8, it is all
    // ones exactly where bit e of `qh` is set.
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi8(-1));
    _mm256_or_si256(q, _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8)))
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
