//! A run directory and its layout: the one place that names the files a training run leaves
//! behind, read by everything that uses a run (the trainer, the CLI, the server).
//!
//! ```text
//! <run>/train-config.json      the run's specification (RunSpec: task, objective, TrainConfig)
//! <run>/tokenizer.json         its BPE vocabulary (SubwordTokenizer)
//! <run>/checkpoints/step-NNNNNNNN/   checkpoints (model, optimiser, progress, manifest)
//! <run>/model/                 the final model: the average of the last checkpoints
//! <run>/metrics.jsonl | .csv   the metrics log (MetricsLog)
//! <run>/decoding.json          beam search's length penalty chosen for the run (DecodingChoice)
//! <run>/loss-curve.png, attention/*.png, results.json, test.{greedy,beam}.txt
//!                              what `xfmr train` shows at the end of a run
//! ```
//!
//! Runs written before the specification existed (no `train-config.json`) are translation
//! runs ([`RunDir::task`]); every file keeps the name and JSON format it always had.
//!
//! ```
//! use xfmr_train::run_dir::RunDir;
//!
//! let run = RunDir::new("runs/es-en");
//! assert_eq!(run.tokenizer_path(), std::path::Path::new("runs/es-en/tokenizer.json"));
//! assert_eq!(run.checkpoint_dir(400), std::path::Path::new("runs/es-en/checkpoints/step-00000400"));
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use xfmr_models::checkpoint::ModelConfig;
use xfmr_translate::DecodingChoice;
use xfmr_translate::SubwordTokenizer;

use crate::spec::{RunSpec, Task};
use crate::trainer::{load_model, MetricsFormat, TrainError};

/// A run directory: its paths, and reading and writing what it holds (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// The run's specification ([`RunSpec`]).
    pub const SPEC_FILE: &'static str = "train-config.json";
    /// The run's vocabulary ([`SubwordTokenizer`]).
    pub const TOKENIZER_FILE: &'static str = "tokenizer.json";
    /// The directory of the run's checkpoints, each `step-NNNNNNNN`.
    pub const CHECKPOINTS_DIR: &'static str = "checkpoints";
    /// The final model's directory: the average of the last checkpoints, written by
    /// [`Trainer::run`](crate::Trainer::run).
    pub const MODEL_DIR: &'static str = "model";
    /// Beam search's length penalty chosen for the run ([`DecodingChoice`]).
    pub const DECODING_FILE: &'static str = xfmr_translate::translate::DECODING_FILE;
    /// The metrics log as JSON lines ([`MetricsFormat::Jsonl`]).
    pub const METRICS_JSONL: &'static str = "metrics.jsonl";
    /// The metrics log as CSV ([`MetricsFormat::Csv`]).
    pub const METRICS_CSV: &'static str = "metrics.csv";
    /// The loss curve `xfmr train` draws.
    pub const LOSS_CURVE_FILE: &'static str = "loss-curve.png";
    /// The attention maps `xfmr train` draws at the end of a translation run.
    pub const ATTENTION_DIR: &'static str = "attention";
    /// The test scores `xfmr train` writes at the end of a translation run.
    pub const RESULTS_FILE: &'static str = "results.json";

    /// The run directory at `root` (nothing is read or created).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<run>/train-config.json`.
    pub fn spec_path(&self) -> PathBuf {
        self.root.join(Self::SPEC_FILE)
    }

    /// `<run>/tokenizer.json`.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.root.join(Self::TOKENIZER_FILE)
    }

    /// `<run>/checkpoints`.
    pub fn checkpoints_dir(&self) -> PathBuf {
        self.root.join(Self::CHECKPOINTS_DIR)
    }

    /// `<run>/checkpoints/step-NNNNNNNN`: the checkpoint after `step` optimiser steps.
    pub fn checkpoint_dir(&self, step: usize) -> PathBuf {
        self.checkpoints_dir().join(format!("step-{step:08}"))
    }

    /// `<run>/model`: the final model.
    pub fn model_dir(&self) -> PathBuf {
        self.root.join(Self::MODEL_DIR)
    }

    /// `<run>/decoding.json`.
    pub fn decoding_path(&self) -> PathBuf {
        self.root.join(Self::DECODING_FILE)
    }

    /// `<run>/metrics.jsonl` or `<run>/metrics.csv`.
    pub fn metrics_path(&self, format: MetricsFormat) -> PathBuf {
        self.root.join(match format {
            MetricsFormat::Jsonl => Self::METRICS_JSONL,
            MetricsFormat::Csv => Self::METRICS_CSV,
        })
    }

    /// `<run>/loss-curve.png`.
    pub fn loss_curve_path(&self) -> PathBuf {
        self.root.join(Self::LOSS_CURVE_FILE)
    }

    /// `<run>/attention`.
    pub fn attention_dir(&self) -> PathBuf {
        self.root.join(Self::ATTENTION_DIR)
    }

    /// `<run>/results.json`.
    pub fn results_path(&self) -> PathBuf {
        self.root.join(Self::RESULTS_FILE)
    }

    /// `<run>/test.<search>.txt`: the test split's translations by search `search` (`greedy`,
    /// `beam`), one per line.
    pub fn test_translations_path(&self, search: &str) -> PathBuf {
        self.root.join(format!("test.{search}.txt"))
    }

    /// Creates the directory (and its parents) if it does not exist.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the directory.
    pub fn create(&self) -> Result<(), TrainError> {
        fs::create_dir_all(&self.root).map_err(|e| TrainError::io(&self.root, e))
    }

    /// The complete checkpoints, oldest first, as (step, directory); none when the run has no
    /// checkpoint directory.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] if the directory exists but cannot be listed.
    pub fn checkpoints(&self) -> Result<Vec<(usize, PathBuf)>, TrainError> {
        let root = self.checkpoints_dir();
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

    /// The newest complete checkpoint, if any.
    ///
    /// # Errors
    /// As [`RunDir::checkpoints`].
    pub fn latest_checkpoint(&self) -> Result<Option<PathBuf>, TrainError> {
        Ok(self.checkpoints()?.pop().map(|(_, dir)| dir))
    }

    /// Whether the run has a vocabulary.
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer_path().exists()
    }

    /// Reads the run's vocabulary.
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] naming the file.
    pub fn read_tokenizer(&self) -> Result<SubwordTokenizer, TrainError> {
        Ok(SubwordTokenizer::load(&self.tokenizer_path())?)
    }

    /// Writes the run's vocabulary, atomically.
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] naming the file.
    pub fn write_tokenizer(&self, tokenizer: &SubwordTokenizer) -> Result<(), TrainError> {
        Ok(tokenizer.save(&self.tokenizer_path())?)
    }

    /// Reads the run's specification.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file ([`RunSpec::read`]).
    pub fn read_spec(&self) -> Result<RunSpec, TrainError> {
        RunSpec::read(&self.spec_path())
    }

    /// Writes the run's specification, atomically.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn write_spec(&self, spec: &RunSpec) -> Result<(), TrainError> {
        spec.write(&self.spec_path())
    }

    /// The task the run was trained for: its specification's; a run with a final model or
    /// checkpoints but no specification (written before tasks existed), or a specification
    /// without a task, is a translation run. `None` when the directory holds no run.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the specification when it cannot be read.
    pub fn task(&self) -> Result<Option<Task>, TrainError> {
        let path = self.spec_path();
        if path.exists() {
            return Ok(Some(
                RunSpec::read_task(&path)?.unwrap_or(Task::Translation),
            ));
        }
        Ok(
            (self.model_dir().is_dir() || self.checkpoints_dir().is_dir())
                .then_some(Task::Translation),
        )
    }

    /// The directory of the model the run leaves for inference: its final model if the run
    /// finished, else its newest checkpoint.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] naming the run when it holds neither.
    pub fn inference_model_dir(&self) -> Result<PathBuf, TrainError> {
        let model = self.model_dir();
        if model.is_dir() {
            return Ok(model);
        }
        self.latest_checkpoint()?
            .ok_or_else(|| TrainError::Checkpoint {
                path: self.root.clone(),
                problem: format!(
                    "no {}/ and no checkpoint: not a trained run",
                    Self::MODEL_DIR
                ),
            })
    }

    /// The model the run leaves for inference ([`RunDir::inference_model_dir`]), of
    /// configuration type `C`, and the run's vocabulary.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`] naming the run when it holds no model, or the file that is
    /// missing or corrupt; [`TrainError::Tokenizer`] for the vocabulary.
    pub fn load_model<B: Backend, C: ModelConfig>(
        &self,
        device: &B::Device,
    ) -> Result<(C::Model<B>, SubwordTokenizer), TrainError> {
        let dir = self.inference_model_dir()?;
        let tokenizer = self.read_tokenizer()?;
        let (_, model) = load_model::<B, C>(&dir, device)?;
        Ok((model, tokenizer))
    }

    /// The length penalty chosen for the run ([`DecodingChoice::load`]); `None` when it has
    /// none.
    ///
    /// # Errors
    /// As [`DecodingChoice::load`].
    pub fn decoding(&self) -> Result<Option<DecodingChoice>, TrainError> {
        Ok(DecodingChoice::load(&self.root)?)
    }

    /// Beam search's length penalty for the run: the one chosen for it, else the paper's 0.6
    /// ([`DecodingChoice::length_penalty_of`]).
    ///
    /// # Errors
    /// As [`DecodingChoice::load`].
    pub fn length_penalty(&self) -> Result<f64, TrainError> {
        Ok(DecodingChoice::length_penalty_of(&self.root)?)
    }
}

impl AsRef<Path> for RunDir {
    fn as_ref(&self) -> &Path {
        &self.root
    }
}

impl From<PathBuf> for RunDir {
    fn from(root: PathBuf) -> Self {
        Self::new(root)
    }
}

impl From<&Path> for RunDir {
    fn from(root: &Path) -> Self {
        Self::new(root)
    }
}
