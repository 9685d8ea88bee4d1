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

/// xfmr's flex kernel under `Autodiff<Flex>` (f32, its own backward pass,
/// `xfmr_kernels::attention_autodiff`): its gradients of `sum(Attention(Q, K, V) ⊙ R)` equal
/// central finite differences of the same function computed in f64 (the reference path on
/// `NdArray<f64>`, step 1e-6), within f32 rounding (1e-5 absolute + 1e-4 relative). Grouped
/// key/value heads (4 query heads on 2), inputs as strided head views of `[batch, seq, heads,
/// d]` leaves, key padding and a fully masked query row.
#[cfg(feature = "flex")]
#[test]
fn flex_autodiff_kernel_gradients_match_finite_differences() {
    type Ad = Autodiff<burn::backend::Flex>;
    assert!(xfmr_kernels::runs_on_autodiff::<Ad>(
        burn::tensor::DType::F32
    ));
    kernel_gradients_match_finite_differences::<Ad>("flex kernel");
}

/// The same for attention as one operation of `Autodiff<Wgpu>`'s graph with its own backward
/// (`xfmr_kernels::gpu_attention_autodiff`, on lavapipe in CI), same inputs and tolerance
/// (1e-5 absolute + 1e-4 relative).
#[cfg(feature = "wgpu")]
#[test]
fn gpu_attention_autodiff_gradients_match_finite_differences() {
    type Ad = Autodiff<burn::backend::Wgpu>;
    assert!(xfmr_kernels::runs_on_gpu_autodiff::<Ad>(
        burn::tensor::DType::F32
    ));
    kernel_gradients_match_finite_differences::<Ad>("GPU autodiff attention");
}

/// The gradients of `scaled_dot_product_attention` (`Auto`) under `Ad` (f32) against central
/// finite differences of the reference path in f64 (see the tests above).
#[cfg(any(feature = "flex", feature = "wgpu"))]
fn kernel_gradients_match_finite_differences<Ad: burn::tensor::backend::AutodiffBackend>(
    path: &str,
) {
    use burn::tensor::{Bool, TensorData};
    type F64 = NdArray<f64>;
    let (batch, heads, heads_kv, seq_q, seq_k, d) = (2, 4, 2, 3, 5, 4);
    let shapes = [
        [batch, seq_q, heads, d],
        [batch, seq_k, heads_kv, d],
        [batch, seq_k, heads_kv, d],
    ];
    let mut rng = TestRng::new(31);
    // Values representable in f32, so both sides start from the same numbers.
    let mut values = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| rng.uniform(-1.0, 1.0) as f32 as f64)
            .collect()
    };
    let inputs: Vec<Vec<f64>> = shapes.iter().map(|s| values(s.iter().product())).collect();
    let upstream = values(batch * heads * seq_q * d);
    // Sequence 0 ignores its last key; query row 1 of sequence 1 ignores every key.
    let mut ignored = vec![false; batch * seq_q * seq_k];
    for q in 0..seq_q {
        ignored[q * seq_k + seq_k - 1] = true;
    }
    ignored[(seq_q + 1) * seq_k..(seq_q + 2) * seq_k].fill(true);
    fn mask<B: Backend>(ignored: &[bool], dims: [usize; 4]) -> AttnMask<B> {
        let data = TensorData::new(ignored.to_vec(), dims);
        AttnMask::from_tensor(Tensor::<B, 4, Bool>::from_data(data, &Default::default()))
    }
    let mask_dims = [batch, 1, seq_q, seq_k];
    let r_dims = [batch, heads, seq_q, d];

    // The kernel's gradients, f32.
    let device = Default::default();
    let leaves: Vec<Tensor<Ad, 4>> = inputs
        .iter()
        .zip(&shapes)
        .map(|(v, s)| float_tensor::<Ad, 4>(v.clone(), s.to_vec(), &device).require_grad())
        .collect();
    let view = |t: &Tensor<Ad, 4>| t.clone().swap_dims(1, 2);
    let options = AttentionOptions::default().with_mask(mask::<Ad>(&ignored, mask_dims));
    let context = scaled_dot_product_attention(
        view(&leaves[0]),
        view(&leaves[1]),
        view(&leaves[2]),
        options,
    )
    .unwrap()
    .context;
    let r = float_tensor::<Ad, 4>(upstream.clone(), r_dims.to_vec(), &device);
    let grads = (context * r).sum().backward();

    // The same function in f64.
    let loss = |args: &[Vec<f64>]| -> f64 {
        let t = |i: usize| {
            float_tensor::<F64, 4>(args[i].clone(), shapes[i].to_vec(), &Default::default())
                .swap_dims(1, 2)
        };
        let options = AttentionOptions::default()
            .with_mask(mask::<F64>(&ignored, mask_dims))
            .with_weights(true); // the reference path
        let ctx = scaled_dot_product_attention(t(0), t(1), t(2), options)
            .unwrap()
            .context;
        let r = float_tensor::<F64, 4>(upstream.clone(), r_dims.to_vec(), &Default::default());
        (ctx * r).sum().into_scalar()
    };
    let eps = 1e-6;
    for (which, leaf) in leaves.iter().enumerate() {
        let grad = to_vec(&leaf.grad(&grads).expect("a gradient"));
        for i in 0..inputs[which].len() {
            let perturbed = |delta: f64| {
                let mut args = inputs.clone();
                args[which][i] += delta;
                loss(&args)
            };
            let numeric = (perturbed(eps) - perturbed(-eps)) / (2.0 * eps);
            let tol = 1e-5 + 1e-4 * numeric.abs();
            assert!(
                (grad[i] - numeric).abs() <= tol,
                "d loss / d {}[{i}]: {path} {} vs finite difference {numeric}",
                ["Q", "K", "V"][which],
                grad[i]
            );
        }
    }
}
