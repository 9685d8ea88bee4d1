//! The learning-rate schedule against its formula, computed on the host in f64. (The
//! label-smoothed loss every objective minimises is xfmr-models' and tested there.)

use burn::lr_scheduler::LrScheduler;
use xfmr_train::schedule::noam_schedule;

/// `lrate = factor · d^−0.5 · min(step^−0.5, step · warmup^−1.5)` at every step through the
/// warm-up, its peak and the decay.
#[test]
fn schedule_equals_the_papers_formula() {
    let (factor, d_model, warmup) = (2.0, 512usize, 400usize);
    let mut schedule = noam_schedule(factor, d_model, warmup).unwrap();
    for step in 1..=2000usize {
        let lr = schedule.step();
        let s = step as f64;
        let want = factor
            * (d_model as f64).powf(-0.5)
            * f64::min(s.powf(-0.5), s * (warmup as f64).powf(-1.5));
        assert!(
            (lr - want).abs() <= 1e-12 * want,
            "step {step}: {lr} vs {want}"
        );
    }
    assert!(noam_schedule(1.0, 512, 0).is_err());
}
