//! Data-parallel training: processes and devices train as one replica would; a missing rank is
//! named; a killed replica stops its peer, and a restart resumes the run.

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
    let single_args = parallel_run_args(dir.path(), data, 6);
    let single_args: Vec<&str> = single_args.iter().map(String::as_str).collect();

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

/// The arguments of [`data_parallel_trains_as_one`]'s runs for `steps` steps (its configuration
/// file written into `dir`), `--out` (index 4) still empty.
fn parallel_run_args(dir: &std::path::Path, data: &str, steps: usize) -> Vec<String> {
    let model = xfmr::models::TransformerConfig::tiny(300).map_layer(|l| l.with_dropout(0.0));
    let config = xfmr::train::TrainConfig::new()
        .with_steps(steps)
        .with_max_tokens(400)
        .with_warmup(4)
        .with_lr_factor(0.3) // the CLI's default for `tiny`
        .with_epsilon(0.1)
        .with_checkpoint_every(3)
        .with_keep_checkpoints(2)
        .with_average(2);
    let spec = serde_json::json!({
        "task": "translation",
        "objective": xfmr::train::Translation::new(model, 1, 2),
        "train": config,
    });
    let config_path = dir.join("train-config.json");
    std::fs::write(&config_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let steps = steps.to_string();
    let mut args: Vec<String> = train_args(data, "", &steps, "0")
        .into_iter()
        .map(String::from)
        .collect();
    let at = args.iter().position(|a| a == "--preset").unwrap();
    args.splice(
        at..at + 2,
        [
            "--config".to_string(),
            config_path.to_str().unwrap().to_string(),
        ],
    );
    args
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

/// `xfmr train` as rank `rank` of a two-process run of one replica each, into `run`, its
/// standard error into `log`.
fn spawn_rank(
    template: &[String],
    run: &std::path::Path,
    rank: usize,
    coordinator: &str,
    peer_timeout: u64,
    log: &std::path::Path,
) -> std::process::Child {
    let mut args = template.to_vec();
    args[4] = run.to_str().unwrap().to_string();
    let (port, timeout) = (free_port().to_string(), peer_timeout.to_string());
    for extra in [
        ["--nodes", "2"],
        ["--rank", &rank.to_string()],
        ["--devices", "1"],
        ["--coordinator", coordinator],
        ["--data-port", &port],
        ["--peer-timeout", &timeout],
    ] {
        args.extend(extra.map(String::from));
    }
    Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// A replica killed mid-run: rank 1 of a two-process run gets SIGKILL once the step-3
/// checkpoint is complete. Rank 0 stops within the peer timeout (plus a margin for a debug
/// build), with an error naming the step it waited in and the replica it waited for; then the
/// same command on both ranks resumes from the last complete checkpoint and ends where one
/// uninterrupted process does (≤ 1e-4 on every weight, the bound of
/// [`data_parallel_trains_as_one`], for the same reasons).
#[test]
fn killed_replica_stops_its_peer_and_the_run_resumes() {
    const STEPS: usize = 30;
    // Long enough for two debug builds on two busy cores to start and reach every agreement
    // (the other data-parallel tests wait up to 300 s); a killed peer's dropped connection
    // usually ends the wait sooner.
    const PEER_TIMEOUT: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let data = small_corpus(dir.path());
    let template = parallel_run_args(dir.path(), data.to_str().unwrap(), STEPS);

    let single = dir.path().join("single");
    let mut args = template.clone();
    args[4] = single.to_str().unwrap().to_string();
    args.extend(["--devices", "1"].map(String::from));
    xfmr_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let run = dir.path().join("run");
    let coordinator = format!("127.0.0.1:{}", free_port());
    let logs: Vec<std::path::PathBuf> = (0..4)
        .map(|i| dir.path().join(format!("rank-{i}.log")))
        .collect();
    let read = |i: usize| std::fs::read_to_string(&logs[i]).unwrap_or_default();
    let mut rank0 = spawn_rank(&template, &run, 0, &coordinator, PEER_TIMEOUT, &logs[0]);
    let mut rank1 = spawn_rank(&template, &run, 1, &coordinator, PEER_TIMEOUT, &logs[1]);
    let first = run.join("checkpoints/step-00000003");
    let start = std::time::Instant::now();
    while !first.exists() {
        let finished = rank0.try_wait().unwrap().is_some() || rank1.try_wait().unwrap().is_some();
        if finished || start.elapsed().as_secs() > 600 {
            let _ = (rank0.kill(), rank1.kill());
            panic!("no step-3 checkpoint:\n{}\n{}", read(0), read(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    rank1.kill().unwrap(); // SIGKILL on Unix
    rank1.wait().unwrap();
    let killed = std::time::Instant::now();
    let status = loop {
        if let Some(status) = rank0.try_wait().unwrap() {
            break status;
        }
        if killed.elapsed().as_secs() > PEER_TIMEOUT + 60 {
            rank0.kill().unwrap();
            panic!(
                "rank 0 still running a minute after the peer timeout:\n{}",
                read(0)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stopped = killed.elapsed();
    let stderr = read(0);
    assert!(
        !status.success(),
        "rank 0 finished without its peer:\n{stderr}"
    );
    assert!(
        stopped.as_secs() <= PEER_TIMEOUT + 30,
        "rank 0 stopped {stopped:?} after its peer was killed:\n{stderr}"
    );
    eprintln!("rank 0 after its peer was killed ({stopped:?}):\n{stderr}");
    for expected in ["rank 0 of 2", "step ", "waiting for replica(s) [1]"] {
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in:\n{stderr}"
        );
    }
    let complete = latest_checkpoint_step(&run);
    assert!(
        (3..STEPS).contains(&complete),
        "last checkpoint: step {complete}"
    );

    // The same command on both ranks.
    let coordinator = format!("127.0.0.1:{}", free_port());
    let ranks = [
        spawn_rank(&template, &run, 0, &coordinator, 300, &logs[2]),
        spawn_rank(&template, &run, 1, &coordinator, 300, &logs[3]),
    ];
    for (i, mut rank) in ranks.into_iter().enumerate() {
        let status = rank.wait().unwrap();
        assert!(
            status.success(),
            "restarted rank {i} failed:\n{}",
            read(2 + i)
        );
    }
    let resumed = read(2);
    assert!(
        resumed.contains(&format!("from step {complete}")),
        "rank 0 did not resume from step {complete}:\n{resumed}"
    );
    let last = format!("checkpoints/step-{STEPS:08}");
    let expected = checkpoint_params(&single.join(&last));
    let got = checkpoint_params(&run.join(&last));
    let worst = got
        .iter()
        .zip(&expected)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-4, "max |resumed − single| = {worst}");
}

/// The step of the newest complete checkpoint of `run`.
fn latest_checkpoint_step(run: &std::path::Path) -> usize {
    xfmr_train::RunDir::new(run)
        .checkpoints()
        .unwrap()
        .last()
        .map(|c| c.0)
        .expect("a checkpoint")
}
