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

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn::lr_scheduler::noam::NoamLrScheduler;
use burn::lr_scheduler::LrScheduler;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use xfmr_models::{checkpoint, ModelError, Transformer, TransformerConfig};

use crate::data::{shuffled, token_batches, DataError, SplitMix64};
use crate::loss::{label_smoothed_loss, noam_schedule, SmoothedLoss};
use crate::tokenizer::TokenizerError;

/// What can go wrong while training, checkpointing or evaluating.
#[derive(Debug, Error)]
pub enum TrainError {
    /// From the model (configuration, sequence length, files).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// From the corpus.
    #[error(transparent)]
    Data(#[from] DataError),
    /// From the tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A checkpoint that is missing, incomplete, corrupt or of another run.
    #[error("checkpoint {}: {problem}", path.display())]
    Checkpoint {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A training option outside its range.
    #[error("invalid training option {field} = {value}: {expected}")]
    InvalidConfig {
        /// The option.
        field: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
}

impl TrainError {
    fn checkpoint(path: impl Into<PathBuf>, problem: impl ToString) -> Self {
        Self::Checkpoint {
            path: path.into(),
            problem: problem.to_string(),
        }
    }
}

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
    fn check(&self) -> Result<(), TrainError> {
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

/// One training pair as token ids, without start or end tokens (the trainer adds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Source ids.
    pub src: Vec<u32>,
    /// Target ids.
    pub tgt: Vec<u32>,
}

/// A padded batch, ready for the model.
#[derive(Debug, Clone)]
pub struct Batch<B: Backend> {
    /// Sources followed by the end token, right-padded: `[rows, seq_src]`.
    pub src: Tensor<B, 2, Int>,
    /// The start token followed by the targets (teacher forcing): `[rows, seq_tgt]`.
    pub tgt_in: Tensor<B, 2, Int>,
    /// The targets followed by the end token: what each position predicts, `[rows, seq_tgt]`.
    pub tgt_out: Tensor<B, 2, Int>,
    /// Non-padding source tokens.
    pub src_tokens: usize,
    /// Non-padding target tokens (the loss's denominator).
    pub tgt_tokens: usize,
}

impl<B: Backend> Batch<B> {
    /// Pads `examples` into one batch with the given special ids.
    ///
    /// # Panics
    /// If `examples` is empty.
    pub fn new(
        examples: &[&Example],
        pad: usize,
        bos: usize,
        eos: usize,
        device: &B::Device,
    ) -> Self {
        assert!(!examples.is_empty(), "Batch::new: no examples");
        let rows = examples.len();
        let src_len = examples.iter().map(|e| e.src.len() + 1).max().unwrap_or(1);
        let tgt_len = examples.iter().map(|e| e.tgt.len() + 1).max().unwrap_or(1);
        let (pad, bos, eos) = (pad as i64, bos as i64, eos as i64);
        let padded = |ids: Vec<i64>, len: usize| {
            let n = ids.len();
            ids.into_iter().chain(std::iter::repeat_n(pad, len - n))
        };
        let tensor = |flat: Vec<i64>, len: usize| {
            Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [rows, len]), device)
        };
        fn ids(v: &[u32]) -> impl Iterator<Item = i64> + '_ {
            v.iter().map(|&t| t as i64)
        }
        let src: Vec<i64> = examples
            .iter()
            .flat_map(|e| padded(ids(&e.src).chain([eos]).collect(), src_len))
            .collect();
        let tgt_in: Vec<i64> = examples
            .iter()
            .flat_map(|e| padded([bos].into_iter().chain(ids(&e.tgt)).collect(), tgt_len))
            .collect();
        let tgt_out: Vec<i64> = examples
            .iter()
            .flat_map(|e| padded(ids(&e.tgt).chain([eos]).collect(), tgt_len))
            .collect();
        Self {
            src: tensor(src, src_len),
            tgt_in: tensor(tgt_in, tgt_len),
            tgt_out: tensor(tgt_out, tgt_len),
            src_tokens: examples.iter().map(|e| e.src.len() + 1).sum(),
            tgt_tokens: examples.iter().map(|e| e.tgt.len() + 1).sum(),
        }
    }
}

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

/// Name of the checkpoint directory inside a run directory.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
const OPTIMIZER_FILE: &str = "optimizer.mpk";
const TRAINER_FILE: &str = "trainer.json";
const MANIFEST_FILE: &str = "manifest.json";

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
        })
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
        // what an uninterrupted one would.
        B::seed(&self.device, step_seed(self.config.seed, before.step));
        let mut accumulator = GradientsAccumulator::<Transformer<B>>::new();
        let (mut loss, mut nll, mut src_tokens) = (0.0, 0.0, 0);
        for indices in &picked {
            let model = self.model();
            let (out, src) =
                match batch_loss(model, &self.config, &self.examples, indices, &self.device) {
                    Ok(loss) => loss,
                    Err(e) => {
                        self.progress = before;
                        return Err(e);
                    }
                };
            src_tokens += src;
            let weight = out.tokens as f64 / total as f64;
            let weighted = out.loss.mul_scalar(weight);
            loss += weighted.clone().into_scalar().elem::<f64>();
            nll += out.nll.into_scalar().elem::<f64>() * weight;
            let grads = GradientsParams::from_grads(weighted.backward(), model);
            accumulator.accumulate(model, grads);
        }
        let lr = self.schedule.step();
        let model = self
            .model
            .take()
            .expect("the model is present between steps");
        self.model = Some(self.optim.step(lr, model, accumulator.grads()));
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

/// Token-count batches of `examples`, each pair counted with its end token.
fn batches_of(examples: &[Example], max_tokens: usize) -> Vec<Vec<usize>> {
    let lengths: Vec<(usize, usize)> = examples
        .iter()
        .map(|e| (e.src.len() + 1, e.tgt.len() + 1))
        .collect();
    token_batches(&lengths, max_tokens)
}

/// The label-smoothed loss of `model` on the pairs `indices` of `examples`, padded into one
/// batch, and the batch's source tokens.
fn batch_loss<B: Backend>(
    model: &Transformer<B>,
    config: &TrainConfig,
    examples: &[Example],
    indices: &[usize],
    device: &B::Device,
) -> Result<(SmoothedLoss<B>, usize), TrainError> {
    let rows: Vec<&Example> = indices.iter().map(|&i| &examples[i]).collect();
    let batch = Batch::<B>::new(
        &rows,
        config.model.pad_id,
        config.bos_id,
        config.eos_id,
        device,
    );
    let logits = model.forward(batch.src, batch.tgt_in)?;
    let out = label_smoothed_loss(
        logits,
        batch.tgt_out,
        config.model.pad_id,
        config.label_smoothing,
    );
    Ok((out, batch.src_tokens))
}

fn step_seed(seed: u64, step: usize) -> u64 {
    SplitMix64(seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next()
}

/// The complete checkpoints of a run, oldest first, as (step, directory).
///
/// # Errors
/// [`TrainError::Checkpoint`] if the directory exists but cannot be listed.
pub fn checkpoints(run_dir: &Path) -> Result<Vec<(usize, PathBuf)>, TrainError> {
    let root = run_dir.join(CHECKPOINTS_DIR);
    let entries = match fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::checkpoint(&root, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| TrainError::checkpoint(&root, e))?;
        let name = entry.file_name();
        let step = name
            .to_str()
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(step) = step {
            found.push((step, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// The newest complete checkpoint of a run, if any.
///
/// # Errors
/// As [`checkpoints`].
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    Ok(checkpoints(run_dir)?.pop().map(|(_, dir)| dir))
}

/// Loads a checkpoint's model (for translation or evaluation) after checking its manifest.
///
/// # Errors
/// [`TrainError::Checkpoint`] naming the file that is missing or corrupt.
pub fn load_model<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(TransformerConfig, Transformer<B>), TrainError> {
    verify_manifest(dir)?;
    Ok(checkpoint::load::<B, TransformerConfig>(dir, device)?)
}

/// Saves a model for translation (no optimiser state) the way checkpoints are saved: into
/// `dir.partial` with a manifest, then renamed to `dir` (an older `dir` is replaced), so
/// [`load_model`] sees a complete model or none.
///
/// # Errors
/// [`TrainError::Checkpoint`] or [`ModelError::Io`] naming the file that could not be written.
pub fn save_model<B: Backend>(
    model: &Transformer<B>,
    config: &TransformerConfig,
    dir: &Path,
) -> Result<(), TrainError> {
    let files = [checkpoint::CONFIG_FILE, checkpoint::WEIGHTS_FILE];
    publish(dir, &files, |partial| {
        Ok(checkpoint::save::<B, TransformerConfig>(
            model, config, partial,
        )?)
    })
}

/// Writes directory `dir` atomically: `fill` writes `files` into `<dir>.partial` (emptied
/// first), a manifest of them is added, and the directory is renamed to `dir`, replacing an older
/// one. A reader sees the whole directory or none ([`checkpoints`] skips `.partial` ones).
fn publish(
    dir: &Path,
    files: &[&str],
    fill: impl FnOnce(&Path) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let partial = dir.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(|e| TrainError::checkpoint(&partial, e))?;
    }
    fill(&partial)?;
    write_manifest(&partial, files)?;
    if dir.exists() {
        fs::remove_dir_all(dir).map_err(|e| TrainError::checkpoint(dir, e))?;
    }
    fs::rename(&partial, dir).map_err(|e| TrainError::checkpoint(dir, e))
}

/// The element-wise mean of the checkpoints' parameters (paper §6.1: "averaging the last 5
/// checkpoints"). Every checkpoint must hold the same configuration.
///
/// # Errors
/// No directory given, a corrupt checkpoint, or differing configurations.
pub fn average_checkpoints<B: Backend>(
    dirs: &[PathBuf],
    device: &B::Device,
) -> Result<(TransformerConfig, Transformer<B>), TrainError> {
    let (first, rest) = dirs.split_first().ok_or(TrainError::InvalidConfig {
        field: "checkpoints",
        value: "none".into(),
        expected: "at least one checkpoint to average",
    })?;
    let (config, model) = load_model::<B>(first, device)?;
    let mut sums = collect_params(&model);
    for dir in rest {
        verify_manifest(dir)?;
        let other = checkpoint::load_expecting::<B, TransformerConfig>(dir, &config, device)?;
        for (sum, p) in sums.iter_mut().zip(collect_params(&other)) {
            *sum = sum.clone() + p;
        }
    }
    let n = dirs.len() as f64;
    let mut mapper = ReplaceParams {
        values: sums.into_iter().map(|s| s.div_scalar(n)).collect(),
        next: 0,
    };
    Ok((config, model.map(&mut mapper)))
}

fn collect_params<B: Backend>(model: &Transformer<B>) -> Vec<Tensor<B, 1>> {
    struct Collect<B: Backend>(Vec<Tensor<B, 1>>);
    impl<B: Backend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let t = param.val();
            let n = t.shape().num_elements();
            self.0.push(t.reshape([n]));
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

struct ReplaceParams<B: Backend> {
    values: Vec<Tensor<B, 1>>,
    next: usize,
}

impl<B: Backend> ModuleMapper<B> for ReplaceParams<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let value = self.values[self.next].clone();
        self.next += 1;
        param.map(|t| value.reshape(t.shape()))
    }
}

/// 64-bit FNV-1a: a checksum to notice truncated or altered checkpoint files (not a defence
/// against deliberate tampering).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[derive(Serialize, Deserialize)]
struct FileSum {
    bytes: u64,
    fnv1a: String,
}

fn write_manifest(dir: &Path, names: &[&str]) -> Result<(), TrainError> {
    let mut files = BTreeMap::new();
    for &name in names {
        let path = dir.join(name);
        let bytes = fs::read(&path).map_err(|e| TrainError::checkpoint(&path, e))?;
        files.insert(
            name.to_string(),
            FileSum {
                bytes: bytes.len() as u64,
                fnv1a: format!("{:016x}", fnv1a(&bytes)),
            },
        );
    }
    let json = serde_json::to_vec_pretty(&files)
        .map_err(|e| TrainError::checkpoint(dir.join(MANIFEST_FILE), e))?;
    Ok(checkpoint::write_atomic(&dir.join(MANIFEST_FILE), &json)?)
}

/// Checks every file a checkpoint's manifest lists: present, of the recorded size and hash.
fn verify_manifest(dir: &Path) -> Result<(), TrainError> {
    if !dir.is_dir() {
        return Err(TrainError::checkpoint(dir, "not a checkpoint directory"));
    }
    let files: BTreeMap<String, FileSum> = read_json(&dir.join(MANIFEST_FILE))?;
    for name in [checkpoint::CONFIG_FILE, checkpoint::WEIGHTS_FILE] {
        if !files.contains_key(name) {
            return Err(TrainError::checkpoint(
                dir.join(MANIFEST_FILE),
                format!("does not list {name}"),
            ));
        }
    }
    for (name, sum) in &files {
        let path = dir.join(name);
        let bytes = fs::read(&path).map_err(|e| TrainError::checkpoint(&path, e))?;
        if bytes.len() as u64 != sum.bytes {
            return Err(TrainError::checkpoint(
                &path,
                format!(
                    "{} bytes, the manifest says {} (truncated?)",
                    bytes.len(),
                    sum.bytes
                ),
            ));
        }
        let hash = format!("{:016x}", fnv1a(&bytes));
        if hash != sum.fnv1a {
            return Err(TrainError::checkpoint(
                &path,
                format!("checksum {hash}, the manifest says {} (corrupt)", sum.fnv1a),
            ));
        }
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TrainError> {
    let text = fs::read_to_string(path).map_err(|e| TrainError::checkpoint(path, e))?;
    serde_json::from_str(&text).map_err(|e| TrainError::checkpoint(path, e))
}

/// Validation loss: the label-smoothed loss and the negative log-likelihood per target token
/// over `examples`, without dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalLoss {
    /// Label-smoothed loss per target token.
    pub loss: f64,
    /// Negative log-likelihood per target token.
    pub nll: f64,
    /// Target tokens scored.
    pub tokens: usize,
}

impl EvalLoss {
    /// Perplexity, `exp(nll)`.
    pub fn perplexity(&self) -> f64 {
        self.nll.exp()
    }
}

/// The loss of `model` on `examples` (inference mode: call it on [`AutodiffModule::valid`] of
/// the trained model, or on a loaded one), batched by `max_tokens`.
///
/// # Errors
/// No examples; a sequence longer than a learned position table.
pub fn evaluate_loss<B: Backend>(
    model: &Transformer<B>,
    config: &TrainConfig,
    examples: &[Example],
) -> Result<EvalLoss, TrainError> {
    let device = model.src_embedding.weight.device();
    let (mut loss, mut nll, mut tokens) = (0.0, 0.0, 0);
    for indices in batches_of(examples, config.max_tokens) {
        let (out, _) = batch_loss(model, config, examples, &indices, &device)?;
        loss += out.loss.into_scalar().elem::<f64>() * out.tokens as f64;
        nll += out.nll.into_scalar().elem::<f64>() * out.tokens as f64;
        tokens += out.tokens;
    }
    if tokens == 0 {
        return Err(TrainError::InvalidConfig {
            field: "examples",
            value: "0".into(),
            expected: "at least one pair to evaluate",
        });
    }
    Ok(EvalLoss {
        loss: loss / tokens as f64,
        nll: nll / tokens as f64,
        tokens,
    })
}

/// The inference copy of a trainer's model (no autodiff, dropout off).
pub fn inference_model<B: AutodiffBackend>(trainer: &Trainer<B>) -> Transformer<B::InnerBackend> {
    trainer.model().valid()
}
