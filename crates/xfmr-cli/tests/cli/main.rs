//! The `xfmr` binary end to end: the demo and the MiniLM commands here; training, translation
//! and evaluation (`translation.rs`); data-parallel runs (`parallel.rs`); the language-model
//! tasks and the downstream example (`families.rs`); `xfmr serve`'s memory (`serve.rs`); run
//! directories written by an earlier binary (`old_runs.rs`).

mod families;
mod generate;
mod old_runs;
mod parallel;
mod serve;
mod translation;

use std::process::Command;

pub(crate) fn xfmr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(args)
        .output()
        .expect("the xfmr binary runs")
}

/// Runs `xfmr` and fails the test, showing both streams, unless it exits successfully.
pub(crate) fn xfmr_ok(args: &[&str]) -> std::process::Output {
    let out = xfmr(args);
    assert!(
        out.status.success(),
        "xfmr {}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `xfmr demo` runs on the embedded sentences, never puts weight on padding, and its invariant
/// checks (printed maxima of |diff|) pass, which the binary signals by its exit status.
#[test]
fn demo_runs_and_its_invariants_hold() {
    let out = xfmr_ok(&["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("(weight on padding: 0)").count(),
        8,
        "{stdout}"
    );
    assert!(stdout.contains("cached step-by-step decoding vs full pass: max |diff| ="));
}

#[test]
fn demo_rejects_an_invalid_config_with_the_values() {
    let out = xfmr(&["demo", "--d-model", "30", "--heads", "4"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: d_model (30) must be divisible by n_heads (4)"
    );
}

/// One backend rule: every command takes `--backend`, and its default is `auto` everywhere.
#[test]
fn every_command_takes_the_backend_with_the_auto_default() {
    for command in [
        "train",
        "translate",
        "eval",
        "attention",
        "demo",
        "generate",
        "fill-mask",
        "embed",
        "similarity",
        "serve",
    ] {
        let out = xfmr_ok(&[command, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        // The option's lines: from its name to the next option's.
        let option: Vec<&str> = help
            .lines()
            .skip_while(|l| !l.contains("--backend <BACKEND>"))
            .enumerate()
            .take_while(|(i, l)| *i == 0 || !(l.starts_with("      --") || l.starts_with("  -")))
            .map(|(_, l)| l)
            .collect();
        assert!(
            !option.is_empty(),
            "xfmr {command} has no --backend:\n{help}"
        );
        let option = option.join("\n");
        assert!(
            option.contains("[default: auto]"),
            "xfmr {command} --backend:{option}"
        );
    }
}

/// The fetched sentence model; a failure naming the fetch command when it is absent.
pub(crate) fn minilm() -> std::path::PathBuf {
    xfmr_sentence::fetch::find_minilm()
        .unwrap_or_else(|| panic!("all-MiniLM-L6-v2 not found: run `xfmr fetch-model minilm`"))
}

/// `xfmr similarity` ranks a paraphrase above an unrelated sentence; `xfmr embed --json` writes
/// 384-dimensional unit vectors, one per input line of `--file`; with `--backend flex
/// --precision bf16` the same vectors within cosine 0.999 (bf16 products where the CPU has
/// them, for batches of at least `BF16_MIN_ROWS` token rows: forty lines here); an unknown
/// precision is refused, naming the two.
#[test]
#[ignore = "needs all-MiniLM-L6-v2: `cargo run -p xfmr-cli -- fetch-model minilm`, then `cargo test -p xfmr-cli -- --ignored`"]
fn embed_and_similarity() {
    let dir = minilm();
    let dir = dir.to_str().unwrap();
    let sim = |a: &str, b: &str| -> f64 {
        let out = xfmr_ok(&["similarity", a, b, "--model-dir", dir]);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let close = sim("A man is eating food.", "A man is eating a meal.");
    let far = sim("A man is eating food.", "The stock market fell sharply.");
    assert!(close > 0.8 && far < 0.3, "close {close}, far {far}");

    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.txt");
    std::fs::write(
        &input,
        "In the beginning.\n\nAnd God said, Let there be light.\n",
    )
    .unwrap();
    let output = tmp.path().join("out.json");
    xfmr_ok(&[
        "embed",
        "--file",
        input.to_str().unwrap(),
        "--json",
        output.to_str().unwrap(),
        "--model-dir",
        dir,
    ]);
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "blank lines are skipped");
    assert_eq!(rows[1]["sentence"], "And God said, Let there be light.");
    let e: Vec<f64> = serde_json::from_value(rows[0]["embedding"].clone()).unwrap();
    assert_eq!(e.len(), 384);
    assert!((e.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4);

    // bf16 products run from BF16_MIN_ROWS (128) token rows per batch: forty lines.
    let bf16 = tmp.path().join("bf16.json");
    let many = tmp.path().join("many.txt");
    std::fs::write(
        &many,
        "In the beginning.\nAnd God said, Let there be light.\n".repeat(20),
    )
    .unwrap();
    let args = [
        "embed",
        "--file",
        many.to_str().unwrap(),
        "--model-dir",
        dir,
        "--backend",
        "flex",
    ];
    xfmr_ok(
        &[
            &args[..],
            &["--precision", "bf16", "--json", bf16.to_str().unwrap()],
        ]
        .concat(),
    );
    let fast: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&bf16).unwrap()).unwrap();
    let fast = fast.as_array().unwrap();
    assert_eq!(fast.len(), 40);
    for (i, b) in fast.iter().enumerate() {
        assert_eq!(b["sentence"], rows[i % 2]["sentence"], "line {i}");
        let a: Vec<f64> = serde_json::from_value(rows[i % 2]["embedding"].clone()).unwrap();
        let b: Vec<f64> = serde_json::from_value(b["embedding"].clone()).unwrap();
        let cos: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!(cos >= 0.999, "bf16 embedding cosine {cos} to f32");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args([&args[..], &["--precision", "fp8"]].concat())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("f32 or bf16"),
        "{err}"
    );
}

#[test]
fn embed_without_a_model_says_how_to_get_one() {
    let out = Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(["embed", "hello"])
        .env("XFMR_MINILM_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xfmr fetch-model minilm"), "{err}");
}

/// A small corpus for fast training runs: the first pairs of the embedded training split with
/// both sides of at most 100 characters (short sequences keep the tests' runs quick).
pub(crate) fn small_corpus(dir: &std::path::Path) -> std::path::PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let train = include_str!("../../data/es-en/train.tsv");
    let lines: Vec<&str> = train
        .lines()
        .filter(|l| l.split('\t').all(|side| side.chars().count() <= 100))
        .take(340)
        .collect();
    assert_eq!(
        lines.len(),
        340,
        "the embedded set has at least 340 short pairs"
    );
    std::fs::write(data.join("train.tsv"), lines[..300].join("\n")).unwrap();
    std::fs::write(data.join("valid.tsv"), lines[300..330].join("\n")).unwrap();
    std::fs::write(data.join("test.tsv"), lines[330..340].join("\n")).unwrap();
    data
}

pub(crate) fn train_args<'a>(
    data: &'a str,
    out: &'a str,
    steps: &'a str,
    test: &'a str,
) -> Vec<&'a str> {
    vec![
        "train",
        "--data",
        data,
        "--out",
        out,
        "--preset",
        "tiny",
        "--vocab-size",
        "300",
        "--steps",
        steps,
        "--max-tokens",
        "400",
        "--warmup",
        "4",
        "--checkpoint-every",
        "4",
        "--eval-every",
        "4",
        "--average",
        "2",
        "--test-sentences",
        test,
    ]
}

/// (step, loss) of the training records of a run's metrics.jsonl.
pub(crate) fn train_losses(run: &std::path::Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}
