//! The glue to burn's `flex` backend (feature `flex`): the kernels that take and return burn
//! tensors, and the checks that let generic code reach them.
//!
//! - [`attention()`]: the whole of `softmax(QKᵀ·s + M + A) V` per block of query rows, reading
//!   multi-head attention's strided head views in place;
//! - [`attention_autodiff`]: the same as one operation of `Autodiff<Flex>`'s graph, with a
//!   backward kernel of its own (training on the CPU);
//! - [`gelu`]: exact GELU on flex tensors, vectorised; [`gelu_autodiff`]: the same as one
//!   operation of `Autodiff<Flex>`'s graph, with its derivative as the backward;
//! - [`smoothed_cross_entropy`]: the label-smoothed loss, row by row, and under
//!   `Autodiff<Flex>` one operation whose state is its gradient in closed form;
//! - [`linear_bf16`]: `x·W + b` with `bf16` products and `f32` sums (callers that permit
//!   them); [`linear_bf16_autodiff`]: the same as one operation of `Autodiff<Flex>`'s graph,
//!   its backward's two products in `bf16` too (training);
//! - [`norm`]: LayerNorm and RMSNorm over the last dimension, one row at a time;
//!   [`norm_autodiff`]: the same as one operation of `Autodiff<Flex>`'s graph, with its
//!   gradients with respect to `x`, γ and β row by row as the backward.
//!
//! They run only where [`runs_on`] holds: the `burn::backend::Flex` backend itself (not under
//! `Autodiff`) with f32 tensors; [`attention_autodiff`], [`gelu_autodiff`],
//! [`linear_bf16_autodiff`] and [`norm_autodiff`] only where [`runs_on_autodiff`] holds
//! (`Autodiff<Flex>`, f32); [`smoothed_cross_entropy`] where either does. Callers check it and
//! take burn's generic path otherwise; the kernels assert it again (in debug builds; the loss
//! in all builds). Everything else in the crate is host code on
//! plain slices and needs no burn.

use std::any::{Any, TypeId};

use burn::backend::flex::{Flex, FlexTensor};
use burn::backend::Autodiff;
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::{DType, Tensor, TensorPrimitive};

mod attention;
mod attention_autodiff;
mod gelu;
mod linear;
mod linear_autodiff;
mod loss;
mod norm;

pub use attention::attention;
pub use attention_autodiff::{attention_autodiff, runs_on_autodiff};
pub use gelu::{gelu, gelu_autodiff};
pub use linear::linear_bf16;
pub use linear_autodiff::linear_bf16_autodiff;
pub use loss::{smoothed_cross_entropy, SmoothedCrossEntropy};
pub use norm::{norm, norm_autodiff};

/// Whether the kernels run on backend `B` for tensors of `dtype`: the `flex` backend itself
/// (not under `Autodiff`, whose tensors are another type), f32.
pub fn runs_on<B: Backend>(dtype: DType) -> bool {
    TypeId::of::<B>() == TypeId::of::<Flex>() && dtype == DType::F32
}

/// `x` as type `U`; the caller has checked that `T` is `U` ([`runs_on`]).
fn same<T: 'static, U: 'static>(x: T) -> U {
    *(Box::new(x) as Box<dyn Any>)
        .downcast::<U>()
        .unwrap_or_else(|_| panic!("xfmr-kernels: called where `runs_on` does not hold"))
}

/// `Autodiff<Flex>`'s float tensor: the flex tensor and its node in the graph.
type AutodiffTensor = <Autodiff<Flex> as BackendTypes>::FloatTensorPrimitive;

/// `t`'s float primitive as `Autodiff<Flex>`'s; the caller has checked that `B` is
/// `Autodiff<Flex>` ([`runs_on_autodiff`]).
fn autodiff_primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> AutodiffTensor {
    same(t.into_primitive().tensor())
}

/// `Autodiff<Flex>`'s float primitive `t` as a tensor of `B`, which the caller has checked is
/// `Autodiff<Flex>`.
fn from_autodiff<B: Backend, const D: usize>(t: AutodiffTensor) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(same::<
        AutodiffTensor,
        B::FloatTensorPrimitive,
    >(t)))
}

/// `t` as a contiguous tensor that covers its whole buffer (a copy only when it is not), so
/// that its `storage` is its elements in order.
fn contiguous(t: FlexTensor) -> FlexTensor {
    let whole = t.is_contiguous()
        && t.layout().start_offset() == 0
        && t.bytes().len() == t.layout().num_elements() * std::mem::size_of::<f32>();
    if whole {
        t
    } else {
        t.to_contiguous()
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Flex, NdArray};
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};

    /// Views that do not collapse to two dimensions, as `[4-D, 4-D, 3-D]` tensors of `B`:
    /// a head split (`[b, s, h, d]` → `[b, h, s, d]`), a permutation with no unit stride inside
    /// a slice (an offset start), and a mask expanded along a stride-0 dimension, transposed.
    fn views<B: Backend>() -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 3>) {
        let device = Default::default();
        let values: Vec<f32> = (0..360).map(|i| i as f32).collect();
        let t = Tensor::<B, 1>::from_data(TensorData::new(values, [360]), &device);
        let t = t.reshape([3, 4, 5, 6]);
        let mask = t.clone().slice([0..3, 0..1, 0..1, 0..6]).reshape([3, 1, 6]);
        (
            t.clone().swap_dims(1, 2),
            t.slice([1..3, 0..4, 1..4, 0..6]).permute([2, 0, 3, 1]),
            mask.expand([3, 5, 6]).swap_dims(0, 1),
        )
    }

    /// burn-flex's `to_contiguous` of strided views of three or more dimensions (patched to
    /// copy the innermost dimension by runs, vendor/PATCHED.md) gives the elements ndarray's
    /// copy gives, in the same order, for unit and non-unit inner strides, an offset start and
    /// a stride-0 dimension.
    #[test]
    fn flex_strided_copy_by_runs_equals_ndarray() {
        let (a, b, c) = views::<Flex>();
        let (x, y, z) = views::<NdArray>();
        let flex = |t: burn::backend::flex::FlexTensor| t.to_contiguous().into_data();
        let got = [
            flex(a.into_primitive().tensor()),
            flex(b.into_primitive().tensor()),
            flex(c.into_primitive().tensor()),
        ];
        let want = [x.into_data(), y.into_data(), z.into_data()];
        for (case, (got, want)) in got.iter().zip(&want).enumerate() {
            assert_eq!(got.shape, want.shape, "view {case}: shape");
            assert_eq!(
                got.to_vec::<f32>().unwrap(),
                want.to_vec::<f32>().unwrap(),
                "view {case}"
            );
        }
    }
}
