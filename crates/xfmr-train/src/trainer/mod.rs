//! The training loop of §5: token-count batches, the label-smoothed loss, burn's Adam
//! (β = (0.9, 0.98), ε = 1e-9) driven by burn's Noam schedule, gradient accumulation with
//! burn's [`GradientsAccumulator`], and checkpoints that resume exactly.
//!
//! **Exact resume.** A run's randomness is the batch order of each epoch (a seeded shuffle,
//! [`shuffled`]) and dropout (the backend's generator, reseeded from `(seed, step)` before every
//! step). A checkpoint stores the model, Adam's moments, the schedule's step and the data position
//! (epoch, batch), so a resumed run computes the same steps an uninterrupted one would: the same
//! batches, the same dropout masks, the same learning rates. Its losses agree with an
//! uninterrupted run's to rounding (≤ 1e-4 in the tests; not bit for bit, because burn's backward
//! pass sums a shared parameter's gradient contributions in an order that varies between runs).
//!
//! **Checkpoint layout.** `<run>/checkpoints/step-00000400/` holds `config.json` and `model.mpk`
//! (as [`xfmr_models::checkpoint`] writes them), `optimizer.mpk` (burn's record of Adam's
//! moments), `trainer.json` (the [`TrainConfig`] and the [`Progress`]) and `manifest.json` (the
//! size and FNV-1a hash of each file). A checkpoint is written into a `*.partial` directory and
//! renamed when complete, and checked against its manifest before anything is decoded, so a
//! killed writer, a truncated copy or a flipped byte is a [`TrainError::Checkpoint`] naming the
//! file, never a half-loaded model.
//!
//! The module's files: `config.rs` ([`TrainConfig`]), `error.rs` ([`TrainError`]), `batch.rs`
//! ([`Example`], [`Batch`], the validation loss), and checkpoints on disk (listing, atomic writing,
//! verification, loading and averaging of checkpoints: `store.rs`); the loop itself is here.

use std::fs;
use std::path::{Path, PathBuf};

use burn::lr_scheduler::noam::NoamLrScheduler;
use burn::lr_scheduler::LrScheduler;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor};
use serde::{Deserialize, Serialize};
use xfmr_models::{checkpoint, Transformer, TransformerConfig};

use crate::data::{shuffled, SplitMix64};
use crate::distributed::{param_order, DataParallel};
use crate::loss::noam_schedule;

mod batch;
mod config;
mod error;
mod store;

use batch::{batch_loss, batches_of};
pub use batch::{evaluate_loss, Batch, EvalLoss, Example};
pub use config::TrainConfig;
pub use error::TrainError;
pub use store::{
    average_checkpoints, checkpoints, latest_checkpoint, load_model, parameter_fingerprint,
    save_model, CHECKPOINTS_DIR,
};
use store::{publish, read_json, verify_manifest, OPTIMIZER_FILE, TRAINER_FILE};

/// Where a run stands: optimiser steps taken and the next micro-batch to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Optimiser steps taken.
    pub step: usize,
    /// Current epoch (0-based).
    pub epoch: u64,
    /// Micro-batches of the current epoch already read.
    pub batch: usize,
}

/// What one optimiser step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The step just taken (1-based).
    pub step: usize,
    /// The epoch its last micro-batch came from.
    pub epoch: u64,
    /// Label-smoothed loss, averaged over the step's target tokens.
    pub loss: f64,
    /// Negative log-likelihood per target token (its exponential is the perplexity).
    pub nll: f64,
    /// The learning rate the step used.
    pub lr: f64,
    /// Non-padding source tokens read.
    pub src_tokens: usize,
    /// Non-padding target tokens read.
    pub tgt_tokens: usize,
}

/// What a checkpoint stores beside the model and the optimiser.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainerState {
    config: TrainConfig,
    progress: Progress,
}

type AdamOf<B> = OptimizerAdaptor<Adam, Transformer<B>, B>;
type AdamRecord<B> = <AdamOf<B> as Optimizer<Transformer<B>, B>>::Record;

/// Trains a [`Transformer`] on [`Example`]s (see the module docs).
pub struct Trainer<B: AutodiffBackend> {
    config: TrainConfig,
    model: Option<Transformer<B>>,
    optim: AdamOf<B>,
    schedule: NoamLrScheduler,
    examples: Vec<Example>,
    batches: Vec<Vec<usize>>,
    order: (u64, Vec<usize>),
    progress: Progress,
    device: B::Device,
    data_parallel: Option<DataParallel<B::InnerBackend>>,
}

impl<B: AutodiffBackend> std::fmt::Debug for Trainer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("progress", &self.progress)
            .field("examples", &self.examples.len())
            .field("batches", &self.batches.len())
            .finish()
    }
}

impl<B: AutodiffBackend> Trainer<B> {
    /// A fresh run: the model initialised from the configuration after seeding the backend with
    /// `config.seed`.
    ///
    /// # Errors
    /// An invalid configuration, no examples, an id outside the vocabulary.
    pub fn new(
        config: TrainConfig,
        examples: Vec<Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        config.check()?;
        B::seed(device, config.seed);
        let model = config.model.init::<B>(device)?;
        initialize_now(&model);
        let optim = Self::adam(&config);
        Self::assemble(config, model, optim, Progress::default(), examples, device)
    }

    /// Resumes the run saved in checkpoint directory `dir` (see [`latest_checkpoint`]) on the
    /// same examples.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] for a missing, incomplete or corrupt checkpoint, naming the
    /// file.
    pub fn resume(
        dir: &Path,
        examples: Vec<Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        verify_manifest(dir)?;
        let state: TrainerState = read_json(&dir.join(TRAINER_FILE))?;
        state.config.check()?;
        let model =
            checkpoint::load_expecting::<B, TransformerConfig>(dir, &state.config.model, device)?;
        let path = dir.join(OPTIMIZER_FILE);
        let bytes = fs::read(&path).map_err(|e| TrainError::checkpoint(&path, e))?;
        let record: AdamRecord<B> = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
            .load(bytes, device)
            .map_err(|e| TrainError::checkpoint(&path, e))?;
        let optim = Self::adam(&state.config).load_record(record);
        Self::assemble(state.config, model, optim, state.progress, examples, device)
    }

    fn adam(config: &TrainConfig) -> AdamOf<B> {
        AdamConfig::new()
            .with_beta_1(config.beta_1)
            .with_beta_2(config.beta_2)
            .with_epsilon(config.epsilon)
            .init()
    }

    fn assemble(
        config: TrainConfig,
        model: Transformer<B>,
        optim: AdamOf<B>,
        progress: Progress,
        examples: Vec<Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        if examples.is_empty() {
            return Err(TrainError::InvalidConfig {
                field: "examples",
                value: "0".into(),
                expected: "at least one training pair",
            });
        }
        let vocab = config.model.src_vocab_size.min(config.model.tgt_vocab_size);
        if let Some((row, id)) = examples.iter().enumerate().find_map(|(i, e)| {
            e.src
                .iter()
                .chain(&e.tgt)
                .find(|&&t| t as usize >= vocab)
                .map(|&t| (i, t))
        }) {
            return Err(TrainError::InvalidConfig {
                field: "examples",
                value: format!("id {id} in pair {row}"),
                expected: "ids below the vocabulary size",
            });
        }
        let batches = batches_of(&examples, config.max_tokens);
        let schedule = noam_schedule(config.lr_factor, config.model.layer.d_model, config.warmup)
            .map_err(|problem| TrainError::InvalidConfig {
                field: "warmup",
                value: format!("{} ({problem})", config.warmup),
                expected: "a valid Noam schedule",
            })?
            .load_record::<B>(progress.step);
        let order = (
            progress.epoch,
            shuffled(batches.len(), config.seed, progress.epoch),
        );
        Ok(Self {
            config,
            model: Some(model),
            optim,
            schedule,
            examples,
            batches,
            order,
            progress,
            device: device.clone(),
            data_parallel: None,
        })
    }

    /// Trains data-parallel as one replica of `run` (see [`crate::distributed`]): every step
    /// then reads this replica's share of each micro-batch and sums the gradients over the
    /// replicas. All replicas must start from the same state (the same configuration and seed,
    /// or the same checkpoint): this is checked here, against the others.
    ///
    /// # Errors
    /// [`TrainError::Peer`] when the replicas start from different steps or do not answer.
    pub fn with_data_parallel(
        mut self,
        run: DataParallel<B::InnerBackend>,
    ) -> Result<Self, TrainError> {
        run.agree(self.progress.step as u64, "the step to start from")?;
        self.data_parallel = Some(run);
        Ok(self)
    }

    /// The data-parallel run this trainer is a replica of, if any.
    pub fn data_parallel(&self) -> Option<&DataParallel<B::InnerBackend>> {
        self.data_parallel.as_ref()
    }

    /// Leaves the data-parallel run, if any (call it when training is done).
    ///
    /// # Errors
    /// [`TrainError::Peer`] when the other replicas do not answer.
    pub fn finish(&mut self) -> Result<(), TrainError> {
        match self.data_parallel.take() {
            Some(run) => run.finish(),
            None => Ok(()),
        }
    }

    /// The run's configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Where the run stands.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Training pairs.
    pub fn num_examples(&self) -> usize {
        self.examples.len()
    }

    /// Micro-batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    /// The model being trained (with dropout active; [`AutodiffModule::valid`] gives the
    /// inference copy).
    pub fn model(&self) -> &Transformer<B> {
        self.model
            .as_ref()
            .expect("the model is present between steps")
    }

    fn next_batch(&mut self) -> Vec<usize> {
        if self.progress.batch == self.batches.len() {
            self.progress.epoch += 1;
            self.progress.batch = 0;
        }
        if self.order.0 != self.progress.epoch {
            let epoch = self.progress.epoch;
            self.order = (epoch, shuffled(self.batches.len(), self.config.seed, epoch));
        }
        let batch = self.batches[self.order.1[self.progress.batch]].clone();
        self.progress.batch += 1;
        batch
    }

    /// One optimiser step over the next `accumulate` micro-batches.
    ///
    /// # Errors
    /// A sequence longer than a learned position table.
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        let before = self.progress;
        let picked: Vec<Vec<usize>> = (0..self.config.accumulate)
            .map(|_| self.next_batch())
            .collect();
        let total: usize = picked
            .iter()
            .flatten()
            .map(|&i| self.examples[i].tgt.len() + 1)
            .sum();
        // Dropout draws from the backend's generator: reseeded per step, a resumed run draws
        // what an uninterrupted one would. Data-parallel replicas draw their own masks (replica
        // 0 draws the single-process ones), not one pattern laid over every replica's rows.
        let replica = self
            .data_parallel
            .as_ref()
            .map_or(0, |run| u64::from(run.replica()));
        let seed = self.config.seed ^ replica.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        B::seed(&self.device, step_seed(seed, before.step));
        let mut accumulator = GradientsAccumulator::<Transformer<B>>::new();
        let (mut loss, mut nll, mut src_tokens) = (0.0, 0.0, 0);
        for indices in &picked {
            // Data-parallel: this replica's rows. A replica left without rows still runs one row
            // at weight 0, so that every replica brings gradients (zeros) for every parameter.
            let (rows, scale) = match &self.data_parallel {
                Some(run) => match run.share(indices) {
                    rows if rows.is_empty() => (indices[..1].to_vec(), 0.0),
                    rows => (rows, 1.0),
                },
                None => (indices.clone(), 1.0),
            };
            let model = self.model();
            let (out, src) =
                match batch_loss(model, &self.config, &self.examples, &rows, &self.device) {
                    Ok(loss) => loss,
                    Err(e) => {
                        self.progress = before;
                        return Err(e);
                    }
                };
            src_tokens += (src as f64 * scale) as usize;
            let weight = scale * out.tokens as f64 / total as f64;
            let weighted = out.loss.mul_scalar(weight);
            loss += weighted.clone().into_scalar().elem::<f64>();
            nll += out.nll.into_scalar().elem::<f64>() * weight;
            let grads = GradientsParams::from_grads(weighted.backward(), model);
            accumulator.accumulate(model, grads);
        }
        let mut grads = accumulator.grads();
        if let Some(run) = &self.data_parallel {
            let summed = run
                .sum_gradients(grads, param_order(self.model()), before.step + 1)
                .and_then(|g| {
                    let what = format!("the loss of step {}", before.step + 1);
                    Ok((g, run.sum(&[loss, nll, src_tokens as f64], &what)?))
                });
            match summed {
                Ok((g, totals)) => {
                    grads = g;
                    (loss, nll, src_tokens) = (totals[0], totals[1], totals[2] as usize);
                }
                Err(e) => {
                    self.progress = before;
                    return Err(e);
                }
            }
        }
        let lr = self.schedule.step();
        let model = self
            .model
            .take()
            .expect("the model is present between steps");
        self.model = Some(self.optim.step(lr, model, grads));
        self.progress.step += 1;
        Ok(StepReport {
            step: self.progress.step,
            epoch: self.progress.epoch,
            loss,
            nll,
            lr,
            src_tokens,
            tgt_tokens: total,
        })
    }

    /// Writes a checkpoint of the current state into `<run_dir>/checkpoints/step-NNNNNNNN`
    /// (atomically: a `.partial` directory renamed when complete), then removes checkpoints
    /// beyond the newest `keep_checkpoints`. Returns the checkpoint's directory.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] or [`ModelError::Io`] naming the file that could not be
    /// written.
    pub fn save_checkpoint(&self, run_dir: &Path) -> Result<PathBuf, TrainError> {
        let dir = run_dir
            .join(CHECKPOINTS_DIR)
            .join(format!("step-{:08}", self.progress.step));
        let files = [
            checkpoint::CONFIG_FILE,
            checkpoint::WEIGHTS_FILE,
            OPTIMIZER_FILE,
            TRAINER_FILE,
        ];
        publish(&dir, &files, |partial| {
            checkpoint::save::<B, TransformerConfig>(self.model(), &self.config.model, partial)?;
            let optimizer = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
                .record(self.optim.to_record(), ())
                .map_err(|e| TrainError::checkpoint(partial.join(OPTIMIZER_FILE), e))?;
            checkpoint::write_atomic(&partial.join(OPTIMIZER_FILE), &optimizer)?;
            let state = TrainerState {
                config: self.config.clone(),
                progress: self.progress,
            };
            let json = serde_json::to_vec_pretty(&state)
                .map_err(|e| TrainError::checkpoint(partial.join(TRAINER_FILE), e))?;
            Ok(checkpoint::write_atomic(
                &partial.join(TRAINER_FILE),
                &json,
            )?)
        })?;
        for old in checkpoints(run_dir)?
            .iter()
            .rev()
            .skip(self.config.keep_checkpoints)
        {
            fs::remove_dir_all(&old.1).map_err(|e| TrainError::checkpoint(&old.1, e))?;
        }
        Ok(dir)
    }
}

fn step_seed(seed: u64, step: usize) -> u64 {
    SplitMix64(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next()
}

/// Draws every parameter of `module` now, in the module's order. burn initialises a parameter
/// lazily, on its first use: left to the first step, which reseeds the generator and draws
/// dropout masks between the layers, the initial weights would depend on the dropout rate and
/// on the first batch's shape, and two data-parallel replicas (different rows, so different
/// dropout draws) would start from different weights.
fn initialize_now<B: Backend, M: Module<B>>(module: &M) {
    struct Touch;
    impl<B: Backend> ModuleVisitor<B> for Touch {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            drop(param.val());
        }
    }
    module.visit(&mut Touch);
}

/// The inference copy of a trainer's model (no autodiff, dropout off).
pub fn inference_model<B: AutodiffBackend>(trainer: &Trainer<B>) -> Transformer<B::InnerBackend> {
    trainer.model().valid()
}
