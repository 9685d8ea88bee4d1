//! Hostile run directories: the final model's `config.json` edited and its manifest sealed
//! again over it (the manifest catches damage, not a file written that way), loaded through
//! [`RunDir::load_model`], the path of `xfmr translate`, `xfmr eval` and `xfmr serve
//! --translation`. Each load is a typed error naming the field or the tensor, in this process:
//! a panic fails the test, an abort (an allocation of 10¹² values) kills the test binary.

use std::path::Path;

use burn::backend::NdArray;
use serde_json::Value;
use xfmr_models::checkpoint::{self, ModelConfig, CONFIG_FILE, WEIGHTS_FILE};
use xfmr_models::{DecoderOnlyConfig, ModelError, TransformerConfig};
use xfmr_testing::error_chain;
use xfmr_train::{RunDir, Task, TrainError};
use xfmr_translate::Pair;

/// A run directory in `root` with a vocabulary and a final model of `config` (fresh weights:
/// loading does not care whether they were trained).
fn run_with<C: ModelConfig>(root: &Path, task: Task, config: C) -> RunDir {
    let run = RunDir::new(root);
    run.create().unwrap();
    let pairs: Vec<Pair> = ["the cat sat", "a dog ran", "the dog sat on the mat"]
        .iter()
        .map(|t| Pair {
            src: t.to_uppercase(),
            tgt: t.to_string(),
        })
        .collect();
    let tokenizer = task.learn_vocabulary(&pairs, 60).unwrap();
    run.write_tokenizer(&tokenizer).unwrap();
    let model = config.init_model::<NdArray>(&Default::default()).unwrap();
    checkpoint::save::<NdArray, C>(&model, &config, &run.model_dir()).unwrap();
    run
}

/// A translation run whose model is the tiny Transformer (d_model 64, d_ff 128, 2 + 2 layers).
fn translation_run(root: &Path) -> RunDir {
    run_with(root, Task::Translation, TransformerConfig::tiny(40))
}

/// Edits the final model's `config.json` and seals its manifest again.
fn edit_config(run: &RunDir, edit: impl FnOnce(&mut Value)) {
    let dir = run.model_dir();
    let path = dir.join(CONFIG_FILE);
    let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    xfmr_io::write_manifest(&dir, &[CONFIG_FILE, WEIGHTS_FILE]).unwrap();
}

/// The model error of loading the run's model as `C` (what `xfmr translate` does).
fn load_err<C: ModelConfig>(run: &RunDir) -> ModelError {
    match run.load_model::<NdArray, C>(&Default::default()) {
        Ok(_) => panic!("the edited run {} loaded", run.root().display()),
        Err(TrainError::Model(e)) => e,
        Err(other) => panic!("expected a model error, got {other}"),
    }
}

fn invalid_field(e: &ModelError) -> (&'static str, &str) {
    match e {
        ModelError::InvalidConfig { field, value, .. } => (field, value),
        other => panic!("expected InvalidConfig, got {other}"),
    }
}

fn mismatch(e: &ModelError) -> (&str, Option<&[usize]>, Option<&[usize]>) {
    match e {
        ModelError::WeightsMismatch {
            tensor,
            expected,
            found,
            ..
        } => (tensor, expected.as_deref(), found.as_deref()),
        other => panic!("expected WeightsMismatch, got {other}"),
    }
}

#[test]
fn hostile_file_config_huge_d_model() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(dir.path());
    edit_config(&run, |json| {
        json["layer"]["d_model"] = 1_000_000_000_000u64.into()
    });
    let e = load_err::<TransformerConfig>(&run);
    assert_eq!(invalid_field(&e), ("layer.d_model", "1000000000000"), "{e}");
}

#[test]
fn hostile_file_config_huge_d_ff() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(dir.path());
    edit_config(&run, |json| {
        json["layer"]["d_ff"] = 1_000_000_000_000u64.into()
    });
    let e = load_err::<TransformerConfig>(&run);
    assert_eq!(invalid_field(&e), ("layer.d_ff", "1000000000000"), "{e}");
}

#[test]
fn hostile_file_config_huge_max_len() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(dir.path());
    edit_config(&run, |json| json["max_len"] = 1_000_000_000_000u64.into());
    let e = load_err::<TransformerConfig>(&run);
    assert_eq!(invalid_field(&e), ("max_len", "1000000000000"), "{e}");
}

/// 1,000 decoder layers over weights of 2 (the panic at `xfmr serve --translation`
/// start-up): the first missing tensor, with both layer counts. A language-model run with
/// 1,000 layers likewise.
#[test]
fn hostile_file_config_thousand_layers() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(&dir.path().join("translation"));
    edit_config(&run, |json| json["n_decoder_layers"] = 1000.into());
    let e = load_err::<TransformerConfig>(&run);
    let (tensor, expected, found) = mismatch(&e);
    assert!(tensor.starts_with("decoder.layers.2."), "{e}");
    assert!(expected.is_some() && found.is_none(), "{e}");
    assert!(
        e.to_string()
            .contains("the configuration has 1000 layers in `decoder.layers`, the weights 2"),
        "{e}"
    );

    let lm = run_with(
        &dir.path().join("lm"),
        Task::Lm,
        DecoderOnlyConfig::tiny(40),
    );
    edit_config(&lm, |json| json["n_layers"] = 1000.into());
    let e = load_err::<DecoderOnlyConfig>(&lm);
    let (tensor, _, found) = mismatch(&e);
    assert!(tensor.starts_with("stack.layers.2."), "{e}");
    assert!(found.is_none(), "{e}");
}

/// `layer.d_model` 32 over weights of 64: refused at load naming the embedding and both
/// shapes (it used to load and panic at inference).
#[test]
fn hostile_file_config_d_model_disagrees_with_weights() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(dir.path());
    edit_config(&run, |json| json["layer"]["d_model"] = 32.into());
    let e = load_err::<TransformerConfig>(&run);
    assert_eq!(
        mismatch(&e),
        (
            "src_embedding.weight",
            Some(&[40, 32][..]),
            Some(&[40, 64][..])
        ),
        "{e}"
    );
}

/// `layer.d_ff` 10⁶ (accepted before: the shapes were never compared) is over its bound;
/// within the bound, 512 over weights of 128 names the first feed-forward tensor.
#[test]
fn hostile_file_config_d_ff_disagrees_with_weights() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(dir.path());
    edit_config(&run, |json| json["layer"]["d_ff"] = 1_000_000.into());
    let e = load_err::<TransformerConfig>(&run);
    assert_eq!(invalid_field(&e), ("layer.d_ff", "1000000"), "{e}");

    edit_config(&run, |json| json["layer"]["d_ff"] = 512.into());
    let e = load_err::<TransformerConfig>(&run);
    let (tensor, expected, found) = mismatch(&e);
    assert!(tensor.starts_with("encoder.layers.0.ffn."), "{e}");
    assert!(
        expected.unwrap().contains(&512) && found.unwrap().contains(&128),
        "{e}"
    );
}

/// A run whose model's weights file cannot be read, or whose vocabulary is missing: the OS
/// error's message appears once in what the CLI prints, and the path once.
#[test]
fn hostile_file_error_names_os_message_once() {
    // Building the model draws from the backend's one generator (crate::trainer::lock).
    let _guard = crate::trainer::lock();
    let dir = tempfile::tempdir().unwrap();
    let run = translation_run(dir.path());
    let weights = run.model_dir().join(WEIGHTS_FILE);
    std::fs::remove_file(&weights).unwrap();
    std::fs::create_dir(&weights).unwrap();
    let e = run
        .load_model::<NdArray, TransformerConfig>(&Default::default())
        .map(|_| ())
        .unwrap_err();
    let text = error_chain(&e);
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    assert_eq!(
        text.matches(&*weights.to_string_lossy()).count(),
        1,
        "{text}"
    );

    std::fs::remove_file(run.tokenizer_path()).unwrap();
    let e = run.read_tokenizer().map(|_| ()).unwrap_err();
    let text = error_chain(&e);
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    assert_eq!(
        text.matches(&*run.tokenizer_path().to_string_lossy())
            .count(),
        1,
        "{text}"
    );
}
