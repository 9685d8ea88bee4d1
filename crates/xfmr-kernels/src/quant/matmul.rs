//! The products of [`QuantizedMatrix`]: one parallel pass over the weight rows of one or
//! several matrices, each task choosing the kernel its rows and the activations' count call
//! for.

use rayon::prelude::*;

use super::dot::{
    dot_blocks, dot_blocks4, dot_group, dot_kpanels, dot_ktile, dot_panel, dot_row, dot_rows4,
    has_group_kernel, has_ktile, reads_in_place, ActBlock, PANEL,
};
use super::formats::BlockFormat;
use super::interleave::{Layout, GROUP};
use super::{
    panel_min_rows, ActivationRows, Path, QuantizedMatrix, Sub32, PANEL_MIN_ROWS, ROWS_PER_TASK,
    SUB,
};
use crate::cpu::DotLevel;

impl QuantizedMatrix {
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
    /// columns of every row of `y`. `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` rows are read in place: four
    /// weight rows per activation row when `x` has one row, four weight rows by panels of
    /// [`PANEL`] activation rows when it has enough rows (3 for `Q4_0`/`Q4_1`, 7 for
    /// `Q8_0`), four activation rows per weight row in between; `Q4_K`, `Q5_K` and `Q6_K`
    /// rows are read in place too, four weight rows by every panel at once (from 3 activation
    /// rows) or by the one or two activation rows there are; other formats' rows are unpacked
    /// once and
    /// multiplied with every row of `x`. Interleaved matrices
    /// ([`Layout::Interleaved`]) take sixteen weight rows by up to four activation rows at a
    /// time on AVX-512 VNNI; on the other paths (and for their rows past the last group)
    /// their rows are gathered back into ggml's layout first.
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
            // Rows of interleaved matrices gathered back into ggml's layout, where no kernel
            // reads the groups (allocated on first use too).
            let mut gathered: [Vec<u8>; 4] = Default::default();
            // The panels' sums of four K-quant rows (allocated on first use too).
            let mut ktiles = Vec::new();
            let (mut part, mut r) = (0, t * ROWS_PER_TASK);
            let count = out[0].len();
            let mut i = 0;
            while i < count {
                while r >= parts[part].rows {
                    r -= parts[part].rows;
                    part += 1;
                }
                let m = parts[part];
                if m.layout == Layout::Interleaved
                    && has_group_kernel(path, m.format)
                    && r.is_multiple_of(GROUP)
                    && r + GROUP <= m.rows / GROUP * GROUP
                    && i + GROUP <= count
                {
                    // A whole group: sixteen weight rows by up to four activation rows.
                    let tiles = m.group(r / GROUP);
                    let mut k = 0;
                    macro_rules! rows_of {
                        ($n:literal) => {{
                            let xs: [&[ActBlock]; $n] = std::array::from_fn(|c| x.row(k + c));
                            let sums = dot_group(path, m.format, tiles, xs).expect("group kernel");
                            for (c, sums) in sums.iter().enumerate() {
                                out[k + c][i..i + GROUP].copy_from_slice(sums);
                            }
                            k += $n;
                        }};
                    }
                    while k < n {
                        match n - k {
                            1 => rows_of!(1),
                            2 => rows_of!(2),
                            3 => rows_of!(3),
                            _ => rows_of!(4),
                        }
                    }
                    (i, r) = (i + GROUP, r + GROUP);
                    continue;
                }
                let in_place = reads_in_place(path, m.format);
                let four_rows = i + 4 <= count && r + 4 <= m.rows;
                if in_place && four_rows && (n == 1 || n >= panel_min_rows(m.format)) {
                    let rows = m.rows4_in(r, &mut gathered);
                    if n == 1 {
                        // One activation row: four weight rows at a time.
                        let four = dot_rows4(path, m.format, rows, x.row(0)).expect("in place");
                        out[0][i..i + 4].copy_from_slice(&four);
                    } else {
                        // Four weight rows by a panel of activation rows at a time.
                        for (p, first) in (0..n).step_by(PANEL).enumerate() {
                            let tile =
                                dot_panel(path, m.format, rows, x.panel(p)).expect("in place");
                            put_panel(out, first, i, &tile);
                        }
                    }
                    (i, r) = (i + 4, r + 4);
                    continue;
                }
                if has_ktile(path, m.format) {
                    // The K-quants read in place: four weight rows (or the last one by
                    // one) by panels of activation rows when there are enough, else by up to
                    // four activation rows at a time.
                    if four_rows {
                        let rows = m.rows4_in(r, &mut gathered);
                        if n >= PANEL_MIN_ROWS {
                            // Every panel at once (each block decoded once for all of them).
                            ktiles.resize(n.div_ceil(PANEL), [[0.0; PANEL]; 4]);
                            let done = dot_kpanels(path, m.format, rows, x.panels(), &mut ktiles);
                            assert!(done, "a K-quant panel kernel");
                            for (p, tile) in ktiles.iter().enumerate() {
                                put_panel(out, p * PANEL, i, tile);
                            }
                        } else {
                            ktile_rows(path, m.format, rows, x, out, i);
                        }
                        (i, r) = (i + 4, r + 4);
                    } else {
                        ktile_rows(path, m.format, [m.row_in(r, &mut gathered[0])], x, out, i);
                        (i, r) = (i + 1, r + 1);
                    }
                    continue;
                }
                let row = m.row_in(r, &mut gathered[0]);
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

/// The `R` weight rows `rows` of a `Q4_K`, `Q5_K` or `Q6_K` matrix times every row of `x`,
/// into `out[k][i..i + R]` (`out[k]` the task's columns of row `k` of `y`): tiles of four
/// activation rows, then the rest.
fn ktile_rows<const R: usize>(
    path: DotLevel,
    format: BlockFormat,
    rows: [&[u8]; R],
    x: &ActivationRows,
    out: &mut [&mut [f32]],
    i: usize,
) {
    fn tile<const R: usize, const C: usize>(
        (path, format, rows): (DotLevel, BlockFormat, [&[u8]; R]),
        x: &ActivationRows,
        out: &mut [&mut [f32]],
        (i, k): (usize, usize),
    ) -> usize {
        let xs: [&[ActBlock]; C] = std::array::from_fn(|c| x.row(k + c));
        let sums = dot_ktile(path, format, rows, xs).expect("a K-quant tile");
        for (c, sums) in sums.iter().enumerate() {
            out[k + c][i..i + R].copy_from_slice(sums);
        }
        C
    }
    let (n, what) = (x.n(), (path, format, rows));
    let mut k = 0;
    while k < n {
        k += match n - k {
            1 => tile::<R, 1>(what, x, out, (i, k)),
            2 => tile::<R, 2>(what, x, out, (i, k)),
            3 => tile::<R, 3>(what, x, out, (i, k)),
            _ => tile::<R, 4>(what, x, out, (i, k)),
        };
    }
}

/// The products of four weight rows (`tile[j][c]`: row `j` times activation row `first + c`)
/// into columns `i..i + 4` of the rows `first..` of `out` (the task's columns of `y`), as many
/// as the panel has real rows.
fn put_panel(out: &mut [&mut [f32]], first: usize, i: usize, tile: &[[f32; PANEL]; 4]) {
    let end = out.len().min(first + PANEL);
    for (c, y_row) in out[first..end].iter_mut().enumerate() {
        for (j, lanes) in tile.iter().enumerate() {
            y_row[i + j] = lanes[c];
        }
    }
}
