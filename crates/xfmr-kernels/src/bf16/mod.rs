//! Matrix products with `bf16` factors and `f32` sums: `C = A·W (+ b)` where `A` is `f32`
//! activations, rounded to `bf16` as they are read, and `W` a weight matrix packed once into
//! `bf16` tiles ([`PackedBf16`]). Every product of two `bf16` values is exact in `f32` (8
//! significant bits each); only the rounding of the factors (relative error ≤ 2⁻⁸ each: bf16's unit
//! roundoff, so a product of two is within `2⁻⁷ + 2⁻¹⁶`) and the `f32` sums (which start from
//! the bias: `k + 1` terms) differ from the exact product, so, per element,
//!
//! ```text
//! |C − A·W − b| ≤ (2⁻⁷ + 2⁻¹⁶ + (k+1)·2⁻²⁴) · (Σₗ |A_il|·|W_lj| + |b_j|)      (k = inner size)
//! ```
//!
//! which the tests hold every level to. This is what PyTorch's
//! `torch.set_float32_matmul_precision("medium")` and oneDNN's `bf16` math mode allow an `f32`
//! matrix product to do; xfmr asks for it the same way, as a precision a caller permits
//! (`xfmr_attention::with_matmul_precision`), never by default.
//!
//! The levels ([`Bf16Level`]): AMX multiplies a 16×32 tile of `A` by a 32×16 tile of `W`
//! into a 16×16 tile of `f32` sums in one instruction (`tdpbf16ps`), about four times what
//! AVX-512's `f32` FMAs give one core (`src/bf16/amx.rs`); AVX-512 BF16's `vdpbf16ps` sums two
//! products per `f32` lane, twice the FMA's (`src/bf16/avx512.rs`); the portable loop does the
//! same arithmetic in plain `f32` (slower than an `f32` product: tests and CPUs without either).
//!
//! The layout ([`PackedBf16`]) is the one AMX reads and `vdpbf16ps` reads too: for each tile
//! of 16 output columns and each chunk of 32 inner indices, 16 rows of 64 bytes, row `r`
//! holding the pairs `(W[2r][j], W[2r+1][j])` for the tile's 16 columns `j` (Intel's "VNNI"
//! layout of the second factor), the inner size padded to 32 and the columns to 32 with zeros.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::cpu::Bf16Level;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod strided;
#[cfg(test)]
mod tests;

pub use strided::Strided;

/// Output columns per tile.
const TILE_N: usize = 16;
/// Inner indices per chunk (a tile row of 64 bytes of `bf16`).
const CHUNK_K: usize = 32;
/// `bf16` values in one tile of the packed weights (16 rows of 32).
const TILE: usize = TILE_N * CHUNK_K;
/// Rows of `A` per task (two AMX tiles of 16).
const BLOCK_M: usize = 32;
/// Output columns per block of a task (the sums of a partial block go through scratch).
const BLOCK_N: usize = 128;

/// `x` rounded to the nearest `bf16` (ties to even), as its 16 bits; NaN stays NaN (quiet).
#[inline]
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The `f32` of a `bf16`'s 16 bits (exact).
#[inline]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// A weight matrix `W` (`[k, n]`, as burn's `Linear` holds it) rounded to `bf16` and packed in
/// the layout the kernels read (the module's docs): packed once, read by every product with
/// it.
#[derive(Clone, Debug)]
pub struct PackedBf16 {
    k: usize,
    n: usize,
    /// Chunks of 32 along `k` (`k` padded up).
    chunks: usize,
    /// Tiles of 16 along `n` (`n` padded up to a multiple of 32).
    tiles: usize,
    data: Vec<u16>,
}

impl PackedBf16 {
    /// Packs `w`, `[k, n]` row-major, in parallel over tiles of columns.
    ///
    /// # Panics
    /// If `w.len() != k · n`.
    pub fn pack(w: &[f32], k: usize, n: usize) -> Self {
        Self::pack_strided(Strided::row_major(w, k, n))
    }

    /// Packs `w` (`[k, n]`, any strides: a transposed view is read in place).
    ///
    /// # Panics
    /// If an element of `w` is past its buffer.
    pub fn pack_strided(w: Strided<'_>) -> Self {
        Self::pack_strided_on(Bf16Level::detect(), w)
    }

    /// [`pack_strided`](Self::pack_strided) converting on `level` (the same `bf16` on every
    /// level for values in `f32`'s normal range).
    fn pack_strided_on(level: Bf16Level, w: Strided<'_>) -> Self {
        w.check();
        let (k, n) = (w.rows, w.cols);
        let chunks = k.div_ceil(CHUNK_K);
        let tiles = n.div_ceil(2 * TILE_N) * 2;
        let mut data = vec![0u16; tiles * chunks * TILE];
        data.par_chunks_mut((chunks * TILE).max(1))
            .enumerate()
            .for_each(|(t, tile)| {
                let cols = TILE_N.min(n.saturating_sub(t * TILE_N));
                if w.row_stride == 1 {
                    // A transposed view (PyTorch's `[out, in]`): column `j` of `W` is row `j`
                    // of the view's transpose, adjacent in memory; converted as one row, then
                    // its pairs placed.
                    let wt = Strided {
                        rows: n,
                        cols: k,
                        row_stride: w.col_stride,
                        col_stride: 1,
                        ..w
                    };
                    let mut column = vec![0u16; k];
                    for col in 0..cols {
                        convert_row(level, &wt, t * TILE_N + col, &mut column);
                        for (l, &h) in column.iter().enumerate() {
                            let (c, r, p) = (l / CHUNK_K, (l % CHUNK_K) / 2, l % 2);
                            tile[c * TILE + r * 2 * TILE_N + 2 * col + p] = h;
                        }
                    }
                } else if w.col_stride == 1 {
                    // Rows adjacent in memory (burn's `[in, out]`): each row of a tile, the
                    // pairs of two rows' 16 columns, in one step.
                    let row = |l: usize| match l < k && cols > 0 {
                        true => &w.data[w.offset + l * w.row_stride + t * TILE_N..][..cols],
                        false => &[][..],
                    };
                    for (pair, dst) in tile.chunks_exact_mut(2 * TILE_N).enumerate() {
                        let l = 2 * pair;
                        let dst = dst.try_into().expect("rows of 32");
                        pair_row(level, row(l), row(l + 1), dst);
                    }
                } else {
                    for l in 0..k {
                        let (c, r, p) = (l / CHUNK_K, (l % CHUNK_K) / 2, l % 2);
                        let row = &mut tile[c * TILE + r * 2 * TILE_N..][..2 * TILE_N];
                        for col in 0..cols {
                            row[2 * col + p] = to_bf16(w.get(l, t * TILE_N + col));
                        }
                    }
                }
            });
        Self {
            k,
            n,
            chunks,
            tiles,
            data,
        }
    }

    /// The inner size `k` (rows of `W`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The output size `n` (columns of `W`).
    pub fn n(&self) -> usize {
        self.n
    }

    /// The packed tile of output columns `16·t..16·t + 16` and inner chunk `c`.
    #[cfg(test)]
    fn tile(&self, t: usize, c: usize) -> &[u16] {
        let start = (t * self.chunks + c) * TILE;
        &self.data[start..start + TILE]
    }

    /// The packed tiles of columns `16·t..`, every chunk, in order.
    fn column_tiles(&self, t: usize) -> &[u16] {
        &self.data[t * self.chunks * TILE..]
    }
}

/// `out = a · W (+ bias)`: `a` is `[m, k]` row-major `f32` (rounded to `bf16` as read), `out`
/// `[m, n]` row-major, `bias` (`[n]`) added in `f32`. On the best [`Bf16Level`] this CPU has,
/// in parallel over blocks of 32 rows.
///
/// # Panics
/// If the lengths disagree with `m` and `w`'s shape.
pub fn matmul_bf16(a: &[f32], m: usize, w: &PackedBf16, bias: Option<&[f32]>, out: &mut [f32]) {
    let a = Strided::row_major(a, m, w.k);
    matmul_bf16_on(Bf16Level::detect(), a, w, bias, out)
}

/// The buffers a task reuses from one call to the next on its thread: the block's activations
/// in `bf16` and the sums of blocks that do not fill whole tiles.
struct Scratch {
    a: Vec<u16>,
    sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = const {
        std::cell::RefCell::new(Scratch { a: Vec::new(), sums: Vec::new() })
    };
}

/// [`matmul_bf16`] on `level` with `a` `[m, k]` in any layout (a strided view is read in
/// place); the tests call it with every level the CPU has.
///
/// # Panics
/// If the level is not available, or as [`matmul_bf16`].
#[allow(unsafe_code)]
pub fn matmul_bf16_on(
    level: Bf16Level,
    a: Strided<'_>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    // SAFETY: `matmul_bf16_into` writes only initialised `f32` through the view.
    matmul_bf16_into(level, a, w, bias, unsafe { as_uninit(out) });
}

/// `out` as a slice of possibly uninitialised values, for a writer of initialised ones.
///
/// # Safety
/// Nothing written through the result may be uninitialised (`MaybeUninit::uninit()`): `out`
/// must hold initialised `f32` when the borrow ends.
#[allow(unsafe_code)]
unsafe fn as_uninit(out: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s size and alignment; the caller writes only
    // initialised values (this function's contract).
    unsafe { &mut *(std::ptr::from_mut(out) as *mut [MaybeUninit<f32>]) }
}

/// [`matmul_bf16_on`] into an output that need not be initialised (a vector's spare capacity,
/// which spares the zeroing of a new buffer: `out` is `[m, n]`, thousands of rows in a
/// training step). **Writes every element of `out`**, which callers rely on to mark a
/// vector's spare capacity as initialised.
///
/// # Panics
/// As [`matmul_bf16_on`].
#[allow(unsafe_code)]
pub fn matmul_bf16_into(
    level: Bf16Level,
    a: Strided<'_>,
    w: &PackedBf16,
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
) {
    level.assert_available();
    a.check();
    let (m, k, n) = (a.rows, w.k, w.n);
    assert_eq!(a.cols, k, "matmul_bf16: a is not [m, k]");
    assert_eq!(out.len(), m * n, "matmul_bf16: out is not [m, n]");
    if let Some(bias) = bias {
        assert_eq!(bias.len(), n, "matmul_bf16: bias is not [n]");
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for row in out.chunks_exact_mut(n) {
            for (j, v) in row.iter_mut().enumerate() {
                v.write(bias.map_or(0.0, |b| b[j]));
            }
        }
        return;
    }
    let width = w.chunks * CHUNK_K;
    // The sums start from the bias (zeros without one), padded to whole tiles: every kernel
    // loads its accumulators from it, so the bias costs no pass of its own.
    let mut start = vec![0f32; w.tiles * TILE_N];
    if let Some(bias) = bias {
        start[..n].copy_from_slice(bias);
    }
    out.par_chunks_mut(BLOCK_M * n)
        .enumerate()
        .for_each(|(bm, out_rows)| {
            let rows = out_rows.len() / n;
            SCRATCH.with(|scratch| {
                let scratch = &mut *scratch.borrow_mut();
                scratch.a.resize(BLOCK_M * width, 0);
                scratch.sums.resize(BLOCK_M * BLOCK_N, 0.0);
                // The block's rows in bf16, padded with zeros to whole chunks (the padding
                // meets the weights' zero padding) and, for AMX, to 32 rows.
                for (r, dst) in scratch.a.chunks_exact_mut(width).enumerate() {
                    if r < rows {
                        convert_row(level, &a, bm * BLOCK_M + r, &mut dst[..k]);
                        dst[k..].fill(0);
                    } else {
                        dst.fill(0);
                    }
                }
                for (bn, cols) in (0..n).step_by(BLOCK_N).enumerate() {
                    let cols = (n - cols).min(BLOCK_N);
                    let t0 = bn * BLOCK_N / TILE_N;
                    let tiles = (w.tiles - t0).min(BLOCK_N / TILE_N);
                    let whole =
                        cols == tiles * TILE_N && (rows == BLOCK_M || level != Bf16Level::Amx);
                    let block = Block {
                        a: &scratch.a,
                        width,
                        rows,
                        w,
                        t0,
                        tiles,
                        start: &start[t0 * TILE_N..],
                    };
                    if whole {
                        block_on(level, &block, &mut out_rows[bn * BLOCK_N..], n);
                    } else {
                        // SAFETY: `block_on` writes sums, initialised values.
                        block_on(
                            level,
                            &block,
                            unsafe { as_uninit(&mut scratch.sums) },
                            BLOCK_N,
                        );
                        for r in 0..rows {
                            let sums = &scratch.sums[r * BLOCK_N..][..cols];
                            let dst = &mut out_rows[r * n + bn * BLOCK_N..][..cols];
                            for (d, s) in dst.iter_mut().zip(sums) {
                                d.write(*s);
                            }
                        }
                    }
                }
            });
        });
}

/// Row `i` of `a` to `bf16` (`dst.len() == a.cols`).
#[allow(unsafe_code)]
fn convert_row(level: Bf16Level, a: &Strided<'_>, i: usize, dst: &mut [u16]) {
    level.assert_available();
    match (level, a.row(i)) {
        // SAFETY: the level is available (asserted above) and both include AVX-512F and
        // AVX-512 BF16 (`Bf16Level::supported_by`).
        #[cfg(target_arch = "x86_64")]
        (Bf16Level::Amx | Bf16Level::Avx512Bf16, Some(src)) => unsafe { avx512::convert(src, dst) },
        (_, Some(src)) => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = to_bf16(s);
            }
        }
        (_, None) => {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = to_bf16(a.get(i, j));
            }
        }
    }
}

/// One row of a packed tile on `level`: `dst[2j] = to_bf16(lo[j])`, `dst[2j + 1] =
/// to_bf16(hi[j])` for the 16 columns `j`, zeros past a slice's end (each at most 16 long).
#[allow(unsafe_code)]
fn pair_row(level: Bf16Level, lo: &[f32], hi: &[f32], dst: &mut [u16; 2 * TILE_N]) {
    level.assert_available();
    match level {
        // SAFETY: the level is available (asserted above) and both include AVX-512F and
        // AVX-512 BF16 (`Bf16Level::supported_by`).
        #[cfg(target_arch = "x86_64")]
        Bf16Level::Amx | Bf16Level::Avx512Bf16 => unsafe { avx512::pair_row(lo, hi, dst) },
        _ => {
            for (j, pair) in dst.chunks_exact_mut(2).enumerate() {
                pair[0] = lo.get(j).map_or(0, |&x| to_bf16(x));
                pair[1] = hi.get(j).map_or(0, |&x| to_bf16(x));
            }
        }
    }
}

/// One task's block: `a` is `BLOCK_M` rows of `width` `bf16` (only the first `rows` are
/// real), the columns are those of `tiles` tiles from tile `t0` (an even number), and their
/// sums start from `start` (the bias of those columns, or zeros).
pub(super) struct Block<'a> {
    pub(super) a: &'a [u16],
    pub(super) width: usize,
    pub(super) rows: usize,
    pub(super) w: &'a PackedBf16,
    pub(super) t0: usize,
    pub(super) tiles: usize,
    pub(super) start: &'a [f32],
}

impl Block<'_> {
    /// Panics unless the block's operands hold what the kernels read: `a` 32 rows of `width`
    /// (the weights' chunks × 32), the tiles inside `w`, `start` one value per column, and `c`
    /// `rows` rows (AMX: 32) of the block's columns `ldc` apart.
    fn check(&self, rows: usize, c: &[MaybeUninit<f32>], ldc: usize) {
        assert!(self.width == self.w.chunks * CHUNK_K && self.w.chunks > 0);
        assert!(self.a.len() >= BLOCK_M * self.width && self.rows <= BLOCK_M);
        assert!(self.tiles.is_multiple_of(2) && self.tiles * TILE_N <= BLOCK_N);
        assert!(self.t0 + self.tiles <= self.w.tiles);
        assert!(self.start.len() >= self.tiles * TILE_N);
        assert!(rows == 0 || c.len() >= (rows - 1) * ldc + self.tiles * TILE_N);
    }
}

/// One task's block of sums into `c`, row `r` at `c[r·ldc..]` (AMX writes all 32 rows, the
/// other levels the block's `rows`).
#[allow(unsafe_code)]
fn block_on(level: Bf16Level, block: &Block<'_>, c: &mut [MaybeUninit<f32>], ldc: usize) {
    level.assert_available();
    let rows = if level == Bf16Level::Amx {
        BLOCK_M
    } else {
        block.rows
    };
    block.check(rows, c, ldc);
    match level {
        // SAFETY: the level is available (asserted above): AMX's tiles and BF16 products, with
        // the OS's leave; the operands' bounds are checked above (`Block::check`).
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        Bf16Level::Amx => unsafe { amx::block(block, c, ldc) },
        // SAFETY: as above, AVX-512F and AVX-512 BF16.
        #[cfg(target_arch = "x86_64")]
        Bf16Level::Avx512Bf16 => unsafe { avx512::block(block, c, ldc) },
        _ => block_portable(block, c, ldc),
    }
}

/// [`block_on`] in plain Rust: for each row and tile, the same pairs of exact products summed
/// in `f32` as `vdpbf16ps` sums them (the second of a pair first, then the first).
fn block_portable(block: &Block<'_>, c: &mut [MaybeUninit<f32>], ldc: usize) {
    let Block {
        a,
        width,
        rows,
        w,
        t0,
        tiles,
        start,
    } = *block;
    for i in 0..rows {
        let a_row = &a[i * width..(i + 1) * width];
        for t in 0..tiles {
            let mut acc = [0f32; TILE_N];
            acc.copy_from_slice(&start[t * TILE_N..(t + 1) * TILE_N]);
            let column = w.column_tiles(t0 + t);
            for (chunk, tile) in column.chunks_exact(TILE).take(w.chunks).enumerate() {
                for r in 0..CHUNK_K / 2 {
                    let x0 = from_bf16(a_row[chunk * CHUNK_K + 2 * r]);
                    let x1 = from_bf16(a_row[chunk * CHUNK_K + 2 * r + 1]);
                    let row = &tile[r * 2 * TILE_N..(r + 1) * 2 * TILE_N];
                    for (j, s) in acc.iter_mut().enumerate() {
                        *s += x1 * from_bf16(row[2 * j + 1]);
                        *s += x0 * from_bf16(row[2 * j]);
                    }
                }
            }
            for (d, s) in c[i * ldc + t * TILE_N..][..TILE_N].iter_mut().zip(&acc) {
                d.write(*s);
            }
        }
    }
}
