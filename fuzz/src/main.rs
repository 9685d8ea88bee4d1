//! `xfmr-fuzz`: every kept input of every fuzz target, then random mutations of them for a
//! while, without coverage instrumentation (CI's short runs; `fuzz/run.sh` runs libFuzzer).
//!
//! ```text
//! xfmr-fuzz [--seconds N] [--seed S] [--corpus DIR] [TARGET...]
//! xfmr-fuzz --write-seeds DIR        # each target's seeds as files, DIR/<target>/seed-<i>
//! xfmr-fuzz --list                   # name, max_len and description of each target
//! ```
//!
//! An input that fails (a panic: a failed property, or a loader's bug) is written to
//! `target/fuzz-failures/<target>-<n>` and named; the run goes on and exits 1 at the end. A
//! refused allocation aborts the process ("memory allocation of N bytes failed") after the line
//! that names the target; an input that runs for a minute ends the run, naming it.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use std::{fs, process, thread};

use xfmr_fuzz::mutate::{mutate, Rng};
use xfmr_fuzz::{run_one, Target, TARGETS, TIME_LIMIT};

/// The command line.
struct Args {
    seconds: f64,
    seed: u64,
    corpus: PathBuf,
    targets: Vec<&'static Target>,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "xfmr-fuzz: {problem}\nusage: xfmr-fuzz [--seconds N] [--seed S] [--corpus DIR] \
         [TARGET...] | --write-seeds DIR | --list\ntargets: {}",
        TARGETS.iter().map(|t| t.name).collect::<Vec<_>>().join(" ")
    );
    process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args {
        seconds: 3.0,
        seed: 1,
        corpus: Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"),
        targets: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--seconds" => {
                args.seconds = value("--seconds")
                    .parse()
                    .unwrap_or_else(|_| usage("--seconds takes a number"))
            }
            "--seed" => {
                args.seed = value("--seed")
                    .parse()
                    .unwrap_or_else(|_| usage("--seed takes a whole number"))
            }
            "--corpus" => args.corpus = PathBuf::from(value("--corpus")),
            "--write-seeds" => {
                write_seeds(Path::new(&value("--write-seeds")));
                process::exit(0)
            }
            "--list" => {
                for t in TARGETS {
                    println!("{}\t{}\t{}", t.name, t.max_len, t.about);
                }
                process::exit(0)
            }
            "-h" | "--help" => usage("help"),
            name => args.targets.push(
                xfmr_fuzz::target(name).unwrap_or_else(|| usage(&format!("no target {name:?}"))),
            ),
        }
    }
    if args.targets.is_empty() {
        args.targets = TARGETS.iter().collect();
    }
    args
}

fn write_seeds(dir: &Path) {
    for t in TARGETS {
        let out = dir.join(t.name);
        fs::create_dir_all(&out).unwrap_or_else(|e| usage(&format!("{}: {e}", out.display())));
        for (i, seed) in (t.seeds)().iter().enumerate() {
            let path = out.join(format!("seed-{i}"));
            fs::write(&path, seed).unwrap_or_else(|e| usage(&format!("{}: {e}", path.display())));
        }
    }
}

/// The kept inputs of `target`: its seeds, then the files of its corpus directory (sorted).
fn kept_inputs(target: &Target, corpus: &Path) -> Vec<(String, Vec<u8>)> {
    let mut inputs: Vec<(String, Vec<u8>)> = (target.seeds)()
        .into_iter()
        .enumerate()
        .map(|(i, s)| (format!("seed {i}"), s))
        .collect();
    let dir = corpus.join(target.name);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    files.sort();
    for path in files {
        match fs::read(&path) {
            Ok(bytes) => inputs.push((path.display().to_string(), bytes)),
            Err(e) => usage(&format!("{}: {e}", path.display())),
        }
    }
    inputs
}

/// The message of the last panic (set by the hook instead of printing it).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// One failure: which input, and why.
struct Failure {
    input: String,
    saved: PathBuf,
    message: String,
}

fn main() {
    let args = parse_args();
    panic::set_hook(Box::new(|info| {
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = info.to_string();
    }));
    // The watchdog: an input that runs for a minute is a hang.
    let started = Arc::new(AtomicU64::new(u64::MAX));
    let current = Arc::new(Mutex::new(String::new()));
    let epoch = Instant::now();
    {
        let (started, current) = (Arc::clone(&started), Arc::clone(&current));
        thread::spawn(move || loop {
            thread::sleep(Duration::from_secs(1));
            let at = started.load(Ordering::Relaxed);
            if at != u64::MAX && epoch.elapsed().as_secs().saturating_sub(at) >= 60 {
                eprintln!("fuzz: {} ran for a minute: a hang", current.lock().unwrap());
                process::exit(1);
            }
        });
    }
    let failures_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-failures");
    let mut failures: Vec<Failure> = Vec::new();
    let mut total = 0u64;
    let run = |target: &Target, name: &str, data: &[u8], failures: &mut Vec<Failure>| {
        *current.lock().unwrap() = format!("{} on {name}", target.name);
        started.store(epoch.elapsed().as_secs(), Ordering::Relaxed);
        let t0 = Instant::now();
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| run_one(target.name, data)));
        let took = t0.elapsed();
        started.store(u64::MAX, Ordering::Relaxed);
        let message = match outcome {
            Err(_) => Some(std::mem::take(
                &mut *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()),
            )),
            Ok(()) if took > TIME_LIMIT => Some(format!("took {took:.1?} (limit {TIME_LIMIT:?})")),
            Ok(()) => None,
        };
        if let Some(message) = message {
            let mut h = DefaultHasher::new();
            data.hash(&mut h);
            let saved = failures_dir.join(format!("{}-{:016x}", target.name, h.finish()));
            let _ = fs::create_dir_all(&failures_dir);
            let _ = fs::write(&saved, data);
            eprintln!(
                "fuzz: {}: FAILED on {name} (saved as {}): {message}",
                target.name,
                saved.display()
            );
            failures.push(Failure {
                input: format!("{} on {name}", target.name),
                saved,
                message,
            });
        }
    };
    for target in &args.targets {
        // Printed first, so that an abort (a refused allocation) is seen to come from here.
        eprintln!("fuzz: {} ...", target.name);
        let kept = kept_inputs(target, &args.corpus);
        let before = failures.len();
        for (name, data) in &kept {
            run(target, name, data, &mut failures);
        }
        let mut rng = Rng::new(args.seed ^ (target.name.len() as u64 * 0x9E37_79B9));
        let start = Instant::now();
        let mut mutations = 0u64;
        while start.elapsed().as_secs_f64() < args.seconds && !kept.is_empty() {
            let (base_name, base) = &kept[rng.below(kept.len())];
            let (_, other) = &kept[rng.below(kept.len())];
            let data = mutate(base, other, target.max_len, &mut rng);
            run(
                target,
                &format!("a mutation of {base_name}"),
                &data,
                &mut failures,
            );
            mutations += 1;
        }
        total += kept.len() as u64 + mutations;
        println!(
            "fuzz: {}: {} kept inputs, {} mutations in {:.1} s, {} failures",
            target.name,
            kept.len(),
            mutations,
            start.elapsed().as_secs_f64(),
            failures.len() - before
        );
    }
    println!(
        "fuzz: {} targets, {} inputs, {} failures",
        args.targets.len(),
        total,
        failures.len()
    );
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("  {}: {} ({})", f.input, f.message, f.saved.display());
        }
        process::exit(1);
    }
}
