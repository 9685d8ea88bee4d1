//! Quantised matrix products on ggml's blocks, as llama.cpp computes them: the weights stay in
//! their GGUF blocks, activations are quantised to `i8` per block of 32, and each product is
//! integer arithmetic per block scaled by the two scales.
//!
//! - [`BlockFormat`]: the ggml formats (`Q4_0` … `Q8_0`, `Q2_K` … `Q8_K`), [`dequantize`]
//!   (bit-exact with ggml), and one canonical unpacked form ([`Sub32`]) that every format maps
//!   to, so that one product kernel serves all of them; `Q4_0`, `Q4_1` and `Q8_0` (the
//!   commonest) also have kernels that read their blocks in place;
//! - [`QuantizedMatrix`]: a `[rows, cols]` matrix of blocks and its product with activation
//!   rows ([`QuantizedMatrix::matmul`]), in parallel over row ranges;
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

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use dot::{
    dot_blocks, dot_blocks4, dot_panel, dot_row, dot_rows4, quantize_blocks, reads_in_place,
};
pub use dot::{ActBlock, PanelBlock, PANEL};
pub use formats::{dequantize, BlockFormat, Sub32, SUB};

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

/// A `[rows, cols]` matrix stored as ggml blocks, row after row (a GGUF tensor with
/// `dims = [cols, rows]`), borrowed from a shared buffer (a whole GGUF file held once).
#[derive(Debug, Clone)]
pub struct QuantizedMatrix {
    format: BlockFormat,
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
        let expected = cols
            .is_multiple_of(format.block_len())
            .then(|| (cols / format.block_len()).checked_mul(format.block_bytes()))
            .flatten()
            .and_then(|row| row.checked_mul(rows));
        if expected != Some(range.len()) || range.end > data.len() {
            return Err(ShapeError(format!(
                "{} matrix [{rows}, {cols}]: {} bytes at {range:?} of {}; rows must be whole \
                 blocks of {} elements ({} bytes each)",
                format.name(),
                range.len(),
                data.len(),
                format.block_len(),
                format.block_bytes()
            )));
        }
        Ok(Self {
            format,
            data,
            start: range.start,
            rows,
            cols,
        })
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// Rows (outputs of a linear layer).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs of a linear layer).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The blocks.
    pub fn bytes(&self) -> &[u8] {
        &self.data[self.start..self.start + self.rows * self.row_bytes()]
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.format.block_len() * self.format.block_bytes()
    }

    fn row(&self, r: usize) -> &[u8] {
        let size = self.row_bytes();
        &self.data[self.start + r * size..self.start + (r + 1) * size]
    }

    /// Row `r` dequantised into `out` (`cols` values): an embedding lookup.
    ///
    /// # Panics
    /// If `r ≥ rows` or `out` is not `cols` long.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        dequantize(self.format, self.row(r), out);
    }

    /// The whole matrix dequantised, `[rows, cols]` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        dequantize(self.format, self.bytes(), &mut out);
        out
    }

    /// `y = x Wᵀ`: `y[i][r] = Σ_k W[r][k]·x[i][k]` for the `n` rows of `x`, written into `y`
    /// (`[n, rows]`, row-major), on the best [`Path`] of this CPU.
    ///
    /// # Panics
    /// If `x` is not `cols` wide or `y` not `n·rows` long.
    pub fn matmul(&self, x: &ActivationRows, y: &mut [f32]) {
        Self::matmul_fused(Path::detect(), &[self], x, y);
    }

    /// Products of several matrices of one width with the same activations, as one parallel
    /// pass over all their rows (a layer's query, key and value projections): `y` is
    /// `[n, Σ rows]`, each row of `x` followed by the outputs of `parts[0]`, then `parts[1]`...
    /// Work is split over ranges of weight rows on rayon's threads, each task writing its
    /// columns of every row of `y`. `Q4_0`, `Q4_1` and `Q8_0` rows are read in place: four
    /// weight rows per activation row when `x` has one row, four weight rows by panels of
    /// [`PANEL`] activation rows when it has enough rows (3 for `Q4_0`/`Q4_1`, 7 for
    /// `Q8_0`), four activation rows per weight row in between; other formats' rows are
    /// unpacked once and multiplied with every row of `x`.
    ///
    /// # Panics
    /// If a part is not `x`'s width, `y` not `n·Σ rows` long, or `path` not
    /// [`available`](Path::available).
    pub fn matmul_fused(path: Path, parts: &[&Self], x: &ActivationRows, y: &mut [f32]) {
        path.assert_available();
        let total: usize = parts.iter().map(|p| p.rows).sum();
        assert!(
            parts.iter().all(|p| p.cols == x.cols()) && y.len() == x.n() * total,
            "QuantizedMatrix::matmul: [{}, {}] activations, weights {:?}, {} outputs",
            x.n(),
            x.cols(),
            parts.iter().map(|p| [p.rows, p.cols]).collect::<Vec<_>>(),
            y.len()
        );
        let n = x.n();
        if n == 0 || total == 0 {
            return;
        }
        let subs = x.cols() / SUB;
        // Task `t` computes weight rows `t·ROWS_PER_TASK..` (of all parts in turn) into
        // `out[k]`, its columns of row `k` of `y`.
        let task = |t: usize, out: &mut [&mut [f32]]| {
            // Only formats not read in place unpack (allocated on first use: most tasks of
            // most products never need it).
            let mut unpacked = Vec::new();
            let (mut part, mut r) = (0, t * ROWS_PER_TASK);
            let count = out[0].len();
            let mut i = 0;
            while i < count {
                while r >= parts[part].rows {
                    r -= parts[part].rows;
                    part += 1;
                }
                let m = parts[part];
                let in_place = reads_in_place(path, m.format);
                let four_rows = i + 4 <= count && r + 4 <= m.rows;
                if in_place && four_rows && (n == 1 || n >= panel_min_rows(m.format)) {
                    let rows = [m.row(r), m.row(r + 1), m.row(r + 2), m.row(r + 3)];
                    if n == 1 {
                        // One activation row: four weight rows at a time.
                        let four = dot_rows4(path, m.format, rows, x.row(0)).expect("in place");
                        out[0][i..i + 4].copy_from_slice(&four);
                    } else {
                        // Four weight rows by a panel of activation rows at a time.
                        for (p, first) in (0..n).step_by(PANEL).enumerate() {
                            let tile =
                                dot_panel(path, m.format, rows, x.panel(p)).expect("in place");
                            for (c, y_row) in
                                out[first..n.min(first + PANEL)].iter_mut().enumerate()
                            {
                                for (j, lanes) in tile.iter().enumerate() {
                                    y_row[i + j] = lanes[c];
                                }
                            }
                        }
                    }
                    (i, r) = (i + 4, r + 4);
                    continue;
                }
                let row = m.row(r);
                if in_place {
                    // Four activation rows at a time, then one at a time.
                    let mut k = 0;
                    while k + 4 <= n {
                        let xs = [x.row(k), x.row(k + 1), x.row(k + 2), x.row(k + 3)];
                        let four = dot_blocks4(path, m.format, row, xs).expect("in place");
                        for (q, v) in four.into_iter().enumerate() {
                            out[k + q][i] = v;
                        }
                        k += 4;
                    }
                    for k in k..n {
                        out[k][i] = dot_blocks(path, m.format, row, x.row(k)).expect("in place");
                    }
                } else {
                    let per_block = m.format.subs();
                    unpacked.resize(subs, Sub32::default());
                    for (block, dst) in row
                        .chunks_exact(m.format.block_bytes())
                        .zip(unpacked.chunks_exact_mut(per_block))
                    {
                        m.format.unpack(block, dst);
                    }
                    for (k, y_row) in out.iter_mut().enumerate() {
                        y_row[i] = dot_row(path, &unpacked, m.format.offset(), x.row(k));
                    }
                }
                (i, r) = (i + 1, r + 1);
            }
        };
        if n == 1 {
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(t, out)| task(t, &mut [out]));
        } else {
            // Each task's columns of every row of `y` (disjoint slices), task by task in one
            // allocation: task `t`'s are `columns[t·n..(t + 1)·n]`.
            let tasks = total.div_ceil(ROWS_PER_TASK);
            let mut rows: Vec<_> = y
                .chunks_exact_mut(total)
                .map(|y_row| y_row.chunks_mut(ROWS_PER_TASK))
                .collect();
            let mut columns: Vec<&mut [f32]> = Vec::with_capacity(tasks * n);
            for _ in 0..tasks {
                columns.extend(rows.iter_mut().map(|r| r.next().expect("a piece per task")));
            }
            columns
                .par_chunks_mut(n)
                .enumerate()
                .for_each(|(t, out)| task(t, out));
        }
    }
}
