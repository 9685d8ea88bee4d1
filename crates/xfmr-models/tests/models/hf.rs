//! Hugging Face BERT import by name: a complete state dict loads; every missing, unexpected and
//! wrong-shape tensor is listed at once. (Parity with a real checkpoint: xfmr-sentence.)

use xfmr_blocks::{BlockError, StateDict};
use xfmr_models::{hf, EncoderOnlyConfig, ModelError};
use xfmr_testing::{max_abs_diff, to_vec, TestRng};

use crate::{ids, Cpu, Device};

/// A BERT state dict with HF names and random values for `config`.
fn bert_dict(config: &EncoderOnlyConfig, rng: &mut TestRng) -> StateDict {
    let (d, ff) = (config.layer.d_model, config.layer.d_ff);
    let mut dict = StateDict::default();
    let mut put = |name: String, shape: Vec<usize>| {
        let n = shape.iter().product();
        let values = (0..n).map(|_| rng.uniform(-0.1, 0.1) as f32).collect();
        dict.insert(name, shape, values);
    };
    put(
        "embeddings.word_embeddings.weight".into(),
        vec![config.vocab_size, d],
    );
    put(
        "embeddings.position_embeddings.weight".into(),
        vec![config.max_len, d],
    );
    put(
        "embeddings.token_type_embeddings.weight".into(),
        vec![config.type_vocab_size, d],
    );
    for part in ["weight", "bias"] {
        put(format!("embeddings.LayerNorm.{part}"), vec![d]);
        put(
            format!("pooler.dense.{part}"),
            if part == "weight" {
                vec![d, d]
            } else {
                vec![d]
            },
        );
    }
    for i in 0..config.n_layers {
        let l = format!("encoder.layer.{i}.");
        for (name, out, inp) in [
            ("attention.self.query", d, d),
            ("attention.self.key", d, d),
            ("attention.self.value", d, d),
            ("attention.output.dense", d, d),
            ("intermediate.dense", ff, d),
            ("output.dense", d, ff),
        ] {
            put(format!("{l}{name}.weight"), vec![out, inp]);
            put(format!("{l}{name}.bias"), vec![out]);
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            put(format!("{l}{norm}.weight"), vec![d]);
            put(format!("{l}{norm}.bias"), vec![d]);
        }
    }
    dict
}

#[test]
fn bert_import_by_name_and_its_errors() {
    let device: Device = Default::default();
    let config = EncoderOnlyConfig::tiny(30).with_max_len(16);
    let mut rng = TestRng::new(4);
    let dict = bert_dict(&config, &mut rng);
    let model = hf::load_bert(config.init::<Cpu>(&device).unwrap(), &dict).unwrap();
    // The word table arrives as it is ([vocab, d]); every linear arrives transposed (HF's
    // [out, in] into burn's [in, out]). Square weights (d × d) would take a wrong transpose
    // without a shape error: compare values.
    let d = config.layer.d_model;
    let word = to_vec(&model.token_embedding.weight.val());
    let expected: Vec<f64> = dict
        .get("embeddings.word_embeddings.weight")
        .unwrap()
        .1
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    assert_eq!(word, expected);
    let transposed = |name: &str, rows: usize, cols: usize| -> Vec<f64> {
        let (_, values) = dict.get(name).unwrap();
        (0..cols)
            .flat_map(|c| (0..rows).map(move |r| f64::from(values[r * cols + c])))
            .collect()
    };
    let layer = &model.encoder.layers[1];
    for (ours, name) in [
        (&layer.self_attn.query, "attention.self.query"),
        (&layer.self_attn.key, "attention.self.key"),
        (&layer.self_attn.value, "attention.self.value"),
        (&layer.self_attn.output, "attention.output.dense"),
    ] {
        assert_eq!(
            to_vec(&ours.weight.val()),
            transposed(&format!("encoder.layer.1.{name}.weight"), d, d),
            "{name}"
        );
    }
    let ff = config.layer.d_ff;
    assert_eq!(
        to_vec(&layer.ffn.linear1.weight.val()),
        transposed("encoder.layer.1.intermediate.dense.weight", ff, d)
    );
    let x = ids::<Cpu>(&[vec![2, 7, 9]], &device);
    let a = model.forward(x.clone(), None, None).unwrap();
    let fresh = config.init::<Cpu>(&device).unwrap();
    assert!(max_abs_diff(&a, &fresh.forward(x, None, None).unwrap()) > 1e-3);

    // A `bert.` prefix (BertForMaskedLM and friends) is recognised.
    let mut prefixed = StateDict::default();
    for name in dict.names() {
        let (shape, values) = dict.get(name).unwrap();
        prefixed.insert(format!("bert.{name}"), shape.to_vec(), values.to_vec());
    }
    hf::load_bert(config.init::<Cpu>(&device).unwrap(), &prefixed).unwrap();

    // Everything wrong at once.
    let mut bad = dict.clone();
    bad.remove("encoder.layer.1.output.dense.bias");
    bad.insert("encoder.layer.0.extra.weight", vec![2], vec![0.0, 0.0]);
    bad.insert(
        "encoder.layer.0.intermediate.dense.weight",
        vec![128, 32],
        vec![0.0; 128 * 32],
    );
    match hf::load_bert(config.init::<Cpu>(&device).unwrap(), &bad) {
        Err(ModelError::Block(BlockError::Import(report))) => {
            assert_eq!(
                report.missing,
                [("encoder.layer.1.output.dense.bias".to_string(), vec![64])]
            );
            assert_eq!(report.unexpected, ["encoder.layer.0.extra.weight"]);
            assert_eq!(
                report.wrong_shape,
                [(
                    "encoder.layer.0.intermediate.dense.weight".to_string(),
                    vec![128, 64],
                    vec![128, 32]
                )]
            );
        }
        other => panic!("expected an import report, got {:?}", other.map(|_| ())),
    }
}
