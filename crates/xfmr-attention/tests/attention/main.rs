//! Tests of xfmr-attention: PyTorch parity on every backend, invariants, gradients.
//!
//! One test binary (several files would each link burn and wgpu again).

#[cfg(feature = "wgpu")]
mod gpu;
mod invariants;
mod parity;
mod paths;
#[cfg(feature = "flex")]
mod precision;
mod units;

use burn::backend::NdArray;

/// The default CPU backend of the invariant tests.
pub type Cpu = NdArray<f32>;
