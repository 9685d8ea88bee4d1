//! The `xfmr` binary end to end.

use std::process::Command;

fn xfmr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xfmr"))
        .args(args)
        .output()
        .expect("the xfmr binary runs")
}

/// `xfmr demo` runs on the embedded sentences, never puts weight on padding, and its invariant
/// checks (printed maxima of |diff|) pass, which the binary signals by its exit status.
#[test]
fn demo_runs_and_its_invariants_hold() {
    let out = xfmr(&["demo"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
