//! The interleaved layout of `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` matrices: the blocks of [`GROUP`]
//! weight rows side by side, so that one vector instruction multiplies sixteen rows at once
//! (llama.cpp's CPU "repack" of `Q4_0` into `block_q4_0x8`, here for sixteen rows and the
//! legacy formats whose kernels read blocks in place).
//!
//! A matrix's rows are taken in groups of [`GROUP`]; the rows past the last whole group stay
//! as they are. Group `g` occupies the same bytes as its rows did (`16·row_bytes` from
//! `16·g·row_bytes`), as one *tile* per block column `i` (`16·block_bytes` bytes from
//! `i·16·block_bytes`), and a tile holds, for `S`-byte blocks made of an `H`-byte header of
//! `f16` scales and `S − H` bytes of quants:
//!
//! - each `f16` of the header in turn for the sixteen rows: `d` of rows 0..16 (32 bytes),
//!   then `Q4_1`'s `m` of rows 0..16;
//! - the quants by dword: dword `k` (bytes `4k..4k+4` of the block's quants) of rows 0..16
//!   (64 bytes), for `k` in `0..(S − H)/4`.
//!
//! So the layout is a permutation of the bytes within each group (the same size, made in
//! place, undone by [`gather_row`]), the scales of sixteen rows are one 256-bit load
//! (converted by one `vcvtph2ps`), and dword `k` of sixteen rows is one 512-bit load: with a
//! broadcast activation dword, one `vpdpbusd` advances sixteen dot products (`Q4_0`/`Q4_1`
//! nibbles: the low ones are elements `4k..4k+4`, the high ones `16+4k..`). `Q5_0`'s quants
//! begin with its fifth bits `qh` (one dword: its dword 0 is the `qh` of sixteen rows), then
//! its nibbles as `Q4_0`'s (dwords 1..5).

use super::formats::BlockFormat;
use crate::cpu::DotLevel;

/// Weight rows per interleaved group.
pub const GROUP: usize = 16;

/// How a [`QuantizedMatrix`](super::QuantizedMatrix)'s blocks are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// ggml's: row after row, each row its blocks in order (as in a GGUF file).
    #[default]
    Rows,
    /// Groups of [`GROUP`] rows interleaved block by block (this module's docs); the rows past
    /// the last whole group as in [`Rows`](Self::Rows). `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` only.
    Interleaved,
}

impl Layout {
    /// The layout whose products are fastest for `format` on `path`:
    /// [`Interleaved`](Self::Interleaved) where `path` has the kernel of interleaved groups
    /// (AVX-512 VNNI, for `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0`), [`Rows`](Self::Rows) elsewhere
    /// (the other paths would gather interleaved rows back first).
    pub fn fastest(path: DotLevel, format: BlockFormat) -> Self {
        match super::dot::has_group_kernel(path, format) {
            true => Self::Interleaved,
            false => Self::Rows,
        }
    }
}

/// Header bytes (the `f16` scales) of a block of `format`, when it has an interleaved layout.
pub(super) const fn header(format: BlockFormat) -> Option<usize> {
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 => Some(2),
        BlockFormat::Q4_1 => Some(4),
        _ => None,
    }
}

/// Whether `format` has the interleaved layout (`Q4_0`, `Q4_1`, `Q5_0`, `Q8_0`).
pub const fn interleavable(format: BlockFormat) -> bool {
    header(format).is_some()
}

/// Where byte `j` of row `r`'s block (`r < GROUP`) lies in the block column's tile.
#[inline]
fn tile_offset(head: usize, r: usize, j: usize) -> usize {
    if j < head {
        32 * (j / 2) + 2 * r + j % 2
    } else {
        let q = j - head;
        GROUP * head + 64 * (q / 4) + 4 * r + q % 4
    }
}

/// Permutes the blocks of a `[rows, cols]` matrix of `format` from [`Layout::Rows`] to
/// [`Layout::Interleaved`], in place (one group's bytes copied aside at a time).
///
/// # Panics
/// If `format` has no interleaved layout, `cols` is not whole blocks or `bytes` is not the
/// matrix's size (callers check the shape first: [`QuantizedMatrix`](super::QuantizedMatrix)).
pub fn interleave(format: BlockFormat, bytes: &mut [u8], rows: usize, cols: usize) {
    let (head, size, per_row) = geometry(format, bytes.len(), rows, cols);
    if per_row == 0 || rows < GROUP {
        return; // no whole group (or rows of no blocks): nothing moves
    }
    let mut group = vec![0u8; GROUP * per_row * size];
    for dst in bytes.chunks_exact_mut(GROUP * per_row * size) {
        group.copy_from_slice(dst);
        for (r, row) in group.chunks_exact(per_row * size).enumerate() {
            for (i, block) in row.chunks_exact(size).enumerate() {
                let tile = &mut dst[i * GROUP * size..(i + 1) * GROUP * size];
                for (j, &b) in block.iter().enumerate() {
                    tile[tile_offset(head, r, j)] = b;
                }
            }
        }
    }
}

/// Row `r` of an interleaved `[rows, cols]` matrix of `format`, in ggml's layout, into `out`
/// (`cols / 32` blocks of bytes): the inverse of [`interleave`] for one row.
///
/// # Panics
/// As [`interleave`]; if `r ≥ rows` or `out` is not one row's bytes.
pub fn gather_row(
    format: BlockFormat,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    r: usize,
    out: &mut [u8],
) {
    let (head, size, per_row) = geometry(format, bytes.len(), rows, cols);
    assert!(
        r < rows && out.len() == per_row * size,
        "gather_row: row {r} of {rows} into {} bytes",
        out.len()
    );
    let row_bytes = per_row * size;
    let whole = rows / GROUP * GROUP;
    if r >= whole {
        out.copy_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
        return;
    }
    let group = &bytes[r / GROUP * GROUP * row_bytes..];
    for (i, block) in out.chunks_exact_mut(size).enumerate() {
        gather_block(
            head,
            &group[i * GROUP * size..(i + 1) * GROUP * size],
            r % GROUP,
            block,
        );
    }
}

/// Row `r`'s block (`r < GROUP`, `out` one block's bytes) from a tile of an interleaved
/// group whose blocks have `head` header bytes.
pub(super) fn gather_block(head: usize, tile: &[u8], r: usize, out: &mut [u8]) {
    for (j, b) in out.iter_mut().enumerate() {
        *b = tile[tile_offset(head, r, j)];
    }
}

/// `(header bytes, block bytes, blocks per row)`, after checking the sizes.
fn geometry(format: BlockFormat, len: usize, rows: usize, cols: usize) -> (usize, usize, usize) {
    let head =
        header(format).unwrap_or_else(|| panic!("{} has no interleaved layout", format.name()));
    let size = format.block_bytes();
    assert!(
        cols.is_multiple_of(format.block_len()) && len == rows * cols / format.block_len() * size,
        "{} matrix [{rows}, {cols}] in {len} bytes",
        format.name()
    );
    (head, size, cols / format.block_len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Interleaving moves every byte of a whole group exactly once (a permutation), keeps
    /// the rows past the last group, and [`gather_row`] gives every row back, for each
    /// format and for row counts below, at and past a group.
    #[test]
    fn interleave_is_a_permutation_that_gather_row_undoes() {
        for format in [
            BlockFormat::Q4_0,
            BlockFormat::Q4_1,
            BlockFormat::Q5_0,
            BlockFormat::Q8_0,
        ] {
            for (rows, cols) in [(3, 96), (16, 96), (37, 96), (20, 0)] {
                let row_bytes = cols / 32 * format.block_bytes();
                let original: Vec<u8> = (0..rows * row_bytes)
                    .map(|i| (i * 7 + i / 251) as u8)
                    .collect();
                let mut bytes = original.clone();
                interleave(format, &mut bytes, rows, cols);
                let whole = rows / GROUP * GROUP * row_bytes;
                assert_eq!(
                    bytes[whole..],
                    original[whole..],
                    "{format:?}: the tail moved"
                );
                let mut sorted = (bytes[..whole].to_vec(), original[..whole].to_vec());
                sorted.0.sort_unstable();
                sorted.1.sort_unstable();
                assert_eq!(sorted.0, sorted.1, "{format:?}: not a permutation");
                if rows >= GROUP && cols > 0 {
                    assert_ne!(bytes[..whole], original[..whole], "{format:?}: unchanged");
                }
                let mut row = vec![0u8; row_bytes];
                for r in 0..rows {
                    gather_row(format, &bytes, rows, cols, r, &mut row);
                    assert_eq!(row, original[r * row_bytes..(r + 1) * row_bytes], "row {r}");
                }
            }
        }
    }
}
