//! The training configuration.

use burn::config::Config;
use xfmr_attention::MatmulPrecision;
use xfmr_models::ladder::LengthLadder;

use super::TrainError;

/// How to train, whatever the objective: batches, optimiser, seed, the run's budget and its
/// cadence. Defaults are the paper's where it gives one (§5.2–5.4). The model and what it
/// predicts live in the [`Objective`](crate::Objective).
///
/// **On resume** a run keeps the recipe its checkpoint was written with (batches, optimiser,
/// schedule, seed: what makes the resumed steps equal to uninterrupted ones) and takes the run's
/// budget and cadence from the caller ([`TrainConfig::with_run_options_of`]): `steps`,
/// `minutes`, `eval_every`, `checkpoint_every`, `keep_checkpoints`, `average`. A longer `steps`
/// continues a finished run.
#[derive(Config, Debug)]
pub struct TrainConfig {
    /// Padded tokens per micro-batch: rows × the longest sequence (input or output, special
    /// tokens included) stays within it. The paper used ≈ 25,000 source and 25,000 target
    /// tokens per step over 8 GPUs; `max_tokens × accumulate` is the equivalent here.
    #[config(default = 4096)]
    pub max_tokens: usize,
    /// Pad batches to a ladder of lengths and row counts, so that a run meets a few batch
    /// shapes (GPU backends compile kernels per shape; [`xfmr_models::ladder`]); `None`: each
    /// micro-batch padded to its longest sequence. Part of the recipe (it decides the batches):
    /// a resumed run keeps its checkpoint's, and a configuration written before this field
    /// existed reads as `None`. `xfmr train` turns it on for wgpu and CUDA.
    #[config(default = "None")]
    pub ladder: Option<LengthLadder>,
    /// Micro-batches whose gradients are summed (burn's `GradientsAccumulator`, each weighted by
    /// its share of the step's predicted tokens) before one optimiser step.
    #[config(default = 1)]
    pub accumulate: usize,
    /// Optimiser steps to train for, counted from the start of the run (paper: 100,000 for
    /// `base`).
    #[config(default = 1000)]
    pub steps: usize,
    /// A wall-clock budget in minutes for this invocation of [`Trainer::run`](crate::Trainer::run),
    /// on top of `steps`: the run stops at whichever comes first. The time is the leader's;
    /// data-parallel replicas stop at the same step.
    #[config(default = "None")]
    pub minutes: Option<f64>,
    /// Warm-up steps of the schedule (paper: 4000).
    #[config(default = 4000)]
    pub warmup: usize,
    /// Multiplier of the schedule (paper: 1).
    #[config(default = 1.0)]
    pub lr_factor: f64,
    /// The learning rate after warm-up: `None`, the paper's inverse square root of the step
    /// (§5.3; no end, so a run can go on at any step); [`Decay::Linear`], straight down to zero
    /// at the end of the run's budget. The warm-up line is the same in both.
    #[config(default = "None")]
    pub decay: Option<Decay>,
    /// Adam β₁ (paper: 0.9).
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Adam β₂ (paper: 0.98).
    #[config(default = 0.98)]
    pub beta_2: f32,
    /// Adam ε (paper: 1e-9).
    #[config(default = 1e-9)]
    pub epsilon: f32,
    /// Seed of the initial weights, the batch order, dropout and the objective's draws.
    #[config(default = 42)]
    pub seed: u64,
    /// Validation loss every this many steps (and after the last).
    #[config(default = 200)]
    pub eval_every: usize,
    /// Write a checkpoint every this many steps (and after the last).
    #[config(default = 200)]
    pub checkpoint_every: usize,
    /// Checkpoints kept on disk, the newest; at least `average`.
    #[config(default = 5)]
    pub keep_checkpoints: usize,
    /// Checkpoints averaged into the final model (paper §6.1: the last 5).
    #[config(default = 5)]
    pub average: usize,
    /// What the training step's matrix products may compute in
    /// ([`xfmr_attention::with_matmul_precision`]); `None` is [`MatmulPrecision::F32`].
    /// [`MatmulPrecision::Bf16`] rounds the factors of every projection's product (forward, and
    /// under `Autodiff<Flex>` the backward's two) to `bf16` and sums in `f32` where the backend
    /// is flex and the CPU has AMX or AVX-512 BF16; the parameters, gradients and Adam's moments
    /// stay `f32`. Validation and the final evaluation run in `f32`. Part of the recipe (it
    /// changes the arithmetic of every step): a resumed run keeps its checkpoint's, and a
    /// configuration written before this field existed reads as `None`.
    #[config(default = "None")]
    pub matmul_precision: Option<MatmulPrecision>,
}

/// How the learning rate falls after warm-up (see [`TrainConfig::decay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// `lr = peak · min(s / warmup, 1 − p)` at step `s`, where `peak` is the paper's schedule
    /// at `s = warmup`, `factor · d_model^-½ · warmup^-½`, and `p ∈ [0, 1]` is how much of the
    /// budget is spent: the larger of `s / steps` and, with a `minutes` budget, the time this
    /// invocation of [`Trainer::run`](crate::Trainer::run) has trained over that budget (the
    /// leader's clock, shared with data-parallel replicas at every step). The budget itself
    /// thus sets the schedule's length: a run that stops on time ends at a learning rate near
    /// zero instead of the inverse square root's tail. The warm-up line meets the falling one
    /// at `peak · (1 − p)` a little before `s = warmup`, so the highest rate is below `peak` by
    /// the share of the budget the warm-up takes (0.82 · peak for warm-up 300 of ~1,350 steps). A run resumed with a time budget starts
    /// that budget's decay again from the warm-up's end. For a run far from converging it is
    /// worse: ten minutes of the CPU preset scored 3.6 BLEU below the inverse square root at the
    /// same peak (docs/training.md).
    Linear,
}

impl TrainConfig {
    /// The training step's matmul precision: [`TrainConfig::matmul_precision`], `f32` where
    /// it is `None`.
    pub fn precision(&self) -> MatmulPrecision {
        self.matmul_precision.unwrap_or_default()
    }

    /// This configuration with the run options (budget and cadence, see the type's docs) of
    /// `other`.
    pub fn with_run_options_of(self, other: &TrainConfig) -> Self {
        Self {
            steps: other.steps,
            minutes: other.minutes,
            eval_every: other.eval_every,
            checkpoint_every: other.checkpoint_every,
            keep_checkpoints: other.keep_checkpoints,
            average: other.average,
            ..self
        }
    }

    pub(crate) fn check(&self) -> Result<(), TrainError> {
        let positive = |field, value: usize| {
            if value == 0 {
                Err(TrainError::InvalidConfig {
                    field,
                    value: "0".into(),
                    expected: "at least 1",
                })
            } else {
                Ok(())
            }
        };
        positive("max_tokens", self.max_tokens)?;
        positive("accumulate", self.accumulate)?;
        positive("warmup", self.warmup)?;
        positive("eval_every", self.eval_every)?;
        positive("checkpoint_every", self.checkpoint_every)?;
        positive("average", self.average)?;
        if let Some(ladder) = self.ladder {
            positive("ladder.min_len", ladder.min_len)?;
        }
        if self.keep_checkpoints < self.average {
            return Err(TrainError::InvalidConfig {
                field: "keep_checkpoints",
                value: self.keep_checkpoints.to_string(),
                expected: "at least `average` (the checkpoints averaged must be kept)",
            });
        }
        if let Some(minutes) = self.minutes {
            if !(minutes > 0.0 && minutes.is_finite()) {
                return Err(TrainError::InvalidConfig {
                    field: "minutes",
                    value: minutes.to_string(),
                    expected: "a positive number of minutes",
                });
            }
        }
        Ok(())
    }
}
