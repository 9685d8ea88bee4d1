//! The training objective and the learning-rate schedule of the paper (§5.3, §5.4).
//!
//! **Label smoothing.** Each non-padding target `y` is compared with the distribution `q` that
//! puts `1 − ε` on `y` and spreads `ε` evenly over the `V − 2` tokens that are neither `y` nor
//! padding (padding is never a prediction, so it gets no mass):
//!
//! ```text
//! L_t = −(1 − ε) · log p(y_t) − ε / (V − 2) · Σ_{v ∉ {y_t, pad}} log p(v)
//! L   = Σ_t L_t / #{t : y_t ≠ pad}
//! ```
//!
//! Padding positions are left out of the sum and of the count. ε = 0 is the plain negative
//! log-likelihood, which is also returned (its exponential is the perplexity). This differs from
//! `xfmr_models::cross_entropy` (PyTorch's `label_smoothing`, which spreads `ε` over all `V`
//! tokens, padding included).
//!
//! **Schedule.** `lrate = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`: burn's
//! [`NoamLrScheduler`](burn::lr_scheduler::noam::NoamLrScheduler), built by [`noam_schedule`].

use burn::lr_scheduler::noam::{NoamLrScheduler, NoamLrSchedulerConfig};
use burn::tensor::{activation::log_softmax, backend::Backend, ElementConversion, Int, Tensor};

/// The smoothed loss to minimise and the plain negative log-likelihood, both averaged over the
/// non-padding targets.
#[derive(Debug, Clone)]
pub struct SmoothedLoss<B: Backend> {
    /// `L` above: what the optimiser minimises. Shape `[1]`.
    pub loss: Tensor<B, 1>,
    /// Mean `−log p(y_t)` over the non-padding targets (detached). Shape `[1]`.
    pub nll: Tensor<B, 1>,
    /// Number of non-padding targets.
    pub tokens: usize,
}

/// Label-smoothed cross-entropy with padding out of the average and of the smoothing mass (see
/// the module docs).
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`; `targets`: `[batch, seq]`
///
/// # Panics
/// If the shapes disagree, if `vocab < 3`, if `pad_id >= vocab`, or if `epsilon` is outside
/// `[0, 1)`.
pub fn label_smoothed_loss<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    pad_id: usize,
    epsilon: f64,
) -> SmoothedLoss<B> {
    let [batch, seq, vocab] = logits.dims();
    assert_eq!(
        targets.dims(),
        [batch, seq],
        "label_smoothed_loss: targets {:?} do not match logits {:?}",
        targets.dims(),
        logits.dims()
    );
    assert!(vocab >= 3, "label_smoothed_loss: vocab {vocab} < 3");
    assert!(
        pad_id < vocab,
        "label_smoothed_loss: pad {pad_id} ≥ vocab {vocab}"
    );
    assert!(
        (0.0..1.0).contains(&epsilon),
        "label_smoothed_loss: epsilon {epsilon} outside [0, 1)"
    );
    let n = batch * seq;
    let log_probs = log_softmax(logits.reshape([n, vocab]), 1);
    let targets = targets.reshape([n, 1]);
    let keep = targets
        .clone()
        .not_equal_elem(pad_id as i64)
        .float()
        .reshape([n]);
    let tokens = keep.clone().sum().into_scalar().elem::<f64>().round() as usize;
    let target_lp = log_probs.clone().gather(1, targets).reshape([n]);
    let pad_lp = log_probs.clone().narrow(1, pad_id, 1).reshape([n]);
    let others = log_probs.sum_dim(1).reshape([n]) - target_lp.clone() - pad_lp;
    let per_token = target_lp.clone().mul_scalar(-(1.0 - epsilon))
        - others.mul_scalar(epsilon / (vocab - 2) as f64);
    let count = tokens.max(1) as f64;
    let loss = (per_token * keep.clone()).sum().div_scalar(count);
    let nll = (target_lp.neg() * keep).sum().div_scalar(count).detach();
    SmoothedLoss { loss, nll, tokens }
}

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
