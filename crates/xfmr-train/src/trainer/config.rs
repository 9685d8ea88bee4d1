//! The training configuration.

use burn::config::Config;
use xfmr_models::TransformerConfig;

use super::TrainError;

/// How to train: the model, the batches, the optimiser and the checkpoints. Defaults are the
/// paper's where it gives one (§5.2–5.4).
#[derive(Config, Debug)]
pub struct TrainConfig {
    /// The model (its `layer.dropout` is the paper's P_drop, 0.1 for `base`).
    pub model: TransformerConfig,
    /// Padded tokens per micro-batch: rows × the longest sentence (source or target, end
    /// token included) stays within it. The paper used ≈ 25,000 source and 25,000 target tokens
    /// per step over 8 GPUs; `max_tokens × accumulate` is the equivalent here.
    #[config(default = 4096)]
    pub max_tokens: usize,
    /// Micro-batches whose gradients are summed (burn's `GradientsAccumulator`, each weighted by
    /// its share of the step's target tokens) before one optimiser step.
    #[config(default = 1)]
    pub accumulate: usize,
    /// Optimiser steps to train for (paper: 100,000 for `base`).
    #[config(default = 1000)]
    pub steps: usize,
    /// Warm-up steps of the schedule (paper: 4000).
    #[config(default = 4000)]
    pub warmup: usize,
    /// Multiplier of the schedule (paper: 1).
    #[config(default = 1.0)]
    pub lr_factor: f64,
    /// Label smoothing ε (paper: 0.1).
    #[config(default = 0.1)]
    pub label_smoothing: f64,
    /// Adam β₁ (paper: 0.9).
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Adam β₂ (paper: 0.98).
    #[config(default = 0.98)]
    pub beta_2: f32,
    /// Adam ε (paper: 1e-9).
    #[config(default = 1e-9)]
    pub epsilon: f32,
    /// Seed of the batch order and of dropout.
    #[config(default = 42)]
    pub seed: u64,
    /// Start-of-sentence id (the decoder's first input).
    #[config(default = 1)]
    pub bos_id: usize,
    /// End-of-sentence id (appended to sources and targets).
    #[config(default = 2)]
    pub eos_id: usize,
    /// Write a checkpoint every this many steps (and after the last).
    #[config(default = 200)]
    pub checkpoint_every: usize,
    /// Checkpoints kept on disk, the newest (at least the ones averaged; paper: last 5).
    #[config(default = 5)]
    pub keep_checkpoints: usize,
}

impl TrainConfig {
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
        positive("checkpoint_every", self.checkpoint_every)?;
        positive("keep_checkpoints", self.keep_checkpoints)?;
        if !(0.0..1.0).contains(&self.label_smoothing) {
            return Err(TrainError::InvalidConfig {
                field: "label_smoothing",
                value: self.label_smoothing.to_string(),
                expected: "in [0, 1)",
            });
        }
        let vocab = self.model.tgt_vocab_size;
        for (field, id) in [
            ("bos_id", self.bos_id),
            ("eos_id", self.eos_id),
            ("model.pad_id", self.model.pad_id),
        ] {
            if id >= vocab {
                return Err(TrainError::InvalidConfig {
                    field,
                    value: id.to_string(),
                    expected: "below the target vocabulary size",
                });
            }
        }
        Ok(())
    }
}
