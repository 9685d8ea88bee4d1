//! The `xfmr` binary end to end.

use std::process::Command;

fn xfmr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(args)
        .output()
        .expect("the xfmr binary runs")
}

/// Runs `xfmr` and fails the test, showing both streams, unless it exits successfully.
fn xfmr_ok(args: &[&str]) -> std::process::Output {
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

/// The fetched sentence model; a failure naming the fetch command when it is absent.
fn minilm() -> std::path::PathBuf {
    xfmr_sentence::fetch::find_minilm()
        .unwrap_or_else(|| panic!("all-MiniLM-L6-v2 not found: run `xfmr fetch-model minilm`"))
}

/// `xfmr similarity` ranks a paraphrase above an unrelated sentence; `xfmr embed --json` writes
/// 384-dimensional unit vectors, one per input line of `--file`.
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

/// A small corpus for fast training runs: the first pairs of the embedded training split.
fn small_corpus(dir: &std::path::Path) -> std::path::PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let train = include_str!("../data/es-en/train.tsv");
    let lines: Vec<&str> = train.lines().collect();
    std::fs::write(data.join("train.tsv"), lines[..300].join("\n")).unwrap();
    std::fs::write(data.join("valid.tsv"), lines[300..330].join("\n")).unwrap();
    std::fs::write(data.join("test.tsv"), lines[330..340].join("\n")).unwrap();
    data
}

fn train_args<'a>(data: &'a str, out: &'a str, steps: &'a str, test: &'a str) -> Vec<&'a str> {
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
fn train_losses(run: &std::path::Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// SIGKILL during training, then the same command again: it resumes from the last checkpoint
/// and the following losses equal an uninterrupted run's (to 1e-4; see
/// `xfmr_train::trainer` on why not bit for bit).
#[test]
fn training_killed_and_restarted_matches_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let data = data.to_str().unwrap();
    let straight = dir.path().join("straight");
    xfmr_ok(&train_args(data, straight.to_str().unwrap(), "16", "0"));
    let expected = train_losses(&straight);
    assert_eq!(expected.len(), 16);

    let killed = dir.path().join("killed");
    let args = train_args(data, killed.to_str().unwrap(), "16", "0");
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

/// The whole job on a small corpus: train, translate, eval, attention; bad input is refused
/// with the file and line.
#[test]
fn train_translate_eval_attention() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let run = dir.path().join("run");
    let mut args = train_args(data.to_str().unwrap(), run.to_str().unwrap(), "6", "3");
    args.extend(["--beam", "2"]);
    let out = xfmr_ok(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("test (3 sentences, greedy): BLEU"),
        "{stdout}"
    );
    assert!(
        stdout.contains("test (3 sentences, beam): BLEU"),
        "{stdout}"
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    assert!(results["beam"]["bleu"].as_f64().unwrap() >= 0.0);
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

/// A free TCP port on localhost (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every parameter of the model in checkpoint `dir`, flattened in visiting order.
fn checkpoint_params(dir: &std::path::Path) -> Vec<Vec<f32>> {
    use xfmr::burn::module::{Module, ModuleVisitor, Param};
    use xfmr::burn::tensor::Tensor;
    type B = xfmr::burn::backend::NdArray;
    struct Collect(Vec<Vec<f32>>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0
                .push(param.val().into_data().to_vec::<f32>().unwrap());
        }
    }
    let (_, model) =
        xfmr_train::trainer::average_checkpoints::<B, xfmr::models::TransformerConfig>(
            &[dir.to_path_buf()],
            &Default::default(),
        )
        .unwrap();
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// `(step, fingerprint)` of every parameter fingerprint a data-parallel replica printed.
fn fingerprints(stderr: &str) -> Vec<(String, String)> {
    stderr
        .lines()
        .filter_map(|l| {
            let (head, fingerprint) = l.split_once(": fingerprint ")?;
            let step = head.rsplit_once("at step ")?.1;
            Some((step.to_string(), fingerprint.to_string()))
        })
        .collect()
}

/// Data-parallel training (burn's collective all-reduce): `nodes` `xfmr train` processes on
/// localhost, each holding `devices` replicas (threads; on ndarray they share its one device),
/// each replica reading its share of every batch. Every replica prints its parameters'
/// fingerprint at each checkpoint (steps 3 and 6) and they all agree (the replicas also check
/// this among themselves); the parameters equal those of one process trained on the whole
/// batches (≤ 1e-4 on every weight after 6 Adam steps; dropout off, since dropout masks depend
/// on how a batch is split). 1e-4 is the bound the resume test uses, for the same reason: burn's
/// backward pass sums a shared parameter's contributions (the tied embedding's) in an order that
/// varies between runs, so the single-process reference is not reproducible bit for bit (its
/// checkpoint hash differed in six runs of one command); against it the replicas were 2.4e-7 or
/// 5.04e-5 apart, the latter in about half of the runs, for 2 × 1, 1 × 2 and 2 × 2 alike.
///
/// Adam's ε is 0.1 here, not the paper's 1e-9. With ε ≪ √v an early Adam step is about
/// `lr · sign(g)`, so a gradient that is zero but for rounding (the key projection's bias,
/// whose gradient vanishes because softmax ignores a shift of all scores; a ReLU whose input
/// rounds to either side of 0) moves by ±lr whichever way its rounding falls, and splitting a
/// batch over two processes rounds differently. Measured with ε = 1e-9: 0.03 apart after 6
/// steps, the key biases first. With ε = 0.1 a step is proportional to the gradient, and the
/// comparison checks what data parallelism promises: the same summed gradients.
fn data_parallel_trains_as_one(nodes: usize, devices: usize) {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let data = data.to_str().unwrap();
    let model = xfmr::models::TransformerConfig::tiny(300).map_layer(|l| l.with_dropout(0.0));
    let config = xfmr::train::TrainConfig::new()
        .with_steps(6)
        .with_max_tokens(400)
        .with_warmup(4)
        .with_lr_factor(0.3) // the CLI's default
        .with_epsilon(0.1)
        .with_checkpoint_every(3)
        .with_keep_checkpoints(2)
        .with_average(2);
    let spec = serde_json::json!({
        "task": "translation",
        "objective": xfmr::train::Translation::new(model),
        "train": config,
    });
    let config_path = dir.path().join("train-config.json");
    std::fs::write(&config_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let mut single_args = train_args(data, "", "6", "0");
    let at = single_args.iter().position(|&a| a == "--preset").unwrap();
    single_args.splice(at..at + 2, ["--config", config_path.to_str().unwrap()]);

    let single = dir.path().join("single");
    let mut args = single_args.clone();
    args[4] = single.to_str().unwrap();
    xfmr_ok(&args);

    let run = dir.path().join("parallel");
    let coordinator = format!("127.0.0.1:{}", free_port());
    let (nodes_arg, devices_arg) = (nodes.to_string(), devices.to_string());
    let ranks: Vec<std::process::Child> = (0..nodes)
        .map(|rank| {
            let rank = rank.to_string();
            let port = free_port().to_string();
            let mut args = single_args.clone();
            args[4] = run.to_str().unwrap();
            args.extend([
                "--nodes",
                &nodes_arg,
                "--rank",
                &rank,
                "--devices",
                &devices_arg,
            ]);
            args.extend(["--coordinator", &coordinator, "--data-port", &port]);
            args.extend(["--peer-timeout", "300"]);
            Command::new(env!("CARGO_BIN_EXE_xfmr"))
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<std::process::Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let stderrs: Vec<String> = outputs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    let all: String = stderrs
        .iter()
        .enumerate()
        .map(|(rank, e)| format!("--- rank {rank} stderr:\n{e}"))
        .collect();
    let mut printed = Vec::new();
    for (rank, out) in outputs.iter().enumerate() {
        assert!(out.status.success(), "rank {rank} failed:\n{all}");
        let mine = fingerprints(&stderrs[rank]);
        assert_eq!(
            mine.len(),
            2 * devices,
            "rank {rank}: steps 3 and 6 per device:\n{all}"
        );
        printed.extend(mine);
    }
    for step in ["3", "6"] {
        let at: Vec<&String> = printed
            .iter()
            .filter(|p| p.0 == step)
            .map(|p| &p.1)
            .collect();
        assert_eq!(at.len(), nodes * devices, "{all}");
        assert!(
            at.iter().all(|f| *f == at[0]),
            "the replicas differ at step {step}:\n{all}"
        );
    }

    // Only rank 0 wrote the run.
    assert_eq!(train_losses(&run).len(), 6);
    let expected = checkpoint_params(&single.join("checkpoints/step-00000006"));
    let got = checkpoint_params(&run.join("checkpoints/step-00000006"));
    assert_eq!(got.len(), expected.len());
    let mut worst = 0.0f32;
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g.len(), e.len());
        for (a, b) in g.iter().zip(e) {
            worst = worst.max((a - b).abs());
        }
    }
    assert!(worst <= 1e-4, "max |parallel − single| = {worst}");
    // The two runs did move the weights: the comparison is not of two initialisations.
    let initial_gap = checkpoint_params(&single.join("checkpoints/step-00000003"))
        .iter()
        .zip(&expected)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    assert!(
        initial_gap > 1e-3,
        "steps 4–6 moved the weights by {initial_gap}"
    );
}

/// Two processes of one replica each (see [`data_parallel_trains_as_one`]).
#[test]
fn two_processes_train_as_one() {
    data_parallel_trains_as_one(2, 1);
}

/// One process of two replicas, each on its own thread (see [`data_parallel_trains_as_one`]).
#[test]
fn two_devices_in_one_process_train_as_one() {
    data_parallel_trains_as_one(1, 2);
}

/// Two processes of two replicas each: burn's local sum within each process, then its ring
/// across the processes (see [`data_parallel_trains_as_one`]).
#[test]
fn two_processes_of_two_devices_train_as_one() {
    data_parallel_trains_as_one(2, 2);
}

/// Rank 0 of a two-process run whose rank 1 never starts: it fails after `--peer-timeout`,
/// naming the operation and the replica it waited for, and writes no checkpoint.
#[test]
fn a_missing_rank_is_named_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let run = dir.path().join("run");
    let (coordinator, port) = (
        format!("127.0.0.1:{}", free_port()),
        free_port().to_string(),
    );
    let mut args = train_args(data.to_str().unwrap(), run.to_str().unwrap(), "6", "0");
    args.extend(["--nodes", "2", "--rank", "0", "--coordinator", &coordinator]);
    args.extend(["--data-port", &port, "--peer-timeout", "3"]);
    let out = xfmr(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for expected in [
        "rank 0 of 2, device 0 of 1: joining the run: no answer within 3 s",
        "waiting for replica(s) [1]",
    ] {
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in:\n{stderr}"
        );
    }
    assert!(!run.join("checkpoints").exists());
}

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

#[allow(dead_code)]
#[path = "../../../examples/train_custom.rs"]
mod train_custom;

/// `examples/train_custom.rs`, the downstream example, trains on a small TSV file, prints its
/// validation lines and leaves a final model; run again with a larger budget, it resumes.
#[test]
fn the_downstream_example_trains_on_a_tsv_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let run = dir.path().join("custom");
    let summary = train_custom::train(&data.join("train.tsv"), &run, 20).unwrap();
    assert_eq!((summary.start_step, summary.step), (0, 20));
    let validation = summary.validation.unwrap();
    assert!(validation.loss.is_finite() && validation.tokens > 0);
    assert!(summary.final_model.unwrap().join("model.mpk").exists());
    assert!(run.join("tokenizer.json").exists());
    // Run again with a larger budget: it resumes (same vocabulary, same examples) and goes on.
    let again = train_custom::train(&data.join("train.tsv"), &run, 30).unwrap();
    assert_eq!((again.start_step, again.step), (20, 30));
}
