//! `x·W + b` with `bf16` products on flex tensors: [`linear_bf16`] over
//! [`matmul_bf16`](crate::bf16::matmul_bf16).

use burn::backend::flex::FlexTensor;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};

use super::same;
use crate::bf16::{matmul_bf16_on, PackedBf16, Strided};
use crate::cpu::Bf16Level;

/// `x·W + b` as burn's `Linear` computes it, with the products in `bf16` and the sums in `f32`
/// ([`bf16`](crate::bf16)'s bound per element), on the best
/// [`Bf16Level`](crate::cpu::Bf16Level) this CPU has. The weight is packed for each call (one
/// pass over it; a product reads it once per 32 rows of `x`), so there is no cache to go stale
/// when the weights change. Both are read in place through their strides (a weight loaded
/// from PyTorch's `[out, in]` is a transposed view), copied only where `x`'s leading
/// dimensions do not merge into one row index.
///
/// Only where [`runs_on`](crate::runs_on) holds for `x` (asserted in debug builds); callers
/// choose it where [`has_bf16_products`](crate::cpu::has_bf16_products) holds (elsewhere it is
/// slower than the `f32` product).
///
/// # Shapes
/// - `x`: `[..., d_in]`
/// - `weight`: `[d_in, d_out]`; `bias`: `[d_out]`
/// - output: `[..., d_out]`
pub fn linear_bf16<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on::<B>(x.dtype()),
        "xfmr_kernels::linear_bf16: not a flex f32 tensor"
    );
    let dims = x.dims();
    let [k, n] = weight.dims();
    assert_eq!(
        dims[D - 1],
        k,
        "linear_bf16: x's last dimension is not W's rows"
    );
    let m = dims[..D - 1].iter().product();
    let flex = |t: B::FloatTensorPrimitive| same::<_, FlexTensor>(t);
    let x = matrix_view(flex(x.into_primitive().tensor()));
    let weight = matrix_view(flex(weight.into_primitive().tensor()));
    let bias = bias.map(|b| super::contiguous(flex(b.into_primitive().tensor())));
    let packed = PackedBf16::pack_strided(strided(&weight, k, n));
    let mut out = vec![0f32; m * n];
    matmul_bf16_on(
        Bf16Level::detect(),
        strided(&x, m, k),
        &packed,
        bias.as_ref().map(|b| b.storage::<f32>()),
        &mut out,
    );
    let mut shape = dims;
    shape[D - 1] = n;
    let out = FlexTensor::from_data(TensorData::new(out, shape));
    Tensor::from_primitive(TensorPrimitive::Float(same::<
        FlexTensor,
        B::FloatTensorPrimitive,
    >(out)))
}

/// `t` itself where its elements form a matrix `[rows, cols]` with one stride per axis (its
/// leading dimensions merge into the rows; no negative stride), else a contiguous copy.
pub(super) fn matrix_view(t: FlexTensor) -> FlexTensor {
    let layout = t.layout();
    let dims = layout.shape().to_vec();
    let strides = layout.strides();
    // The leading dimensions larger than one (a dimension of one may carry any stride), outer
    // first: each must step over the whole of the next.
    let leading: Vec<(usize, isize)> = (0..dims.len().saturating_sub(1))
        .filter(|&i| dims[i] > 1)
        .map(|i| (dims[i], strides[i]))
        .collect();
    let merges = strides.iter().all(|&s| s >= 0)
        && leading
            .windows(2)
            .all(|p| p[0].1 == p[1].1 * p[1].0 as isize);
    if merges {
        t
    } else {
        t.to_contiguous()
    }
}

/// `t` (checked by [`matrix_view`]) as a `[rows, cols]` view of its storage.
pub(super) fn strided(t: &FlexTensor, rows: usize, cols: usize) -> Strided<'_> {
    let layout = t.layout();
    let strides = layout.strides();
    let d = strides.len();
    // The merged row stride: the innermost leading dimension's that is larger than one (none:
    // one row, any stride).
    let dims = layout.shape().to_vec();
    let row_stride = (0..d.saturating_sub(1))
        .rev()
        .find(|&i| dims[i] > 1)
        .map_or(0, |i| strides[i] as usize);
    Strided {
        data: t.storage::<f32>(),
        offset: layout.start_offset(),
        rows,
        cols,
        row_stride,
        col_stride: if d == 0 { 1 } else { strides[d - 1] as usize },
    }
}
