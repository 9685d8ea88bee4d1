//! The training loop of §5 for any [`Objective`]: token-count batches, burn's Adam
//! (β = (0.9, 0.98), ε = 1e-9) driven by burn's Noam schedule, gradient accumulation with
//! burn's [`GradientsAccumulator`], data parallelism on burn's collective, checkpoints that
//! resume exactly, and the whole run ([`Trainer::run`]: budget, validation and checkpoint
//! cadence, the replicas' agreement checks, averaging, the final model) reported to an
//! [`Observer`].
//!
//! **Exact resume.** A run's randomness is the batch order of each epoch (a seeded shuffle,
//! [`shuffled`]), dropout (the backend's generator, reseeded from `(seed, step)` before every
//! step) and the objective's draws (seeded from `(seed, step, example)`). A checkpoint stores the
//! model, Adam's moments, the schedule's step and the data position (epoch, batch), so a resumed
//! run computes the same steps an uninterrupted one would: the same batches, the same dropout
//! masks, the same learning rates. On one process with one replica its losses, learning rates
//! and weights equal an uninterrupted run's bit for bit (tested on ndarray: burn-autodiff runs
//! its tape in a fixed order, so two uninterrupted runs are bit-identical too). Replicas that
//! share a process draw dropout from burn's one generator in thread order, and backends whose
//! reductions split work between threads may add in another order: there the tests allow 1e-4.
//!
//! **Checkpoint layout.** `<run>/checkpoints/step-00000400/` holds `config.json` and `model.mpk`
//! (as [`xfmr_models::checkpoint`] writes them), `optimizer.mpk` (burn's record of Adam's
//! moments), `trainer.json` (the objective, the [`TrainConfig`], the [`Progress`] and the number of training
//! examples) and
//! `manifest.json` (the size and FNV-1a hash of each file). A checkpoint is written into a
//! `*.partial` directory and renamed when complete, and checked against its manifest before
//! anything is decoded, so a killed writer, a truncated copy or a flipped byte is a
//! [`TrainError::Checkpoint`] naming the file, never a half-loaded model.
//!
//! The module's files: `config.rs` ([`TrainConfig`]), `error.rs` ([`TrainError`]), `batch.rs`
//! (batches, draws, the validation loss), `store.rs` (checkpoints on disk: listing, atomic
//! writing, verification, loading and averaging), `optim.rs` (Adam, the learning rate, each
//! step's seed), `run.rs` (the run and its observer), `log.rs` (the metrics log); the step
//! itself is here. A run directory's layout is [`RunDir`]'s.

use std::fs;
use std::path::Path;

use burn::lr_scheduler::noam::NoamLrScheduler;
use burn::lr_scheduler::LrScheduler;
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ElementConversion;
use serde::{Deserialize, Serialize};
use xfmr_models::checkpoint::{self, ModelConfig};

use crate::data::shuffled;
use crate::distributed::{param_order, DataParallel};
use crate::objective::{ModelOf, Objective, Translation};
use crate::run_dir::RunDir;
use crate::schedule::noam_schedule;

mod batch;
mod config;
mod error;
mod log;
mod optim;
mod run;
mod store;

use batch::{batches_of, draw, shape_of};
pub use batch::{evaluate_loss, EvalLoss};
pub use config::{Decay, TrainConfig};
pub use error::TrainError;
pub use log::{read_metrics, MetricKind, MetricRecord, MetricsFormat, MetricsLog, TokenRate};
use optim::{adam, replica_step_seed, step_seed};
pub use run::{Event, Observer, RunSummary, Silent, Stop, Tee};
pub use store::{average_checkpoints, load_model, parameter_fingerprint, save_model};
use store::{read_state, refuse_unlisted_files, OPTIMIZER_FILE, TRAINER_FILE};

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
    /// Label-smoothed loss, averaged over the step's predicted tokens.
    pub loss: f64,
    /// Negative log-likelihood per predicted token (its exponential is the perplexity).
    pub nll: f64,
    /// The learning rate the step used.
    pub lr: f64,
    /// Non-padding input tokens read (the source side for translation).
    pub input_tokens: usize,
    /// Tokens predicted (the target side for translation).
    pub target_tokens: usize,
}

/// What a checkpoint stores beside the model and the optimiser.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "O: Objective")]
struct TrainerState<O> {
    objective: O,
    config: TrainConfig,
    progress: Progress,
    /// Training examples the run reads (its batches and data position refer to them).
    #[serde(default)]
    examples: Option<usize>,
}

type AdamOf<B, M> = OptimizerAdaptor<Adam, M, B>;
type AdamRecord<B, M> = <AdamOf<B, M> as Optimizer<M, B>>::Record;

/// Trains the model of an [`Objective`] on its examples (see the module docs). `O` defaults to
/// the paper's [`Translation`].
pub struct Trainer<B: AutodiffBackend, O: Objective = Translation>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    objective: O,
    config: TrainConfig,
    model: Option<ModelOf<O, B>>,
    optim: AdamOf<B, ModelOf<O, B>>,
    schedule: NoamLrScheduler,
    examples: Vec<O::Example>,
    batches: Vec<Vec<usize>>,
    order: (u64, Vec<usize>),
    progress: Progress,
    device: B::Device,
    data_parallel: Option<DataParallel<B::InnerBackend>>,
    /// The share of the time budget spent before the next step, `0..=1` ([`Trainer::run`] sets
    /// it; [`Decay::Linear`] reads it).
    time_spent: f64,
}

impl<B: AutodiffBackend, O: Objective> std::fmt::Debug for Trainer<B, O>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("objective", &self.objective)
            .field("progress", &self.progress)
            .field("examples", &self.examples.len())
            .field("batches", &self.batches.len())
            .finish()
    }
}

impl<B: AutodiffBackend, O: Objective> Trainer<B, O>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    /// A fresh run: the model initialised from the objective's configuration after seeding the
    /// backend with `config.seed`.
    ///
    /// # Errors
    /// An invalid objective or configuration, no examples, an invalid example (an id outside
    /// the vocabulary).
    pub fn new(
        objective: O,
        config: TrainConfig,
        examples: Vec<O::Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        config.check()?;
        objective.check()?;
        B::seed(device, config.seed);
        let model = objective.model().init_model::<B>(device)?;
        // Every parameter drawn now, in the module's order. burn initialises a parameter
        // lazily, on its first use: left to the first step, which reseeds the generator and
        // draws dropout masks between the layers, the initial weights would depend on the
        // dropout rate and on the first batch's shape, and two data-parallel replicas
        // (different rows, so different dropout draws) would start from different weights.
        checkpoint::materialise(&model);
        let optim = adam(&config);
        Self::assemble(
            objective,
            config,
            model,
            optim,
            Progress::default(),
            examples,
            device,
        )
    }

    /// Resumes the run saved in checkpoint directory `dir` (see
    /// [`RunDir::latest_checkpoint`]) on the same examples, with the objective and configuration
    /// saved there.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] for a missing, incomplete or corrupt checkpoint, one holding a
    /// file its manifest does not list (edited by hand), one of another objective, or one
    /// written for another number of training examples, naming the file;
    /// [`TrainError::Model`] with [`ModelError::ConfigMismatch`](xfmr_models::ModelError::ConfigMismatch)
    /// when the model's configuration and the training state's disagree, naming the field.
    pub fn resume(
        dir: &Path,
        examples: Vec<O::Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        // Hashed once: the model is loaded through `verified` below, not verified again.
        let verified = checkpoint::verify(dir)?;
        refuse_unlisted_files(dir)?;
        let state: TrainerState<O> = read_state(&dir.join(TRAINER_FILE))?;
        if let Some(n) = state.examples.filter(|&n| n != examples.len()) {
            return Err(TrainError::checkpoint(
                dir.join(TRAINER_FILE),
                format!(
                    "written for {n} training examples, resumed with {}: resume on the same \
                     data, or start a new run",
                    examples.len()
                ),
            ));
        }
        state.config.check()?;
        state.objective.check()?;
        let model = verified.load_expecting::<B, O::Config>(state.objective.model(), device)?;
        let path = dir.join(OPTIMIZER_FILE);
        let bytes = fs::read(&path).map_err(|e| TrainError::checkpoint(&path, e))?;
        let record: AdamRecord<B, ModelOf<O, B>> = checkpoint::decode_record(bytes, device)
            .map_err(|e| TrainError::checkpoint(&path, e))?;
        let optim = adam(&state.config).load_record(record);
        let (objective, config, progress) = (state.objective, state.config, state.progress);
        Self::assemble(objective, config, model, optim, progress, examples, device)
    }

    /// The run in directory `run_dir`: resumed from its newest checkpoint if it has one (the
    /// recipe saved there, the run options of `config`, see [`TrainConfig`]), else a fresh run
    /// of `objective` and `config`.
    ///
    /// # Errors
    /// As [`Trainer::new`] and [`Trainer::resume`].
    pub fn open(
        run_dir: &Path,
        objective: O,
        config: TrainConfig,
        examples: Vec<O::Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        match RunDir::new(run_dir).latest_checkpoint()? {
            Some(dir) => {
                let mut trainer = Self::resume(&dir, examples, device)?;
                trainer.config = trainer.config.clone().with_run_options_of(&config);
                trainer.config.check()?;
                Ok(trainer)
            }
            None => Self::new(objective, config, examples, device),
        }
    }

    fn assemble(
        objective: O,
        config: TrainConfig,
        model: ModelOf<O, B>,
        optim: AdamOf<B, ModelOf<O, B>>,
        progress: Progress,
        examples: Vec<O::Example>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        if examples.is_empty() {
            return Err(TrainError::InvalidConfig {
                field: "examples",
                value: "0".into(),
                expected: "at least one training example",
            });
        }
        if let Some((row, problem)) = examples
            .iter()
            .enumerate()
            .find_map(|(i, e)| objective.check_example(e).err().map(|p| (i, p)))
        {
            return Err(TrainError::InvalidExample {
                index: row,
                problem,
            });
        }
        let batches = batches_of(&objective, &examples, &config);
        let schedule = noam_schedule(config.lr_factor, objective.d_model(), config.warmup)
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
            objective,
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
            time_spent: 0.0,
        })
    }

    /// The device the model trains on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The run's objective.
    pub fn objective(&self) -> &O {
        &self.objective
    }

    /// The run's configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Where the run stands.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Training examples.
    pub fn num_examples(&self) -> usize {
        self.examples.len()
    }

    /// Micro-batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches.len()
    }

    /// The distinct padded shapes of an epoch's micro-batches, `[rows, input, output]` tokens
    /// (the whole micro-batch, before a data-parallel split): one per rung on a
    /// [`LengthLadder`](xfmr_models::ladder::LengthLadder), about one per batch without.
    pub fn batch_shapes(&self) -> Vec<[usize; 3]> {
        let o = &self.objective;
        let mut shapes: Vec<[usize; 3]> = (self.batches.iter())
            .map(|b| match shape_of(o, &self.examples, &self.config, b, 1) {
                Some(s) => [s.rows, s.len, s.len],
                None => {
                    let side = |f: fn((usize, usize)) -> usize| {
                        b.iter().map(|&i| f(o.lengths(&self.examples[i]))).max()
                    };
                    [
                        b.len(),
                        side(|l| l.0).unwrap_or(0),
                        side(|l| l.1).unwrap_or(0),
                    ]
                }
            })
            .collect();
        shapes.sort_unstable();
        shapes.dedup();
        shapes
    }

    /// The model being trained (with dropout active; [`Trainer::inference_model`] gives the
    /// inference copy).
    pub fn model(&self) -> &ModelOf<O, B> {
        self.model
            .as_ref()
            .expect("the model is present between steps")
    }

    /// The inference copy of the model (no autodiff, dropout off).
    pub fn inference_model(&self) -> ModelOf<O, B::InnerBackend> {
        self.model().valid()
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

    /// One optimiser step over the next `accumulate` micro-batches. On an error the run stands
    /// where it stood before the step.
    ///
    /// # Errors
    /// A sequence longer than a learned position table; [`TrainError::Peer`] in a
    /// data-parallel run.
    pub fn step(&mut self) -> Result<StepReport, TrainError> {
        let before = self.progress;
        let result = self.try_step(before);
        if result.is_err() {
            self.progress = before;
        }
        result
    }

    fn try_step(&mut self, before: Progress) -> Result<StepReport, TrainError> {
        let picked: Vec<Vec<usize>> = (0..self.config.accumulate)
            .map(|_| self.next_batch())
            .collect();
        let step = before.step as u64;
        let draws = |indices: &[usize], seed: u64| -> Vec<u64> {
            indices.iter().map(|&i| draw(seed, step, i)).collect()
        };
        let total: usize = picked
            .iter()
            .map(|indices| {
                let d = draws(indices, self.config.seed);
                indices
                    .iter()
                    .zip(d)
                    .map(|(&i, d)| self.objective.targets(&self.examples[i], d))
                    .sum::<usize>()
            })
            .sum();
        // Dropout draws from the backend's generator, reseeded per step, and on the CPU from
        // this thread's stream (`with_dropout_seed`, per micro-batch), so that replicas sharing
        // one generator do not draw in turns the scheduler picks; a resumed run draws what an
        // uninterrupted one would. Replicas draw their own masks (seeded by their index), so
        // masks are not a single process's (the tests compare with dropout off).
        let replica = self.data_parallel.as_ref().map_or(0, |run| run.replica());
        let seed = replica_step_seed(self.config.seed, replica, before.step);
        B::seed(&self.device, seed);
        let mut accumulator = GradientsAccumulator::<ModelOf<O, B>>::new();
        let (mut loss, mut nll, mut input_tokens) = (0.0, 0.0, 0.0);
        let replicas = self
            .data_parallel
            .as_ref()
            .map_or(1, |r| r.replicas() as usize);
        for (micro, indices) in picked.iter().enumerate() {
            let shape = shape_of(
                &self.objective,
                &self.examples,
                &self.config,
                indices,
                replicas,
            );
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
            let batch: Vec<&O::Example> = rows.iter().map(|&i| &self.examples[i]).collect();
            let draws = draws(&rows, self.config.seed);
            let out = xfmr_attention::with_dropout_seed(step_seed(seed, micro), || {
                xfmr_attention::with_matmul_precision(self.config.precision(), || {
                    self.objective
                        .loss(model, &batch, &draws, shape, &self.device)
                })
            })?;
            input_tokens += out.input_tokens as f64 * scale;
            let weight = scale * out.loss.tokens as f64 / total.max(1) as f64;
            let weighted = out.loss.loss.mul_scalar(weight);
            loss += weighted.clone().into_scalar().elem::<f64>();
            nll += out.loss.nll.into_scalar().elem::<f64>() * weight;
            let grads = GradientsParams::from_grads(weighted.backward(), model);
            accumulator.accumulate(model, grads);
        }
        let mut grads = accumulator.grads();
        let mut time_spent = self.time_spent;
        if let Some(run) = &self.data_parallel {
            grads = run.sum_gradients(grads, param_order(self.model()), before.step + 1)?;
            let what = format!("the loss of step {}", before.step + 1);
            // The leader's clock decides the time budget's share: every replica takes it.
            let clock = if run.is_leader() { time_spent } else { 0.0 };
            let totals = run.sum(&[loss, nll, input_tokens, clock], &what)?;
            (loss, nll, input_tokens, time_spent) = (totals[0], totals[1], totals[2], totals[3]);
        }
        let lr = self.learning_rate(before.step + 1, time_spent);
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
            input_tokens: input_tokens.round() as usize,
            target_tokens: total,
        })
    }
}
