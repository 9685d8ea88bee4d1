//! The scores of one block of [`KEY_BLOCK`] keys for up to four query heads: the one part of
//! the cached attention written with intrinsics, because the compiler does not keep the
//! portable loops' sixteen-lane accumulators in registers (it spilled them to the stack
//! every element, slower than the dot products it replaced).
//!
//! Every copy computes, for head `j` and lane `l`, `even + odd` where `even` is the fused
//! multiply-add chain `q_j[c]·K[c][l]` over the even elements `c` in order (and the last
//! element when `d_k` is odd) and `odd` the chain over the odd ones: the same operations in the
//! same order, so the copies agree bit for bit.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::CachePrecision;
use super::{CacheElement, KEY_BLOCK};
use crate::cpu::FloatLevel;

/// The sixteen scores (before scaling) of the block `rows` (`[d_k, 16]`, row `c` element `c`
/// of the block's keys, widened to `f32` exactly as loaded) for each head of `q` (`d_k` each), on
/// `level`.
///
/// # Panics
/// If `level` is not available, or a head of `q` is not as long as `rows` (all builds).
#[allow(unsafe_code)]
#[inline(always)]
pub(super) fn block_scores<const G: usize, E: CacheElement>(
    level: FloatLevel,
    q: &[&[f32]; G],
    rows: &[[E; KEY_BLOCK]],
) -> [[f32; KEY_BLOCK]; G] {
    assert!(
        q.iter().all(|q| q.len() == rows.len()),
        "block_scores: heads of {:?} for {} key elements",
        q.map(<[f32]>::len),
        rows.len()
    );
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's level is available (the dispatch asserted it): the CPU has
        // AVX-512F and FMA; it loads whole rows of `rows` (bounds-checked) and stores into
        // its own arrays.
        FloatLevel::Avx512 => unsafe { scores_avx512(q, rows) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, AVX2 and FMA, and F16C (`attend_typed` takes this level only where
        // the CPU has it).
        FloatLevel::Avx2 => unsafe { scores_avx2(q, rows) },
        _ => scores_portable(q, rows),
    }
}

/// The plain loops.
fn scores_portable<const G: usize, E: CacheElement>(
    q: &[&[f32]; G],
    rows: &[[E; KEY_BLOCK]],
) -> [[f32; KEY_BLOCK]; G] {
    let (pairs, last) = rows.as_chunks::<2>();
    let mut even = [[0f32; KEY_BLOCK]; G];
    let mut odd = [[0f32; KEY_BLOCK]; G];
    for (i, [k0, k1]) in pairs.iter().enumerate() {
        let (k0, k1) = (k0.map(E::to_f32), k1.map(E::to_f32));
        for j in 0..G {
            let (x0, x1) = (q[j][2 * i], q[j][2 * i + 1]);
            for l in 0..KEY_BLOCK {
                even[j][l] = x0.mul_add(k0[l], even[j][l]);
                odd[j][l] = x1.mul_add(k1[l], odd[j][l]);
            }
        }
    }
    if let [k] = last {
        let k = k.map(E::to_f32);
        for j in 0..G {
            let x = q[j][rows.len() - 1];
            for l in 0..KEY_BLOCK {
                even[j][l] = x.mul_add(k[l], even[j][l]);
            }
        }
    }
    std::array::from_fn(|j| std::array::from_fn(|l| even[j][l] + odd[j][l]))
}

/// The same on 512-bit registers: one register per chain and head.
///
/// # Safety
/// The CPU has AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn scores_avx512<const G: usize, E: CacheElement>(
    q: &[&[f32]; G],
    rows: &[[E; KEY_BLOCK]],
) -> [[f32; KEY_BLOCK]; G] {
    let mut even = [_mm512_setzero_ps(); G];
    let mut odd = [_mm512_setzero_ps(); G];
    let d_k = rows.len();
    let mut c = 0;
    while c + 2 <= d_k {
        let (k0, k1) = (load16(&rows[c]), load16(&rows[c + 1]));
        for j in 0..G {
            let (x0, x1) = (q[j][c], q[j][c + 1]);
            even[j] = _mm512_fmadd_ps(_mm512_set1_ps(x0), k0, even[j]);
            odd[j] = _mm512_fmadd_ps(_mm512_set1_ps(x1), k1, odd[j]);
        }
        c += 2;
    }
    if c < d_k {
        let k = load16(&rows[c]);
        for j in 0..G {
            even[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][c]), k, even[j]);
        }
    }
    let mut out = [[0f32; KEY_BLOCK]; G];
    for j in 0..G {
        // SAFETY: `out[j]` is sixteen floats.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), _mm512_add_ps(even[j], odd[j])) };
    }
    out
}

/// The same on 256-bit registers: each chain's sixteen lanes in two registers (lanes 0–7,
/// 8–15), the same operations per lane.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2<const G: usize, E: CacheElement>(
    q: &[&[f32]; G],
    rows: &[[E; KEY_BLOCK]],
) -> [[f32; KEY_BLOCK]; G] {
    let mut even = [[_mm256_setzero_ps(); 2]; G];
    let mut odd = [[_mm256_setzero_ps(); 2]; G];
    let d_k = rows.len();
    let mut c = 0;
    while c + 2 <= d_k {
        for h in 0..2 {
            let (k0, k1) = (load8(&rows[c], h), load8(&rows[c + 1], h));
            for j in 0..G {
                let (x0, x1) = (q[j][c], q[j][c + 1]);
                even[j][h] = _mm256_fmadd_ps(_mm256_set1_ps(x0), k0, even[j][h]);
                odd[j][h] = _mm256_fmadd_ps(_mm256_set1_ps(x1), k1, odd[j][h]);
            }
        }
        c += 2;
    }
    if c < d_k {
        for h in 0..2 {
            let k = load8(&rows[c], h);
            for j in 0..G {
                even[j][h] = _mm256_fmadd_ps(_mm256_set1_ps(q[j][c]), k, even[j][h]);
            }
        }
    }
    let mut out = [[0f32; KEY_BLOCK]; G];
    for j in 0..G {
        for h in 0..2 {
            let sum = _mm256_add_ps(even[j][h], odd[j][h]);
            // SAFETY: lanes `8h..8h + 8` of `out[j]`, sixteen floats.
            unsafe { _mm256_storeu_ps(out[j].as_mut_ptr().add(8 * h), sum) };
        }
    }
    out
}

/// The sixteen elements of `row` as `f32`: one load, and `vcvtph2ps` for `f16`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx512f")]
fn load16<E: CacheElement>(row: &[E; KEY_BLOCK]) -> __m512 {
    let p = row.as_ptr();
    // SAFETY: the whole of `row`: sixteen elements of `E`, 32 bytes for `f16` and 64 for
    // `f32` (the branch is on the type, resolved when compiled).
    unsafe {
        match E::PRECISION {
            CachePrecision::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            CachePrecision::F32 => _mm512_loadu_ps(p.cast()),
        }
    }
}

/// Lanes `8h..8h + 8` of `row` as `f32` (`h < 2`, checked): one load, and `vcvtph2ps` for
/// `f16`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx,f16c")]
fn load8<E: CacheElement>(row: &[E; KEY_BLOCK], h: usize) -> __m256 {
    assert!(h < 2);
    // SAFETY: elements `8h..8h + 8` of `row` (sixteen long), 16 bytes for `f16` and 32 for
    // `f32` (the branch is on the type, resolved when compiled).
    unsafe {
        let p = row.as_ptr().add(8 * h);
        match E::PRECISION {
            CachePrecision::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            CachePrecision::F32 => _mm256_loadu_ps(p.cast()),
        }
    }
}

/// `src` widened to `f32` (exactly: every `f16` is an `f32`), on `level`: `vcvtph2ps` on
/// AVX-512 and AVX2 (with F16C), [`CacheElement::to_f32`] elsewhere; the same values on every
/// level. `f32` elements are copied.
#[allow(unsafe_code)]
#[inline(always)]
pub(super) fn widen<const W: usize, E: CacheElement>(level: FloatLevel, src: &[E; W]) -> [f32; W] {
    #[cfg(target_arch = "x86_64")]
    if E::PRECISION == CachePrecision::F16
        && W.is_multiple_of(8)
        && matches!(level, FloatLevel::Avx512 | FloatLevel::Avx2)
    {
        // SAFETY: the caller's level is available with F16C (`attend_typed`, the kernel's only
        // entry, takes `Avx512` and `Avx2` only where the CPU has F16C): whole arrays read and
        // written; the elements are `f16` (checked).
        return unsafe { widen_f16c(src) };
    }
    src.map(E::to_f32)
}

/// [`widen`] eight lanes at a time.
///
/// # Safety
/// The CPU has AVX and F16C; `W` is a multiple of 8; `E` is `f16`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c<const W: usize, E: CacheElement>(src: &[E; W]) -> [f32; W] {
    debug_assert_eq!(E::PRECISION, CachePrecision::F16);
    let mut out = [0f32; W];
    for i in (0..W).step_by(8) {
        // SAFETY: elements `i..i + 8` of both arrays (`i + 8 ≤ W`, `W` a multiple of 8), the
        // source's `f16` (the caller's promise): 16 bytes read, 32 written.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i).cast()));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
    }
    out
}
