//! Activations quantised to `i8` per block of 32, and the integer products of an unpacked
//! weight row with them: AVX-512 VNNI, AVX-VNNI and AVX2 paths chosen at run time (the
//! [`DotLevel`] of [`crate::cpu`]), a portable one elsewhere. This file is the generic code
//! and the dispatch; the SIMD products are in `dot/x86/` (the products of unpacked rows in
//! its `mod.rs`, the rows read in place in `blocks.rs`, the panels in `panel.rs`).

use super::formats::{BlockFormat, Sub32, SUB};
use crate::cpu::{DotLevel, FloatLevel};

/// 32 activations as `d·q`, `q` in −127..=127 (ggml's `Q8_0` scheme, `d = max|x| / 127`),
/// with `d·Σq` of each half kept for the weights' minimums.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C, align(32))]
pub struct ActBlock {
    /// Quants.
    pub q: [i8; SUB],
    /// Scale.
    pub d: f32,
    /// `d·Σq` over each half (16 elements).
    pub sum: [f32; 2],
}

/// The largest `f32` below ½.
const HALF_DOWN: f32 = 0.499_999_97;
/// `1.5·2²³`: an integer `k` with `|k| < 2²²` added to it sits in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;

impl ActBlock {
    /// Quantises 32 values: `q = round(x / d)`, `d = max|x| / 127` (all zero when `x` is).
    #[inline(always)]
    pub fn quantize(x: &[f32]) -> Self {
        let x: &[f32; SUB] = x.try_into().expect("32 values");
        // The maximum in eight lanes, then across them (the same value in any order).
        // Plain loops: `array::from_fn`'s closures are not inlined into the AVX2 copy.
        let mut lanes = [0f32; 8];
        for k in 0..SUB / 8 {
            for l in 0..8 {
                lanes[l] = lanes[l].max(x[8 * k + l].abs());
            }
        }
        let amax = lanes.iter().fold(0f32, |m, &v| m.max(v));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        // Written so that it vectorises: `round` (half away from zero) as
        // `trunc(v + copysign(0.5⁻, v))`, LLVM's own exact lowering of it (the sum rounds a
        // tie up to the next integer), where `round` alone is a libm call per value; the
        // integer taken from the mantissa of `r + 1.5·2²³` (a bit cast, where a saturating
        // `as` is a scalar conversion per value); the half sums added as floats (exact: at
        // most 16 integers of magnitude ≤ 127). Clamped: a subnormal `d` makes `id`
        // infinite; |q| ≤ 127 is what the sign trick and AVX2's unsaturated `vpmaddubsw`
        // rely on.
        let mut r = [0f32; SUB];
        let mut q = [0i8; SUB];
        for j in 0..SUB {
            // NaN (a NaN activation, or 0·∞ when a subnormal `d` made `id` infinite) counts
            // as 0, so that the block's sums stay finite.
            let v = x[j] * id;
            let v = if v.is_nan() { 0.0 } else { v };
            r[j] = (v + HALF_DOWN.copysign(v)).trunc().clamp(-127.0, 127.0);
            q[j] = (r[j] + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as i8;
        }
        let mut sum = [0f32; 2];
        for (h, sum) in sum.iter_mut().enumerate() {
            let mut eight = [0f32; 8];
            for l in 0..8 {
                eight[l] = r[16 * h + l] + r[16 * h + 8 + l];
            }
            let four = [
                eight[0] + eight[4],
                eight[1] + eight[5],
                eight[2] + eight[6],
                eight[3] + eight[7],
            ];
            *sum = d * ((four[0] + four[2]) + (four[1] + four[3]));
        }
        Self { q, d, sum }
    }
}

/// [`ActBlock::quantize`] over consecutive blocks of 32: `out[i]` from `x[32i..32i + 32]`.
/// Compiled for AVX2 when the CPU has it (the [`FloatLevel`] probed at run time: `Avx512`
/// and `Avx2` take the AVX2 copy), where the rounding, the maximum and the sums vectorise
/// (baseline x86-64 calls libm's `roundf` per value); the same operations on both paths, so
/// the same blocks.
///
/// # Panics
/// Unless `x` holds `32·out.len()` values.
pub(super) fn quantize_blocks(x: &[f32], out: &mut [ActBlock]) {
    quantize_blocks_on(FloatLevel::detect(), x, out);
}

/// [`quantize_blocks`] on `level`, which must be available (asserted in all builds).
#[allow(unsafe_code)]
fn quantize_blocks_on(level: FloatLevel, x: &[f32], out: &mut [ActBlock]) {
    assert_eq!(
        x.len(),
        out.len() * SUB,
        "quantize_blocks: {} values for {} blocks",
        x.len(),
        out.len()
    );
    level.assert_available();
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is available (asserted above) and both levels include AVX2, the
        // only feature the copy is compiled for.
        FloatLevel::Avx512 | FloatLevel::Avx2 => unsafe { quantize_blocks_avx2(x, out) },
        _ => quantize_blocks_portable(x, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_blocks_avx2(x: &[f32], out: &mut [ActBlock]) {
    quantize_blocks_portable(x, out);
}

#[inline(always)]
fn quantize_blocks_portable(x: &[f32], out: &mut [ActBlock]) {
    for (o, x) in out.iter_mut().zip(x.chunks_exact(SUB)) {
        *o = ActBlock::quantize(x);
    }
}

/// Activation rows in a panel of [`PANEL`], lane `c` of every vector holding row `c`'s values:
/// the layout of `dot_panel`'s products, where each weight dword is broadcast to all lanes
/// and multiplied with eight activation rows at once.
///
/// For one block of 32 columns: `q[k]` holds, in its 4-byte lane `c`, row `c`'s quants
/// `4k..4k+4`; `d[c]` is row `c`'s scale, `sum[c]` its `d·Σq` over the block and `first[c]`
/// over the block's first half. Rows past the
/// end of a partial panel are zero (their products are zero and are not written).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C, align(32))]
pub struct PanelBlock {
    /// Quants, lane `c` of `q[k]` = row `c`'s quants `4k..4k+4`.
    pub q: [[i8; SUB]; 8],
    /// Each row's scale.
    pub d: [f32; PANEL],
    /// Each row's `d·Σq` over the block.
    pub sum: [f32; PANEL],
    /// Each row's `d·Σq` over the block's first half (elements 0..16), for formats with a
    /// scale per half (`Q6_K`).
    pub first: [f32; PANEL],
}

/// Activation rows per [`PanelBlock`].
pub const PANEL: usize = 8;

impl PanelBlock {
    /// Block `i` of up to [`PANEL`] activation rows (`rows[c][i]` is row `c`'s block).
    ///
    /// # Panics
    /// If there are more than [`PANEL`] rows or a row has no block `i`.
    pub fn gather(rows: &[&[ActBlock]], i: usize) -> Self {
        assert!(
            rows.len() <= PANEL,
            "{} rows in a panel of {PANEL}",
            rows.len()
        );
        let mut out = Self::default();
        for (c, row) in rows.iter().enumerate() {
            let a = &row[i];
            for k in 0..8 {
                out.q[k][4 * c..4 * c + 4].copy_from_slice(&a.q[4 * k..4 * k + 4]);
            }
            out.d[c] = a.d;
            out.sum[c] = a.sum[0] + a.sum[1];
            out.first[c] = a.sum[0];
        }
        out
    }
}

/// `Some(x86::$f(args))` for the function `$f` of `path` (AVX-512 VNNI, AVX-VNNI, AVX2);
/// `None` on the portable path and on other architectures: the dispatch of [`crate::cpu`] as
/// one `match` for six of the product kernels below, and (with [`dot_group`], whose kernel
/// exists on one path only, and [`dot_ktile`], generic over its tile's shape) the one place the
/// `unsafe` `#[target_feature]` functions of `x86` are called.
macro_rules! on_simd_path {
    ($path:expr, $avx512vnni:ident, $avxvnni:ident, $avx2:ident ($($arg:expr),*)) => {
        match $path {
            #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
            #[allow(unsafe_code)]
            // SAFETY: the path is available (the callers' contract: `matmul_fused` asserts it
            // in all builds); the functions assert their length preconditions themselves.
            DotLevel::Avx512Vnni => Some(unsafe { x86::$avx512vnni($($arg),*) }),
            #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
            #[allow(unsafe_code)]
            // SAFETY: as above.
            DotLevel::AvxVnni => Some(unsafe { x86::$avxvnni($($arg),*) }),
            #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
            #[allow(unsafe_code)]
            // SAFETY: as above.
            DotLevel::Avx2 => Some(unsafe { x86::$avx2($($arg),*) }),
            _ => None,
        }
    };
}

/// `Σ_j w_j·x_j` of one unpacked weight row (sub-blocks with the format's `offset`) and one
/// quantised activation row of the same length, on `path` (which must be
/// [`available`](DotLevel::available)).
///
/// `Σ_h scale_h·d·Σ_j q_j·xq_j` comes from the integer products; the offsets and minimums
/// add `Σ_h (min_h − scale_h·offset)·d·Σ_j xq_j` from the blocks' half sums.
pub(super) fn dot_row(path: DotLevel, w: &[Sub32], offset: i32, x: &[ActBlock]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut bias = 0f32;
    for (s, a) in w.iter().zip(x) {
        bias += (s.min[0] - s.scale[0] * offset as f32) * a.sum[0]
            + (s.min[1] - s.scale[1] * offset as f32) * a.sum[1];
    }
    let products = on_simd_path!(
        path,
        products_avx512vnni,
        products_avxvnni,
        products_avx2(w, x)
    )
    .unwrap_or_else(|| products_portable(w, x));
    products + bias
}

/// Whether [`dot_blocks`], [`dot_blocks4`], [`dot_rows4`] and [`dot_panel`] serve `format` on
/// `path`: `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` on the SIMD paths.
pub(super) fn reads_in_place(path: DotLevel, format: BlockFormat) -> bool {
    path != DotLevel::Portable
        && matches!(
            format,
            BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 | BlockFormat::Q8_0
        )
}

/// `Σ_j w_j·x_j` of one row of `Q4_0`, `Q4_1`, `Q5_0` or `Q8_0` blocks read in place (no unpacking
/// to [`Sub32`]), on a SIMD `path`; `None` for other formats and the portable path, which
/// take [`dot_row`].
pub(super) fn dot_blocks(
    path: DotLevel,
    format: BlockFormat,
    row: &[u8],
    x: &[ActBlock],
) -> Option<f32> {
    if !reads_in_place(path, format) {
        return None;
    }
    on_simd_path!(
        path,
        blocks_avx512vnni,
        blocks_avxvnni,
        blocks_avx2(format, row, x)
    )
}

/// As [`dot_blocks`] for four activation rows at once (each weight block read once).
pub(super) fn dot_blocks4(
    path: DotLevel,
    format: BlockFormat,
    row: &[u8],
    xs: [&[ActBlock]; 4],
) -> Option<[f32; 4]> {
    if !reads_in_place(path, format) {
        return None;
    }
    on_simd_path!(
        path,
        blocks4_avx512vnni,
        blocks4_avxvnni,
        blocks4_avx2(format, row, xs)
    )
}

/// As [`dot_blocks`] for four weight rows and one activation row (each activation block
/// loaded once).
pub(super) fn dot_rows4(
    path: DotLevel,
    format: BlockFormat,
    rows: [&[u8]; 4],
    x: &[ActBlock],
) -> Option<[f32; 4]> {
    if !reads_in_place(path, format) {
        return None;
    }
    on_simd_path!(
        path,
        rows4_avx512vnni,
        rows4_avxvnni,
        rows4_avx2(format, rows, x)
    )
}

/// The products of four weight rows of `Q4_0`, `Q4_1`, `Q5_0` or `Q8_0` blocks (read in place) with
/// the [`PANEL`] activation rows of `panel` (one [`PanelBlock`] per block of the rows): `out[r][c]`
/// is weight row `r` times activation row `c`. `None` for other formats and the portable path.
///
/// Each weight dword (4 quants of one row) is broadcast to every lane and multiplied with the
/// panel's eight rows in one `vpdpbusd` (on AVX2, a `vpmaddubsw`), so a block's unpacking serves eight activation rows
/// and the scaling is one vector multiply-add per block and weight row, with no horizontal
/// sums: the kernel of batched decoding and of prompts.
pub(super) fn dot_panel(
    path: DotLevel,
    format: BlockFormat,
    rows: [&[u8]; 4],
    panel: &[PanelBlock],
) -> Option<[[f32; PANEL]; 4]> {
    if !reads_in_place(path, format) {
        return None;
    }
    on_simd_path!(
        path,
        panel_avx512vnni,
        panel_avxvnni,
        panel_avx2(format, rows, panel)
    )
}

/// Whether [`dot_ktile`] serves `format` on `path`: `Q4_K`, `Q5_K` and `Q6_K` on the SIMD
/// paths.
pub(super) fn has_ktile(path: DotLevel, format: BlockFormat) -> bool {
    path != DotLevel::Portable
        && matches!(
            format,
            BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K
        )
}

/// The products of `R` weight rows of `Q4_K`, `Q5_K` or `Q6_K` blocks (read in place,
/// `dot/x86/kquant.rs`)
/// with `C` activation rows: `out[c][r]` is weight row `r` times activation row `c`. `None`
/// where [`has_ktile`] is false.
pub(super) fn dot_ktile<const R: usize, const C: usize>(
    path: DotLevel,
    format: BlockFormat,
    rows: [&[u8]; R],
    xs: [&[ActBlock]; C],
) -> Option<[[f32; R]; C]> {
    if !has_ktile(path, format) {
        return None;
    }
    match path {
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        #[allow(unsafe_code)]
        // SAFETY: the path is available (`matmul_fused`, the only caller, asserts it in all
        // builds) and has every feature the function enables; it asserts the shapes itself.
        DotLevel::Avx512Vnni => Some(unsafe { x86::ktile_avx512vnni(format, rows, xs) }),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        #[allow(unsafe_code)]
        // SAFETY: as above.
        DotLevel::AvxVnni => Some(unsafe { x86::ktile_avxvnni(format, rows, xs) }),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        #[allow(unsafe_code)]
        // SAFETY: as above.
        DotLevel::Avx2 => Some(unsafe { x86::ktile_avx2(format, rows, xs) }),
        _ => None,
    }
}

/// The products of four weight rows of `Q4_K`, `Q5_K` or `Q6_K` blocks (read in place) with every
/// panel of `panels` (panel after panel, each [`PanelBlock`]s of all the rows' blocks), as
/// [`dot_panel`] does for the legacy formats one panel at a time: `out[p][r][c]` is weight row
/// `r` times row `c` of panel `p`. `false` (nothing written) where [`has_ktile`] is false.
pub(super) fn dot_kpanels(
    path: DotLevel,
    format: BlockFormat,
    rows: [&[u8]; 4],
    panels: &[PanelBlock],
    out: &mut [[[f32; PANEL]; 4]],
) -> bool {
    if !has_ktile(path, format) {
        return false;
    }
    on_simd_path!(
        path,
        kpanels_avx512vnni,
        kpanels_avxvnni,
        kpanels_avx2(format, rows, panels, out)
    )
    .is_some()
}

/// Whether [`dot_group`] serves interleaved matrices of `format` on `path`: `Q4_0`, `Q4_1`,
/// `Q5_0` and `Q8_0` on AVX-512 VNNI (the other paths read interleaved rows gathered back into
/// ggml's layout).
pub(super) fn has_group_kernel(path: DotLevel, format: BlockFormat) -> bool {
    path == DotLevel::Avx512Vnni && super::interleave::interleavable(format)
}

/// The sixteen rows of one interleaved group ([`super::interleave`], `tiles` one tile per
/// block column) times the `R ≤ 4` activation rows `xs`: `out[c][r]` is weight row `r` times
/// activation row `c`. `None` where [`has_group_kernel`] is false.
pub(super) fn dot_group<const R: usize>(
    path: DotLevel,
    format: BlockFormat,
    tiles: &[u8],
    xs: [&[ActBlock]; R],
) -> Option<[[f32; super::interleave::GROUP]; R]> {
    if !has_group_kernel(path, format) {
        return None;
    }
    match path {
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        #[allow(unsafe_code)]
        // SAFETY: the path is available (`matmul_fused`, the only caller, asserts it in all
        // builds) and has every feature the function enables (AVX-512 F/VNNI/VL/BW, AVX2,
        // FMA, F16C); the function asserts its length precondition itself.
        DotLevel::Avx512Vnni => Some(unsafe { x86::group_avx512vnni(format, tiles, xs) }),
        _ => None,
    }
}

/// `Σ_subs Σ_h scale_h·d·Σ_{j∈h} q_j·xq_j` in plain Rust.
fn products_portable(w: &[Sub32], x: &[ActBlock]) -> f32 {
    let mut acc = 0f32;
    for (s, a) in w.iter().zip(x) {
        let mut sums = [0i32; 2];
        for (h, sum) in sums.iter_mut().enumerate() {
            for j in 16 * h..16 * h + 16 {
                *sum += i32::from(s.q[j]) * i32::from(a.q[j]);
            }
        }
        acc += a.d * (s.scale[0] * sums[0] as f32 + s.scale[1] * sums[1] as f32);
    }
    acc
}

#[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
#[allow(unsafe_code)]
mod x86;

#[cfg(test)]
mod tests;
