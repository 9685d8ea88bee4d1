//! A run directory's layout and files (`RunDir`), and the run specification's presets and
//! JSON shape (`RunSpec`, `train-config.json`).

use xfmr_models::ladder::LengthLadder;
use xfmr_train::run_dir::RunDir;
use xfmr_train::spec::{Preset, RunSpec, Task};
use xfmr_train::trainer::{MetricsFormat, TrainConfig};
use xfmr_translate::Pair;

fn pairs() -> Vec<Pair> {
    [
        "the cat sat",
        "a dog ran",
        "the dog sat on the mat",
        "a cat ran away",
    ]
    .iter()
    .map(|t| Pair {
        src: t.to_uppercase(),
        tgt: t.to_string(),
    })
    .collect()
}

/// The layout keeps the names runs have always had.
#[test]
fn paths_keep_the_names_of_existing_runs() {
    let run = RunDir::new("r");
    let name = |p: std::path::PathBuf| p.to_str().unwrap().to_string();
    assert_eq!(name(run.spec_path()), "r/train-config.json");
    assert_eq!(name(run.tokenizer_path()), "r/tokenizer.json");
    assert_eq!(name(run.model_dir()), "r/model");
    assert_eq!(name(run.checkpoint_dir(8)), "r/checkpoints/step-00000008");
    assert_eq!(name(run.decoding_path()), "r/decoding.json");
    assert_eq!(
        name(run.metrics_path(MetricsFormat::Jsonl)),
        "r/metrics.jsonl"
    );
    assert_eq!(name(run.metrics_path(MetricsFormat::Csv)), "r/metrics.csv");
    assert_eq!(name(run.loss_curve_path()), "r/loss-curve.png");
    assert_eq!(name(run.attention_dir()), "r/attention");
    assert_eq!(name(run.results_path()), "r/results.json");
    assert_eq!(name(run.test_translations_path("beam")), "r/test.beam.txt");
    assert_eq!(
        xfmr_translate::translate::DECODING_FILE,
        RunDir::DECODING_FILE
    );
}

/// A run's task: its specification's; a run from before specifications (checkpoints or a
/// model, no `train-config.json`) is a translation run; an empty directory is no run.
#[test]
fn the_task_of_old_and_new_runs() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::new(dir.path().join("run"));
    assert_eq!(run.task().unwrap(), None);
    std::fs::create_dir_all(run.checkpoints_dir()).unwrap();
    assert_eq!(run.task().unwrap(), Some(Task::Translation));
    let tokenizer = Task::Lm.learn_vocabulary(&pairs(), 60).unwrap();
    let spec = Preset::Tiny
        .spec(Task::Lm, &tokenizer, None, 20, TrainConfig::new())
        .unwrap();
    run.write_spec(&spec).unwrap();
    assert_eq!(run.task().unwrap(), Some(Task::Lm));
    // A specification without a task (hand-written) is a translation run's.
    std::fs::write(run.spec_path(), "{}").unwrap();
    assert_eq!(run.task().unwrap(), Some(Task::Translation));
    assert!(run
        .load_model::<burn::backend::NdArray, xfmr_models::TransformerConfig>(&Default::default())
        .unwrap_err()
        .to_string()
        .contains("no model/ and no checkpoint"));
}

/// `train-config.json` keeps its JSON shape (`task` beside `objective` and `train`), and
/// the specification and vocabulary read back as written.
#[test]
fn spec_and_vocabulary_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunDir::new(dir.path());
    let tokenizer = Task::Mlm.learn_vocabulary(&pairs(), 60).unwrap();
    assert!(tokenizer.mask_id().is_some());
    run.write_tokenizer(&tokenizer).unwrap();
    assert!(run.has_tokenizer());
    let read = run.read_tokenizer().unwrap();
    assert_eq!(read.fingerprint(), tokenizer.fingerprint());
    let spec = Preset::Tiny
        .spec(
            Task::Mlm,
            &read,
            Some(0.0),
            20,
            TrainConfig::new().with_steps(7),
        )
        .unwrap();
    run.write_spec(&spec).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.spec_path()).unwrap()).unwrap();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort();
    assert_eq!(keys, ["objective", "task", "train"]);
    assert_eq!(json["task"], "mlm");
    let back = run.read_spec().unwrap();
    assert_eq!(back.task(), Task::Mlm);
    assert_eq!(back.train_config().steps, 7);
    let RunSpec::Mlm { objective, .. } = back else {
        panic!("an mlm run")
    };
    assert_eq!(Some(objective.mask_id), tokenizer.mask_id());
    assert_eq!(objective.model.layer.dropout, 0.0);
    // Unreadable files are named.
    std::fs::write(run.spec_path(), "not json").unwrap();
    let err = run.read_spec().unwrap_err().to_string();
    assert!(err.contains("train-config.json"), "{err}");
    std::fs::remove_file(run.tokenizer_path()).unwrap();
    let err = run.read_tokenizer().unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

/// The keys of a `train-config.json`'s training configuration, pinned: a key renamed or
/// removed breaks every run directory written before. `ladder` (issue 41) and
/// `matmul_precision` (issue 44) came last: a file without them (written before) still loads,
/// with no ladder and `f32` products, and one with them keeps them.
#[test]
fn train_config_keys_are_pinned_and_old_files_load() {
    let config = Preset::Tiny.train_config(Task::Lm);
    let json = serde_json::to_value(&config).unwrap();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "accumulate",
            "average",
            "beta_1",
            "beta_2",
            "checkpoint_every",
            "decay",
            "epsilon",
            "eval_every",
            "keep_checkpoints",
            "ladder",
            "lr_factor",
            "matmul_precision",
            "max_tokens",
            "minutes",
            "seed",
            "steps",
            "warmup"
        ]
    );
    let mut old = json.clone();
    old.as_object_mut().unwrap().remove("ladder");
    old.as_object_mut().unwrap().remove("matmul_precision");
    let read: xfmr_train::TrainConfig = serde_json::from_value(old).unwrap();
    assert_eq!(read.ladder, None);
    assert_eq!(read.matmul_precision, None);
    let bf16 = config
        .clone()
        .with_matmul_precision(Some(xfmr_attention::MatmulPrecision::Bf16));
    let text = serde_json::to_string(&bf16).unwrap();
    assert!(text.contains(r#""matmul_precision":"bf16""#), "{text}");
    let read: xfmr_train::TrainConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(
        read.matmul_precision,
        Some(xfmr_attention::MatmulPrecision::Bf16)
    );
    let on = config.with_ladder(Some(LengthLadder::new(8)));
    let text = serde_json::to_string(&on).unwrap();
    assert!(text.contains(r#""ladder":{"min_len":8}"#), "{text}");
    let read: xfmr_train::TrainConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(read.ladder, Some(LengthLadder::new(8)));
    // A whole run specification of before, as a run directory holds it.
    let mut spec = serde_json::json!({"task": "lm", "train": json});
    spec["train"].as_object_mut().unwrap().remove("ladder");
    spec["train"]
        .as_object_mut()
        .unwrap()
        .remove("matmul_precision");
    let objective = xfmr_train::CausalLm::new(xfmr_models::DecoderOnlyConfig::tiny(40), 1, 2);
    spec["objective"] = serde_json::to_value(objective).unwrap();
    let spec: RunSpec = serde_json::from_value(spec).unwrap();
    assert_eq!(spec.train_config().ladder, None);
    assert_eq!(spec.train_config().matmul_precision, None);
}

/// The dropout default: the preset model's, except none for the `cpu` translation run.
#[test]
fn dropout_defaults_to_the_presets() {
    assert_eq!(Preset::Cpu.dropout(Task::Translation), 0.0);
    assert_eq!(Preset::Cpu.dropout(Task::Lm), 0.1);
    assert_eq!(Preset::Tiny.dropout(Task::Translation), 0.1);
    assert_eq!(Preset::Small.dropout(Task::Translation), 0.1);
    assert_eq!(Preset::Base.dropout(Task::Mlm), 0.1);
    assert_eq!(Preset::Big.dropout(Task::Translation), 0.3);
}

/// The warm-up and schedule factor: the measured recipe for the `cpu` translation run
/// only.
#[test]
fn schedule_defaults_to_the_presets() {
    assert_eq!(Preset::Cpu.schedule(Task::Translation), (800, 1.0));
    assert_eq!(Preset::Cpu.schedule(Task::Lm), (300, 0.3));
    assert_eq!(Preset::Cpu.schedule(Task::Mlm), (300, 0.3));
    assert_eq!(Preset::Tiny.schedule(Task::Translation), (300, 0.3));
    assert_eq!(Preset::Small.schedule(Task::Translation), (300, 0.3));
    let config = Preset::Cpu.train_config(Task::Translation);
    assert_eq!((config.warmup, config.lr_factor), (800, 1.0));
}

/// The vocabulary size: 8,000 for the `cpu` translation run only.
#[test]
fn vocabulary_defaults_to_the_presets() {
    assert_eq!(Preset::Cpu.vocab_size(Task::Translation), 8000);
    assert_eq!(Preset::Cpu.vocab_size(Task::Lm), 4000);
    assert_eq!(Preset::Cpu.vocab_size(Task::Mlm), 4000);
    assert_eq!(Preset::Small.vocab_size(Task::Translation), 4000);
}

/// Names round-trip through `FromStr`, and unknown ones are refused with the choices.
#[test]
fn names_parse() {
    for task in Task::ALL {
        assert_eq!(task.name().parse::<Task>().unwrap(), task);
    }
    for preset in Preset::ALL {
        assert_eq!(preset.name().parse::<Preset>().unwrap(), preset);
    }
    assert!("gpt".parse::<Task>().unwrap_err().contains("lm"));
    assert!("huge".parse::<Preset>().unwrap_err().contains("base"));
}
