//! The AVX-512 BF16 kernels of [`super`]: activations rounded to `bf16` sixteen at a time
//! (`vcvtne2ps2bf16`), and blocks of up to 4 rows by 4 tiles of 16 columns, 16 registers of
//! `f32` sums, one `vdpbf16ps` per pair of inner indices, row and tile (the packed layout's
//! row of a tile is one register). Called only for a [`Bf16Level`](crate::cpu::Bf16Level)
//! whose features include AVX-512 BF16 (`Amx` and `Avx512Bf16`).

use std::arch::x86_64::*;
use std::mem::{transmute, MaybeUninit};

use super::{to_bf16, Block, CHUNK_K, TILE, TILE_N};

/// `dst[i] = to_bf16(src[i])` for `i < src.len().min(dst.len())` (inputs below `f32`'s
/// normal range are read as zero here, as the instruction does).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16.
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn convert(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 32 <= n {
        // In bounds: i + 32 <= both lengths; unaligned loads and store.
        let lo = _mm512_loadu_ps(src.as_ptr().add(i));
        let hi = _mm512_loadu_ps(src.as_ptr().add(i + 16));
        let v: __m512i = transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst.as_mut_ptr().add(i).cast(), v);
        i += 32;
    }
    for j in i..n {
        dst[j] = to_bf16(src[j]);
    }
}

/// One row of a packed tile: `dst[2j] = to_bf16(lo[j])` and `dst[2j + 1] = to_bf16(hi[j])`
/// for the 16 columns `j`, an element past a slice's end as zero (inputs below `f32`'s normal
/// range read as zero, as in [`convert`]).
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16.
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn pair_row(lo: &[f32], hi: &[f32], dst: &mut [u16; 2 * TILE_N]) {
    // Masked loads read only the slices' own elements (at most 16 each).
    let mask = |len: usize| ((1u32 << len.min(TILE_N)) - 1) as u16;
    let lo = _mm512_maskz_loadu_ps(mask(lo.len()), lo.as_ptr());
    let hi = _mm512_maskz_loadu_ps(mask(hi.len()), hi.as_ptr());
    let lo: __m256i = transmute(_mm512_cvtneps_pbh(lo));
    let hi: __m256i = transmute(_mm512_cvtneps_pbh(hi));
    // Each 32-bit lane the pair (lo, hi): lo in its low half, as the layout reads it.
    let pairs = _mm512_or_si512(
        _mm512_cvtepu16_epi32(lo),
        _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)),
    );
    _mm512_storeu_si512(dst.as_mut_ptr().cast(), pairs);
}

/// One task's block of sums (`super::block_on`): the block's `rows` rows into `c` (row `r`
/// at `c[r·ldc..]`), started from the block's `start`.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 BF16; `block.check(block.rows, c, ldc)` holds
/// (`block_on` asserts it): every load and store of `micro` stays inside it.
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn block(block: &Block<'_>, c: &mut [MaybeUninit<f32>], ldc: usize) {
    let (a, width, w) = (block.a, block.width, block.w);
    let (stride, chunks) = (w.chunks * TILE, w.chunks);
    let mut i = 0;
    while i < block.rows {
        let mr = (block.rows - i).min(4);
        let mut t = 0;
        while t < block.tiles {
            let nt = (block.tiles - t).min(4);
            let a_rows = a.as_ptr().add(i * width);
            let b = w.column_tiles(block.t0 + t).as_ptr();
            let s = block.start.as_ptr().add(t * TILE_N);
            let out = c.as_mut_ptr().cast::<f32>().add(i * ldc + t * TILE_N);
            let rows = Rows {
                a: a_rows,
                width,
                b,
                stride,
                chunks,
                start: s,
                c: out,
                ldc,
            };
            match (mr, nt) {
                (4, 4) => micro::<4, 4>(rows),
                (3, 4) => micro::<3, 4>(rows),
                (2, 4) => micro::<2, 4>(rows),
                (1, 4) => micro::<1, 4>(rows),
                (4, _) => micro::<4, 2>(rows),
                (3, _) => micro::<3, 2>(rows),
                (2, _) => micro::<2, 2>(rows),
                _ => micro::<1, 2>(rows),
            }
            t += nt;
        }
        i += mr;
    }
}

/// The operands of one `micro` call, as raw pointers into `block`'s checked slices.
#[derive(Clone, Copy)]
struct Rows {
    /// `MR` rows of `width = 32·chunks` `bf16`.
    a: *const u16,
    width: usize,
    /// `NT` packed tiles of columns, `stride = chunks·512` values apart.
    b: *const u16,
    stride: usize,
    chunks: usize,
    /// The `16·NT` columns' starting sums.
    start: *const f32,
    /// `MR` rows of `16·NT` sums, `ldc` apart.
    c: *mut f32,
    ldc: usize,
}

/// `MR` rows of `a` by `NT` tiles of `b` into `c`, each sum started from `start`.
///
/// # Safety
/// AVX-512F and AVX-512 BF16; the pointers of `rows` hold what its fields' docs say (`block`
/// derives them from a checked `Block`).
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn micro<const MR: usize, const NT: usize>(rows: Rows) {
    let Rows {
        a,
        width,
        b,
        stride,
        chunks,
        start,
        c,
        ldc,
    } = rows;
    let mut acc = [[_mm512_setzero_ps(); NT]; MR];
    for sums in acc.iter_mut() {
        for (j, s) in sums.iter_mut().enumerate() {
            *s = _mm512_loadu_ps(start.add(j * TILE_N));
        }
    }
    for chunk in 0..chunks {
        for r in 0..CHUNK_K / 2 {
            let mut bv = [_mm512_setzero_si512(); NT];
            for (j, v) in bv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(b.add(j * stride + chunk * TILE + r * 2 * TILE_N).cast());
            }
            for (i, sums) in acc.iter_mut().enumerate() {
                let pair = a
                    .add(i * width + chunk * CHUNK_K + 2 * r)
                    .cast::<i32>()
                    .read_unaligned();
                let x: __m512bh = transmute(_mm512_set1_epi32(pair));
                for (s, v) in sums.iter_mut().zip(&bv) {
                    *s = _mm512_dpbf16_ps(*s, x, transmute::<__m512i, __m512bh>(*v));
                }
            }
        }
    }
    for (i, sums) in acc.iter().enumerate() {
        for (j, s) in sums.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc + j * TILE_N), *s);
        }
    }
}
