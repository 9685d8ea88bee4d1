//! Run directories written before `positions` moved from the layer configuration to the
//! model's (`tests/old-runs/README.md`, by the binary of 2026-12-03) still load, decode, sample
//! and resume, with exactly the outputs that binary gave on flex. (The outputs are compared
//! exactly: another CPU's kernels round differently in the last bits, which would change a
//! token only where two candidates tie within them; a changed configuration changes the
//! outputs everywhere.)

use std::path::{Path, PathBuf};

use crate::xfmr_ok;

/// A committed run directory.
fn old_run(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/old-runs")
        .join(name)
}

fn test_split() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/es-en/test.tsv")
}

/// The translation run (sinusoidal positions in `layer.positions`) translates the first three
/// test sentences as it did when it was written, greedy and by beam search.
#[test]
fn old_runs_translation_decodes_as_before() {
    let run = old_run("translation");
    let split = test_split();
    let dir = tempfile::tempdir().unwrap();
    for (search, args) in [
        ("greedy", &["--beam", "1"][..]),
        ("beam", &["--beam", "2", "--length-penalty", "0.6"][..]),
    ] {
        let hypotheses = dir.path().join(format!("{search}.txt"));
        let mut command = vec!["eval", "--backend", "flex", "--run", run.to_str().unwrap()];
        command.extend(["--limit", "3"]);
        command.extend_from_slice(args);
        command.extend(["--hypotheses", hypotheses.to_str().unwrap()]);
        command.push(split.to_str().unwrap());
        xfmr_ok(&command);
        let expected = std::fs::read_to_string(run.join(format!("test.{search}.txt"))).unwrap();
        let found = std::fs::read_to_string(&hypotheses).unwrap();
        assert_eq!(found, expected, "{search}");
    }
}

/// The language-model run (learned positions in `layer.positions`) samples the very text it
/// sampled when it was written (seeded, temperature 1: any change in its logits would show),
/// and resumes from its checkpoint (its `trainer.json` and `config.json` in the old layout,
/// which without the upgrade fail to parse: burn's configurations have no serde defaults),
/// writing the new layout.
#[test]
fn old_runs_lm_samples_as_before_and_resumes() {
    let run = old_run("lm");
    let out = xfmr_ok(&[
        "generate",
        "--backend",
        "flex",
        "--run",
        run.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--temperature",
        "1",
        "--seed",
        "7",
        "And Enos lived",
    ]);
    let expected = std::fs::read_to_string(old_run("lm.sample.txt")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);

    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("lm");
    copy_dir(&run, &copy);
    // As it was written: flex with two replicas, the task named (a run's directory does not
    // choose it).
    let out = xfmr_ok(&[
        "train",
        "--backend",
        "flex",
        "--devices",
        "2",
        "--task",
        "lm",
        "--out",
        copy.to_str().unwrap(),
        "--steps",
        "62",
        "--minutes",
        "0",
        "--checkpoint-every",
        "1",
        "--test-sentences",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("steps 60→62"), "{stderr}");
    assert!(stderr.contains("resuming"), "{stderr}");
    let step = copy.join("checkpoints/step-00000062");
    for (file, model) in [("config.json", ""), ("trainer.json", "/objective/model")] {
        let text = std::fs::read_to_string(step.join(file)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let config = json.pointer(model).unwrap();
        assert_eq!(config["positions"], "Learned", "{file}: {config}");
        assert!(
            config["layer"].get("positions").is_none(),
            "{file}: {config}"
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
