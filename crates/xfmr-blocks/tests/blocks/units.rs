//! Import errors, invalid configurations, and the pieces against their formulas.

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_blocks::{
    add_positions, Activation, BlockError, FeedForwardConfig, LayerConfig, NormConfig, NormKind,
    PositionEncoding, StackConfig, StateDict, TokenEmbeddingConfig,
};
use xfmr_testing::{assert_uniform, linear_values, max_abs_diff, TestRng};

use crate::Cpu;

/// An import lists every missing, unexpected and wrong-shape tensor at once.
#[test]
fn import_errors_list_every_problem() {
    let device = Default::default();
    let encoder = StackConfig::new(LayerConfig::new(8, 2, 16), 1)
        .init_encoder::<Cpu>(&device)
        .unwrap();
    let mut dict = StateDict::default();
    let mut add = |name: &str, shape: Vec<usize>| {
        let n = shape.iter().product();
        dict.insert(name, shape, vec![0.0; n]);
    };
    add("enc.layers.0.self_attn.in_proj_weight", vec![24, 8]);
    add("enc.layers.0.self_attn.in_proj_bias", vec![24]);
    add("enc.layers.0.self_attn.out_proj.weight", vec![8, 8]);
    add("enc.layers.0.self_attn.out_proj.bias", vec![8]);
    add("enc.layers.0.linear1.weight", vec![16, 8]);
    add("enc.layers.0.linear1.bias", vec![16]);
    add("enc.layers.0.linear2.weight", vec![8, 15]); // wrong shape
    add("enc.layers.0.linear2.bias", vec![8]);
    add("enc.layers.0.norm1.weight", vec![8]);
    add("enc.layers.0.norm1.bias", vec![8]);
    add("enc.layers.0.norm2.weight", vec![8]);
    // norm2.bias missing
    add("enc.layers.0.extra", vec![3]); // unexpected
    add("other.ignored", vec![1]); // outside the prefix
    let err = encoder.load_torch(&dict, "enc.").unwrap_err();
    let BlockError::Import(report) = &err else {
        panic!("not an import error: {err}")
    };
    assert_eq!(
        report.missing,
        vec![("enc.layers.0.norm2.bias".to_string(), vec![8])]
    );
    assert_eq!(report.unexpected, vec!["enc.layers.0.extra".to_string()]);
    assert_eq!(
        report.wrong_shape,
        vec![(
            "enc.layers.0.linear2.weight".to_string(),
            vec![8, 16],
            vec![8, 15]
        )]
    );
    assert_eq!(
        err.to_string(),
        "state dict does not match the module: missing: enc.layers.0.norm2.bias [8]; \
         unexpected: enc.layers.0.extra; wrong shape: enc.layers.0.linear2.weight \
         (expected [8, 16], found [8, 15])"
    );
}

#[test]
fn invalid_configs_are_typed_errors() {
    let device = Default::default();
    let err = LayerConfig::new(30, 4, 8)
        .init_encoder::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "d_model (30) must be divisible by n_heads (4)"
    );
    let err = LayerConfig::new(8, 2, 8)
        .with_dropout(1.0)
        .init_decoder::<Cpu>(&device)
        .unwrap_err();
    assert!(
        matches!(&err, BlockError::InvalidConfig { field: "dropout", value, .. } if value == "1"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "invalid configuration: `dropout` = 1: a dropout probability in [0, 1)"
    );
    let err = StackConfig::new(LayerConfig::new(8, 2, 8), 0)
        .init_encoder::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: `n_layers` = 0: must be positive"
    );
    // A stack applies positions inside attention only: an absolute kind is the model's to add
    // to its embeddings, and a stack given one says so rather than ignoring it.
    for absolute in [PositionEncoding::Sinusoidal, PositionEncoding::Learned] {
        let err = StackConfig::new(LayerConfig::new(8, 2, 16), 1)
            .with_positions(absolute.clone())
            .init_causal::<Cpu>(&device)
            .unwrap_err();
        assert!(
            matches!(
                &err,
                BlockError::InvalidConfig {
                    field: "positions",
                    ..
                }
            ),
            "{absolute:?}: {err:?}"
        );
        assert_eq!(absolute.in_attention(), PositionEncoding::None);
    }
    let err = NormConfig::new(8)
        .with_eps(0.0)
        .init::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: `eps` = 0: must be positive"
    );
}

/// LayerNorm and RMSNorm against their formulas on one row.
#[test]
fn norms_match_their_formulas() {
    let device = Default::default();
    let row = [1.0f32, 2.0, 4.0, -3.0];
    let x = Tensor::<Cpu, 1>::from_floats(row, &device).reshape([1, 1, 4]);
    let mean = row.iter().sum::<f32>() / 4.0;
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
    let ms = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
    for (kind, expected) in [
        (
            NormKind::LayerNorm,
            row.map(|v| (v - mean) / (var + 1e-5).sqrt()),
        ),
        (NormKind::RmsNorm, row.map(|v| v / (ms + 1e-5).sqrt())),
    ] {
        let norm = NormConfig::new(4)
            .with_kind(kind)
            .init::<Cpu>(&device)
            .unwrap();
        let out: Vec<f32> = norm.forward(x.clone()).into_data().to_vec().unwrap();
        for (a, e) in out.iter().zip(expected) {
            assert!((a - e).abs() < 1e-6, "{kind:?}: {a} vs {e}");
        }
    }
    assert!(NormConfig::new(4)
        .with_kind(NormKind::RmsNorm)
        .init::<Cpu>(&device)
        .unwrap()
        .beta
        .is_none());
}

/// SwiGLU's gate is a real parameter (counted and saved), and the network computes
/// `(silu(x W₁) ⊙ x W₃) W₂`.
#[test]
fn swiglu_has_real_gate_parameters() {
    let device = Default::default();
    let (d, d_ff) = (6, 10);
    let relu = FeedForwardConfig::new(d, d_ff)
        .init::<Cpu>(&device)
        .unwrap();
    let swiglu = FeedForwardConfig::new(d, d_ff)
        .with_activation(Activation::SwiGlu)
        .init::<Cpu>(&device)
        .unwrap();
    assert_eq!(relu.num_params(), 2 * d * d_ff + d_ff + d);
    assert_eq!(swiglu.num_params(), 3 * d * d_ff + 2 * d_ff + d);
    let x = TestRng::new(2).tensor::<Cpu, 3>([1, 3, d], 1.0, &device);
    let x2 = x.clone().reshape([3, d]);
    let gate = swiglu.gate().unwrap();
    let h1 = swiglu.linear1.forward(x2.clone());
    let expected = swiglu
        .linear2
        .forward(burn::tensor::activation::silu(h1) * gate.forward(x2));
    assert!(max_abs_diff(&swiglu.forward(x), &expected.reshape([1, 3, d])) < 1e-6);
}

/// Embeddings are scaled by √d_model; the tied projection is `x Eᵀ`.
#[test]
fn embedding_scale_and_tied_logits() {
    let device = Default::default();
    let emb = TokenEmbeddingConfig::new(5, 4)
        .init::<Cpu>(&device)
        .unwrap();
    let ids = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(vec![3i64, 0], [1, 2]), &device);
    let out = emb.forward(ids);
    let row3 = emb
        .weight
        .val()
        .narrow(0, 3, 1)
        .mul_scalar(2.0)
        .reshape([1, 1, 4]);
    assert!(max_abs_diff(&out.clone().narrow(1, 0, 1), &row3) < 1e-6);
    let logits = emb.logits(out.clone());
    assert_eq!(logits.dims(), [1, 2, 5]);
    let expected = out
        .reshape([2, 4])
        .matmul(emb.weight.val().transpose())
        .reshape([1, 2, 5]);
    assert!(max_abs_diff(&logits, &expected) < 1e-6);

    // Both product orders (few rows: `(E xᵀ)ᵀ`; many: `x Eᵀ`) give `x Eᵀ`.
    let mut rng = TestRng::new(9);
    for rows in [1, 16, 17, 40] {
        let x = rng.tensor::<Cpu, 3>([1, rows, 4], 1.0, &device);
        let expected = x
            .clone()
            .reshape([rows, 4])
            .matmul(emb.weight.val().transpose())
            .reshape([1, rows, 5]);
        let diff = max_abs_diff(&emb.logits(x), &expected);
        assert!(diff < 1e-5, "{rows} rows: {diff}");
    }
}

/// F16 and BF16 tensors are read exactly as f32, integer and boolean buffers as their values;
/// an 8-bit float tensor is a typed error naming it.
#[test]
fn state_dict_reads_half_floats_and_integers_and_rejects_fp8() {
    use safetensors::tensor::{serialize, TensorView};
    use safetensors::Dtype;
    // 1.0, -2.5, 65504 (largest f16), 2^-24 (smallest subnormal), -0.0, 0.333251953125
    let halves: [u16; 6] = [0x3c00, 0xc100, 0x7bff, 0x0001, 0x8000, 0x3555];
    let expected = [1.0f32, -2.5, 65504.0, 2f32.powi(-24), -0.0, 0.333_251_95];
    let f16_bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
    // BF16 is the upper half of f32.
    let bf16_bytes: Vec<u8> = [1.0f32, -2.5]
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let tensors = vec![
        (
            "h",
            TensorView::new(Dtype::F16, vec![2, 3], &f16_bytes).unwrap(),
        ),
        (
            "b",
            TensorView::new(Dtype::BF16, vec![2], &bf16_bytes).unwrap(),
        ),
    ];
    let bytes = serialize(tensors, None).unwrap();
    let dict = StateDict::from_bytes(&bytes).unwrap();
    let (shape, values) = dict.get("h").expect("F16 tensor read");
    assert_eq!(shape, &[2, 3]);
    for (v, e) in values.iter().zip(expected) {
        assert_eq!(v.to_bits(), e.to_bits(), "{v} != {e}");
    }
    assert_eq!(dict.get("b").unwrap().1, &[1.0, -2.5]);

    assert_eq!(dict.dtype("h"), Some("F16"));

    let ints: Vec<u8> = [7i64, -8, 1 << 24]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let flags = [1u8, 0];
    let bytes = serialize(
        vec![
            ("ids", TensorView::new(Dtype::I64, vec![3], &ints).unwrap()),
            (
                "mask",
                TensorView::new(Dtype::BOOL, vec![2], &flags).unwrap(),
            ),
        ],
        None,
    )
    .unwrap();
    let dict = StateDict::from_bytes(&bytes).unwrap();
    assert_eq!(dict.get("ids").unwrap().1, &[7.0, -8.0, 16_777_216.0]);
    assert_eq!(dict.dtype("ids"), Some("I64"));
    assert_eq!(dict.get("mask").unwrap().1, &[1.0, 0.0]);

    let fp8 = [0x38u8, 0x40];
    let bytes = serialize(
        vec![("q", TensorView::new(Dtype::F8_E4M3, vec![2], &fp8).unwrap())],
        None,
    )
    .unwrap();
    match StateDict::from_bytes(&bytes) {
        Err(BlockError::UnsupportedDtype { name, dtype }) => {
            assert_eq!(name, "q");
            assert_eq!(dtype, "F8_E4M3");
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
}

/// `exact_gelu` on flex takes the vectorised host kernel (`xfmr_kernels::gelu`, tested against
/// libm in xfmr-kernels), bit for bit, and not burn's `gelu`, from which it differs. Compiled
/// only with this crate's `flex` feature (`cargo test --workspace` turns it on); `.ci/run`
/// fails when the test did not run.
#[cfg(feature = "flex")]
#[test]
fn exact_gelu_on_flex_takes_the_kernel() {
    use burn::backend::Flex;
    use burn::tensor::Tensor;
    use xfmr_blocks::exact_gelu;

    let xs: Vec<f32> = (-3_000..=3_000).map(|i| i as f32 * 1e-3).collect();
    let x = || Tensor::<Flex, 1>::from_floats(xs.as_slice(), &Default::default());
    let ours: Vec<f32> = exact_gelu(x()).into_data().to_vec().unwrap();
    let kernel: Vec<f32> = xfmr_kernels::gelu(x()).into_data().to_vec().unwrap();
    let burns: Vec<f32> = burn::tensor::activation::gelu(x())
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(ours, kernel, "exact_gelu on flex is not the kernel");
    assert_ne!(
        ours, burns,
        "the kernel and burn's gelu agree bit for bit: no proof of the path"
    );
}

/// `exact_gelu` on `Autodiff<Flex>` is the kernel's operation: its value is
/// `xfmr_kernels::gelu`'s bit for bit, its gradient `xfmr_kernels::gelu_backward_in_place`'s
/// bit for bit (the proof of the path), and that gradient is within 1e-6 absolute of the
/// composed exact path's on `Autodiff<NdArray>` (libm's `erf`; the kernel's is within
/// 1.5e-7), for an incoming gradient that is not 1. Compiled only with this crate's `flex`
/// feature; `.ci/run` fails when the test did not run.
#[cfg(feature = "flex")]
#[test]
fn exact_gelu_on_autodiff_flex_takes_the_kernel() {
    use burn::backend::{Autodiff, Flex, NdArray};
    use xfmr_blocks::exact_gelu;

    let xs: Vec<f32> = (-3_000..3_000).map(|i| i as f32 * 2e-3).collect();
    let ws: Vec<f32> = (0..xs.len()).map(|i| (i % 17) as f32 * 0.1 - 0.7).collect();
    fn run<B: burn::tensor::backend::AutodiffBackend>(xs: &[f32], ws: &[f32]) -> [Vec<f32>; 2] {
        let device = B::Device::default();
        let x = Tensor::<B, 1>::from_floats(xs, &device).require_grad();
        let y = exact_gelu(x.clone().reshape([3, xs.len() / 3]));
        let w = Tensor::<B, 1>::from_floats(ws, &device).reshape([3, xs.len() / 3]);
        let grads = (y.clone() * w).sum().backward();
        let grad = x.grad(&grads).expect("x is tracked");
        let values = |t: Tensor<B::InnerBackend, 1>| t.into_data().to_vec::<f32>().unwrap();
        [values(y.inner().reshape([xs.len()])), values(grad)]
    }
    let [value, grad] = run::<Autodiff<Flex>>(&xs, &ws);
    let kernel: Vec<f32> = xfmr_kernels::gelu(Tensor::<Flex, 1>::from_floats(
        xs.as_slice(),
        &Default::default(),
    ))
    .into_data()
    .to_vec()
    .unwrap();
    assert_eq!(
        value, kernel,
        "exact_gelu on Autodiff<Flex> is not the kernel"
    );
    let mut kernel_grad = ws.clone();
    xfmr_kernels::gelu_backward_in_place(&xs, &mut kernel_grad);
    assert_eq!(grad, kernel_grad, "the gradient is not the kernel's");
    let [_, composed] = run::<Autodiff<NdArray>>(&xs, &ws);
    for (i, (a, b)) in grad.iter().zip(&composed).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6,
            "∂/∂x at x = {}: the kernel {a}, the composed path {b}",
            xs[i]
        );
    }
}

/// `Norm::forward` on flex takes the row kernel (`xfmr_kernels::norm`, tested against f64
/// formulas in xfmr-kernels), bit for bit, for LayerNorm (MiniLM's ε, γ and β set) and RMSNorm;
/// it agrees with the nine-operation composition (on ndarray) within 2e-6 absolute plus 2e-6
/// relative (the two sum in different orders), and differs from it somewhere (the proof of the
/// path); an RMSNorm given a β keeps burn's path. Compiled only with this crate's `flex`
/// feature; `.ci/run` fails when it did not run.
#[cfg(feature = "flex")]
#[test]
fn norm_on_flex_takes_the_kernel() {
    use burn::backend::{Flex, NdArray};
    use burn::module::Param;
    use burn::tensor::{backend::Backend, Tensor};
    use xfmr_blocks::{Norm, NormConfig, NormKind};

    let (batch, seq, d) = (2, 5, 384);
    let xs: Vec<f32> = (0..batch * seq * d)
        .map(|i| ((i * 7_919 % 1_013) as f32 - 506.0) * 0.013 + (i / d) as f32 * 0.5)
        .collect();
    let gammas: Vec<f32> = (0..d).map(|j| 0.5 + (j % 7) as f32 * 0.25).collect();
    let betas: Vec<f32> = (0..d).map(|j| (j % 5) as f32 * 0.1 - 0.2).collect();
    // A norm with these γ and β; with `beta`, also for an RMSNorm (a public field that `init`
    // never sets for one).
    fn norm<B: Backend>(kind: NormKind, gammas: &[f32], betas: Option<&[f32]>) -> Norm<B> {
        let device = Default::default();
        let mut n = NormConfig::new(gammas.len())
            .with_kind(kind)
            .with_eps(1e-12)
            .init::<B>(&device)
            .unwrap();
        n.gamma = Param::from_tensor(Tensor::from_floats(gammas, &device));
        n.beta = betas.map(|b| Param::from_tensor(Tensor::from_floats(b, &device)));
        n
    }
    fn forward<B: Backend>(n: &Norm<B>, xs: &[f32], shape: [usize; 3]) -> Vec<f32> {
        n.forward(Tensor::<B, 1>::from_floats(xs, &Default::default()).reshape(shape))
            .into_data()
            .to_vec()
            .unwrap()
    }
    fn assert_close(what: &str, got: &[f32], want: &[f32]) {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 2e-6 + 2e-6 * b.abs(),
                "{what} element {i}: flex {a}, ndarray {b}"
            );
        }
    }
    let shape = [batch, seq, d];
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let beta = (kind == NormKind::LayerNorm).then_some(betas.as_slice());
        let flex = norm::<Flex>(kind, &gammas, beta);
        let ours = forward::<Flex>(&flex, &xs, shape);
        let kernel: Vec<f32> = xfmr_kernels::norm(
            Tensor::<Flex, 1>::from_floats(xs.as_slice(), &Default::default()).reshape(shape),
            flex.gamma.val(),
            flex.beta.as_ref().map(Param::val),
            1e-12,
            kind == NormKind::RmsNorm,
        )
        .into_data()
        .to_vec()
        .unwrap();
        assert_eq!(ours, kernel, "{kind:?} on flex is not the kernel");
        let composed = forward::<NdArray>(&norm(kind, &gammas, beta), &xs, shape);
        assert_close(&format!("{kind:?}"), &ours, &composed);
        assert_ne!(
            ours, composed,
            "{kind:?}: the kernel and the composition agree bit for bit: no proof of the path"
        );
    }
    // An RMSNorm given a β keeps burn's path, which adds it: flex agrees with ndarray within
    // the same bound.
    let beta = Some(betas.as_slice());
    assert_close(
        "RMSNorm with β",
        &forward::<Flex>(&norm(NormKind::RmsNorm, &gammas, beta), &xs, shape),
        &forward::<NdArray>(&norm(NormKind::RmsNorm, &gammas, beta), &xs, shape),
    );
}

/// `xfmr_blocks::dropout` under `Autodiff<Flex>` takes xfmr's mask (`xfmr_kernels::dropout_mask`)
/// and keeps burn's law: every output is 0 or `x/(1−p)`; the dropped fraction is within 5σ of
/// `p` (binomial); the gradient of `sum(dropout(x))` is the mask itself (`1/(1−p)` where kept, 0
/// where dropped); another seed, another mask; the identity without autodiff and at `p = 0`.
/// burn's own `Dropout::forward` with the same seed gives another mask (the proof of the path).
#[cfg(feature = "flex")]
#[test]
fn dropout_on_autodiff_flex_takes_xfmr_mask() {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::DropoutConfig;
    use burn::tensor::backend::Backend;
    type B = Autodiff<Flex>;
    let device = Default::default();
    let (n, p) = (200_000usize, 0.1f64);
    let d = DropoutConfig::new(p).init();
    let xs: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32).collect();
    let x = || Tensor::<B, 1>::from_floats(xs.as_slice(), &device).require_grad();
    let run = |seed: u64| {
        B::seed(&device, seed);
        let x = x();
        let y = xfmr_blocks::dropout(&d, x.clone());
        let grads = y.clone().sum().backward();
        let y: Vec<f32> = y.into_data().to_vec().unwrap();
        let g: Vec<f32> = x.grad(&grads).unwrap().into_data().to_vec().unwrap();
        (y, g)
    };
    let (y, g) = run(5);
    let scale = 1.0 / (1.0 - p as f32);
    let mut dropped = 0usize;
    for i in 0..n {
        if y[i] == 0.0 {
            dropped += 1;
            assert_eq!(g[i], 0.0, "element {i}: dropped but gradient {}", g[i]);
        } else {
            assert_eq!(y[i], xs[i] * scale, "element {i}");
            assert_eq!(g[i], scale, "element {i}: gradient");
        }
    }
    let sigma = (n as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (dropped as f64 - n as f64 * p).abs() <= 5.0 * sigma,
        "{dropped} of {n} dropped at p = {p}"
    );
    // (That one seed gives one mask is not asserted here: other tests of this binary draw from
    // flex's one global generator meanwhile. `dropout_mask` is a function of its seed,
    // tested in xfmr-kernels.)
    assert_ne!(run(6).0, y, "two seeds give one mask");
    B::seed(&device, 5);
    let burns: Vec<f32> = d.forward(x()).into_data().to_vec().unwrap();
    assert_ne!(
        burns, y,
        "burn's dropout gives the same mask: no proof of the path"
    );
    let plain = Tensor::<Flex, 1>::from_floats(xs.as_slice(), &device);
    let same: Vec<f32> = xfmr_blocks::dropout(&d, plain)
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(same, xs, "dropout changed a tensor outside autodiff");
    let off = DropoutConfig::new(0.0).init();
    let kept: Vec<f32> = xfmr_blocks::dropout(&off, x())
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(kept, xs, "dropout 0 changed the tensor");
}

/// Inside `xfmr_attention::with_dropout_seed` the masks of `Autodiff<Flex>` come from the
/// calling thread's own stream: two threads given one seed draw the same three masks while a
/// third reseeds and draws from flex's one generator meanwhile (what two replicas of a run on
/// one CPU do); successive masks of a stream differ, another seed gives others, and a
/// nested call's stream ends with it.
#[cfg(feature = "flex")]
#[test]
fn dropout_seed_stream_is_the_threads_own() {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::DropoutConfig;
    use burn::tensor::backend::Backend;
    use burn::tensor::Distribution;
    type B = Autodiff<Flex>;
    let device = Default::default();
    let d = DropoutConfig::new(0.5).init();
    let ones = || Tensor::<B, 1>::ones([4096], &device);
    let masks = |seed: u64| -> Vec<Vec<f32>> {
        xfmr_attention::with_dropout_seed(seed, || {
            (0..3)
                .map(|_| {
                    let y = xfmr_blocks::dropout(&d, ones());
                    y.into_data().to_vec::<f32>().unwrap()
                })
                .collect()
        })
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| masks(7));
        let b = s.spawn(|| masks(7));
        s.spawn(|| {
            for i in 0..200 {
                B::seed(&device, i);
                let _ = Tensor::<B, 1>::random([64], Distribution::Default, &device).into_data();
            }
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, b, "one seed, two threads, other masks");
    assert_ne!(a[0], a[1], "a stream repeated its mask");
    assert_ne!(masks(8), a, "two seeds give the same masks");
    // A nested stream ends with its call: the outer one goes on where it was.
    let resumed: Vec<Vec<f32>> = xfmr_attention::with_dropout_seed(7, || {
        let first = xfmr_blocks::dropout(&d, ones());
        xfmr_attention::with_dropout_seed(9, || xfmr_blocks::dropout(&d, ones()));
        let second = xfmr_blocks::dropout(&d, ones());
        [first, second]
            .into_iter()
            .map(|y| y.into_data().to_vec::<f32>().unwrap())
            .collect()
    });
    assert_eq!(
        resumed,
        a[..2],
        "the nested stream did not restore the outer one"
    );
}

/// Damaged safetensors bytes are `BlockError::Read`, never a panic: the file cut at every
/// length, its header's length field lying (past the end, `u64::MAX`), every header byte
/// inverted (an error or a dictionary, not a panic); through `from_file` the error names the
/// file.
#[test]
fn corrupt_safetensors_bytes_are_read_errors() {
    use safetensors::tensor::{serialize, TensorView};
    use safetensors::Dtype;
    let values: Vec<u8> = [1.0f32, -2.0, 3.5, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bytes = serialize(
        vec![
            (
                "w",
                TensorView::new(Dtype::F32, vec![2, 2], &values).unwrap(),
            ),
            ("b", TensorView::new(Dtype::F32, vec![4], &values).unwrap()),
        ],
        None,
    )
    .unwrap();
    assert!(StateDict::from_bytes(&bytes).is_ok());
    let read_error = |bytes: &[u8], case: &str| match StateDict::from_bytes(bytes) {
        Err(BlockError::Read(_)) => {}
        other => panic!("{case}: expected a read error, got {other:?}"),
    };
    for len in 0..bytes.len() {
        read_error(&bytes[..len], &format!("cut at {len} of {}", bytes.len()));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for lie in [bytes.len() as u64, u64::MAX, (header_len + 1) as u64] {
        let mut b = bytes.clone();
        b[..8].copy_from_slice(&lie.to_le_bytes());
        read_error(&b, &format!("header length {lie}"));
    }
    for i in 8..8 + header_len {
        let mut b = bytes.clone();
        b[i] ^= 0xff;
        let _ = StateDict::from_bytes(&b); // an error or a dictionary; a panic fails the test
    }
    let path =
        std::env::temp_dir().join(format!("xfmr-corrupt-{}.safetensors", std::process::id()));
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = StateDict::from_file(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    match err {
        BlockError::Read(m) => assert!(m.contains(&path.display().to_string()), "{m}"),
        other => panic!("expected a read error naming the file, got {other:?}"),
    }
}

/// The feed-forward's projections start as PyTorch's `nn.Linear`: weights and biases uniform
/// in `±1/√fan_in` (the weights checked by `xfmr_testing::assert_uniform`; the biases, 256 and
/// 64 draws, inside the bound and not all zero).
#[test]
fn ffn_initialisation_is_nn_linears() {
    let (d_model, d_ff) = (64, 256);
    let ffn = FeedForwardConfig::new(d_model, d_ff)
        .init::<Cpu>(&Default::default())
        .unwrap();
    for (name, linear, fan_in) in [("W1", &ffn.linear1, d_model), ("W2", &ffn.linear2, d_ff)] {
        let bound = 1.0 / (fan_in as f64).sqrt();
        let (weight, bias) = linear_values(linear);
        assert_uniform(name, &weight, bound);
        assert!(!bias.is_empty(), "{name}: no bias");
        assert!(
            bias.iter().all(|v| v.abs() <= bound * (1.0 + 1e-6)),
            "{name}: a bias outside ±{bound}"
        );
        assert!(bias.iter().any(|&b| b != 0.0), "{name}: bias all zero");
    }
}

/// `add_positions` adds the vectors of positions `offset..offset + seq` to every sequence of
/// the batch: each element equals `x + table[offset + t]` (one `f32` sum, so exactly), for
/// the sinusoids and a learned table, at offsets 0 and 3.
#[test]
fn add_positions_adds_each_position_to_every_sequence() {
    let device = Default::default();
    let (batch, seq, d_model, max_len) = (3, 5, 8, 16);
    let x = Tensor::<Cpu, 3>::from_data(
        TensorData::new(
            (0..batch * seq * d_model)
                .map(|i| (i as f32 * 0.37).sin())
                .collect::<Vec<f32>>(),
            [batch, seq, d_model],
        ),
        &device,
    );
    for scheme in [PositionEncoding::Sinusoidal, PositionEncoding::Learned] {
        let positions = scheme
            .init_input::<Cpu>(max_len, d_model, &device)
            .unwrap()
            .unwrap();
        for offset in [0, 3] {
            let table: Vec<f32> = positions
                .range(seq, offset)
                .unwrap()
                .into_data()
                .to_vec()
                .unwrap();
            let got: Vec<f32> = add_positions(Some(&positions), x.clone(), offset)
                .unwrap()
                .into_data()
                .to_vec()
                .unwrap();
            let xs: Vec<f32> = x.clone().into_data().to_vec().unwrap();
            let want: Vec<f32> = xs
                .iter()
                .enumerate()
                .map(|(i, v)| v + table[i % (seq * d_model)])
                .collect();
            assert_eq!(got, want, "{scheme:?} at offset {offset}");
        }
    }
}
