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
//! `xfmr_models::cross_entropy_smoothed_over_vocab` (PyTorch's `label_smoothing`, which
//! spreads `ε` over all `V` tokens, padding included); the names say which is which.
//!
//! **Gradient.** `∂L/∂z_tv = [y_t ≠ pad] / #{t : y_t ≠ pad} · (p_tv − q_tv)`, with `p` the softmax
//! of the logits `z` and `q` the smoothed target above. The loss hands autodiff this closed form
//! (computed from the same row statistics as the value) instead of differentiating its own
//! formula, which saves the log-softmax's backward passes over the `[tokens, V]` logits; PyTorch's
//! fused `cross_entropy` backward does the same. Tests compare it with the autodiff of the formula.
//!
//! **Schedule.** `lrate = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`: burn's
//! [`NoamLrScheduler`](burn::lr_scheduler::noam::NoamLrScheduler), built by [`noam_schedule`].

use burn::lr_scheduler::noam::{NoamLrScheduler, NoamLrSchedulerConfig};
use burn::tensor::{backend::Backend, ElementConversion, IndexingUpdateOp, Int, Tensor};

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
pub fn label_smoothed_loss_skipping_pad<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    pad_id: u32,
    epsilon: f64,
) -> SmoothedLoss<B> {
    let [batch, seq, vocab] = logits.dims();
    assert_eq!(
        targets.dims(),
        [batch, seq],
        "label_smoothed_loss_skipping_pad: targets {:?} do not match logits {:?}",
        targets.dims(),
        logits.dims()
    );
    assert!(
        vocab >= 3,
        "label_smoothed_loss_skipping_pad: vocab {vocab} < 3"
    );
    assert!(
        (pad_id as usize) < vocab,
        "label_smoothed_loss_skipping_pad: pad {pad_id} ≥ vocab {vocab}"
    );
    assert!(
        (0.0..1.0).contains(&epsilon),
        "label_smoothed_loss_skipping_pad: epsilon {epsilon} outside [0, 1)"
    );
    let n = batch * seq;
    let device = logits.device();
    let logits = logits.reshape([n, vocab]);
    // Every statistic below is computed outside the autodiff graph; the graph gets one product
    // whose gradient is the closed form (see `with_gradient`).
    let z = logits.clone().detach();
    let targets = targets.reshape([n, 1]);
    let keep = targets.clone().not_equal_elem(pad_id as i64).float(); // [n, 1]
    let tokens = keep.clone().sum().into_scalar().elem::<f64>().round() as usize;
    let count = tokens.max(1) as f64;

    // log p(v) = z_v − log Z with log Z = m + log Σ_v exp(z_v − m), m the row maximum.
    let max = z.clone().max_dim(1); // [n, 1]
    let exp = (z.clone() - max.clone()).exp(); // [n, V]
    let sum_exp = exp.clone().sum_dim(1); // [n, 1]
    let log_z = max + sum_exp.clone().log();
    let z_target = z.clone().gather(1, targets.clone());
    let z_pad = z.clone().narrow(1, pad_id as usize, 1);
    // Σ_{v ∉ {y, pad}} log p(v) = Σ_v z_v − z_y − z_pad − (V − 2) log Z
    let others =
        z.sum_dim(1) - z_target.clone() - z_pad - log_z.clone().mul_scalar((vocab - 2) as f64);
    let target_lp = z_target - log_z; // [n, 1]
    let smooth = epsilon / (vocab - 2) as f64;
    let per_token = target_lp.clone().mul_scalar(-(1.0 - epsilon)) - others.mul_scalar(smooth);
    let loss = (per_token * keep.clone()).sum().div_scalar(count);
    let nll = (target_lp.neg() * keep.clone()).sum().div_scalar(count);
    if !B::ad_enabled(&device) {
        return SmoothedLoss { loss, nll, tokens };
    }

    // ∂L/∂z_tv = w_t (p_tv − q_tv), w_t = keep_t / count, q the smoothed target of the module
    // docs: p − s everywhere (s = ε/(V−2)), then + s at the padding column (q_pad = 0) and
    // − (1 − ε − s) at the target (q_y = 1 − ε), both added by one scatter.
    let weight = keep.div_scalar(count); // [n, 1]
    let gradient = (exp - sum_exp.clone().mul_scalar(smooth)) * (weight.clone() / sum_exp);
    // `full_like`: the target ids' own integer type, which `cat` needs.
    let pad_column = targets.full_like(pad_id as i64);
    let columns = Tensor::cat(vec![targets, pad_column], 1);
    let corrections = Tensor::cat(
        vec![
            weight.clone().mul_scalar(-(1.0 - epsilon - smooth)),
            weight.mul_scalar(smooth),
        ],
        1,
    );
    let gradient = gradient.scatter(1, columns, corrections, IndexingUpdateOp::Add);
    SmoothedLoss {
        loss: with_gradient(loss, logits, gradient),
        nll,
        tokens,
    }
}

/// `value` (detached, shape `[1]`) whose gradient with respect to `input` is `gradient`
/// (detached, `input`'s shape): `value + (Σ input ⊙ gradient − (Σ input ⊙ gradient)ₓ)`, where
/// `ₓ` detaches. The two sums are one tensor, so their difference is exactly 0, and the
/// backward pass through the graph is one element-wise product.
///
/// This replaces the autodiff of the loss's own formula (log-softmax, gather, slice and their
/// backward passes: ~17 whole-tensor passes over `[tokens, V]`) by its closed form. Only first
/// derivatives are right: nothing here differentiates the gradient again.
fn with_gradient<B: Backend, const D: usize>(
    value: Tensor<B, 1>,
    input: Tensor<B, D>,
    gradient: Tensor<B, D>,
) -> Tensor<B, 1> {
    let surrogate = (input * gradient).sum();
    value.detach() + (surrogate.clone() - surrogate.detach())
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
