//! Training the translation model: a killed run resumes as if uninterrupted; a disk that fills
//! during a checkpoint leaves the previous one; the whole job (train, translate, eval,
//! attention) on a small corpus; hostile input files (over-long sources, a byte-order mark)
//! against `translate` and `eval` on an untrained tiny run.

use std::path::{Path, PathBuf};
use std::process::Command;

use xfmr::models::{checkpoint, TransformerConfig};
use xfmr_train::RunDir;
use xfmr_translate::SubwordTokenizer;

use crate::{small_corpus, train_args, train_losses, xfmr, xfmr_ok};

/// SIGKILL during training, then the same command again: it resumes from the last checkpoint
/// and the following losses equal an uninterrupted run's (to 1e-4; see
/// `xfmr_train::trainer` on why not bit for bit).
#[test]
fn training_killed_and_restarted_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let data = data.to_str().unwrap();
    let straight = dir.path().join("straight");
    // One replica: on the CPU the default is one per core, and replicas of one process draw
    // their dropout masks from burn's one generator in thread order (docs/distributed.md).
    let one = ["--devices", "1"];
    let mut args = train_args(data, straight.to_str().unwrap(), "16", "0");
    args.extend(one);
    xfmr_ok(&args);
    let expected = train_losses(&straight);
    assert_eq!(expected.len(), 16);

    let killed = dir.path().join("killed");
    let mut args = train_args(data, killed.to_str().unwrap(), "16", "0");
    args.extend(one);
    let mut child = Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill as soon as the step-8 checkpoint is complete (renamed from .partial).
    let ckpt = killed.join("checkpoints/step-00000008");
    let t = std::time::Instant::now();
    while !ckpt.exists() {
        assert!(
            t.elapsed().as_secs() < 600,
            "no checkpoint after 10 minutes"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    let before = train_losses(&killed);
    assert!(
        before.len() >= 8 && before.len() < 16,
        "killed after {} steps",
        before.len()
    );

    let out = xfmr_ok(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let resumed_from: u64 = stderr
        .split("from step ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resume message in:\n{stderr}"));
    assert!(resumed_from >= 8, "resumed from step {resumed_from}");
    let after = train_losses(&killed);
    assert_eq!(
        after.iter().map(|l| l.0).collect::<Vec<_>>(),
        (1..=16).collect::<Vec<_>>(),
        "one record per step, none twice"
    );
    for (a, e) in after.iter().zip(&expected) {
        assert!(
            (a.1 - e.1).abs() <= 1e-4,
            "step {}: {} vs {}",
            a.0,
            a.1,
            e.1
        );
    }
    assert!(killed.join("model/model.mpk").exists());
    assert!(killed.join("loss-curve.png").exists());
}

/// A disk that fills while a checkpoint is written: the run is resumed with every file it
/// writes limited below the size of the model's weights (`ulimit -f`, with `SIGXFSZ` ignored so
/// that the write fails with "File too large" instead of the signal killing the process), so
/// the first checkpoint it writes fails. The run stops with an error naming the file; the
/// previous checkpoint stays the newest, nothing half-written is left, and the same command
/// without the limit resumes from it and finishes.
#[cfg(unix)]
#[test]
fn full_disk_during_a_checkpoint_keeps_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let data = data.to_str().unwrap();
    let run = dir.path().join("run");
    let one = ["--devices", "1"];
    let mut args = train_args(data, run.to_str().unwrap(), "4", "0");
    args.extend(one);
    xfmr_ok(&args);
    let checkpoints = run.join("checkpoints");
    let previous = checkpoints.join("step-00000004");
    let weights = std::fs::metadata(previous.join("model.mpk")).unwrap().len();
    let before: Vec<(String, Vec<u8>)> = std::fs::read_dir(&previous)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();

    // A quarter of the weights' size in the shell's blocks of 512 bytes (dash; bash's are
    // 1,024 bytes, half the size: below it either way).
    let blocks = weights / 4 / 512;
    assert!(
        blocks >= 16,
        "model.mpk of {weights} bytes: too small for the limit"
    );
    let mut args = train_args(data, run.to_str().unwrap(), "8", "0");
    args.extend(one);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f {blocks}; exec \"$0\" \"$@\""
        ))
        .arg(env!("CARGO_BIN_EXE_xfmr"))
        .args(&args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run did not fail:\n{stderr}");
    assert!(
        stderr.contains("checkpoints/step-00000008.partial/model.mpk"),
        "the error does not name the checkpoint's file:\n{stderr}"
    );
    assert!(stderr.contains("File too large"), "{stderr}");
    eprintln!("the run under the limit:\n{stderr}");
    let left: Vec<String> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["step-00000004"], "only the previous checkpoint");
    for (name, bytes) in &before {
        assert_eq!(
            &std::fs::read(previous.join(name)).unwrap(),
            bytes,
            "{name} changed"
        );
    }

    let out = xfmr_ok(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("from step 4"), "{stderr}");
    let steps: Vec<u64> = train_losses(&run).iter().map(|l| l.0).collect();
    assert_eq!(
        steps,
        (1..=8).collect::<Vec<_>>(),
        "one record per step, none twice"
    );
}

/// The whole job on a small corpus: train, translate, eval, attention; bad input is refused
/// with the file and line. The trained model must have learnt: its validation loss (the
/// negative log-likelihood per token of the 30 validation pairs, from `metrics.jsonl`) is
/// below that of the same run stopped after one step (warm-up keeps that step's learning rate
/// near zero: an untrained model). Not the test scores: on 3 sentences after 40 steps both
/// BLEU and chrF sit near zero, noise either way (chrF 3.32 trained against 3.65 untrained once
/// the dropout masks changed, while the validation loss fell from 5.75 to 5.06).
#[test]
fn train_translate_eval_attention() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let scores = |run: &std::path::Path| -> (f64, f64) {
        let results: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap())
                .unwrap();
        let beam = &results["beam"];
        (
            beam["bleu"].as_f64().unwrap(),
            beam["chrf"].as_f64().unwrap(),
        )
    };
    let untrained = dir.path().join("untrained");
    // One replica, so that each run is reproducible (replicas of one process draw dropout
    // masks in thread order; on the CPU the default is one per core).
    let mut args = train_args(
        data.to_str().unwrap(),
        untrained.to_str().unwrap(),
        "1",
        "3",
    );
    args.extend(["--beam", "2", "--devices", "1"]);
    xfmr_ok(&args);
    let (bleu_untrained, chrf_untrained) = scores(&untrained);

    let run = dir.path().join("run");
    let mut args = train_args(data.to_str().unwrap(), run.to_str().unwrap(), "40", "3");
    args.extend(["--beam", "2", "--devices", "1"]);
    let out = xfmr_ok(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("test (3 sentences, greedy): BLEU"),
        "{stdout}"
    );
    // The length penalty is chosen on the validation split, recorded in the run, and the one
    // the test split is translated with.
    assert!(
        stdout.contains("length penalty on the validation split (30 sentences, beam 2, BLEU)"),
        "{stdout}"
    );
    let choice = xfmr_translate::DecodingChoice::load(&run)
        .unwrap()
        .expect("decoding.json");
    let tried: Vec<f64> = choice.tried.iter().map(|t| t.0).collect();
    assert_eq!(tried, xfmr_translate::translate::LENGTH_PENALTIES);
    assert_eq!((choice.beam_size, choice.sentences), (2, 30));
    let alpha = choice.length_penalty;
    assert!(
        stdout.contains(&format!(
            "test (3 sentences, beam 2, length penalty {alpha}): BLEU"
        )),
        "{stdout}"
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["beam"]["length_penalty"].as_f64(), Some(alpha));
    let (bleu, chrf) = scores(&run);
    let validation_nll = |run: &std::path::Path| -> f64 {
        let log = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        let last = log
            .lines()
            .rev()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .find(|record| record["kind"] == "valid")
            .expect("a validation record");
        last["nll"].as_f64().unwrap()
    };
    let (nll, nll_untrained) = (validation_nll(&run), validation_nll(&untrained));
    assert!(
        nll < nll_untrained && (0.0..=100.0).contains(&chrf),
        "trained: validation NLL {nll:.3}, BLEU {bleu:.2} chrF {chrf:.2}; untrained: NLL \
         {nll_untrained:.3}, BLEU {bleu_untrained:.2} chrF {chrf_untrained:.2}"
    );
    let png = std::fs::read(run.join("loss-curve.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");

    let run_s = run.to_str().unwrap();
    let out = xfmr_ok(&[
        "translate",
        "--run",
        run_s,
        "--beam",
        "2",
        "--n-best",
        "2",
        "Y dijo Dios",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains('\t'))
            .count(),
        2
    );

    let test = data.join("test.tsv");
    let out = xfmr_ok(&[
        "eval",
        "--run",
        run_s,
        "--beam",
        "1",
        test.to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("10 sentences, greedy: BLEU"));
    // Beam search takes the run's length penalty, or the one given; a length penalty that is not
    // finite is refused before anything runs.
    let eval_beam = |extra: &[&str]| -> String {
        let mut args = vec!["eval", "--run", run_s, "--beam", "2", "--limit", "3"];
        args.extend_from_slice(extra);
        args.push(test.to_str().unwrap());
        String::from_utf8_lossy(&xfmr_ok(&args).stdout).into_owned()
    };
    let stdout = eval_beam(&[]);
    assert!(
        stdout.contains(&format!(
            "3 sentences, beam 2, length penalty {alpha}: BLEU"
        )),
        "{stdout}"
    );
    let stdout = eval_beam(&["--length-penalty", "0.25"]);
    assert!(
        stdout.contains("3 sentences, beam 2, length penalty 0.25: BLEU"),
        "{stdout}"
    );
    let out = xfmr(&[
        "eval",
        "--run",
        run_s,
        "--length-penalty",
        "nan",
        test.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("must be finite"), "{stderr}");

    let maps = dir.path().join("maps");
    xfmr_ok(&[
        "attention",
        "--run",
        run_s,
        "--out",
        maps.to_str().unwrap(),
        "Y dijo Dios",
    ]);
    // tiny: 2 + 2 layers × 4 heads, encoder and cross.
    assert_eq!(std::fs::read_dir(&maps).unwrap().count(), 16);

    let bad = dir.path().join("bad.tsv");
    std::fs::write(&bad, "uno\tone\ndos sin tabulador\n").unwrap();
    let out = xfmr(&["eval", "--run", run_s, bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.tsv:2"), "{stderr}");
}

/// Rows of the position table of [`tiny_run`]'s model: its sources' limit, end token included.
const POSITIONS: usize = 16;

/// A run directory with an untrained tiny translation model (its position table of
/// [`POSITIONS`] rows) and a vocabulary learnt on a few sentences: what `translate` and `eval`
/// read, made in well under a second (no training: these tests are about the input, not the
/// translations).
fn tiny_run(dir: &Path) -> PathBuf {
    type B = xfmr::burn::backend::NdArray;
    let corpus = [
        "uno dos tres cuatro",
        "one two three four",
        "y dijo dios",
        "and god said",
    ];
    let sentences: Vec<&str> = (0..5).flat_map(|_| corpus).collect();
    let tokenizer = SubwordTokenizer::train(sentences.iter(), 60).unwrap();
    let run = dir.join("run");
    let run_dir = RunDir::new(&run);
    run_dir.create().unwrap();
    run_dir.write_tokenizer(&tokenizer).unwrap();
    let config = TransformerConfig::tiny(tokenizer.vocab_size()).with_max_len(POSITIONS);
    let model = config.init::<B>(&Default::default()).unwrap();
    checkpoint::save::<B, TransformerConfig>(&model, &config, &run_dir.model_dir()).unwrap();
    run
}

/// `count` words of the tiny run's vocabulary: more than [`POSITIONS`] tokens for `count` ≥
/// 16 (a word is at least one token).
fn words(count: usize) -> String {
    vec!["uno"; count].join(" ")
}

/// An 8.5 MB line (8,500,000 bytes, no space at either end for a TSV reader to trim), the size
/// that kept `xfmr translate` busy past a minute (issue 43).
fn huge_line() -> String {
    "dos ".repeat(8_500_000 / 4 - 1) + "dos."
}

/// `xfmr translate --input FILE` refuses a line longer than the model's positions, naming the
/// file and line and what to do, before translating anything; from stdin, the line of stdin.
#[test]
fn hostile_file_translate_long_line_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run(dir.path());
    let input = dir.path().join("in.txt");
    std::fs::write(&input, format!("uno dos\n{}\ntres\n", words(40))).unwrap();
    let out = xfmr(&[
        "translate",
        "--run",
        run.to_str().unwrap(),
        "--beam",
        "1",
        "--input",
        input.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing translated");
    assert!(stderr.contains("in.txt:2: source 1: 41 tokens"), "{stderr}");
    assert!(
        stderr.contains(&format!("the {POSITIONS} tokens")),
        "{stderr}"
    );
    assert!(stderr.contains("--truncate"), "{stderr}");

    // The 8.5 MB line on stdin: refused on its length in bytes, without tokenising it.
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(["translate", "--run", run.to_str().unwrap(), "--beam", "1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let text = format!("uno\n{}\n", huge_line());
    let writer = std::thread::spawn(move || {
        // The program may exit before reading everything: a broken pipe is not a failure.
        let _ = std::io::Write::write_all(&mut stdin, text.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("<stdin>:2: source 1: 8500000 bytes"),
        "{stderr}"
    );
    // The fault: past a minute. Refused unread, it takes a fraction of that.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

/// With `--truncate` the long lines are translated from their first tokens, one output line
/// per input line, and stderr says how many were cut and where the first was.
#[test]
fn hostile_file_translate_truncate_flag() {
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run(dir.path());
    let input = dir.path().join("in.txt");
    std::fs::write(
        &input,
        format!("uno dos\n{}\ntres\n{}\n", words(40), huge_line()),
    )
    .unwrap();
    let out = xfmr_ok(&[
        "translate",
        "--run",
        run.to_str().unwrap(),
        "--beam",
        "2",
        "--truncate",
        "--input",
        input.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 4);
    assert!(
        stderr.contains(&format!(
            "truncated 2 of 4 sources to the model's {POSITIONS} tokens"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("the first at "), "{stderr}");
    assert!(stderr.contains("in.txt:2"), "{stderr}");
}

/// `xfmr eval` refuses a source longer than the model's positions naming the TSV file and its
/// line (the 8.5 MB one, on its byte length); `--truncate` evaluates it from its first tokens
/// and prints BLEU as sacreBLEU does, not a debug dump.
#[test]
fn hostile_file_eval_long_line_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run(dir.path());
    let tsv = dir.path().join("test.tsv");
    // A blank line first: the error names the file's line, not the pair's index.
    std::fs::write(
        &tsv,
        format!("\nuno dos\tone two\n{}\tthree\ntres\tthree\n", huge_line()),
    )
    .unwrap();
    let run = run.to_str().unwrap();
    let out = xfmr(&["eval", "--run", run, "--beam", "1", tsv.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("test.tsv:3: source 1: 8500000 bytes"),
        "{stderr}"
    );

    let out = xfmr_ok(&[
        "eval",
        "--run",
        run,
        "--beam",
        "1",
        "--truncate",
        tsv.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("truncated 1 of 3 sources"), "{stderr}");
    assert!(stderr.contains("test.tsv:3"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("3 sentences, greedy: BLEU"), "{stdout}");
    let bleu = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("BLEU = "))
        .unwrap_or_else(|| panic!("no sacreBLEU line:\n{stdout}"));
    assert!(
        bleu.contains("(BP = ") && bleu.contains(" ratio = ") && bleu.contains(" ref_len = "),
        "{bleu}"
    );
    assert!(!stdout.contains("BleuScore"), "{stdout}");
}

/// A UTF-8 byte-order mark at the start of a TSV is not part of the first source: the
/// library's reader drops it, and `xfmr eval` (whose first source would otherwise be the
/// invisible mark alone) finds that source empty, naming line 1.
#[test]
fn hostile_file_tsv_with_bom() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("bom.tsv");
    std::fs::write(&tsv, "\u{FEFF}uno dos\tone two\ntres\tthree\n").unwrap();
    let pairs = xfmr_translate::data::read_tsv(&tsv).unwrap();
    assert_eq!(pairs[0].src, "uno dos");

    let run = tiny_run(dir.path());
    let run = run.to_str().unwrap();
    let out = xfmr_ok(&["eval", "--run", run, "--beam", "1", tsv.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 sentences, greedy: BLEU"));

    let only_bom = dir.path().join("only-bom.tsv");
    std::fs::write(&only_bom, "\u{FEFF}\tone\ntres\tthree\n").unwrap();
    let out = xfmr(&["eval", "--run", run, only_bom.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("only-bom.tsv:1: empty source"), "{stderr}");
}
