//! LayerNorm and RMSNorm on flex tensors: [`norm_rows`](crate::norm_rows) over parallel blocks
//! of rows.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

use crate::norm::{norm_rows, RowNorm};

/// Values per parallel task, at least (whole rows).
const CHUNK: usize = 16 * 1024;

/// LayerNorm (`beta` given or not, `rms` false) or RMSNorm (`rms` true, `beta` ignored) over
/// the last dimension of `x`, scaled by `gamma`: [`norm_rows`](crate::norm_rows) on blocks of
/// rows in parallel, each row normalised while it sits in L1, in place on the tensor's own
/// buffer: `into_data` (no copy when nothing else holds it), `as_mut_slice`, `from_data`.
///
/// Only where [`runs_on`](crate::runs_on) holds for `x`, `gamma` and `beta` (asserted in
/// debug builds).
///
/// # Shapes
/// - `x`: `[..., d]`
/// - `gamma`, `beta`: `[d]`
/// - output: `x`'s shape
///
/// # Panics
/// If `gamma` or `beta` is not as long as `x`'s last dimension.
pub fn norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
    rms: bool,
) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on::<B>(x.dtype())
            && crate::runs_on::<B>(gamma.dtype())
            && beta.as_ref().is_none_or(|b| crate::runs_on::<B>(b.dtype())),
        "xfmr_kernels::norm: not flex f32 tensors"
    );
    let device = x.device();
    let width = x.dims()[D - 1];
    let host = |t: Tensor<B, 1>| {
        t.into_data()
            .into_vec::<f32>()
            .expect("runs_on: an f32 tensor")
    };
    let gamma = host(gamma);
    let beta = if rms { None } else { beta.map(host) };
    assert_eq!(gamma.len(), width, "norm: γ against rows of {width}");
    let norm = if rms {
        RowNorm::Rms
    } else {
        RowNorm::Layer {
            beta: beta.as_deref(),
        }
    };
    let rows_per_task = (CHUNK / width.max(1)).max(1);
    let mut data = x.into_data();
    data.as_mut_slice::<f32>()
        .expect("runs_on: an f32 tensor")
        .par_chunks_mut(rows_per_task * width.max(1))
        .for_each(|rows| norm_rows(rows, &gamma, norm, eps as f32));
    Tensor::from_data(data, (&device, DType::F32))
}
