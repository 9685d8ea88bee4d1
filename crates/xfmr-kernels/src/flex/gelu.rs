//! Exact GELU on flex tensors: [`gelu_in_place`](crate::gelu_in_place) over parallel chunks
//! ([`gelu`]), and under `Autodiff<Flex>` as one operation of the graph whose backward is
//! [`gelu_backward_in_place`](crate::gelu_backward_in_place) ([`gelu_autodiff`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::{autodiff_primitive, contiguous, from_autodiff};
use crate::gelu::{gelu_backward_in_place, gelu_in_place, gelu_into};

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
        .for_each(gelu_in_place);
    Tensor::from_data(data, (&device, DType::F32))
}

/// Exact GELU as one differentiable operation of `Autodiff<Flex>`: the forward of [`gelu`]
/// into a new buffer (the input is the backward pass's state), the backward
/// `∂ℓ/∂x = ∂ℓ/∂y · (Φ(x) + x φ(x))` in one pass over the incoming gradient's buffer
/// ([`gelu_backward_in_place`](crate::gelu_backward_in_place)). burn's autodiff of the composed
/// `x · ½(1 + erf(x/√2))` (the exact gradient; burn's own `gelu` backward is the tanh
/// approximation's) makes four whole-tensor passes forward and about a dozen backward, with a
/// scalar libm `erff` and `expf` per element.
///
/// Only where [`runs_on_autodiff`](crate::runs_on_autodiff) holds for `x` (asserted in debug
/// builds).
///
/// # Shapes
/// Any; the output has the input's shape.
pub fn gelu_autodiff<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on_autodiff::<B>(x.dtype()),
        "xfmr_kernels::gelu_autodiff: not an Autodiff<Flex> f32 tensor"
    );
    let tensor = autodiff_primitive(x);
    let input = contiguous(tensor.primitive.clone());
    let shape = input.layout().shape().clone();
    let out = gelu_of(input.storage::<f32>());
    let out = FlexTensor::from_data(TensorData::new(out, shape));
    let out = match GeluBackward
        .prepare::<NoCheckpointing>([tensor.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(input, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    from_autodiff(out)
}

/// GELU of `src` into a new buffer, in parallel chunks, written once (not zeroed, not a copy
/// of `src` first).
#[allow(unsafe_code)]
fn gelu_of(src: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(src.len());
    out.spare_capacity_mut()[..src.len()]
        .par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(dst, src)| gelu_into(src, dst));
    // SAFETY: the chunks cover the first `src.len()` elements, and `gelu_into` writes every
    // element of its chunk.
    unsafe { out.set_len(src.len()) };
    out
}

/// The operation's node in burn's graph; its state is the input `x`.
#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let Some(parent) = parent else { return };
        let x = ops.state;
        // Copy-on-write: a copy only when another tensor shares the incoming gradient.
        let mut grad = contiguous(grad);
        grad.storage_mut::<f32>()
            .par_chunks_mut(CHUNK)
            .zip(x.storage::<f32>().par_chunks(CHUNK))
            .for_each(|(g, x)| gelu_backward_in_place(x, g));
        grads.register::<Flex>(parent.id, grad);
    }
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
