//! The shared layer options in every model: RoPE, ALiBi, RMSNorm, SwiGLU, grouped key/value
//! heads and bias-free projections. Each decoding model, partly trained with the option, gives
//! cached steps equal to a full recomputation of the prefix (≤ 1e-4 on the logits); batches
//! equal their rows; the encoder-only model keeps real positions independent of padding.

use burn::tensor::Tensor;
use xfmr_blocks::{
    Activation, LayerConfig, NormKind, NormPosition, PositionEncoding, RotaryLayout,
};
use xfmr_models::checkpoint;
use xfmr_models::{
    DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig, GenerationOptions, Transformer,
    TransformerConfig,
};
use xfmr_testing::assert_tensors_close;

use crate::{
    greedy_by_steps_lm, greedy_by_steps_transformer, ids, sources, trained_lm, trained_transformer,
    Cpu, Device, BOS, EOS, PAD, VOCAB,
};

const MAX_LEN: usize = 10;

/// The layer and position variants under test, by name.
fn variants(base: LayerConfig) -> Vec<(&'static str, LayerConfig, PositionEncoding)> {
    let llama = base
        .clone()
        .with_norm(NormKind::RmsNorm)
        .with_norm_position(NormPosition::Pre)
        .with_activation(Activation::SwiGlu)
        .with_n_kv_heads(Some(2))
        .with_bias(false);
    vec![
        ("rope", base.clone(), PositionEncoding::rotary()),
        (
            "rope-interleaved",
            base.clone(),
            PositionEncoding::Rotary {
                theta: 10000.0,
                layout: RotaryLayout::Interleaved,
            },
        ),
        ("alibi", base.clone(), PositionEncoding::Alibi),
        (
            "rmsnorm+swiglu+gqa+rope",
            llama.clone(),
            PositionEncoding::rotary(),
        ),
        ("rmsnorm+swiglu+gqa+alibi", llama, PositionEncoding::Alibi),
    ]
}

/// Cached greedy steps equal the full recomputation, and the decoder is not degenerate.
fn check_transformer(model: &Transformer<Cpu>, what: &str) {
    let prefix = greedy_by_steps_transformer(model, sources()[0].clone(), MAX_LEN, what);
    let distinct: std::collections::BTreeSet<u32> = prefix[1..].iter().copied().collect();
    assert!(
        distinct.len() > 1,
        "{what}: a degenerate decoder ({prefix:?})"
    );
}

fn check_lm(model: &DecoderOnly<Cpu>, what: &str) {
    greedy_by_steps_lm(model, sources()[2].clone(), MAX_LEN, what);
}

#[test]
fn encoder_decoder_variants_cache_equals_full() {
    for (i, (name, layer, positions)) in variants(TransformerConfig::tiny(VOCAB).layer)
        .into_iter()
        .enumerate()
    {
        let config = TransformerConfig {
            layer,
            positions,
            ..TransformerConfig::tiny(VOCAB)
        };
        let model = trained_transformer(&config, 20 + i as u64);
        check_transformer(&model, name);
        // A batch equals its rows one by one (right-padded sources).
        let options = GenerationOptions::greedy(MAX_LEN, EOS, PAD);
        let batch = model.generate(&sources(), BOS, &options).unwrap();
        for (row, src) in sources().iter().enumerate() {
            let alone = model
                .generate(std::slice::from_ref(src), BOS, &options)
                .unwrap();
            assert_eq!(
                batch.hypotheses[row][0].tokens, alone.hypotheses[0][0].tokens,
                "{name}: row {row}"
            );
        }
    }
}

#[test]
fn decoder_only_variants_cache_equals_full_and_left_padding_is_invisible() {
    for (i, (name, layer, positions)) in variants(DecoderOnlyConfig::tiny(VOCAB).layer)
        .into_iter()
        .enumerate()
    {
        let config = DecoderOnlyConfig {
            layer,
            positions,
            ..DecoderOnlyConfig::tiny(VOCAB)
        };
        let model = trained_lm(&config, 30 + i as u64);
        check_lm(&model, name);
        // Relative positions see only offsets: a left-padded row decodes as it would alone.
        let options = GenerationOptions::greedy(MAX_LEN, EOS, PAD);
        let batch = model.generate(&sources(), &options).unwrap();
        for (row, prompt) in sources().iter().enumerate() {
            let alone = model
                .generate(std::slice::from_ref(prompt), &options)
                .unwrap();
            assert_eq!(
                batch.hypotheses[row][0].tokens, alone.hypotheses[0][0].tokens,
                "{name}: row {row}"
            );
            assert!(
                (batch.hypotheses[row][0].log_prob - alone.hypotheses[0][0].log_prob).abs() <= 1e-4,
                "{name}: row {row} log-probabilities"
            );
        }
    }
}

/// Encoder-only with every variant: padding never changes real positions, and the
/// configuration (positions enum included) survives a checkpoint.
#[test]
fn encoder_only_variants_padding_invariant_and_checkpointed() {
    let device: Device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    for (name, layer, positions) in variants(EncoderOnlyConfig::tiny(VOCAB).layer) {
        let config = EncoderOnlyConfig {
            layer: layer.with_dropout(0.0).with_attention_dropout(0.0),
            positions,
            ..EncoderOnlyConfig::tiny(VOCAB)
        }
        .with_pooler(false);
        let model: EncoderOnly<Cpu> = config.init(&device).unwrap();
        let short = vec![5u32, 9, 3];
        let padded = vec![5u32, 9, 3, PAD, PAD];
        let x = ids::<Cpu>(std::slice::from_ref(&padded), &device);
        let mask = model.padding_mask(x.clone());
        let with_pad = model.forward(x, None, Some(&mask)).unwrap().narrow(1, 0, 3);
        let plain = model
            .forward(ids::<Cpu>(&[short], &device), None, None)
            .unwrap();
        assert_tensors_close(&with_pad, &plain, 1e-5, 0.0, name);

        let path = dir.path().join(name);
        checkpoint::save(&model, &config, &path).unwrap();
        let (loaded_config, loaded): (EncoderOnlyConfig, EncoderOnly<Cpu>) =
            checkpoint::load(&path, &device).unwrap();
        assert_eq!(loaded_config.positions, config.positions, "{name}");
        let again: Tensor<Cpu, 3> = loaded
            .forward(ids::<Cpu>(&[padded], &device), None, Some(&mask))
            .unwrap()
            .narrow(1, 0, 3);
        assert_tensors_close(&again, &with_pad, 0.0, 0.0, name);
    }
}
