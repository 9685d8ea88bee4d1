//! The learning-rate schedule of the paper (§5.3).
//!
//! `lrate = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`: burn's
//! [`NoamLrScheduler`], built by [`noam_schedule`].
//! (The label-smoothed loss of §5.4 that every objective minimises is xfmr-models'
//! [`LabelSmoothedCrossEntropy`](xfmr_models::LabelSmoothedCrossEntropy).)

use burn::lr_scheduler::noam::{NoamLrScheduler, NoamLrSchedulerConfig};

/// The paper's learning rate: burn's Noam scheduler with `factor`, `d_model` and `warmup` steps
/// (paper: factor 1, warm-up 4000).
///
/// # Errors
/// burn's message if `d_model` or `warmup` is 0.
pub fn noam_schedule(
    factor: f64,
    d_model: usize,
    warmup: usize,
) -> Result<NoamLrScheduler, String> {
    NoamLrSchedulerConfig::new(factor)
        .with_model_size(d_model)
        .with_warmup_steps(warmup)
        .init()
}
