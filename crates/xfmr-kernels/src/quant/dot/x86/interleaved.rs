//! Sixteen interleaved weight rows of `Q4_0`, `Q4_1`, `Q5_0` or `Q8_0` (one group of
//! [`crate::quant::interleave`]'s layout) times up to four activation rows, on 512-bit
//! registers: lane `r` of every vector is weight row `r`, so there is no horizontal sum and
//! the scales of the sixteen rows are one conversion per block.

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::prefetch;
use crate::quant::dot::ActBlock;
use crate::quant::formats::BlockFormat;
use crate::quant::interleave::GROUP;

/// How far ahead of the tile being multiplied the kernel asks for the weights (bytes): the
/// tiles of a product are read in order, so these are the next blocks of the group and then
/// the next groups (the next tasks, which rayon runs mostly on the same thread). Decoding
/// streams ~100 MB of weights per step from memory: without the hints the loads waited
/// for memory and the arithmetic waited for the loads (eight rows of `[3072, 576]` `Q4_1` over
/// 64 matrices, 116 µs; with them 70–71 µs, within 12% of the same product from the cache,
/// 62.6 µs; one row 46 → 29–33 µs; `benches/quant.rs`' `streamed` cases, Intel Xeon,
/// 2026-12-05). 2, 3 and 4 KiB measured alike; 1 KiB was too near, 8 KiB too far.
const PREFETCH_AHEAD: usize = 3072;

/// `vpshufb` controls that put byte `j` of each dword into all four of its bytes (`SPREAD[j]`,
/// the same in each 128-bit lane, as `vpshufb` indexes within lanes).
const SPREAD: [[u8; 64]; 4] = {
    let mut out = [[0u8; 64]; 4];
    let mut j = 0;
    while j < 4 {
        let mut i = 0;
        while i < 64 {
            out[j][i] = ((i % 16) / 4 * 4 + j) as u8;
            i += 1;
        }
        j += 1;
    }
    out
};

/// `out[c][r] = Σ_j w_rj·x_cj` for the sixteen rows `r` of one interleaved group (`tiles`, one
/// tile per block column) and the `R` activation rows `xs[c]`.
///
/// Per block and activation row: dword `k` of the activation quants is broadcast and
/// multiplied by dword `k` of the sixteen rows (`vpdpbusd`, `u8 × i8`, exact `i32` sums);
/// the sums are scaled by the sixteen rows' `d` times the block's `d_x` (one multiply-add).
/// The offsets and minimums add `d_x·Σq_x` (the activation block's half sums) times `m`
/// (`Q4_1`), `−8·d` (`Q4_0`), `−16·d` (`Q5_0`) or `−128·d` (`Q8_0`, whose signed quants are
/// made unsigned by flipping their top bit, `q + 128`), kept in a second accumulator.
/// `Q5_0`'s fifth bits are added to its nibbles under byte masks: for dword `k`, byte `b` of
/// row `r` takes bit `4k + b` (low nibbles) or `16 + 4k + b` (high ones) of the row's `qh`,
/// which one shuffle (that byte of `qh` into all four bytes of the lane) and one bit test
/// (`vptestmb` with `1 << (4k + b) % 8`) make a mask of, and a masked byte add of 16 applies.
///
/// # Safety
/// The CPU has AVX-512 F, VNNI, VL and BW, FMA and F16C. `format` is `Q4_0`, `Q4_1`, `Q5_0` or
/// `Q8_0` and
/// `tiles` holds `xs[c].len()` tiles of `16·block_bytes` bytes (both asserted, all builds).
#[target_feature(enable = "avx512f,avx512vnni,avx512vl,avx512bw,avx2,fma,f16c")]
pub(in crate::quant::dot) unsafe fn group_avx512vnni<const R: usize>(
    format: BlockFormat,
    tiles: &[u8],
    xs: [&[ActBlock]; R],
) -> [[f32; GROUP]; R] {
    let nb = xs.first().map_or(0, |x| x.len());
    let tile = GROUP * format.block_bytes();
    assert!(
        crate::quant::interleave::interleavable(format)
            && xs.iter().all(|x| x.len() == nb)
            && tiles.len() == nb * tile,
        "group_avx512vnni: {} bytes for {nb} blocks of {}",
        tiles.len(),
        format.name()
    );
    let low = _mm512_set1_epi8(0x0f);
    let top = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut bias = [_mm512_setzero_ps(); R];
    // Activation dword `k` of block `a`, broadcast to the sixteen lanes.
    let dword = |a: &ActBlock, k: usize| {
        let q = &a.q[4 * k..4 * k + 4];
        _mm512_set1_epi32(i32::from_le_bytes([
            q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8,
        ]))
    };
    for i in 0..nb {
        let t = tiles[i * tile..(i + 1) * tile].as_ptr();
        // The tile `PREFETCH_AHEAD` bytes on (past the matrix's end for the last groups: a
        // hint, never read).
        prefetch(t.wrapping_add(PREFETCH_AHEAD), tile);
        // SAFETY (all loads below): `t` starts a tile of `tile` bytes, in bounds (the slice
        // above); the 32-byte header loads at offsets 0 and 32, the 64-byte quant loads at
        // `head + 64k`, `k < (block_bytes − head/16)/4`, end within `tile`.
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.cast()));
        let quants = |head: usize, k: usize| _mm512_loadu_si512(t.add(head + 64 * k).cast());
        // Per format: the sixteen rows' quants as unsigned bytes, dwords 0..4 of the low half
        // (`lo`) and of the high half (`hi`), and the minimums' multiplier `m`.
        let (lo, hi, m) = match format {
            BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
                let q4_1 = format == BlockFormat::Q4_1;
                let head = if q4_1 { 64 } else { 32 };
                let m = if q4_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(t.add(32).cast()))
                } else {
                    _mm512_mul_ps(d, _mm512_set1_ps(-8.0))
                };
                // Plain loops: `array::map`'s closures need not be inlined here.
                let (mut lo, mut hi) = ([_mm512_setzero_si512(); 4], [_mm512_setzero_si512(); 4]);
                for k in 0..4 {
                    let raw = quants(head, k);
                    lo[k] = _mm512_and_si512(raw, low);
                    hi[k] = _mm512_and_si512(_mm512_srli_epi32::<4>(raw), low);
                }
                (lo, hi, m)
            }
            BlockFormat::Q5_0 => {
                let m = _mm512_mul_ps(d, _mm512_set1_ps(-16.0));
                let qh = quants(32, 0);
                let sixteen = _mm512_set1_epi8(16);
                // The fifth bits of elements `4k..4k+4` lie in byte `k / 2` of `qh`, those
                // of `16+4k..` in byte `2 + k / 2`; bit `4(k % 2) + b` for byte `b` of a lane.
                let fifth = |byte: usize, k: usize| {
                    let spread = _mm512_loadu_si512(SPREAD[byte].as_ptr().cast());
                    let bits = _mm512_set1_epi32(if k.is_multiple_of(2) {
                        0x0804_0201
                    } else {
                        0x8040_2010_u32 as i32
                    });
                    _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, spread), bits)
                };
                let (mut lo, mut hi) = ([_mm512_setzero_si512(); 4], [_mm512_setzero_si512(); 4]);
                for k in 0..4 {
                    let raw = quants(32, 1 + k);
                    let l = _mm512_and_si512(raw, low);
                    let h = _mm512_and_si512(_mm512_srli_epi32::<4>(raw), low);
                    lo[k] = _mm512_mask_add_epi8(l, fifth(k / 2, k), l, sixteen);
                    hi[k] = _mm512_mask_add_epi8(h, fifth(2 + k / 2, k), h, sixteen);
                }
                (lo, hi, m)
            }
            BlockFormat::Q8_0 => {
                let m = _mm512_mul_ps(d, _mm512_set1_ps(-128.0));
                // Dwords 0..4 (elements 0..16) as the nibble formats' `lo`, 4..8 as `hi`.
                let (mut lo, mut hi) = ([_mm512_setzero_si512(); 4], [_mm512_setzero_si512(); 4]);
                for k in 0..4 {
                    lo[k] = _mm512_xor_si512(quants(32, k), top);
                    hi[k] = _mm512_xor_si512(quants(32, 4 + k), top);
                }
                (lo, hi, m)
            }
            _ => unreachable!("asserted above: Q4_0, Q4_1, Q5_0 or Q8_0"),
        };
        // Every format: dwords `k` of `lo` and `hi` (elements `4k..`, `16+4k..`) of sixteen
        // rows times the activation dwords `k` and `4 + k` of each activation row.
        for c in 0..R {
            let a = &xs[c][i];
            let (mut p0, mut p1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..4 {
                p0 = _mm512_dpbusd_epi32(p0, lo[k], dword(a, k));
                p1 = _mm512_dpbusd_epi32(p1, hi[k], dword(a, 4 + k));
            }
            let p = _mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1));
            acc[c] = _mm512_fmadd_ps(p, _mm512_mul_ps(d, _mm512_set1_ps(a.d)), acc[c]);
            bias[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.sum[0] + a.sum[1]), bias[c]);
        }
    }
    let mut out = [[0f32; GROUP]; R];
    for c in 0..R {
        // SAFETY: `out[c]` is 16 `f32`s, one unaligned 64-byte store.
        _mm512_storeu_ps(out[c].as_mut_ptr(), _mm512_add_ps(acc[c], bias[c]));
    }
    out
}
