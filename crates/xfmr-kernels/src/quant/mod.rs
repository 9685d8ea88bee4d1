//! Quantised matrix products on ggml's blocks, as llama.cpp computes them: the weights stay in
//! their GGUF blocks, activations are quantised to `i8` per block of 32, and each product is
//! integer arithmetic per block scaled by the two scales.
//!
//! - [`BlockFormat`]: the ggml formats (`Q4_0` … `Q8_0`, `Q2_K` … `Q8_K`), [`dequantize`]
//!   (bit-exact with ggml), and one canonical unpacked form ([`Sub32`]) that every format maps
//!   to, so that one product kernel serves all of them; `Q4_0`, `Q4_1`, `Q5_0`, `Q8_0`,
//!   `Q4_K`, `Q5_K` and `Q6_K` (the commonest, and what llama.cpp's `Q4_K_M` and `Q5_K_M`
//!   files hold) also have kernels that read their blocks in place on the SIMD paths;
//! - [`QuantizedMatrix`]: a `[rows, cols]` matrix of blocks and its product with activation
//!   rows ([`QuantizedMatrix::matmul`]), in parallel over row ranges; its blocks in ggml's
//!   layout or, for `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0`, interleaved by groups of sixteen rows
//!   ([`interleave`], what the AVX-512 VNNI kernel reads fastest);
//! - [`ActivationRows`]: `[n, cols]` activations quantised once and shared by every product
//!   that reads them (the query, key and value projections of one layer...).
//!
//! # Error of a product
//!
//! Quantising an activation block to `d·q` with `q = round(x / d)`, `d = max|x| / 127`, moves
//! each element by at most `d/2`; the integer products and their half sums are exact; so for a
//! weight row `w` (exact values of its blocks) and an activation row `x` the computed product
//! differs from `Σ w_j x_j` by at most
//!
//! `Σ_blocks (d_b / 2)·Σ_{j∈b} |w_j|  +  ε_f32`,
//!
//! `ε_f32` the `f32` rounding of the per-block terms and their sum: a few ulps of
//! `Σ_j m_j·(|x_j| + d_b)` per block term, `m_j = |scale|·max(q_j, offset) + |min|` the
//! magnitude of the terms the canonical form adds (larger than `|w_j|` where `q_j` is near the
//! offset). The tests check this bound on every format.

mod dot;
mod formats;
pub mod interleave;
mod matmul;

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use dot::quantize_blocks;
pub use dot::{ActBlock, PanelBlock, PANEL};
pub use formats::{dequantize, BlockFormat, Sub32, SUB};
pub use interleave::Layout;

/// The path of the products: [`DotLevel`](crate::cpu::DotLevel), the levels of
/// [`crate::cpu`]'s probe for the integer products (`Path::detect()` is this CPU's best,
/// probed once).
pub use crate::cpu::DotLevel as Path;

/// Rows of the weight matrix per parallel task.
const ROWS_PER_TASK: usize = 16;

/// The fewest activation rows whose products with in-place blocks of `format` go through
/// [`PanelBlock`]s. A panel costs the same for one activation row as for [`PANEL`]; fewer
/// rows take the kernels that read four activation rows per weight row. Measured on AVX2
/// (`benches/quant.rs`, docs/benchmarks.md): panels win from 3 rows of `Q4_0`/`Q4_1` and
/// from 7 of `Q8_0`, whose four-row kernel needs no unpacking.
const fn panel_min_rows(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q8_0 => 7,
        _ => PANEL_MIN_ROWS,
    }
}

/// The fewest activation rows for which [`ActivationRows`] builds panels: the least of
/// [`panel_min_rows`] (that of the 4-bit formats).
const PANEL_MIN_ROWS: usize = 3;

/// From how many activations [`ActivationRows::quantize`] splits the work over rayon's
/// threads: a step of eight sequences (8 × 576 or 8 × 1536 values) quantises in a few
/// microseconds, less than a fork-join costs; a prompt's rows are worth sharing.
const PARALLEL_QUANTIZE: usize = 1 << 15;

/// `[n, cols]` activations quantised per block of 32 (and, for several rows, the same blocks
/// arranged in [`PanelBlock`]s of [`PANEL`] rows).
#[derive(Debug, Clone, Default)]
pub struct ActivationRows {
    blocks: Vec<ActBlock>,
    panels: Vec<PanelBlock>,
    n: usize,
    cols: usize,
}

impl ActivationRows {
    /// Empty; [`quantize`](Self::quantize) fills it (reusing its buffer).
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantises `x` (`[n, cols]`, row-major, `cols` a multiple of 32), reusing the buffer.
    ///
    /// # Panics
    /// If `cols` is not a multiple of 32 or `x` not `n·cols` long.
    pub fn quantize(&mut self, x: &[f32], n: usize, cols: usize) {
        assert!(
            cols.is_multiple_of(SUB) && x.len() == n * cols,
            "ActivationRows::quantize: {} values as [{n}, {cols}] (cols must be a multiple of 32)",
            x.len()
        );
        self.blocks.clear();
        self.blocks.resize(x.len() / SUB, ActBlock::default());
        if x.len() >= PARALLEL_QUANTIZE {
            // Many rows (a prompt): on rayon's threads too, in tasks of 64 blocks.
            self.blocks
                .par_chunks_mut(64)
                .zip(x.par_chunks(64 * SUB))
                .for_each(|(out, x)| quantize_blocks(x, out));
        } else {
            quantize_blocks(x, &mut self.blocks);
        }
        self.n = n;
        self.cols = cols;
        self.panels.clear();
        let per = cols / SUB;
        if n >= PANEL_MIN_ROWS && per > 0 {
            for first in (0..n).step_by(PANEL) {
                let rows: Vec<&[ActBlock]> = self.blocks[first * per..n.min(first + PANEL) * per]
                    .chunks_exact(per)
                    .collect();
                self.panels
                    .extend((0..per).map(|i| PanelBlock::gather(&rows, i)));
            }
        }
    }

    /// Panel `p` (rows `p·PANEL..`), one [`PanelBlock`] per block of 32 columns (built for
    /// `PANEL_MIN_ROWS` rows or more).
    fn panel(&self, p: usize) -> &[PanelBlock] {
        let per = self.cols / SUB;
        &self.panels[p * per..(p + 1) * per]
    }

    /// Every panel, panel after panel (built for `PANEL_MIN_ROWS` rows or more).
    fn panels(&self) -> &[PanelBlock] {
        &self.panels
    }

    /// Rows.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i`'s blocks.
    pub fn row(&self, i: usize) -> &[ActBlock] {
        let per = self.cols / SUB;
        &self.blocks[i * per..(i + 1) * per]
    }
}

/// A `[rows, cols]` matrix stored as ggml blocks (a GGUF tensor with `dims = [cols, rows]`),
/// borrowed from a shared buffer (a whole GGUF file held once), row after row or interleaved
/// by groups of rows ([`Layout`]).
#[derive(Debug, Clone)]
pub struct QuantizedMatrix {
    format: BlockFormat,
    layout: Layout,
    data: Arc<Vec<u8>>,
    start: usize,
    rows: usize,
    cols: usize,
}

/// A [`QuantizedMatrix`] whose sizes disagree with its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

impl QuantizedMatrix {
    /// Takes the blocks of a `[rows, cols]` matrix.
    ///
    /// # Errors
    /// [`ShapeError`] when `cols` is not whole blocks or `bytes` not `rows` rows of them.
    pub fn new(
        format: BlockFormat,
        bytes: Vec<u8>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ShapeError> {
        let len = bytes.len();
        Self::from_shared(format, Arc::new(bytes), 0..len, rows, cols)
    }

    /// The blocks of a `[rows, cols]` matrix in `layout`, its bytes permuted here when
    /// `layout` is [`Layout::Interleaved`] (`bytes` in ggml's row layout, as
    /// [`new`](Self::new) takes them).
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Layout::Interleaved`] for a format without that layout.
    pub fn with_layout(
        format: BlockFormat,
        mut bytes: Vec<u8>,
        rows: usize,
        cols: usize,
        layout: Layout,
    ) -> Result<Self, ShapeError> {
        let len = bytes.len();
        Self::check(format, len, 0..len, rows, cols, layout)?;
        if layout == Layout::Interleaved {
            interleave::interleave(format, &mut bytes, rows, cols);
        }
        Self::from_shared_in(format, Arc::new(bytes), 0..len, rows, cols, layout)
    }

    /// The blocks of a `[rows, cols]` matrix at `range` of a shared buffer (no copy).
    ///
    /// # Errors
    /// [`ShapeError`] when `cols` is not whole blocks, `range` not `rows` rows of them or
    /// outside `data`.
    pub fn from_shared(
        format: BlockFormat,
        data: Arc<Vec<u8>>,
        range: Range<usize>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ShapeError> {
        Self::from_shared_in(format, data, range, rows, cols, Layout::Rows)
    }

    /// As [`from_shared`](Self::from_shared) for blocks already in `layout` (a buffer whose
    /// ranges were permuted by [`interleave::interleave`]).
    ///
    /// # Errors
    /// As [`from_shared`](Self::from_shared); [`Layout::Interleaved`] for a format without
    /// that layout.
    pub fn from_shared_in(
        format: BlockFormat,
        data: Arc<Vec<u8>>,
        range: Range<usize>,
        rows: usize,
        cols: usize,
        layout: Layout,
    ) -> Result<Self, ShapeError> {
        Self::check(format, data.len(), range.clone(), rows, cols, layout)?;
        Ok(Self {
            format,
            layout,
            data,
            start: range.start,
            rows,
            cols,
        })
    }

    /// The size checks of the constructors.
    fn check(
        format: BlockFormat,
        len: usize,
        range: Range<usize>,
        rows: usize,
        cols: usize,
        layout: Layout,
    ) -> Result<(), ShapeError> {
        if layout == Layout::Interleaved && !interleave::interleavable(format) {
            return Err(ShapeError(format!(
                "{} matrix [{rows}, {cols}]: the format has no interleaved layout",
                format.name()
            )));
        }
        let expected = cols
            .is_multiple_of(format.block_len())
            .then(|| (cols / format.block_len()).checked_mul(format.block_bytes()))
            .flatten()
            .and_then(|row| row.checked_mul(rows));
        if expected != Some(range.len()) || range.end > len {
            return Err(ShapeError(format!(
                "{} matrix [{rows}, {cols}]: {} bytes at {range:?} of {}; rows must be whole \
                 blocks of {} elements ({} bytes each)",
                format.name(),
                range.len(),
                len,
                format.block_len(),
                format.block_bytes()
            )));
        }
        Ok(())
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// The layout of the blocks.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Rows (outputs of a linear layer).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs of a linear layer).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The blocks, in the matrix's [`layout`](Self::layout).
    pub fn bytes(&self) -> &[u8] {
        &self.data[self.start..self.start + self.rows * self.row_bytes()]
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.format.block_len() * self.format.block_bytes()
    }

    /// Rows `r..r + 4` as [`row_in`](Self::row_in) gives each (`bufs[k]` the buffer of row
    /// `r + k`).
    fn rows4_in<'a>(&'a self, r: usize, bufs: &'a mut [Vec<u8>; 4]) -> [&'a [u8]; 4] {
        let [b0, b1, b2, b3] = bufs;
        [
            self.row_in(r, b0),
            self.row_in(r + 1, b1),
            self.row_in(r + 2, b2),
            self.row_in(r + 3, b3),
        ]
    }

    /// Row `r`'s blocks in ggml's layout: in place, or gathered into `buf` from an
    /// interleaved group.
    fn row_in<'a>(&'a self, r: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
        let size = self.row_bytes();
        if self.layout == Layout::Rows || r >= self.rows / interleave::GROUP * interleave::GROUP {
            return &self.data[self.start + r * size..self.start + (r + 1) * size];
        }
        buf.resize(size, 0);
        let (rows, cols) = (self.rows, self.cols);
        interleave::gather_row(self.format, self.bytes(), rows, cols, r, buf);
        buf
    }

    /// The tiles of interleaved group `g` (rows `16g..16g + 16`).
    fn group(&self, g: usize) -> &[u8] {
        let size = interleave::GROUP * self.row_bytes();
        &self.data[self.start + g * size..self.start + (g + 1) * size]
    }

    /// Row `r` dequantised into `out` (`cols` values): an embedding lookup.
    ///
    /// # Panics
    /// If `r ≥ rows` or `out` is not `cols` long.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let group = interleave::GROUP;
        match interleave::header(self.format) {
            // Block by block from the group's tiles: no allocation per lookup.
            Some(head) if self.layout == Layout::Interleaved && r < self.rows / group * group => {
                assert_eq!(out.len(), self.cols, "row of {} values", self.cols);
                let (tiles, size) = (self.group(r / group), self.format.block_bytes());
                let mut block = [0u8; 64];
                for (tile, out) in tiles
                    .chunks_exact(group * size)
                    .zip(out.chunks_exact_mut(SUB))
                {
                    interleave::gather_block(head, tile, r % group, &mut block[..size]);
                    dequantize(self.format, &block[..size], out);
                }
            }
            _ => dequantize(self.format, self.row_in(r, &mut Vec::new()), out),
        }
    }

    /// The whole matrix dequantised, `[rows, cols]` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        let mut buf = Vec::new();
        for (r, out) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            dequantize(self.format, self.row_in(r, &mut buf), out);
        }
        out
    }
}
