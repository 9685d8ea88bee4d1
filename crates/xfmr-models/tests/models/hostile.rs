//! Hostile checkpoints: a `config.json` edited after saving and the manifest sealed again over
//! it (the manifest catches damage, not a file written that way), loaded in this process. Each
//! load must be a typed error naming the field or the tensor, never an abort (an allocation of
//! 10¹² values) or a panic (burn's record loader, a shape that disagrees at inference): a panic
//! fails the test, an abort kills the test binary.

use std::path::Path;

use serde_json::Value;
use xfmr_blocks::LayerConfig;
use xfmr_models::checkpoint::{self, ModelConfig, CONFIG_FILE, WEIGHTS_FILE};
use xfmr_models::{DecoderOnlyConfig, EncoderOnlyConfig, ModelError, TransformerConfig};
use xfmr_testing::error_chain;

use crate::{Cpu, Device, VOCAB};

/// A tiny Transformer checkpoint in `dir` (d_model 64, d_ff 128, 2 + 2 layers, vocabulary
/// [`VOCAB`]).
fn transformer_checkpoint(dir: &Path) -> TransformerConfig {
    save(dir, TransformerConfig::tiny(VOCAB))
}

fn save<C: ModelConfig>(dir: &Path, config: C) -> C {
    let model = config.init_model::<Cpu>(&Default::default()).unwrap();
    checkpoint::save::<Cpu, C>(&model, &config, dir).unwrap();
    config
}

/// Edits the checkpoint's `config.json` with `edit` and seals the manifest again, as an
/// attacker who can write the directory would.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join(CONFIG_FILE);
    let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    xfmr_io::write_manifest(dir, &[CONFIG_FILE, WEIGHTS_FILE]).unwrap();
}

/// Loads the (edited) checkpoint in `dir` as configuration type `C`: the error.
fn load_err<C: ModelConfig>(dir: &Path) -> ModelError {
    let device: Device = Default::default();
    match checkpoint::load::<Cpu, C>(dir, &device) {
        Ok(_) => panic!("the edited checkpoint in {} loaded", dir.display()),
        Err(e) => e,
    }
}

/// The field and value of an [`ModelError::InvalidConfig`].
fn invalid_field(e: &ModelError) -> (&'static str, &str) {
    match e {
        ModelError::InvalidConfig { field, value, .. } => (field, value),
        other => panic!("expected InvalidConfig, got {other}"),
    }
}

/// The tensor and both shapes of a [`ModelError::WeightsMismatch`].
fn mismatch(e: &ModelError) -> (&str, Option<&[usize]>, Option<&[usize]>, &str) {
    match e {
        ModelError::WeightsMismatch {
            path,
            tensor,
            expected,
            found,
            note,
        } => {
            assert!(path.ends_with(WEIGHTS_FILE), "{e}");
            (tensor, expected.as_deref(), found.as_deref(), note)
        }
        other => panic!("expected WeightsMismatch, got {other}"),
    }
}

/// `layer.d_model` = 10¹² in each family: refused by its bound, naming the dotted field and
/// the value, before anything is allocated (the test would abort otherwise).
#[test]
fn hostile_file_config_huge_d_model() {
    let root = tempfile::tempdir().unwrap();
    let huge = 1_000_000_000_000u64;
    let set = |json: &mut Value| json["layer"]["d_model"] = huge.into();

    let dir = root.path().join("transformer");
    transformer_checkpoint(&dir);
    edit_config(&dir, set);
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e), ("layer.d_model", "1000000000000"), "{e}");
    assert!(e.to_string().contains("65536"), "states the bound: {e}");

    let dir = root.path().join("lm");
    save(&dir, DecoderOnlyConfig::tiny(VOCAB));
    edit_config(&dir, set);
    let e = load_err::<DecoderOnlyConfig>(&dir);
    assert_eq!(invalid_field(&e), ("layer.d_model", "1000000000000"), "{e}");

    let dir = root.path().join("bert");
    save(&dir, EncoderOnlyConfig::tiny(VOCAB));
    edit_config(&dir, set);
    let e = load_err::<EncoderOnlyConfig>(&dir);
    assert_eq!(invalid_field(&e), ("layer.d_model", "1000000000000"), "{e}");
}

/// `layer.d_ff` = 10¹²: refused by its bound, naming `layer.d_ff`.
#[test]
fn hostile_file_config_huge_d_ff() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    edit_config(&dir, |json| {
        json["layer"]["d_ff"] = 1_000_000_000_000u64.into()
    });
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e), ("layer.d_ff", "1000000000000"), "{e}");
}

/// `max_len` = 10¹² (a sinusoidal table of 10¹² × 64 values, built when the model is built):
/// refused by its bound. Within the bound (2²⁰) but with a table over 2²⁸ values (d_model 512
/// would make 2²⁹), refused too, naming `max_len`; a learned table is a parameter, so the
/// weights' shape refuses it.
#[test]
fn hostile_file_config_huge_max_len() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    edit_config(&dir, |json| json["max_len"] = 1_000_000_000_000u64.into());
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e), ("max_len", "1000000000000"), "{e}");

    let dir = root.path().join("wide");
    let layer = LayerConfig::new(512, 8, 64);
    save(&dir, TransformerConfig::new(VOCAB, VOCAB, layer, 1, 1));
    edit_config(&dir, |json| json["max_len"] = (1u64 << 20).into());
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e).0, "max_len", "{e}");
    assert!(e.to_string().contains("2^28"), "{e}");

    // A learned position table (BERT's) of 2^20 rows: within every bound, but the weights
    // hold 512 rows.
    let dir = root.path().join("bert");
    save(&dir, EncoderOnlyConfig::tiny(VOCAB));
    edit_config(&dir, |json| json["max_len"] = (1u64 << 20).into());
    let e = load_err::<EncoderOnlyConfig>(&dir);
    let (tensor, expected, found, _) = mismatch(&e);
    assert_eq!(tensor, "positions.Learned.table", "{e}");
    assert_eq!(expected, Some(&[1 << 20, 64][..]), "{e}");
    assert_eq!(found, Some(&[512, 64][..]), "{e}");
}

/// 1,000 encoder layers (within the bound of 1,024) over weights of 2: the first missing
/// tensor is named, with both layer counts, as a typed error, not burn's panic ("vec record
/// does not the same length as the module"). Fewer layers than saved: the first tensor the
/// configuration has no place for.
#[test]
fn hostile_file_config_thousand_layers() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    edit_config(&dir, |json| json["n_encoder_layers"] = 1000.into());
    let e = load_err::<TransformerConfig>(&dir);
    let (tensor, expected, found, note) = mismatch(&e);
    assert!(tensor.starts_with("encoder.layers.2."), "{e}");
    assert!(expected.is_some() && found.is_none(), "{e}");
    assert_eq!(
        note, "the configuration has 1000 layers in `encoder.layers`, the weights 2",
        "{e}"
    );
    assert!(e.to_string().contains(tensor), "{e}");

    let dir = root.path().join("fewer");
    save(&dir, DecoderOnlyConfig::tiny(VOCAB));
    edit_config(&dir, |json| json["n_layers"] = 1.into());
    let e = load_err::<DecoderOnlyConfig>(&dir);
    let (tensor, expected, found, note) = mismatch(&e);
    assert!(tensor.starts_with("stack.layers.1."), "{e}");
    assert!(expected.is_none() && found.is_some(), "{e}");
    assert_eq!(
        note, "the configuration has 1 layers in `stack.layers`, the weights 2",
        "{e}"
    );

    // Beyond the bound: refused before the weights are read.
    edit_config(&dir, |json| json["n_layers"] = 100_000.into());
    let e = load_err::<DecoderOnlyConfig>(&dir);
    assert_eq!(invalid_field(&e), ("n_layers", "100000"), "{e}");
}

/// `layer.d_model` 32 over weights of width 64 (and 8 heads, so that the configuration is
/// valid on its own): the first tensor is named with both shapes, where the model used to
/// load and panic at inference.
#[test]
fn hostile_file_config_d_model_disagrees_with_weights() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    edit_config(&dir, |json| json["layer"]["d_model"] = 32.into());
    let e = load_err::<TransformerConfig>(&dir);
    let (tensor, expected, found, _) = mismatch(&e);
    assert_eq!(tensor, "src_embedding.weight", "{e}");
    assert_eq!(expected, Some(&[VOCAB, 32][..]), "{e}");
    assert_eq!(found, Some(&[VOCAB, 64][..]), "{e}");
    assert!(
        e.to_string()
            .contains("tensor `src_embedding.weight`: the configuration implies shape [24, 32], the weights hold [24, 64]"),
        "{e}"
    );

    let dir = root.path().join("bert");
    save(&dir, EncoderOnlyConfig::tiny(VOCAB));
    edit_config(&dir, |json| json["layer"]["d_model"] = 128.into());
    let e = load_err::<EncoderOnlyConfig>(&dir);
    let (tensor, expected, found, _) = mismatch(&e);
    assert_eq!(tensor, "token_embedding.weight", "{e}");
    assert_eq!(
        (expected, found),
        (Some(&[VOCAB, 128][..]), Some(&[VOCAB, 64][..]))
    );
}

/// `layer.d_ff` 10⁶ (the case, accepted before: the shapes were never compared) is
/// over its bound (2¹⁸); `layer.d_ff` 256 over weights of 128 is within it and the first
/// feed-forward tensor is named with both shapes.
#[test]
fn hostile_file_config_d_ff_disagrees_with_weights() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    edit_config(&dir, |json| json["layer"]["d_ff"] = 1_000_000.into());
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e), ("layer.d_ff", "1000000"), "{e}");

    edit_config(&dir, |json| json["layer"]["d_ff"] = 256.into());
    let e = load_err::<TransformerConfig>(&dir);
    let (tensor, expected, found, note) = mismatch(&e);
    assert!(
        tensor.starts_with("encoder.layers.0.ffn.") && tensor.ends_with(".weight"),
        "{e}"
    );
    let (expected, found) = (expected.unwrap(), found.unwrap());
    assert!(expected.contains(&256) && found.contains(&128), "{e}");
    assert_eq!(note, "", "same layer count: {e}");
}

/// A number too large for its field is quoted compactly (serde_json writes `1e+308`), and the
/// file is named; a float field's value (written by Rust's `Display`, 309 digits for 1e308) is
/// quoted compactly too.
#[test]
fn hostile_file_config_number_printed_compactly() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text.replacen("\"d_model\": 64", "\"d_model\": 1e308", 1);
    assert!(text.contains("1e308"));
    std::fs::write(&path, text).unwrap();
    xfmr_io::write_manifest(&dir, &[CONFIG_FILE, WEIGHTS_FILE]).unwrap();
    let e = load_err::<TransformerConfig>(&dir);
    let message = e.to_string();
    assert!(matches!(e, ModelError::Json { .. }), "{message}");
    assert!(
        message.contains("config.json") && message.contains("1e+308"),
        "{message}"
    );
    assert!(longest_digit_run(&message) <= 20, "{message}");

    // A dropout probability of 1e308 (a float field: its value is formatted by Rust, in full).
    edit_config(&dir, |json| {
        json["layer"]["d_model"] = 64.into();
        json["layer"]["dropout"] = 1e308.into();
    });
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e), ("layer.dropout", "1e308"), "{e}");
    edit_config(&dir, |json| {
        json["layer"]["dropout"] = 0.0.into();
        json["positions"] = serde_json::json!({
            "Rotary": { "theta": -1e308, "layout": "HalfSplit" }
        });
    });
    let e = load_err::<TransformerConfig>(&dir);
    assert_eq!(invalid_field(&e), ("positions.theta", "-1e308"), "{e}");
}

fn longest_digit_run(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// Errors that carry an OS error (a missing checkpoint, a weights file that is a directory, a
/// file that cannot be written) print its message once, and the path once, also through the
/// source chain.
#[test]
fn hostile_file_error_names_os_message_once() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    transformer_checkpoint(&dir);
    // The weights file replaced by a directory: reading it fails with an OS error.
    let weights = dir.join(WEIGHTS_FILE);
    std::fs::remove_file(&weights).unwrap();
    std::fs::create_dir(&weights).unwrap();
    let e = load_err::<TransformerConfig>(&dir);
    let text = error_chain(&e);
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    assert_eq!(
        text.matches(&*weights.to_string_lossy()).count(),
        1,
        "{text}"
    );

    // A file listed by the manifest that is gone.
    std::fs::remove_dir(&weights).unwrap();
    let e = load_err::<TransformerConfig>(&dir);
    let text = error_chain(&e);
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    assert_eq!(
        text.matches(&*weights.to_string_lossy()).count(),
        1,
        "{text}"
    );

    // Saving into a path under a file.
    let blocker = root.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let config = TransformerConfig::tiny(VOCAB);
    let model = config.init::<Cpu>(&Default::default()).unwrap();
    let e = checkpoint::save::<Cpu, _>(&model, &config, &blocker.join("ckpt")).unwrap_err();
    let text = error_chain(&e);
    assert_eq!(text.matches("os error").count(), 1, "{text}");
}
