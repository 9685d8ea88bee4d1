//! Tests of xfmr-blocks: PyTorch `nn.Transformer` parity (outputs on ndarray, flex and wgpu, and
//! CUDA with `--features cuda`;
//! gradients under autodiff), incremental decoding, import errors, the pieces.

#[cfg(feature = "flex")]
mod autodiff_kernels;
#[path = "../common/mod.rs"]
mod common;
mod decoding;
mod parity;
mod units;

use burn::backend::NdArray;

/// Default CPU backend.
pub type Cpu = NdArray<f32>;
