//! The attention paths against each other: reference, decomposed, fused and xfmr's flex kernel;
//! grouped key/value heads against repeated heads; dropout on the weights.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};
use xfmr_attention::{
    attention_decomposed, attention_fused, attention_reference, scaled_dot_product_attention,
    AttentionError, AttentionKernel, AttentionOptions, AttnMask, MhaInput,
};
use xfmr_testing::{assert_tensors_close, max_abs_diff, to_vec, TestRng};

use crate::invariants::{indices, random_mha};
use crate::Cpu;

/// Options with a random mask `[batch, 1, seq_q, seq_k]` (a third of the keys ignored, and every
/// key of query row 0 of batch 1), and on odd trials a random bias `[1, heads, seq_q, seq_k]`.
fn random_mask_and_bias<B: Backend>(
    rng: &mut TestRng,
    trial: usize,
    [batch, heads, seq_q, seq_k]: [usize; 4],
) -> AttentionOptions<B> {
    let device = Default::default();
    let mut ignored: Vec<bool> = (0..batch * seq_q * seq_k)
        .map(|_| rng.below(3) == 0)
        .collect();
    ignored[seq_q * seq_k..seq_q * seq_k + seq_k].fill(true);
    let mask = AttnMask::from_tensor(Tensor::from_data(
        TensorData::new(ignored, [batch, 1, seq_q, seq_k]),
        &device,
    ));
    let options = AttentionOptions::default().with_mask(mask);
    match trial % 2 {
        1 => options.with_bias(rng.tensor::<B, 4>([1, heads, seq_q, seq_k], 1.0, &device)),
        _ => options,
    }
}

/// A mask computed by ops, which flex may store as bytes: causal ∪ padding (every fifth key,
/// `[1, 1, seq_q, seq_k]`).
fn op_built_mask<B: Backend>(seq_q: usize, seq_k: usize) -> AttnMask<B> {
    let device = Default::default();
    let ids: Vec<i64> = (0..seq_k as i64).map(|j| j % 5).collect();
    let padding = AttnMask::padding_from_ids(
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, seq_k]), &device),
        0,
    );
    AttnMask::causal(seq_q, seq_k, &device).union(padding)
}

/// Random q, k, v, masks (some rows fully masked) and biases: the fused, decomposed and reference
/// paths agree (≤ 1e-5) on ndarray and on flex, and fully masked rows are exactly zero on all.
fn attention_paths_agree<B: Backend>() {
    let device = Default::default();
    let mut rng = TestRng::new(7);
    for trial in 0..6 {
        let (batch, heads, seq_q, seq_k, d_k) = (2, 3, 1 + rng.below(6), 1 + rng.below(9), 8);
        let q = rng.tensor::<B, 4>([batch, heads, seq_q, d_k], 1.0, &device);
        let k = rng.tensor::<B, 4>([batch, heads, seq_k, d_k], 1.0, &device);
        let v = rng.tensor::<B, 4>([batch, heads, seq_k, d_k], 1.0, &device);
        let mut options = random_mask_and_bias(&mut rng, trial, [batch, heads, seq_q, seq_k]);
        if trial % 3 == 2 {
            options = options.with_scale(0.3);
        }
        let reference =
            attention_reference(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
        let fused = attention_fused(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
        let decomposed = attention_decomposed(q, k, v, options).unwrap();
        for (path, context) in [("fused", &fused), ("decomposed", &decomposed)] {
            assert_tensors_close(
                context,
                &reference.context,
                1e-5,
                0.0,
                &format!("trial {trial}, {path}"),
            );
            let zero_row = context.clone().narrow(0, 1, 1).narrow(2, 0, 1);
            assert!(
                to_vec(&zero_row).iter().all(|&x| x == 0.0),
                "{path}: fully masked row is not zero: {zero_row}"
            );
        }
        let weights = reference.weights.unwrap();
        assert!(to_vec(&weights).iter().all(|x| x.is_finite()));
        let zero_weights = weights.narrow(0, 1, 1).narrow(2, 0, 1);
        assert!(to_vec(&zero_weights).iter().all(|&x| x == 0.0));
    }
}

#[test]
fn attention_paths_agree_ndarray() {
    attention_paths_agree::<NdArray<f32>>();
}

#[test]
fn attention_paths_agree_flex() {
    attention_paths_agree::<Flex>();
}

/// xfmr's own flex kernel ([`AttentionKernel::Flex`]) against the reference path on flex
/// (≤ 1e-5 absolute, as the other paths): random q, k, v read through strided head-split views
/// (as multi-head attention hands them over), grouped key/value heads, masks with a fully masked
/// row (exactly zero) and masks computed by ops (a causal ∪ padding union), biases, a non-default
/// scale, `d_v ≠ d_k`, and a case long enough to be cut into several blocks of query rows.
/// `Auto` takes the same kernel on flex (bit for bit) and not under autodiff.
///
/// Compiled only with this crate's `flex` feature (`cargo test --workspace` turns it on;
/// alone: `cargo test -p xfmr-attention --features flex`); `.ci/run` fails when the test
/// did not run.
#[cfg(feature = "flex")]
#[test]
fn flex_kernel_equals_reference() {
    type B = Flex;
    assert!(xfmr_kernels::runs_on::<B>(DType::F32));
    assert!(!xfmr_kernels::runs_on::<Autodiff<B>>(DType::F32));
    let device = Default::default();
    let mut rng = TestRng::new(23);
    let cases = [
        // (batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)
        (2, 6, 6, 5, 9, 8, 8),
        (2, 6, 2, 4, 7, 8, 5),
        (2, 6, 3, 1, 11, 16, 4),
        (2, 6, 1, 6, 1, 8, 8),
        (1, 2, 2, 300, 700, 8, 6),
        (3, 4, 2, 33, 17, 12, 12),
    ];
    for (trial, (batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)) in cases.into_iter().enumerate() {
        // [batch, seq, heads, d] storage viewed as [batch, heads, seq, d], as in multi-head
        // attention: the kernel reads the strided views in place.
        let q = rng
            .tensor::<B, 4>([batch, seq_q, heads, d_k], 1.0, &device)
            .swap_dims(1, 2);
        let k = rng
            .tensor::<B, 4>([batch, seq_k, heads_kv, d_k], 1.0, &device)
            .swap_dims(1, 2);
        let v = rng
            .tensor::<B, 4>([batch, seq_k, heads_kv, d_v], 1.0, &device)
            .swap_dims(1, 2);
        let mut options = match trial {
            // A fully masked row needs batch ≥ 2 (`random_mask_and_bias` masks row 0 of batch 1).
            t if batch >= 2 => random_mask_and_bias(&mut rng, t, [batch, heads, seq_q, seq_k]),
            // Masks computed by ops (a comparison, a union), which flex may store as bytes.
            _ => AttentionOptions::default().with_mask(op_built_mask(seq_q, seq_k)),
        };
        if trial % 3 == 2 {
            options = options.with_scale(0.3);
        }
        let what = format!("case {trial} {:?}", cases[trial]);
        let reference =
            attention_reference(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
        let cpu = scaled_dot_product_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            options.clone().with_kernel(AttentionKernel::Flex),
        )
        .unwrap()
        .context;
        assert_tensors_close(&cpu, &reference.context, 1e-5, 0.0, &what);
        if batch >= 2 {
            let zero_row = cpu.clone().narrow(0, 1, 1).narrow(2, 0, 1);
            assert!(
                to_vec(&zero_row).iter().all(|&x| x == 0.0),
                "{what}: fully masked row is not zero: {zero_row}"
            );
        }
        let auto = scaled_dot_product_attention(q, k, v, options)
            .unwrap()
            .context;
        assert_eq!(
            to_vec(&auto),
            to_vec(&cpu),
            "{what}: Auto is not the Flex kernel"
        );
    }
}

/// Training on flex: under `Autodiff<Flex>` `Auto` runs xfmr's kernel as one operation with its
/// own backward (`xfmr_kernels::attention_autodiff`); its values and its gradients with respect
/// to q, k and v equal burn's autodiff through the reference path (≤ 1e-5 absolute for values,
/// as the inference kernel; gradients ≤ 1e-4 absolute + 1e-4 relative: f32 sums of up to 700
/// products of O(1) terms, taken in other orders on the two paths). The inputs are leaves of
/// shape `[batch, seq, heads, d]` viewed as heads (as multi-head attention's projections are),
/// so the gradients pass back through the view; grouped key/value heads, masks with a fully
/// masked row (whose query gradient is exactly zero) and masks computed by ops, a non-default
/// scale, `d_v ≠ d_k`, and a case cut into several blocks of query rows.
#[cfg(feature = "flex")]
#[test]
fn flex_autodiff_kernel_gradients_equal_reference() {
    type B = Autodiff<Flex>;
    assert!(xfmr_kernels::runs_on_autodiff::<B>(DType::F32));
    assert!(!xfmr_kernels::runs_on_autodiff::<Flex>(DType::F32));
    assert!(!xfmr_kernels::runs_on_autodiff::<Autodiff<NdArray<f32>>>(
        DType::F32
    ));
    let device = Default::default();
    let mut rng = TestRng::new(29);
    let cases = [
        // (batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)
        (2, 4, 4, 5, 9, 8, 8),
        (2, 6, 2, 4, 7, 8, 5),
        (2, 6, 3, 1, 11, 16, 4),
        (2, 2, 1, 6, 1, 8, 8),
        (1, 2, 2, 300, 700, 8, 6),
        (3, 4, 2, 33, 17, 12, 12),
    ];
    for (trial, (batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)) in cases.into_iter().enumerate() {
        let what = format!("case {trial} {:?}", cases[trial]);
        let leaves = [
            rng.tensor::<B, 4>([batch, seq_q, heads, d_k], 1.0, &device),
            rng.tensor::<B, 4>([batch, seq_k, heads_kv, d_k], 1.0, &device),
            rng.tensor::<B, 4>([batch, seq_k, heads_kv, d_v], 1.0, &device),
        ];
        let upstream = rng.tensor::<B, 4>([batch, heads, seq_q, d_v], 1.0, &device);
        let mut options: AttentionOptions<B> = if batch >= 2 {
            // trial 0: mask only (no bias); row 0 of batch 1 fully masked.
            random_mask_and_bias(&mut rng, 0, [batch, heads, seq_q, seq_k])
        } else {
            AttentionOptions::default().with_mask(op_built_mask(seq_q, seq_k))
        };
        if trial % 3 == 2 {
            options = options.with_scale(0.3);
        }
        // (context, [dq, dk, dv]) of sum(context ⊙ upstream) through one path.
        let run = |kernel: bool| {
            let [q, k, v] = leaves.clone().map(|t| t.detach().require_grad());
            let heads_view = |t: &Tensor<B, 4>| t.clone().swap_dims(1, 2);
            let (qh, kh, vh) = (heads_view(&q), heads_view(&k), heads_view(&v));
            let context = if kernel {
                scaled_dot_product_attention(qh, kh, vh, options.clone())
                    .unwrap()
                    .context
            } else {
                attention_reference(qh, kh, vh, options.clone())
                    .unwrap()
                    .context
            };
            let grads = (context.clone() * upstream.clone()).sum().backward();
            let grad = |t: &Tensor<B, 4>| t.grad(&grads).expect("a gradient");
            (context.inner(), [grad(&q), grad(&k), grad(&v)])
        };
        let (kernel, kernel_grads) = run(true);
        let (reference, reference_grads) = run(false);
        // The proof of the path: the kernel called directly gives the same values, bit for bit.
        let scale = options.scale.unwrap_or(1.0 / (d_k as f64).sqrt()) as f32;
        let heads_view = |t: &Tensor<B, 4>| t.clone().swap_dims(1, 2);
        let direct = xfmr_kernels::attention_autodiff(
            heads_view(&leaves[0]),
            heads_view(&leaves[1]),
            heads_view(&leaves[2]),
            options.mask.clone().map(AttnMask::into_tensor),
            scale,
        );
        assert_eq!(
            to_vec(&direct),
            to_vec(&kernel),
            "{what}: scaled_dot_product_attention did not take the autodiff kernel"
        );
        assert_tensors_close(&kernel, &reference, 1e-5, 0.0, &format!("{what}: values"));
        for (name, (a, b)) in ["dQ", "dK", "dV"]
            .iter()
            .zip(kernel_grads.iter().zip(&reference_grads))
        {
            assert_tensors_close(a, b, 1e-4, 1e-4, &format!("{what}: {name}"));
        }
        if batch >= 2 {
            // Row 0 of batch 1 ignores every key: zero output, zero query gradient.
            let zero_row = kernel.clone().narrow(0, 1, 1).narrow(2, 0, 1);
            assert!(
                to_vec(&zero_row).iter().all(|&x| x == 0.0),
                "{what}: {zero_row}"
            );
            let dq_row = kernel_grads[0].clone().narrow(0, 1, 1).narrow(1, 0, 1);
            assert!(
                to_vec(&dq_row).iter().all(|&x| x == 0.0),
                "{what}: dQ {dq_row}"
            );
        }
    }
}

/// Attention with `h_kv < h` key/value heads (grouped-query) equals attention with each key/value
/// head copied for its `h / h_kv` query heads (built here by index selection), on every path —
/// reference (weights too), fused, decomposed — with masks, a fully masked row and biases
/// (≤ 1e-6: the same sums in the same order); a head count that does not divide is an error.
fn grouped_heads_equal_repeated_heads<B: Backend>() {
    let device = Default::default();
    let mut rng = TestRng::new(11);
    let (batch, heads, d_k, d_v) = (2, 6, 8, 5);
    for (trial, heads_kv) in [1, 2, 3, 2, 3, 1].into_iter().enumerate() {
        let (seq_q, seq_k) = (1 + rng.below(5), 1 + rng.below(9));
        let q = rng.tensor::<B, 4>([batch, heads, seq_q, d_k], 1.0, &device);
        let k = rng.tensor::<B, 4>([batch, heads_kv, seq_k, d_k], 1.0, &device);
        let v = rng.tensor::<B, 4>([batch, heads_kv, seq_k, d_v], 1.0, &device);
        let group = heads / heads_kv;
        let shared: Vec<i64> = (0..heads).map(|h| (h / group) as i64).collect();
        let (k_rep, v_rep) = (
            k.clone().select(1, indices::<B>(&shared)),
            v.clone().select(1, indices::<B>(&shared)),
        );
        let options = random_mask_and_bias(&mut rng, trial, [batch, heads, seq_q, seq_k]);
        let what = |path: &str| format!("trial {trial}, h_kv {heads_kv}, {path}");
        let reference = |k: &Tensor<B, 4>, v: &Tensor<B, 4>| {
            attention_reference(q.clone(), k.clone(), v.clone(), options.clone()).unwrap()
        };
        let (grouped, repeated) = (reference(&k, &v), reference(&k_rep, &v_rep));
        assert_tensors_close(
            &grouped.context,
            &repeated.context,
            1e-6,
            0.0,
            &what("reference"),
        );
        assert_tensors_close(
            &grouped.weights.unwrap(),
            &repeated.weights.unwrap(),
            1e-6,
            0.0,
            &what("reference weights"),
        );
        for (path, run) in [
            ("fused", attention_fused::<B> as fn(_, _, _, _) -> _),
            ("decomposed", attention_decomposed::<B>),
        ] {
            let a = run(q.clone(), k.clone(), v.clone(), options.clone()).unwrap();
            let b = run(q.clone(), k_rep.clone(), v_rep.clone(), options.clone()).unwrap();
            assert_tensors_close(&a, &b, 1e-6, 0.0, &what(path));
        }
    }
    let q = Tensor::<B, 4>::zeros([1, 6, 2, 4], &device);
    let kv = Tensor::<B, 4>::zeros([1, 4, 3, 4], &device);
    let err = scaled_dot_product_attention(q, kv.clone(), kv, AttentionOptions::default());
    assert!(
        matches!(err, Err(AttentionError::InputShape { what: "key", .. })),
        "{err:?}"
    );
}

#[test]
fn grouped_heads_equal_repeated_heads_ndarray() {
    grouped_heads_equal_repeated_heads::<NdArray<f32>>();
}

#[test]
fn grouped_heads_equal_repeated_heads_flex() {
    grouped_heads_equal_repeated_heads::<Flex>();
}

/// Grouped-query attention equals full multi-head attention whose key/value heads are copies
/// of the shared ones.
#[test]
fn grouped_query_attention_equals_repeated_heads() {
    let device = Default::default();
    let mut rng = TestRng::new(9);
    let (d_model, n_heads, n_kv, d_k) = (24, 6, 2, 4);
    let gqa = random_mha::<Cpu>(d_model, n_heads, n_kv);
    let mut full = random_mha::<Cpu>(d_model, n_heads, n_heads);
    // Copy values (not clones: burn parameters are initialised lazily, and a clone of an
    // uninitialised parameter draws its own random values).
    let copy = |src: &Linear<Cpu>, columns: Option<&Tensor<Cpu, 1, Int>>| {
        let (mut weight, mut bias) = (src.weight.val(), src.bias.as_ref().unwrap().val());
        if let Some(idx) = columns {
            weight = weight.select(1, idx.clone());
            bias = bias.select(0, idx.clone());
        }
        Linear {
            weight: Param::from_tensor(weight),
            bias: Some(Param::from_tensor(bias)),
        }
    };
    // Query head h uses key/value head h / group: its columns are that head's block.
    let group = n_heads / n_kv;
    let head_index: Vec<i64> = (0..n_heads)
        .flat_map(|h| (0..d_k).map(move |c| ((h / group) * d_k + c) as i64))
        .collect();
    let idx = indices::<Cpu>(&head_index);
    full.query = copy(&gqa.query, None);
    full.output = copy(&gqa.output, None);
    full.key = copy(&gqa.key, Some(&idx));
    full.value = copy(&gqa.value, Some(&idx));
    let x = rng.tensor::<Cpu, 3>([2, 5, d_model], 1.0, &device);
    let a = gqa.forward(MhaInput::self_attn(x.clone()).causal().need_weights());
    let b = full.forward(MhaInput::self_attn(x).causal().need_weights());
    assert!(max_abs_diff(&a.context, &b.context) <= 1e-5);
    assert!(max_abs_diff(&a.weights.unwrap(), &b.weights.unwrap()) <= 1e-6);
}

/// Attention dropout acts on the weights after softmax: under autodiff (training) each weight is
/// either dropped (0) or scaled by 1/(1-p); with the inner backend (inference) it is inactive.
#[test]
fn dropout_is_applied_to_weights_after_softmax() {
    type B = Autodiff<NdArray<f32>>;
    let device = Default::default();
    let mut rng = TestRng::new(10);
    let q = rng.tensor::<NdArray<f32>, 4>([1, 2, 4, 8], 1.0, &device);
    let k = rng.tensor::<NdArray<f32>, 4>([1, 2, 6, 8], 1.0, &device);
    let v = rng.tensor::<NdArray<f32>, 4>([1, 2, 6, 8], 1.0, &device);
    let p = 0.5;
    let plain = attention_reference(q.clone(), k.clone(), v.clone(), AttentionOptions::default())
        .unwrap()
        .weights
        .unwrap();
    let inference = scaled_dot_product_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        AttentionOptions::default()
            .with_dropout(p)
            .with_weights(true),
    )
    .unwrap()
    .weights
    .unwrap();
    assert!(
        max_abs_diff(&plain, &inference) == 0.0,
        "dropout must be inactive without autodiff"
    );
    let trained = scaled_dot_product_attention(
        Tensor::<B, 4>::from_inner(q),
        Tensor::<B, 4>::from_inner(k),
        Tensor::<B, 4>::from_inner(v),
        AttentionOptions::default()
            .with_dropout(p)
            .with_weights(true),
    )
    .unwrap()
    .weights
    .unwrap()
    .inner();
    let (mut dropped, mut kept) = (0, 0);
    for (t, w) in to_vec(&trained).into_iter().zip(to_vec(&plain)) {
        if t == 0.0 {
            dropped += 1;
        } else {
            kept += 1;
            assert!(
                (t - w / (1.0 - p)).abs() <= 1e-6,
                "kept weight {t} is not {w} / (1 - {p})"
            );
        }
    }
    assert!(dropped > 0 && kept > 0, "dropped {dropped}, kept {kept}");
}
