//! Incremental decoding, import errors, and the pieces against their formulas.

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    Activation, BlockError, DecoderInput, FeedForwardConfig, LayerConfig, NormConfig, NormKind,
    NormPosition, PositionEncoding, RotaryLayout, SelfAttentionInput, StackConfig, StateDict,
    TokenEmbeddingConfig,
};
use xfmr_testing::{max_abs_diff, TestRng};

use crate::Cpu;

/// Decoding one position at a time through the decoder stack's caches equals the full causal
/// pass (≤ 1e-5), for post- and pre-norm, with target and memory padding.
#[test]
fn incremental_decoding_equals_full_pass() {
    let device = Default::default();
    let mut rng = TestRng::new(1);
    for position in [NormPosition::Post, NormPosition::Pre] {
        let layer = LayerConfig::new(16, 4, 32)
            .with_dropout(0.0)
            .with_norm_position(position)
            .with_activation(Activation::Gelu);
        let decoder = StackConfig::new(layer, 2)
            .with_final_norm(true)
            .init_decoder::<Cpu>(&device)
            .unwrap();
        let (batch, seq, src) = (2, 6, 5);
        let tgt = rng.tensor::<Cpu, 3>([batch, seq, 16], 1.0, &device);
        let memory = rng.tensor::<Cpu, 3>([batch, src, 16], 1.0, &device);
        let memory_mask = AttnMask::padding_from_lengths(&[5, 3], src, &device).unwrap();
        let tgt_mask = AttnMask::padding_from_lengths(&[6, 4], seq, &device).unwrap();
        let full = decoder.forward(
            DecoderInput::new(tgt.clone())
                .memory(&memory)
                .self_mask(tgt_mask.clone())
                .memory_mask(memory_mask.clone()),
        );
        let mut cache = decoder.start(&memory, Some(memory_mask));
        let steps: Vec<_> = (0..seq)
            .map(|t| {
                let step = DecoderInput::new(tgt.clone().narrow(1, t, 1))
                    .self_mask(tgt_mask.clone().narrow_keys(0, t + 1));
                decoder.step(step, &mut cache).hidden
            })
            .collect();
        assert_eq!(cache.len(), seq);
        let diff = max_abs_diff(&full, &Tensor::cat(steps, 1));
        assert!(diff <= 1e-5, "{position:?}: max |diff| {diff}");
    }
}

/// A causal self-attention stack (decoder-only) fed in chunks through its caches equals its
/// full causal pass (≤ 1e-5), with grouped key/value heads; the decoder's cross-attention
/// weights come back for the last layer.
#[test]
fn causal_stack_cached_equals_full_and_cross_weights() {
    let device = Default::default();
    let mut rng = TestRng::new(2);
    for position in [NormPosition::Post, NormPosition::Pre] {
        let layer = LayerConfig::new(16, 4, 32)
            .with_n_kv_heads(Some(2))
            .with_dropout(0.0)
            .with_norm_position(position);
        let stack = StackConfig::new(layer.clone(), 3)
            .with_final_norm(true)
            .init_causal::<Cpu>(&device)
            .unwrap();
        let x = rng.tensor::<Cpu, 3>([2, 7, 16], 1.0, &device);
        let full = stack.forward(SelfAttentionInput::new(x.clone()));
        let mut cache = stack.start();
        let chunks: Vec<_> = [(0, 3), (3, 1), (4, 3)]
            .into_iter()
            .map(|(start, len)| {
                stack.step(
                    SelfAttentionInput::new(x.clone().narrow(1, start, len)),
                    &mut cache,
                )
            })
            .collect();
        assert_eq!(cache.len(), 7);
        let diff = max_abs_diff(&full, &Tensor::cat(chunks, 1));
        assert!(diff <= 1e-5, "{position:?}: max |diff| {diff}");
        // Not the bidirectional pass of the same layers.
        let bidirectional = xfmr_blocks::Encoder {
            layers: stack.layers.clone(),
            norm: stack.norm.clone(),
        };
        assert!(max_abs_diff(&full, &bidirectional.forward(SelfAttentionInput::new(x))) > 1e-3);

        let decoder = StackConfig::new(layer, 2)
            .init_decoder::<Cpu>(&device)
            .unwrap();
        let memory = rng.tensor::<Cpu, 3>([2, 5, 16], 1.0, &device);
        let mask = AttnMask::padding_from_lengths(&[5, 2], 5, &device).unwrap();
        let mut cache = decoder.start(&memory, Some(mask));
        let out = decoder.step(
            DecoderInput::new(rng.tensor::<Cpu, 3>([2, 1, 16], 1.0, &device)).need_weights(),
            &mut cache,
        );
        let weights = out.cross_weights.expect("weights requested");
        assert_eq!(weights.dims(), [2, 4, 1, 5]);
        let w = xfmr_testing::to_vec(&weights);
        // Row 1 has two real source positions: the rest get exactly zero.
        assert!(w[20..].chunks(5).all(|r| r[2..].iter().all(|&v| v == 0.0)));
        for row in w.chunks(5) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5);
        }
    }
}

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
    assert_eq!(err, BlockError::InvalidDropout { prob: 1.0 });
    let err = StackConfig::new(LayerConfig::new(8, 2, 8), 0)
        .init_encoder::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(err.to_string(), "`n_layers` must be positive, got 0");
    let err = NormConfig::new(8)
        .with_eps(0.0)
        .init::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(err.to_string(), "norm epsilon must be positive, got 0");
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
    let gate = swiglu.gate.as_ref().unwrap();
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

/// RoPE (both pair layouts) and ALiBi inside the stacks: the causal stack fed in chunks and the
/// decoder fed one position at a time equal their full passes (≤ 1e-5), with grouped heads,
/// RMSNorm and SwiGLU; and the scheme really acts (outputs differ from no positions).
#[test]
fn rotary_and_alibi_cached_equal_full() {
    let device = Default::default();
    let mut rng = TestRng::new(5);
    let schemes = [
        PositionEncoding::rotary(),
        PositionEncoding::Rotary {
            theta: 500.0,
            layout: RotaryLayout::Interleaved,
        },
        PositionEncoding::Alibi,
    ];
    let x = rng.tensor::<Cpu, 3>([2, 6, 16], 1.0, &device);
    let memory = rng.tensor::<Cpu, 3>([2, 4, 16], 1.0, &device);
    for positions in schemes {
        let layer = LayerConfig::new(16, 4, 32)
            .with_n_kv_heads(Some(2))
            .with_dropout(0.0)
            .with_norm(NormKind::RmsNorm)
            .with_norm_position(NormPosition::Pre)
            .with_activation(Activation::SwiGlu)
            .with_bias(false)
            .with_positions(positions.clone());
        let stack = StackConfig::new(layer.clone(), 2)
            .with_final_norm(true)
            .init_causal::<Cpu>(&device)
            .unwrap();
        let full = stack.forward(SelfAttentionInput::new(x.clone()));
        let mut cache = stack.start();
        let chunks: Vec<_> = [(0, 2), (2, 1), (3, 3)]
            .into_iter()
            .map(|(s, l)| {
                stack.step(
                    SelfAttentionInput::new(x.clone().narrow(1, s, l)),
                    &mut cache,
                )
            })
            .collect();
        let diff = max_abs_diff(&full, &Tensor::cat(chunks, 1));
        assert!(
            diff <= 1e-5,
            "{positions:?} causal stack: max |diff| {diff}"
        );
        let mut plain = stack.clone();
        for l in &mut plain.layers {
            l.positions = None;
        }
        let without = plain.forward(SelfAttentionInput::new(x.clone()));
        assert!(
            max_abs_diff(&full, &without) > 1e-3,
            "{positions:?} changes nothing"
        );

        let decoder = StackConfig::new(layer, 2)
            .with_final_norm(true)
            .init_decoder::<Cpu>(&device)
            .unwrap();
        let full = decoder.forward(DecoderInput::new(x.clone()).memory(&memory));
        let mut cache = decoder.start(&memory, None);
        let steps: Vec<_> = (0..6)
            .map(|t| {
                decoder
                    .step(DecoderInput::new(x.clone().narrow(1, t, 1)), &mut cache)
                    .hidden
            })
            .collect();
        let diff = max_abs_diff(&full, &Tensor::cat(steps, 1));
        assert!(diff <= 1e-5, "{positions:?} decoder: max |diff| {diff}");
    }
}

/// Reordering a decoder cache (beam search) equals decoding the reordered batch from scratch;
/// the projected memory moves only when a row changes source sentence.
#[test]
fn decoder_cache_reorder_follows_sources() {
    let device = Default::default();
    let mut rng = TestRng::new(6);
    let layer = LayerConfig::new(16, 4, 32).with_dropout(0.0);
    let decoder = StackConfig::new(layer, 2)
        .init_decoder::<Cpu>(&device)
        .unwrap();
    let memory = rng.tensor::<Cpu, 3>([2, 5, 16], 1.0, &device);
    let mask = AttnMask::padding_from_lengths(&[5, 3], 5, &device).unwrap();
    let x = rng.tensor::<Cpu, 3>([4, 3, 16], 1.0, &device);

    let mut cache = decoder.start(&memory, Some(mask.clone()));
    // Expand to two hypotheses per source: rows 0, 1 read source 0; rows 2, 3 source 1.
    cache.reorder(&[0, 0, 1, 1]);
    assert_eq!(cache.memory.sources(), &[0, 0, 1, 1]);
    let keys_before = cache.memory.layers[0].keys().unwrap().clone();
    decoder.step(DecoderInput::new(x.clone().narrow(1, 0, 2)), &mut cache);
    // A beam reorder inside each source's group: the memory is not gathered again.
    let order = [1usize, 1, 3, 2];
    cache.reorder(&order);
    assert_eq!(cache.memory.sources(), &[0, 0, 1, 1]);
    assert!(max_abs_diff(cache.memory.layers[0].keys().unwrap(), &keys_before) == 0.0);
    // The same rows decoded from scratch over the matching memory rows.
    let idx = |v: &[i64]| {
        Tensor::<Cpu, 1, Int>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device)
    };
    let x_rows = x.select(0, idx(&[1, 1, 3, 2]));
    // The last step feeds each surviving hypothesis its own next token, in the new order.
    let last = decoder
        .step(
            DecoderInput::new(x_rows.clone().narrow(1, 2, 1)),
            &mut cache,
        )
        .hidden;

    let mem_rows = memory.select(0, idx(&[0, 0, 1, 1]));
    let mask_rows = mask.select_batch(idx(&[0, 0, 1, 1]));
    let expected = decoder
        .forward(
            DecoderInput::new(x_rows)
                .memory(&mem_rows)
                .memory_mask(mask_rows),
        )
        .narrow(1, 2, 1);
    assert!(max_abs_diff(&last, &expected) <= 1e-5);

    // Moving a row to another source gathers the memory (and its mask) too.
    cache.reorder(&[2, 0, 3, 1]);
    assert_eq!(cache.memory.sources(), &[1, 0, 1, 0]);
    assert_eq!(cache.memory.mask.as_ref().unwrap().dims()[0], 4);
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

/// `exact_gelu` on flex (with the `flex` feature: the vectorised host kernel) against burn's
/// libm-based `gelu` on ndarray, every 1e-3 over [-12, 12] and at +∞, ±0, ±1e-30: within 1e-6
/// absolute plus 2e-7 relative (the kernel's `erf` is within 1.5e-7 absolute; `x` scales it).
#[test]
fn exact_gelu_on_flex_matches_libm() {
    use burn::backend::{Flex, NdArray};
    use burn::tensor::Tensor;
    use xfmr_blocks::exact_gelu;

    let mut xs: Vec<f32> = (-12_000..=12_000).map(|i| i as f32 * 1e-3).collect();
    xs.extend([0.0, -0.0, f32::INFINITY, 1e-30, -1e-30]);
    let n = xs.len();
    let flex: Vec<f32> = exact_gelu(
        Tensor::<Flex, 1>::from_floats(xs.as_slice(), &Default::default()).reshape([1, n]),
    )
    .into_data()
    .to_vec()
    .unwrap();
    let reference: Vec<f32> = burn::tensor::activation::gelu(Tensor::<NdArray, 1>::from_floats(
        xs.as_slice(),
        &Default::default(),
    ))
    .into_data()
    .to_vec()
    .unwrap();
    for ((x, got), want) in xs.iter().zip(&flex).zip(&reference) {
        if want.is_infinite() {
            assert_eq!(got, want, "gelu({x})");
            continue;
        }
        assert!(
            (got - want).abs() <= 1e-6 + 2e-7 * want.abs(),
            "gelu({x}) = {got}, libm gives {want}"
        );
    }
}
