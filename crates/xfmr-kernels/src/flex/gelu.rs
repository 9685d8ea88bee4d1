//! Exact GELU on the host, vectorised: burn computes it with one scalar libm `erff` call per
//! element.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

use crate::exp::exp_nonpositive;

/// Elements per parallel task.
const CHUNK: usize = 16 * 1024;

/// Exact GELU `½ x (1 + erf(x / √2))` on the host, in parallel chunks, with Abramowitz and
/// Stegun's 7.1.26 for `erf` (absolute error ≤ 1.5e-7, the formula of PyTorch's own vectorised
/// CPU `erf`). Reads the tensor back with `into_data` and returns it with `from_data`.
///
/// Only where [`runs_on`](crate::runs_on) holds for `x` (asserted in debug builds).
///
/// # Shapes
/// Any; the output has the input's shape.
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on::<B>(x.dtype()),
        "xfmr_kernels::gelu: not a flex f32 tensor"
    );
    let device = x.device();
    let shape = x.shape();
    let mut values = x
        .into_data()
        .into_vec::<f32>()
        .expect("runs_on: an f32 tensor");
    values.par_chunks_mut(CHUNK).for_each(|chunk| {
        chunk.iter_mut().for_each(|v| *v = gelu_scalar(*v));
    });
    Tensor::from_data(TensorData::new(values, shape), &device)
}

/// `½ x (1 + erf(x / √2))`, branch-free so that it vectorises.
#[inline(always)]
fn gelu_scalar(x: f32) -> f32 {
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

#[cfg(test)]
mod tests {
    use burn::backend::{Flex, NdArray};
    use burn::tensor::{DType, Tensor};

    /// The kernel on flex against burn's libm-based `gelu` on ndarray, every 1e-3 over
    /// [-12, 12] and at +∞, ±0, ±1e-30: within 1e-6 absolute plus 2e-7 relative (the kernel's
    /// `erf` is within 1.5e-7 absolute; `x` scales it).
    #[test]
    fn gelu_matches_libm() {
        assert!(crate::runs_on::<Flex>(DType::F32));
        let mut xs: Vec<f32> = (-12_000..=12_000).map(|i| i as f32 * 1e-3).collect();
        xs.extend([0.0, -0.0, f32::INFINITY, 1e-30, -1e-30]);
        let n = xs.len();
        let kernel: Vec<f32> = super::gelu(
            Tensor::<Flex, 1>::from_floats(xs.as_slice(), &Default::default()).reshape([1, n]),
        )
        .into_data()
        .to_vec()
        .unwrap();
        let reference: Vec<f32> = burn::tensor::activation::gelu(
            Tensor::<NdArray, 1>::from_floats(xs.as_slice(), &Default::default()),
        )
        .into_data()
        .to_vec()
        .unwrap();
        for ((x, got), want) in xs.iter().zip(&kernel).zip(&reference) {
            if want.is_infinite() {
                assert_eq!(got, want, "gelu({x})");
                continue;
            }
            assert!(
                (got - want).abs() <= 1e-6 + 2e-7 * want.abs(),
                "gelu({x}) = {got}, libm gives {want}"
            );
        }
    }
}
