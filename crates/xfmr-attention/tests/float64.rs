//! Tests in `f64` (`NdArray<f64>`), in a test binary of their own.
//!
//! burn 0.21 keeps default dtypes per device type, first write wins, and `NdArray<f32>` and
//! `NdArray<f64>` share the CPU device: in one process, whichever touches it first decides the
//! dtype of every parameter initialised later. Separate binaries are separate processes.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use xfmr_attention::{scaled_dot_product_attention, AttentionKernel, AttentionOptions, AttnMask};
use xfmr_testing::{float_tensor, to_vec, TestRng};

/// Key padding for the gradient test: the last of five keys is ignored.
fn key_padding<B: Backend>() -> AttnMask<B> {
    AttnMask::padding_from_lengths(&[4], 5, &Default::default()).unwrap()
}

/// Gradients of `sum(Attention(Q, K, V) ⊙ R)` w.r.t. Q, K and V equal central finite
/// differences (f64, step 1e-6, tolerance 1e-6 absolute + 1e-5 relative), through both paths.
#[test]
fn gradients_match_finite_differences() {
    type B = Autodiff<NdArray<f64>>;
    type Inner = NdArray<f64>;
    let device = Default::default();
    let mut rng = TestRng::new(8);
    let shape_q = [1, 2, 3, 4];
    let shape_k = [1, 2, 5, 4];
    let q0 = rng.tensor::<Inner, 4>(shape_q, 1.0, &device);
    let k0 = rng.tensor::<Inner, 4>(shape_k, 1.0, &device);
    let v0 = rng.tensor::<Inner, 4>(shape_k, 1.0, &device);
    let r = rng.tensor::<Inner, 4>(shape_q, 1.0, &device);

    let loss_inner = |q: Tensor<Inner, 4>, k: Tensor<Inner, 4>, v: Tensor<Inner, 4>| -> f64 {
        let opts = AttentionOptions::default().with_mask(key_padding());
        let ctx = scaled_dot_product_attention(q, k, v, opts).unwrap().context;
        (ctx * r.clone()).sum().into_scalar()
    };

    for (need_weights, kernel) in [
        (false, AttentionKernel::Fused),
        (false, AttentionKernel::Decomposed),
        (true, AttentionKernel::Auto),
    ] {
        let q = Tensor::<B, 4>::from_inner(q0.clone()).require_grad();
        let k = Tensor::<B, 4>::from_inner(k0.clone()).require_grad();
        let v = Tensor::<B, 4>::from_inner(v0.clone()).require_grad();
        let opts = AttentionOptions::default()
            .with_mask(key_padding())
            .with_weights(need_weights)
            .with_kernel(kernel);
        let ctx = scaled_dot_product_attention(q.clone(), k.clone(), v.clone(), opts)
            .unwrap()
            .context;
        let grads = (ctx * Tensor::<B, 4>::from_inner(r.clone()))
            .sum()
            .backward();
        let analytic = [
            q.grad(&grads).unwrap(),
            k.grad(&grads).unwrap(),
            v.grad(&grads).unwrap(),
        ];
        let inputs = [q0.clone(), k0.clone(), v0.clone()];
        let eps = 1e-6;
        for (which, grad) in analytic.iter().enumerate() {
            let grad = to_vec(grad);
            let base = to_vec(&inputs[which]);
            let shape = inputs[which].dims();
            for i in 0..base.len() {
                let perturbed = |delta: f64| {
                    let mut values = base.clone();
                    values[i] += delta;
                    let t = float_tensor::<Inner, 4>(values, shape.to_vec(), &device);
                    let mut args = inputs.clone();
                    args[which] = t;
                    let [q, k, v] = args;
                    loss_inner(q, k, v)
                };
                let numeric = (perturbed(eps) - perturbed(-eps)) / (2.0 * eps);
                let tol = 1e-6 + 1e-5 * numeric.abs();
                assert!(
                    (grad[i] - numeric).abs() <= tol,
                    "d loss / d {}[{i}] ({kernel:?}, weights {need_weights}): autodiff {} vs finite \
                     difference {numeric}",
                    ["Q", "K", "V"][which],
                    grad[i]
                );
            }
        }
    }
}
