//! Teacher forcing: shifted decoder inputs and the label-smoothed cross-entropy of the paper
//! (§5.4, ε_ls = 0.1), the one loss every model family trains with.
//!
//! **Label smoothing.** Each non-padding target `y` is compared with a distribution `q` that puts
//! `1 − ε` on `y` and spreads `ε` evenly over a set `S` of tokens, `s = ε / |S|` each; which set is
//! the loss's [`SmoothingMass`]:
//!
//! ```text
//! L_t = −(1 − ε) · log p(y_t) − s · Σ_{v ∈ S} log p(v)
//! L   = Σ_t L_t / #{t : y_t ≠ pad}
//! ```
//!
//! - [`SmoothingMass::NonPadding`] (the default, the trainer's): `S` = the `V − 2` tokens that
//!   are neither `y_t` nor padding (padding is never a prediction, so it gets no mass);
//! - [`SmoothingMass::AllTokens`]: `S` = the whole vocabulary, padding and `y_t` included
//!   (PyTorch's `label_smoothing`, tensor2tensor's uniform mixture).
//!
//! Padding positions are left out of the sum and of the count. ε = 0 is the plain negative
//! log-likelihood, which is also returned (its exponential is the perplexity).
//!
//! **Gradient.** `∂L/∂z_tv = [y_t ≠ pad] / #{t : y_t ≠ pad} · (p_tv − q_tv)`, with `p` the softmax
//! of the logits `z`. The loss hands autodiff this closed form (computed from the same row
//! statistics as the value) instead of differentiating its own formula, which saves the
//! log-softmax's backward passes over the `[tokens, V]` logits; PyTorch's fused
//! `cross_entropy` backward does the same. Tests compare it with the autodiff of the formula
//! (`tests/models/loss.rs`), for both masses. Only first derivatives are right: nothing
//! differentiates the closed form again. With the feature `autodiff`,
//! `LabelSmoothedCrossEntropy::forward_autodiff` goes further on `Autodiff<I>`: the loss is one
//! node of the graph, computed on `I`, whose backward is that closed form (`loss_op.rs`). With
//! the feature `flex`, on burn's flex backend and on `Autodiff<Flex>` (the CPU trainer's) both
//! take xfmr's host kernel instead (`xfmr_kernels::smoothed_cross_entropy`): each row of logits
//! read once while it is in cache, the gradient written over the logits' own buffer and kept as
//! the graph node's state, where the tensor formula makes about a dozen passes over the
//! `[tokens, V]` logits.

use burn::config::Config;
use burn::tensor::{backend::Backend, ElementConversion, IndexingUpdateOp, Int, Tensor};
use xfmr_attention::InvalidConfig;

use crate::ModelError;

/// Decoder input for teacher forcing: the target shifted right behind `bos_id`
/// (`[bos, y₀, …, y_{n-2}]`), so position `i` predicts `yᵢ` from `y_{<i}`.
///
/// # Shapes
/// - `targets`: `[batch, seq]`; output `[batch, seq]`
pub fn shift_right<B: Backend>(targets: Tensor<B, 2, Int>, bos_id: u32) -> Tensor<B, 2, Int> {
    let [batch, seq] = targets.dims();
    let bos = Tensor::<B, 2, Int>::full([batch, 1], bos_id as i64, &targets.device());
    Tensor::cat(vec![bos, targets.narrow(1, 0, seq - 1)], 1)
}

/// Which tokens label smoothing spreads its mass `ε` over (see the module docs).
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum SmoothingMass {
    /// The `V − 2` tokens that are neither the target nor padding: padding is never a
    /// prediction. The trainer's choice.
    NonPadding,
    /// Every token, padding and the target included: PyTorch's `label_smoothing`.
    AllTokens,
}

/// Configuration of [`LabelSmoothedCrossEntropy`], in the shape of burn's
/// `CrossEntropyLossConfig`: the padding id, `ε` and where its mass goes.
#[derive(Config, Debug)]
pub struct LabelSmoothedCrossEntropyConfig {
    /// Targets equal to it are left out of the loss (and, with
    /// [`SmoothingMass::NonPadding`], of the smoothing mass).
    pub pad_id: u32,
    /// `ε`, in `[0, 1)`. Default: the paper's 0.1.
    #[config(default = 0.1)]
    pub epsilon: f64,
    /// Where `ε` goes. Default: [`SmoothingMass::NonPadding`].
    #[config(default = "SmoothingMass::NonPadding")]
    pub mass: SmoothingMass,
}

impl LabelSmoothedCrossEntropyConfig {
    /// The loss.
    ///
    /// # Errors
    /// [`ModelError::InvalidConfig`] for `epsilon` outside `[0, 1)`.
    pub fn init(&self) -> Result<LabelSmoothedCrossEntropy, ModelError> {
        InvalidConfig::check(
            (0.0..1.0).contains(&self.epsilon),
            "epsilon",
            self.epsilon,
            "a smoothing mass in [0, 1)",
        )?;
        Ok(LabelSmoothedCrossEntropy {
            pad_id: self.pad_id,
            epsilon: self.epsilon,
            mass: self.mass,
        })
    }
}

/// The label-smoothed cross-entropy of the module docs, with its gradient in closed form. Make
/// it with [`LabelSmoothedCrossEntropyConfig`].
#[derive(Debug, Clone, Copy)]
pub struct LabelSmoothedCrossEntropy {
    pad_id: u32,
    epsilon: f64,
    mass: SmoothingMass,
}

/// The smoothed loss to minimise and the plain negative log-likelihood, both averaged over the
/// non-padding targets.
#[derive(Debug, Clone)]
pub struct SmoothedLoss<B: Backend> {
    /// `L` of the module docs: what the optimiser minimises. Shape `[1]`.
    pub loss: Tensor<B, 1>,
    /// Mean `−log p(y_t)` over the non-padding targets (detached). Shape `[1]`.
    pub nll: Tensor<B, 1>,
    /// Number of non-padding targets.
    pub tokens: usize,
}

impl LabelSmoothedCrossEntropy {
    /// The loss of `logits` against `targets`.
    ///
    /// Under autodiff, the loss's gradient with respect to `logits` is the closed form of the
    /// module docs: right for first derivatives (training), not for second ones. (With the
    /// feature `autodiff`, `forward_autodiff` makes the loss one node of the graph.)
    ///
    /// # Shapes
    /// - `logits`: `[batch, seq, vocab]`; `targets`: `[batch, seq]`
    ///
    /// # Panics
    /// If the shapes disagree; with [`SmoothingMass::NonPadding`], if `vocab < 3` or
    /// `pad_id >= vocab` (the smoothing set would be empty or the padding column missing); on
    /// flex (feature `flex`), if a target is negative or neither padding nor below `vocab`.
    pub fn forward<B: Backend>(
        &self,
        logits: Tensor<B, 3>,
        targets: Tensor<B, 2, Int>,
    ) -> SmoothedLoss<B> {
        let [batch, seq, vocab] = logits.dims();
        self.check(&logits.dims(), &targets.dims());
        let device = logits.device();
        let logits = logits.reshape([batch * seq, vocab]);
        #[cfg(feature = "flex")]
        if xfmr_kernels::runs_on::<B>(logits.dtype())
            || xfmr_kernels::runs_on_autodiff::<B>(logits.dtype())
        {
            return self.forward_flex(logits, targets);
        }
        // Every statistic below is computed outside the autodiff graph; the graph gets one
        // product whose gradient is the closed form (see `with_gradient`).
        let rows = self.rows(logits.clone().detach(), targets.reshape([batch * seq, 1]));
        let (loss, nll, tokens) = (rows.loss.clone(), rows.nll.clone(), rows.tokens);
        if !B::ad_enabled(&device) {
            return SmoothedLoss { loss, nll, tokens };
        }
        SmoothedLoss {
            loss: with_gradient(loss, logits, self.gradient(rows)),
            nll,
            tokens,
        }
    }

    /// [`forward`](Self::forward) through xfmr's host kernel on `Flex` or `Autodiff<Flex>`
    /// (f32): the same loss, NLL and gradient up to f32 rounding (`loss_on_flex_*` tests).
    #[cfg(feature = "flex")]
    fn forward_flex<B: Backend>(
        &self,
        logits: Tensor<B, 2>,
        targets: Tensor<B, 2, Int>,
    ) -> SmoothedLoss<B> {
        let device = logits.device();
        let ids: Vec<u32> = targets
            .into_data()
            .iter::<i64>()
            .map(|id| {
                u32::try_from(id).unwrap_or_else(|_| {
                    panic!("LabelSmoothedCrossEntropy: target id {id} is not a token id")
                })
            })
            .collect();
        let smoothing = xfmr_kernels::Smoothing {
            pad: self.pad_id,
            epsilon: self.epsilon as f32,
            excludes_target_and_pad: self.mass == SmoothingMass::NonPadding,
        };
        let out = xfmr_kernels::smoothed_cross_entropy(logits, &ids, smoothing);
        SmoothedLoss {
            loss: out.loss,
            nll: Tensor::from_floats([out.nll as f32], &device),
            tokens: out.tokens,
        }
    }

    /// Asserts the shapes `forward` documents.
    pub(crate) fn check(&self, logits: &[usize; 3], targets: &[usize; 2]) {
        let [batch, seq, vocab] = *logits;
        assert_eq!(
            *targets,
            [batch, seq],
            "LabelSmoothedCrossEntropy: targets {targets:?} do not match logits {logits:?}"
        );
        if self.mass == SmoothingMass::NonPadding {
            assert!(vocab >= 3, "LabelSmoothedCrossEntropy: vocab {vocab} < 3");
            assert!(
                (self.pad_id as usize) < vocab,
                "LabelSmoothedCrossEntropy: pad {} ≥ vocab {vocab}",
                self.pad_id
            );
        }
    }

    /// The loss, the NLL and what the gradient needs, from `z` `[n, V]` (no autodiff graph
    /// is built: `z` is detached or an inner backend's) and `targets` `[n, 1]`.
    pub(crate) fn rows<B: Backend>(&self, z: Tensor<B, 2>, targets: Tensor<B, 2, Int>) -> Rows<B> {
        let [_, vocab] = z.dims();
        let (epsilon, pad_id) = (self.epsilon, self.pad_id);
        // 1 where the target is not padding, [n, 1], in z's own float type (`Int::float` would
        // give the device's default one).
        let keep = z
            .clone()
            .narrow(1, 0, 1)
            .zeros_like()
            .mask_fill(targets.clone().not_equal_elem(i64::from(pad_id)), 1.0);
        let tokens = keep.clone().sum().into_scalar().elem::<f64>().round() as usize;
        let count = tokens.max(1) as f64;

        // log p(v) = z_v − log Z with log Z = m + log Σ_v exp(z_v − m), m the row maximum.
        let max = z.clone().max_dim(1); // [n, 1]
        let exp = (z.clone() - max.clone()).exp(); // [n, V]
        let sum_exp = exp.clone().sum_dim(1); // [n, 1]
        let log_z = max + sum_exp.clone().log();
        let z_target = z.clone().gather(1, targets.clone());
        // Σ_{v ∈ S} log p(v) = Σ_{v ∈ S} z_v − |S| log Z.
        let set_size = self.set_size(vocab);
        let set_sum = if self.mass == SmoothingMass::NonPadding {
            let z_pad = z.clone().narrow(1, pad_id as usize, 1);
            z.sum_dim(1) - z_target.clone() - z_pad
        } else {
            z.sum_dim(1)
        };
        let others = set_sum - log_z.clone().mul_scalar(set_size as f64);
        let target_lp = z_target - log_z; // [n, 1]
        let smooth = epsilon / set_size as f64;
        let per_token = target_lp.clone().mul_scalar(-(1.0 - epsilon)) - others.mul_scalar(smooth);
        Rows {
            loss: (per_token * keep.clone()).sum().div_scalar(count),
            nll: (target_lp.neg() * keep.clone()).sum().div_scalar(count),
            tokens,
            exp,
            sum_exp,
            weight: keep.div_scalar(count),
            targets,
        }
    }

    /// `|S|`, the size of the smoothing set over a vocabulary of `vocab`.
    fn set_size(&self, vocab: usize) -> usize {
        match self.mass {
            SmoothingMass::NonPadding => vocab - 2,
            SmoothingMass::AllTokens => vocab,
        }
    }

    /// `∂L/∂z` `[n, V]` in closed form from the row statistics: `w_t (p_tv − q_tv)`.
    pub(crate) fn gradient<B: Backend>(&self, rows: Rows<B>) -> Tensor<B, 2> {
        let Rows {
            exp,
            sum_exp,
            weight,
            targets,
            ..
        } = rows;
        let epsilon = self.epsilon;
        let smooth = epsilon / self.set_size(exp.dims()[1]) as f64;
        // w_t = keep_t / count: p − s everywhere, then at the target − (1 − ε) (all tokens:
        // q_y = 1 − ε + s) or − (1 − ε − s) (non-padding: q_y = 1 − ε), and at the padding
        // column + s (non-padding: q_pad = 0), added by one scatter.
        let gradient = (exp - sum_exp.clone().mul_scalar(smooth)) * (weight.clone() / sum_exp);
        if self.mass == SmoothingMass::NonPadding {
            // `full_like`: the target ids' own integer type, which `cat` needs.
            let pad_column = targets.full_like(i64::from(self.pad_id));
            let columns = Tensor::cat(vec![targets, pad_column], 1);
            let corrections = Tensor::cat(
                vec![
                    weight.clone().mul_scalar(-(1.0 - epsilon - smooth)),
                    weight.mul_scalar(smooth),
                ],
                1,
            );
            gradient.scatter(1, columns, corrections, IndexingUpdateOp::Add)
        } else {
            let corrections = weight.mul_scalar(-(1.0 - epsilon));
            gradient.scatter(1, targets, corrections, IndexingUpdateOp::Add)
        }
    }
}

/// The loss's row statistics ([`LabelSmoothedCrossEntropy::rows`]).
#[derive(Debug, Clone)]
pub(crate) struct Rows<B: Backend> {
    /// `L`, `[1]`.
    pub(crate) loss: Tensor<B, 1>,
    /// The mean NLL, `[1]`.
    pub(crate) nll: Tensor<B, 1>,
    /// Non-padding targets.
    pub(crate) tokens: usize,
    /// `exp(z − max)`, `[n, V]`.
    exp: Tensor<B, 2>,
    /// Its row sums, `[n, 1]`.
    sum_exp: Tensor<B, 2>,
    /// `keep_t / count`, `[n, 1]`.
    weight: Tensor<B, 2>,
    /// `[n, 1]`.
    targets: Tensor<B, 2, Int>,
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
