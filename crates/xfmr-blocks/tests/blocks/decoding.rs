//! Incremental decoding: cached steps equal full passes (every position scheme), cross
//! weights, beam reordering of the decoder cache.
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    Activation, DecoderInput, DecoderStepInput, LayerConfig, NormKind, NormPosition,
    PositionEncoding, RotaryLayout, SelfAttentionInput, StackConfig,
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
            DecoderInput::new(tgt.clone(), &memory)
                .self_mask(tgt_mask.clone())
                .memory_mask(memory_mask.clone()),
        );
        let mut cache = decoder.start(&memory, Some(memory_mask));
        let steps: Vec<_> = (0..seq)
            .map(|t| {
                let step = DecoderStepInput::new(tgt.clone().narrow(1, t, 1))
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
            DecoderStepInput::new(rng.tensor::<Cpu, 3>([2, 1, 16], 1.0, &device)).need_weights(),
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
            .with_bias(false);
        let stack = StackConfig::new(layer.clone(), 2)
            .with_final_norm(true)
            .with_positions(positions.clone())
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
            .with_positions(positions.clone())
            .init_decoder::<Cpu>(&device)
            .unwrap();
        let full = decoder.forward(DecoderInput::new(x.clone(), &memory));
        let mut cache = decoder.start(&memory, None);
        let steps: Vec<_> = (0..6)
            .map(|t| {
                decoder
                    .step(DecoderStepInput::new(x.clone().narrow(1, t, 1)), &mut cache)
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
    assert_eq!(cache.cross.sources(), &[0, 0, 1, 1]);
    let keys_before = cache.cross.layers[0].keys().clone();
    decoder.step(DecoderStepInput::new(x.clone().narrow(1, 0, 2)), &mut cache);
    // A beam reorder inside each source's group: the memory is not gathered again.
    let order = [1usize, 1, 3, 2];
    cache.reorder(&order);
    assert_eq!(cache.cross.sources(), &[0, 0, 1, 1]);
    assert!(max_abs_diff(cache.cross.layers[0].keys(), &keys_before) == 0.0);
    // The same rows decoded from scratch over the matching memory rows.
    let idx = |v: &[i64]| {
        Tensor::<Cpu, 1, Int>::from_data(TensorData::new(v.to_vec(), [v.len()]), &device)
    };
    let x_rows = x.select(0, idx(&[1, 1, 3, 2]));
    // The last step feeds each surviving hypothesis its own next token, in the new order.
    let last = decoder
        .step(
            DecoderStepInput::new(x_rows.clone().narrow(1, 2, 1)),
            &mut cache,
        )
        .hidden;

    let mem_rows = memory.select(0, idx(&[0, 0, 1, 1]));
    let mask_rows = mask.select_batch(idx(&[0, 0, 1, 1]));
    let expected = decoder
        .forward(DecoderInput::new(x_rows, &mem_rows).memory_mask(mask_rows))
        .narrow(1, 2, 1);
    assert!(max_abs_diff(&last, &expected) <= 1e-5);

    // Moving a row to another source gathers the memory (and its mask) too.
    cache.reorder(&[2, 0, 3, 1]);
    assert_eq!(cache.cross.sources(), &[1, 0, 1, 0]);
    assert_eq!(cache.cross.mask.as_ref().unwrap().dims()[0], 4);
}
