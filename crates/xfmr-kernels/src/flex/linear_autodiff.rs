//! `x·W + b` with `bf16` products as one differentiable operation of `Autodiff<Flex>`
//! ([`linear_bf16_autodiff`]): training with the products of [`linear_bf16`](crate::linear_bf16)
//! forward and backward, the weights, their gradients and the optimiser's state all `f32`
//! ("master weights" in `f32`, as PyTorch's autocast keeps them).
//!
//! With `Y = X·W + b` (`X` `[m, k]`, `W` `[k, n]`) and the incoming gradient `G = ∂ℓ/∂Y`:
//!
//! ```text
//! ∂ℓ/∂X = G·Wᵀ      (inner size n)      ∂ℓ/∂W = Xᵀ·G      (inner size m)
//! ∂ℓ/∂b = Σᵢ Gᵢ     (f32 sums)
//! ```
//!
//! The two products are [`matmul_bf16`](crate::bf16::matmul_bf16)'s, each element within
//! `(2⁻⁷ + 2⁻¹⁶ + (K+1)·2⁻²⁴)·Σ|factors|` of the exact one for its inner size `K`, as the
//! forward. `Wᵀ` is packed from `W`'s storage in place (the packer's transposed path); `Xᵀ`
//! is copied once, transposed in blocks, so that its rows are read as adjacent `f32`; `G` is
//! packed as the second factor of `∂ℓ/∂W`.

use std::mem::MaybeUninit;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor, TensorData};
use rayon::prelude::*;

use super::linear::{matrix_view, strided};
use super::{autodiff_primitive, contiguous, from_autodiff};
use crate::bf16::{matmul_bf16_into, PackedBf16, Strided};
use crate::cpu::Bf16Level;

/// Columns of `a` per task of [`transpose`].
const BLOCK: usize = 32;
/// Rows of `a` per tile of [`transpose`].
const TILE_ROWS: usize = 16;

/// `x·W + b` as burn's `Linear` computes it, with `bf16` products and `f32` sums forward and
/// backward, as one operation of `Autodiff<Flex>`'s graph (the module's docs give the
/// backward). Values equal [`linear_bf16`](crate::linear_bf16)'s.
///
/// Only where [`runs_on_autodiff`](crate::runs_on_autodiff) holds for `x`, `weight` and
/// `bias` (asserted in debug builds); callers choose it where
/// [`has_bf16_products`](crate::cpu::has_bf16_products) holds.
///
/// # Shapes
/// - `x`: `[..., d_in]`
/// - `weight`: `[d_in, d_out]` (any strides: a transposed view is read in place); `bias`:
///   `[d_out]`
/// - output: `[..., d_out]`
pub fn linear_bf16_autodiff<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on_autodiff::<B>(x.dtype())
            && crate::runs_on_autodiff::<B>(weight.dtype())
            && bias
                .as_ref()
                .is_none_or(|b| crate::runs_on_autodiff::<B>(b.dtype())),
        "xfmr_kernels::linear_bf16_autodiff: not Autodiff<Flex> f32 tensors"
    );
    let dims = x.dims();
    let [k, n] = weight.dims();
    assert_eq!(
        dims[D - 1],
        k,
        "linear_bf16_autodiff: x's last dimension is not W's rows"
    );
    let m: usize = dims[..D - 1].iter().product();
    let (x, weight) = (autodiff_primitive(x), autodiff_primitive(weight));
    let bias = bias.map(autodiff_primitive);
    let x_flex = matrix_view(x.primitive.clone());
    let w_flex = matrix_view(weight.primitive.clone());
    let b_flex = bias.as_ref().map(|b| contiguous(b.primitive.clone()));
    let level = Bf16Level::detect();
    let packed = PackedBf16::pack_strided(strided(&w_flex, k, n));
    let out = product(m * n, |out| {
        matmul_bf16_into(
            level,
            strided(&x_flex, m, k),
            &packed,
            b_flex.as_ref().map(|b| b.storage::<f32>()),
            out,
        );
    });
    let mut shape = dims;
    shape[D - 1] = n;
    let out = FlexTensor::from_data(TensorData::new(out, shape));
    let state = Saved {
        x: x_flex,
        w: w_flex,
        x_shape: Shape::from(dims.to_vec()),
        m,
        k,
        n,
    };
    // The node with parents `x`, `W` and `b` if any (burn's node type cannot be named here,
    // so a macro rather than a function over both arities), the state kept when tracked.
    macro_rules! finish {
        ($n:literal, $nodes:expr) => {
            match LinearBackward::<$n>
                .prepare::<NoCheckpointing>($nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        };
    }
    let out = match bias {
        Some(b) => finish!(3, [x.node.clone(), weight.node.clone(), b.node.clone()]),
        None => finish!(2, [x.node.clone(), weight.node.clone()]),
    };
    from_autodiff(out)
}

/// The operation's node in burn's graph, with `N` parents: `x`, `W` and (`N` = 3) `b`.
#[derive(Debug)]
struct LinearBackward<const N: usize>;

/// What the backward pass reads: `x` and `W` as the forward read them (matrix views of their
/// storage) and the sizes.
#[derive(Debug, Clone)]
struct Saved {
    x: FlexTensor,
    w: FlexTensor,
    x_shape: Shape,
    m: usize,
    k: usize,
    n: usize,
}

impl<const N: usize> Backward<Flex, N> for LinearBackward<N> {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = matrix_view(grads.consume::<Flex>(&ops.node));
        let Saved {
            x,
            w,
            x_shape,
            m,
            k,
            n,
        } = ops.state;
        let level = Bf16Level::detect();
        let g = strided(&grad, m, n);
        let wanted = |i: usize| ops.parents.get(i).is_some_and(Option::is_some);
        let mut out: [Option<FlexTensor>; 3] = [None, None, None];
        if wanted(0) {
            // ∂ℓ/∂X = G·Wᵀ: Wᵀ is `W`'s storage with the strides swapped.
            let w = strided(&w, k, n);
            let wt = Strided {
                rows: n,
                cols: k,
                row_stride: w.col_stride,
                col_stride: w.row_stride,
                ..w
            };
            let wt = PackedBf16::pack_strided(wt);
            let dx = product(m * k, |dx| matmul_bf16_into(level, g, &wt, None, dx));
            out[0] = Some(FlexTensor::from_data(TensorData::new(dx, x_shape)));
        }
        if wanted(1) {
            // ∂ℓ/∂W = Xᵀ·G: Xᵀ copied row-major (its rows are X's columns).
            let xt = transpose(strided(&x, m, k));
            let g_packed = PackedBf16::pack_strided(g);
            let xt = Strided::row_major(&xt, k, m);
            let dw = product(k * n, |dw| matmul_bf16_into(level, xt, &g_packed, None, dw));
            out[1] = Some(FlexTensor::from_data(TensorData::new(dw, [k, n])));
        }
        if wanted(2) {
            out[2] = Some(FlexTensor::from_data(TensorData::new(column_sums(g), [n])));
        }
        for (node, grad) in ops.parents.into_iter().zip(out) {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

/// A new vector of `len` values written by `matmul`, a call of
/// [`matmul_bf16_into`] (which writes every element of its output) on the vector's spare
/// capacity: the buffer is not zeroed first. The zeroing of each new product was 3–5% of an lm
/// training step's samples (docs/training.md): a written-once buffer of megabytes, zeroed
/// in memory first.
#[allow(unsafe_code)]
fn product(len: usize, matmul: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    matmul(&mut out.spare_capacity_mut()[..len]);
    // SAFETY: the closure is a call of `matmul_bf16_into` (this function's callers, all in
    // this file), which writes every element of the slice it is given.
    unsafe { out.set_len(len) };
    out
}

/// `a`'s transpose, row-major (`[a.cols, a.rows]`), in parallel over blocks of 32 of `a`'s
/// columns: each block read 16 rows at a time into a small tile (adjacent reads) and written
/// from it column by column (adjacent writes).
#[allow(unsafe_code)]
fn transpose(a: Strided<'_>) -> Vec<f32> {
    let (rows, cols) = (a.rows, a.cols);
    let mut out = Vec::with_capacity(rows * cols);
    if rows == 0 || cols == 0 {
        return out;
    }
    out.spare_capacity_mut()[..rows * cols]
        .par_chunks_mut(BLOCK * rows)
        .enumerate()
        .for_each(|(jb, dst)| {
            let j0 = jb * BLOCK;
            let width = dst.len() / rows;
            let mut tile = [[0f32; BLOCK]; TILE_ROWS];
            for i0 in (0..rows).step_by(TILE_ROWS) {
                let height = (rows - i0).min(TILE_ROWS);
                for (r, line) in tile.iter_mut().enumerate().take(height) {
                    match a.row_part(i0 + r, j0, width) {
                        // A whole block: a copy of known length, inlined (a call of `memcpy`
                        // per 128 bytes was 4.5% of an lm step's samples).
                        Some(src) if width == BLOCK => {
                            *line = src.try_into().expect("a block of BLOCK columns");
                        }
                        Some(src) => line[..width].copy_from_slice(src),
                        None => {
                            for (j, v) in line[..width].iter_mut().enumerate() {
                                *v = a.get(i0 + r, j0 + j);
                            }
                        }
                    }
                }
                for j in 0..width {
                    let column = &mut dst[j * rows + i0..][..height];
                    for (r, v) in column.iter_mut().enumerate() {
                        v.write(tile[r][j]);
                    }
                }
            }
        });
    // SAFETY: the chunks cover `rows · cols` elements, `width` columns of `rows` each, and
    // every column `j < width` is written over rows `i0..i0 + height` for every `i0`, which
    // cover `0..rows`.
    unsafe { out.set_len(rows * cols) };
    out
}

/// The sums of `g`'s columns in `f32`, over blocks of rows in parallel, the blocks' sums added
/// in block order.
fn column_sums(g: Strided<'_>) -> Vec<f32> {
    let rows_per_task = (16 * 1024 / g.cols.max(1)).max(1);
    let partials: Vec<Vec<f32>> = (0..g.rows)
        .step_by(rows_per_task)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|i0| {
            let mut sums = vec![0f32; g.cols];
            for i in i0..(i0 + rows_per_task).min(g.rows) {
                match g.row_part(i, 0, g.cols) {
                    Some(row) => sums.iter_mut().zip(row).for_each(|(s, v)| *s += v),
                    None => sums
                        .iter_mut()
                        .enumerate()
                        .for_each(|(j, s)| *s += g.get(i, j)),
                }
            }
            sums
        })
        .collect();
    let mut sums = vec![0f32; g.cols];
    for partial in &partials {
        for (s, p) in sums.iter_mut().zip(partial) {
            *s += p;
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `transpose` writes every element of its new buffer with `a`'s transpose, for shapes with
    /// partial blocks of columns and partial tiles of rows, a view whose rows have a gap
    /// between them (whole blocks read as one copy, the rest element by element), a
    /// transposed view, and empty shapes.
    #[test]
    fn transpose_writes_every_element_of_the_transpose() {
        for (rows, cols) in [(37, 70), (16, 32), (1, 1), (50, 64), (0, 5), (5, 0)] {
            let gap = 3;
            let buffer: Vec<f32> = (0..5 + rows * (cols + gap)).map(|i| i as f32).collect();
            let at = |i: usize, j: usize| buffer[5 + i * (cols + gap) + j];
            let gapped = Strided {
                data: &buffer,
                offset: 5,
                rows,
                cols,
                row_stride: cols + gap,
                col_stride: 1,
            };
            let want: Vec<f32> = (0..rows * cols).map(|t| at(t % rows, t / rows)).collect();
            assert_eq!(transpose(gapped), want, "[{rows}, {cols}] with gaps");
            // The same matrix through a transposed view of its transpose.
            let flipped = Strided {
                data: &want,
                offset: 0,
                rows,
                cols,
                row_stride: 1,
                col_stride: rows,
            };
            assert_eq!(transpose(flipped), want, "[{rows}, {cols}] transposed view");
        }
    }
}
