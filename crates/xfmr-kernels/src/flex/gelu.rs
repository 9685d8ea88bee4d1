//! Exact GELU on flex tensors: [`gelu_in_place`](crate::gelu_in_place) over parallel chunks.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

/// Elements per parallel task.
const CHUNK: usize = 16 * 1024;

/// Exact GELU `½ x (1 + erf(x / √2))` on the host, in parallel chunks of
/// [`gelu_in_place`](crate::gelu_in_place) (Abramowitz and Stegun's 7.1.26 for `erf`, absolute
/// error ≤ 1.5e-7, vectorised for the CPU's widest registers), in place on the tensor's own
/// buffer: `into_data` (no copy when nothing else holds it), `as_mut_slice`, `from_data`.
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
    let mut data = x.into_data();
    data.as_mut_slice::<f32>()
        .expect("runs_on: an f32 tensor")
        .par_chunks_mut(CHUNK)
        .for_each(crate::gelu::gelu_in_place);
    Tensor::from_data(data, (&device, DType::F32))
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
