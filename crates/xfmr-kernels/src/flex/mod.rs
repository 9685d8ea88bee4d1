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
//!   them);
//! - [`norm`]: LayerNorm and RMSNorm over the last dimension, one row at a time;
//!   [`norm_autodiff`]: the same as one operation of `Autodiff<Flex>`'s graph, with its
//!   gradients with respect to `x`, γ and β row by row as the backward.
//!
//! They run only where [`runs_on`] holds: the `burn::backend::Flex` backend itself (not under
//! `Autodiff`) with f32 tensors; [`attention_autodiff`], [`gelu_autodiff`] and
//! [`norm_autodiff`] only where [`runs_on_autodiff`] holds (`Autodiff<Flex>`, f32);
//! [`smoothed_cross_entropy`] where either does. Callers check it and take burn's generic path otherwise; the kernels assert it again
//! (in debug builds; the loss in all builds). Everything else in the crate is host code on
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
mod loss;
mod norm;

pub use attention::attention;
pub use attention_autodiff::{attention_autodiff, runs_on_autodiff};
pub use gelu::{gelu, gelu_autodiff};
pub use linear::linear_bf16;
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
