//! Every kept input of every fuzz target (the seeds and `fuzz/corpus/`) passes: the crashes
//! fuzzing found stay fixed. Runs the `xfmr-fuzz` binary with no mutation time, in a process
//! of its own (a refused allocation aborts it).

use std::process::Command;

#[test]
fn fuzz_corpus_replays_without_failure() {
    let out = Command::new(env!("CARGO_BIN_EXE_xfmr-fuzz"))
        .args(["--seconds", "0"])
        .output()
        .expect("xfmr-fuzz runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "xfmr-fuzz --seconds 0 failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let targets = xfmr_fuzz::TARGETS.len();
    assert!(
        stdout.contains(&format!("fuzz: {targets} targets,")) && stdout.contains(" 0 failures"),
        "{stdout}"
    );
}
