//! Attention under burn's autodiff on the GPU backends (features `wgpu` and `cuda`): one
//! operation of the graph with a backward of its own, where burn would record the decomposed
//! operations (its `module::attention` falls back to them under `Autodiff`) and keep their
//! `[batch, heads, seq_q, seq_k]` intermediates until the backward pass.
//!
//! - [`gpu_attention_autodiff`]: `softmax(QKᵀ·s + M) V` as one node, keeping the output and
//!   each row's log-sum-exp; its backward is FlashAttention-2's (module
//!   `attention_autodiff`), written with the inner backend's tensor operations (matrix
//!   products, `exp`, row sums), which autodiff does not track;
//! - [`runs_on_gpu_autodiff`]: the check generic code asks first.
//!
//! The operation itself is generic over the inner backend; the backends it is taken on are
//! named once, in the macro `for_each_inner`: with `wgpu`, `Autodiff<Wgpu>` (burn's `Wgpu`: fused
//! when burn's `fusion` is on) and `Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>` (the
//! unfused backend); with `cuda`, `Autodiff<Cuda>` and `Autodiff<CubeBackend<CudaRuntime, f32,
//! i32, u8>>`. Generic code holding a `B: Backend` reaches it by a `TypeId` check and a
//! downcast, as it reaches the flex kernels. No `unsafe` code.

use std::any::{Any, TypeId};

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Tensor};

mod attention_autodiff;

/// Applies the macro `$apply` to each inner backend `I` whose `Autodiff<I>` (without
/// checkpointing, burn's default) takes [`gpu_attention_autodiff`]: the one list of them.
macro_rules! for_each_inner {
    ($apply:ident) => {
        #[cfg(feature = "wgpu")]
        $apply!(burn::backend::Wgpu);
        #[cfg(feature = "wgpu")]
        $apply!(
            burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>
        );
        #[cfg(feature = "cuda")]
        $apply!(burn::backend::Cuda);
        #[cfg(feature = "cuda")]
        $apply!(burn_cubecl::CubeBackend<burn::cubecl::cuda::CudaRuntime, f32, i32, u8>);
    };
}

/// Whether [`gpu_attention_autodiff`] runs on backend `B` for tensors of `dtype`: `Autodiff`
/// (no checkpointing) over one of the GPU backends listed in the module docs, f32.
pub fn runs_on_gpu_autodiff<B: Backend>(dtype: DType) -> bool {
    let mut found = false;
    macro_rules! check {
        ($inner:ty) => {
            found |= TypeId::of::<B>() == TypeId::of::<Autodiff<$inner>>();
        };
    }
    for_each_inner!(check);
    found && dtype == DType::F32
}

/// Scaled dot-product attention `softmax(QKᵀ·scale + M) V` as one differentiable operation of
/// `Autodiff<I>` on a GPU backend `I`, with FlashAttention-2's backward from each row's saved
/// log-sum-exp (the math is in module `attention_autodiff`'s docs). Values equal burn's
/// decomposed attention's up to f32 rounding; gradients equal those of burn's autodiff through
/// the decomposed operations up to f32 rounding (tested against the reference path and
/// against f64 finite differences in `xfmr-attention`, `gpu_attention_autodiff_*`).
///
/// Saved for the backward pass: the inputs, the output and the row log-sum-exp
/// `[batch, heads, seq_q, 1]` (nothing of size `seq_q × seq_k`); the backward recomputes the
/// weights. No additive bias and no dropout on the weights: the caller takes burn's generic
/// path for those.
///
/// # Shapes
/// - `query`: `[batch, heads, seq_q, d_k]`
/// - `key`: `[batch, heads_kv, seq_k, d_k]`, `heads_kv` dividing `heads`
/// - `value`: `[batch, heads_kv, seq_k, d_v]`
/// - `mask` (`true` = ignored): broadcastable to `[batch, heads, seq_q, seq_k]`; a row whose
///   keys are all ignored is zero, and so is its gradient
/// - output: `[batch, heads, seq_q, d_v]`
///
/// # Panics
/// If [`runs_on_gpu_autodiff`] does not hold for `B` (asserted in every build; the dtype only
/// in debug builds). The caller has checked the shapes and that no size is 0.
pub fn gpu_attention_autodiff<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    scale: f32,
) -> Tensor<B, 4> {
    debug_assert!(
        runs_on_gpu_autodiff::<B>(query.dtype()),
        "xfmr_kernels::gpu_attention_autodiff: not an f32 tensor of a GPU backend under Autodiff"
    );
    macro_rules! run {
        ($inner:ty) => {
            if TypeId::of::<B>() == TypeId::of::<Autodiff<$inner>>() {
                return attention_autodiff::attention::<B, $inner>(query, key, value, mask, scale);
            }
        };
    }
    for_each_inner!(run);
    panic!(
        "xfmr_kernels::gpu_attention_autodiff: called where `runs_on_gpu_autodiff` does not hold"
    )
}

/// `x` as type `U`; the caller has checked that `T` is `U` (a `TypeId` comparison).
fn same<T: 'static, U: 'static>(x: T) -> U {
    *(Box::new(x) as Box<dyn Any>)
        .downcast::<U>()
        .unwrap_or_else(|_| {
            panic!("xfmr-kernels: called where `runs_on_gpu_autodiff` does not hold")
        })
}
