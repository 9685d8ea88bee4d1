//! Data-parallel training: processes and devices train as one replica would; a missing rank is
//! named.

use std::process::Command;

use crate::{small_corpus, train_args, train_losses, xfmr, xfmr_ok};

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
        "objective": xfmr::train::Translation::new(model, 1, 2),
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
    // The reference is one replica (on the CPU the default is one per core).
    args.extend(["--devices", "1"]);
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
    args.extend(["--nodes", "2", "--rank", "0", "--devices", "1"]);
    args.extend(["--coordinator", &coordinator]);
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
