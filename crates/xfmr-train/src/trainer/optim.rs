//! The optimiser and its learning rate: burn's Adam configured from the [`TrainConfig`], the
//! schedule (burn's Noam, or [`Decay::Linear`] over the run's budget), and the seed of each
//! step's dropout.

use burn::lr_scheduler::LrScheduler;
use burn::module::AutodiffModule;
use burn::optim::AdamConfig;
use burn::tensor::backend::AutodiffBackend;
use xfmr_translate::data::SplitMix64;

use super::{AdamOf, Decay, TrainConfig, Trainer};
use crate::objective::{ModelOf, Objective};

impl<B: AutodiffBackend, O: Objective> Trainer<B, O>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    /// The learning rate of `step` (1-based) with `time_spent` of the time budget used (see
    /// [`TrainConfig::decay`]). burn's Noam scheduler advances in either case, so that its
    /// recorded step stays the run's.
    pub(super) fn learning_rate(&mut self, step: usize, time_spent: f64) -> f64 {
        let noam = self.schedule.step();
        match self.config.decay {
            None => noam,
            Some(Decay::Linear) => {
                let warmup = self.config.warmup as f64;
                let peak = self.config.lr_factor
                    / ((self.objective.d_model() as f64).sqrt() * warmup.sqrt());
                let spent = (step as f64 / self.config.steps as f64).max(time_spent);
                peak * (step as f64 / warmup).min(1.0 - spent).max(0.0)
            }
        }
    }

    /// Sets the share of the time budget spent (`0..=1`) that the next step's learning rate
    /// reads under [`Decay::Linear`]; [`Trainer::run`] sets it before every step.
    pub(crate) fn set_time_spent(&mut self, share: f64) {
        self.time_spent = share.clamp(0.0, 1.0);
    }
}

pub(super) fn adam<B: AutodiffBackend, M: AutodiffModule<B>>(config: &TrainConfig) -> AdamOf<B, M> {
    AdamConfig::new()
        .with_beta_1(config.beta_1)
        .with_beta_2(config.beta_2)
        .with_epsilon(config.epsilon)
        .init()
}

pub(super) fn step_seed(seed: u64, step: usize) -> u64 {
    SplitMix64(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next()
}

/// The seed of replica `replica`'s step `step` (dropout's generator and streams, `try_step`).
pub(super) fn replica_step_seed(seed: u64, replica: u32, step: usize) -> u64 {
    step_seed(
        seed ^ u64::from(replica).wrapping_mul(0xD6E8_FEB8_6659_FD93),
        step,
    )
}
