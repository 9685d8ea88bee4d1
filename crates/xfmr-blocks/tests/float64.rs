//! Tests in `f64` (`NdArray<f64>`), in a test binary of their own: burn 0.21 keeps default
//! dtypes per device type, first write wins, and `NdArray<f32>`/`NdArray<f64>` share the CPU
//! device, so mixing them in one process makes parameter initialisation depend on test order.

mod common;

use burn::backend::{Autodiff, NdArray};
use common::check_gradients;

/// `Autodiff<NdArray<f64>>`: every element within 1e-3 relative (plus 1e-5 absolute for
/// entries near zero) of PyTorch's f32 gradients. (Measured: ≤ 4e-6 absolute, ≤ 7.2e-4 relative.)
#[test]
fn transformer_gradients_autodiff_f64() {
    check_gradients::<Autodiff<NdArray<f64>>>(|_| (1e-5, 1e-3));
}
