//! The models themselves: parameter counts, masks, heads, checkpoints, configuration errors.

use burn::module::Module;
use burn::tensor::{Int, Tensor};
use xfmr_attention::AttentionError;
use xfmr_blocks::{BlockError, LayerConfig};
use xfmr_models::checkpoint::{self, CONFIG_FILE, MANIFEST_FILE, WEIGHTS_FILE};
use xfmr_models::{
    l2_normalize, DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig, ModelError,
    Pooling, Transformer, TransformerConfig,
};
use xfmr_position::PositionError;
use xfmr_testing::{assert_tensors_close, max_abs_diff, to_vec};

use crate::{ids, sources, tiny_lm, tiny_transformer, Cpu, Device, PAD, VOCAB};

/// Parameters of the paper's model, counted from the configuration by hand: embeddings shared
/// by source, target and output; per layer 4 projections with bias per attention, two FFN
/// linears with bias, 2 (encoder) or 3 (decoder) LayerNorms of 2·d.
fn paper_count(c: &TransformerConfig) -> usize {
    let (d, ff, v) = (c.layer.d_model, c.layer.d_ff, c.src_vocab_size);
    let attention = 4 * (d * d + d);
    let ffn = d * ff + ff + ff * d + d;
    let norm = 2 * d;
    v * d
        + c.n_encoder_layers * (attention + ffn + 2 * norm)
        + c.n_decoder_layers * (2 * attention + ffn + 3 * norm)
}

#[test]
fn parameter_counts_match_the_paper() {
    let device: Device = Default::default();
    // Table 3 of the paper: base 65M, big 213M, with a shared source-target vocabulary of
    // about 37,000 tokens (§5.1).
    for (config, paper_millions) in [
        (TransformerConfig::base(37_000), 65.0),
        (TransformerConfig::big(37_000), 213.0),
    ] {
        let model: Transformer<Cpu> = config.init(&device).unwrap();
        let n = model.num_params();
        assert_eq!(n, paper_count(&config), "count differs from the formula");
        let millions = n as f64 / 1e6;
        // The paper rounds and does not give its exact vocabulary: within 3%.
        assert!(
            (millions / paper_millions - 1.0).abs() < 0.03,
            "{millions:.1}M parameters vs the paper's {paper_millions}M"
        );
    }
}

#[test]
fn source_padding_never_changes_outputs() {
    let device: Device = Default::default();
    let model = tiny_transformer(21);
    let src = vec![5u32, 9, 3, 17];
    let tgt = vec![1u32, 7, 8];
    let plain = model
        .forward(
            ids::<Cpu>(std::slice::from_ref(&src), &device),
            ids::<Cpu>(std::slice::from_ref(&tgt), &device),
        )
        .unwrap();
    let mut padded = src.clone();
    padded.extend([PAD; 5]);
    let with_pad = model
        .forward(ids::<Cpu>(&[padded], &device), ids::<Cpu>(&[tgt], &device))
        .unwrap();
    assert_tensors_close(&with_pad, &plain, 1e-5, 0.0, "logits with source padding");
}

#[test]
fn decoder_only_is_causal() {
    let device: Device = Default::default();
    let lm = tiny_lm(3);
    let a = lm
        .forward(ids::<Cpu>(&[vec![4, 5, 6, 7, 8]], &device))
        .unwrap();
    let b = lm
        .forward(ids::<Cpu>(&[vec![4, 5, 6, 20, 21]], &device))
        .unwrap();
    let (a3, b3) = (a.clone().narrow(1, 0, 3), b.clone().narrow(1, 0, 3));
    assert_tensors_close(
        &a3,
        &b3,
        1e-6,
        0.0,
        "prefix logits after changing the future",
    );
    assert!(max_abs_diff(&a.narrow(1, 3, 2), &b.narrow(1, 3, 2)) > 1e-3);
}

#[test]
fn encoder_only_padding_pooling_and_heads() {
    let device: Device = Default::default();
    let config = EncoderOnlyConfig::tiny(VOCAB)
        .map_layer(|l| l.with_dropout(0.0).with_attention_dropout(0.0))
        .with_mlm_head(true)
        .with_n_classes(Some(3));
    let model: EncoderOnly<Cpu> = config.init(&device).unwrap();
    let real = vec![3u32, 9, 4, 11];
    let batch = [
        real.iter().copied().chain([PAD; 3]).collect::<Vec<_>>(),
        vec![5, 6, 7, 8, 9, 10, 11],
    ];
    let x = ids::<Cpu>(&batch, &device);
    let hidden = model
        .forward(x.clone(), None, Some(&model.padding_mask(x.clone())))
        .unwrap();
    let alone = model
        .forward(ids::<Cpu>(&[real], &device), None, None)
        .unwrap();
    let rows = hidden.clone().narrow(0, 0, 1).narrow(1, 0, 4);
    assert_tensors_close(&rows, &alone, 1e-5, 0.0, "real tokens with padding");

    // Mean pooling over real tokens only.
    let keep: Tensor<Cpu, 2, Int> = x.clone().not_equal_elem(PAD as i64).int();
    let pooled = EncoderOnly::pool(hidden.clone(), keep, Pooling::Mean);
    let expected = alone.clone().mean_dim(1).reshape([1, 64]);
    assert_tensors_close(
        &pooled.clone().narrow(0, 0, 1),
        &expected,
        1e-5,
        0.0,
        "mean pool",
    );
    let unit = l2_normalize(pooled);
    for norm in to_vec(&unit.powi_scalar(2).sum_dim(1)) {
        assert!((norm - 1.0).abs() < 1e-5);
    }
    let cls = EncoderOnly::pool(hidden.clone(), x.clone().ones_like(), Pooling::Cls);
    assert_tensors_close(
        &cls,
        &hidden.clone().narrow(1, 0, 1).reshape([2, 64]),
        0.0,
        0.0,
        "cls pool",
    );
    assert_eq!(
        model.mlm_logits(hidden.clone()).unwrap().dims(),
        [2, 7, VOCAB]
    );
    assert_eq!(model.classify(hidden).dims(), [2, 3]);
}

#[test]
fn checkpoints_round_trip_and_name_mismatched_fields() {
    let device: Device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let config = TransformerConfig::tiny(VOCAB).map_layer(|l| l.with_dropout(0.0));
    let model: Transformer<Cpu> = config.init(&device).unwrap();
    checkpoint::save(&model, &config, dir.path()).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [CONFIG_FILE, MANIFEST_FILE, WEIGHTS_FILE],
        "no temporary files left"
    );

    let (loaded_config, loaded): (TransformerConfig, Transformer<Cpu>) =
        checkpoint::load(dir.path(), &device).unwrap();
    assert_eq!(loaded_config.layer.d_model, config.layer.d_model);
    let src = ids::<Cpu>(&sources()[..1], &device);
    let tgt = ids::<Cpu>(&[vec![1, 4, 5]], &device);
    let a = model.forward(src.clone(), tgt.clone()).unwrap();
    let b = loaded.forward(src.clone(), tgt.clone()).unwrap();
    assert_tensors_close(&b, &a, 0.0, 0.0, "reloaded model");
    let c: Transformer<Cpu> = checkpoint::load_expecting(dir.path(), &config, &device).unwrap();
    assert_tensors_close(
        &c.forward(src, tgt).unwrap(),
        &a,
        0.0,
        0.0,
        "load_expecting",
    );

    let other = config.clone().map_layer(|l| LayerConfig { d_ff: 256, ..l });
    match checkpoint::load_expecting::<Cpu, _>(dir.path(), &other, &device) {
        Err(ModelError::ConfigMismatch {
            field,
            expected,
            found,
            ..
        }) => {
            assert_eq!(field, "layer.d_ff");
            assert_eq!((expected.as_str(), found.as_str()), ("256", "128"));
        }
        other => panic!("expected ConfigMismatch, got {:?}", other.map(|_| ())),
    }
    let e = checkpoint::load::<Cpu, TransformerConfig>(&dir.path().join("nope"), &device)
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("config.json"), "{e}");

    // Decoder-only through the same functions.
    let lm_config = DecoderOnlyConfig::tiny(VOCAB);
    let lm: DecoderOnly<Cpu> = lm_config.init(&device).unwrap();
    let lm_dir = dir.path().join("lm");
    checkpoint::save(&lm, &lm_config, &lm_dir).unwrap();
    let (_, lm2): (DecoderOnlyConfig, DecoderOnly<Cpu>) =
        checkpoint::load(&lm_dir, &device).unwrap();
    let x = ids::<Cpu>(&[vec![3, 4, 5]], &device);
    assert_tensors_close(
        &lm2.forward(x.clone()).unwrap(),
        &lm.forward(x).unwrap(),
        0.0,
        0.0,
        "lm",
    );
}

/// A checkpoint whose weights were altered after saving is refused, naming the file.
#[test]
fn checkpoints_with_altered_weights_are_refused() {
    let device: Device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let config = DecoderOnlyConfig::tiny(VOCAB);
    let model: DecoderOnly<Cpu> = config.init(&device).unwrap();
    checkpoint::save(&model, &config, dir.path()).unwrap();
    let path = dir.path().join(WEIGHTS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    match checkpoint::load::<Cpu, DecoderOnlyConfig>(dir.path(), &device) {
        Err(ModelError::Checkpoint { path: named, .. }) => assert_eq!(named, path),
        other => panic!("expected a checkpoint error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn configuration_errors_name_the_field() {
    let device: Device = Default::default();
    let field = |e: ModelError| match e {
        ModelError::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other}"),
    };
    let e = TransformerConfig::new(10, 12, LayerConfig::new(16, 2, 32), 1, 1)
        .init::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(field(e), "share_embeddings");
    let e = TransformerConfig::tiny(10)
        .with_pad_id(10)
        .init::<Cpu>(&device)
        .unwrap_err();
    assert_eq!(field(e), "pad_id");
    let e = DecoderOnlyConfig::tiny(0).init::<Cpu>(&device).unwrap_err();
    assert_eq!(field(e), "vocab_size");
    // Errors from the blocks come through as themselves, with their values.
    let e = DecoderOnlyConfig::new(10, LayerConfig::new(30, 4, 64), 1)
        .init::<Cpu>(&device)
        .unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Block(BlockError::Attention(AttentionError::HeadsDoNotDivide {
                d_model: 30,
                n_heads: 4
            }))
        ),
        "{e:?}"
    );
    // A learned table is a hard limit, reported with the length asked for and the table's.
    let lm = DecoderOnlyConfig::tiny(VOCAB)
        .with_max_len(4)
        .init::<Cpu>(&device)
        .unwrap();
    let e = lm.forward(ids::<Cpu>(&[vec![3; 6]], &device)).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::Block(BlockError::Position(PositionError::SequenceTooLong {
                seq_len: 6,
                offset: 0,
                max_len: 4
            }))
        ),
        "{e:?}"
    );
}

#[test]
fn untied_and_unshared_variants_run() {
    let device: Device = Default::default();
    let layer = LayerConfig::new(32, 4, 64).with_norm_position(xfmr_blocks::NormPosition::Pre);
    let config = TransformerConfig::new(20, 30, layer, 1, 1)
        .with_share_embeddings(false)
        .with_tie_output(false);
    let model: Transformer<Cpu> = config.init(&device).unwrap();
    let logits = model
        .forward(
            ids::<Cpu>(&[vec![3, 4, 19]], &device),
            ids::<Cpu>(&[vec![1, 29]], &device),
        )
        .unwrap();
    assert_eq!(logits.dims(), [1, 2, 30]);
    assert!(
        model.encoder.norm.is_some(),
        "pre-norm stacks end with a norm"
    );
}

/// `forward_with_attention` returns `forward`'s logits, and per layer and head attention rows
/// that are distributions over the real source tokens (padding gets exactly zero).
#[test]
fn attention_maps_are_distributions_over_real_tokens() {
    let device: Device = Default::default();
    let model = tiny_transformer(11);
    let src_rows = vec![vec![5, 6, 7, 8], vec![9, 10, PAD, PAD]];
    let tgt_rows = vec![vec![1, 5, 6], vec![1, 7, 8]];
    let maps = model
        .forward_with_attention(ids(&src_rows, &device), ids(&tgt_rows, &device))
        .unwrap();
    let plain = model
        .forward(ids(&src_rows, &device), ids(&tgt_rows, &device))
        .unwrap();
    // Asking for weights takes the reference attention path (explicit softmax), `forward` the
    // fused one: equal up to f32 rounding accumulated over 2 + 2 layers.
    assert_tensors_close(
        &maps.logits,
        &plain,
        1e-5,
        0.0,
        "forward_with_attention logits",
    );
    let config = TransformerConfig::tiny(VOCAB);
    assert_eq!(maps.encoder.len(), config.n_encoder_layers);
    assert_eq!(maps.cross.len(), config.n_decoder_layers);
    let heads = config.layer.n_heads;
    for (kind, weights, rows) in [("encoder", &maps.encoder, 4), ("cross", &maps.cross, 3)] {
        for w in weights.iter() {
            assert_eq!(w.dims(), [2, heads, rows, 4], "{kind}");
            let v = to_vec(w);
            for (r, row) in v.chunks(4).enumerate() {
                let batch = r / (heads * rows);
                let sum: f64 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{kind} row {r} sums to {sum}");
                if batch == 1 {
                    assert_eq!(&row[2..], &[0.0, 0.0], "{kind} row {r} weighs padding");
                }
            }
        }
    }
}
