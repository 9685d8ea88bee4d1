//! Host kernels for the `flex` CPU backend (feature `flex`): element-wise functions that burn
//! computes one scalar libm call at a time, vectorised here.
//!
//! They run on `burn::backend::Flex` itself (f32, not under `Autodiff`: xfmr-attention's
//! check), read the tensor back with `into_data` and return it with `from_data`, both public
//! burn API: no `unsafe`, and every other backend keeps the generic path.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use xfmr_attention::exp_nonpositive;

/// Elements per parallel task.
const CHUNK: usize = 16 * 1024;

/// Exact GELU `½ x (1 + erf(x / √2))` on the host, in parallel chunks. Only where
/// [`AttentionKernel::cpu_supported`](xfmr_attention::AttentionKernel::cpu_supported) holds
/// (`burn::backend::Flex` itself, f32, not under `Autodiff`).
pub(crate) fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let device = x.device();
    let shape = x.shape();
    let mut values = x
        .into_data()
        .into_vec::<f32>()
        .expect("cpu_supported checked f32");
    values.par_chunks_mut(CHUNK).for_each(|chunk| {
        chunk.iter_mut().for_each(|v| *v = gelu_scalar(*v));
    });
    Tensor::from_data(TensorData::new(values, shape), &device)
}

/// `½ x (1 + erf(x / √2))` with Abramowitz and Stegun's 7.1.26 for `erf` (absolute error
/// ≤ 1.5e-7, the formula of PyTorch's own vectorised CPU `erf`), branch-free so that it
/// vectorises.
#[inline(always)]
pub(crate) fn gelu_scalar(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = ((((A[4] * t + A[3]) * t + A[2]) * t + A[1]) * t + A[0]) * t;
    let erf_abs = 1.0 - poly * exp_nonpositive(-a * a);
    let erf = erf_abs.copysign(z);
    0.5 * x * (1.0 + erf)
}
