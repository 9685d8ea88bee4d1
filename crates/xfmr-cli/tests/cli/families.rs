//! The language-model tasks from the command line, and the downstream example.

use crate::{small_corpus, train_args, train_losses, xfmr, xfmr_ok};

/// `--task lm`: a GPT-like model of the English side, trained, then continuing a prompt through
/// `xfmr generate --run`; a translation run is refused there, naming the task it needs.
#[test]
fn objective_lm_trains_and_generates_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let run = dir.path().join("lm");
    let mut args = train_args(data.to_str().unwrap(), run.to_str().unwrap(), "8", "3");
    args.extend(["--task", "lm"]);
    let out = xfmr_ok(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("greedy:"), "{stdout}");
    assert_eq!(train_losses(&run).len(), 8);
    assert!(run.join("model/model.mpk").exists());
    let out = xfmr_ok(&[
        "generate",
        "--run",
        run.to_str().unwrap(),
        "--max-tokens",
        "5",
        "And God",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("And God"), "{text}");

    let translation = dir.path().join("tr");
    xfmr_ok(&train_args(
        data.to_str().unwrap(),
        translation.to_str().unwrap(),
        "2",
        "0",
    ));
    let out = xfmr(&[
        "generate",
        "--run",
        translation.to_str().unwrap(),
        "And God",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs a `--task lm` run"), "{stderr}");
}

/// `--task mlm`: a BERT-like model of the English side, trained, then filling in a mask and
/// embedding sentences (`xfmr fill-mask --run`, `xfmr embed --run`).
#[test]
fn objective_mlm_trains_fills_masks_and_embeds_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let run = dir.path().join("mlm");
    let mut args = train_args(data.to_str().unwrap(), run.to_str().unwrap(), "8", "3");
    args.extend(["--task", "mlm"]);
    let out = xfmr_ok(&args);
    assert!(String::from_utf8_lossy(&out.stdout).contains("original"));
    let run_s = run.to_str().unwrap();
    let out = xfmr_ok(&[
        "fill-mask",
        "--run",
        run_s,
        "--top",
        "3",
        "And God <mask> the light",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mask 1:"), "{text}");
    let out = xfmr_ok(&["embed", "--run", run_s, "In the beginning", "And God said"]);
    let vectors: Vec<Vec<f64>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(vectors.len(), 2);
    for v in &vectors {
        assert_eq!(v.len(), 64, "tiny preset: d_model 64");
        let norm: f64 = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "L2-normalised: {norm}");
    }
}

/// The downstream example's run (`examples/train_custom.rs`: the library's
/// `train_translation_on_tsv` with the example's configuration) on a small TSV file for
/// `steps` steps.
fn train_custom(
    tsv: &std::path::Path,
    run: &std::path::Path,
    steps: usize,
) -> Result<xfmr_train::RunSummary, xfmr_train::TrainError> {
    let config = xfmr_train::quickstart::small_config(steps);
    xfmr_train::quickstart::train_translation_on_tsv::<
        xfmr::burn::backend::Autodiff<xfmr::burn::backend::NdArray>,
    >(
        tsv,
        &xfmr_train::RunDir::new(run),
        1000,
        xfmr::models::TransformerConfig::tiny,
        config,
        &mut xfmr_train::Silent,
        &Default::default(),
    )
}

/// The downstream example's library call trains on a small TSV file, reports a validation and
/// leaves a final model; run again with a larger budget, it resumes.
#[test]
fn the_downstream_example_trains_on_a_tsv_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let run = dir.path().join("custom");
    let summary = train_custom(&data.join("train.tsv"), &run, 20).unwrap();
    assert_eq!((summary.start_step, summary.step), (0, 20));
    let validation = summary.validation.unwrap();
    assert!(validation.loss.is_finite() && validation.tokens > 0);
    assert!(summary.final_model.unwrap().join("model.mpk").exists());
    assert!(run.join("tokenizer.json").exists());
    // Run again with a larger budget: it resumes (same vocabulary, same examples) and goes on.
    let again = train_custom(&data.join("train.tsv"), &run, 30).unwrap();
    assert_eq!((again.start_step, again.step), (20, 30));
}
