//! Checkpoints on disk: listing, writing (the model's checkpoint format of
//! [`xfmr_models::checkpoint`], with the optimiser state and progress added), verification,
//! loading, averaging, and parameter fingerprints.

use std::fs;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use xfmr_models::checkpoint::{self, ModelConfig};

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;

use super::{TrainError, Trainer, TrainerState};
use crate::objective::{ModelOf, Objective};
use crate::run_dir::RunDir;

pub(crate) const OPTIMIZER_FILE: &str = "optimizer.mpk";
pub(crate) const TRAINER_FILE: &str = "trainer.json";

/// Loads a checkpoint's model of configuration type `C` (for inference or evaluation):
/// [`checkpoint::load`], which checks the manifest first.
///
/// # Errors
/// [`TrainError::Checkpoint`] naming the file that is missing or corrupt; [`TrainError::Model`]
/// otherwise.
pub fn load_model<B: Backend, C: ModelConfig>(
    dir: &Path,
    device: &B::Device,
) -> Result<(C, C::Model<B>), TrainError> {
    Ok(checkpoint::load::<B, C>(dir, device)?)
}

/// Saves a model for inference (no optimiser state): [`checkpoint::save`], which writes
/// `dir.partial` with a manifest and renames it to `dir` (an older `dir` is replaced), so
/// [`load_model`] sees a complete model or none.
///
/// # Errors
/// [`TrainError::Model`] naming the file that could not be written.
pub fn save_model<B: Backend, C: ModelConfig>(
    model: &C::Model<B>,
    config: &C,
    dir: &Path,
) -> Result<(), TrainError> {
    Ok(checkpoint::save::<B, C>(model, config, dir)?)
}

/// The element-wise mean of the checkpoints' parameters (paper §6.1: "averaging the last 5
/// checkpoints"). Every checkpoint must hold the same configuration.
///
/// # Errors
/// No directory given, a corrupt checkpoint, or differing configurations.
pub fn average_checkpoints<B: Backend, C: ModelConfig>(
    dirs: &[PathBuf],
    device: &B::Device,
) -> Result<(C, C::Model<B>), TrainError> {
    let (first, rest) = dirs.split_first().ok_or(TrainError::InvalidConfig {
        field: "checkpoints",
        value: "none".into(),
        expected: "at least one checkpoint to average",
    })?;
    let (config, model) = load_model::<B, C>(first, device)?;
    let mut sums = collect_params(&model);
    for dir in rest {
        let other = checkpoint::load_expecting::<B, C>(dir, &config, device)?;
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

/// A fingerprint of a model's parameter values: FNV-1a over their f32 bytes in the module's
/// visiting order. Equal fingerprints mean bit-identical replicas (data-parallel ranks check
/// theirs against each other at every checkpoint).
pub fn parameter_fingerprint<B: Backend, M: Module<B>>(model: &M) -> u64 {
    let bytes: Vec<u8> = collect_params(model)
        .into_iter()
        .flat_map(|t| {
            t.into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .expect("f32 data")
                .into_iter()
                .flat_map(f32::to_le_bytes)
        })
        .collect();
    xfmr_io::fnv1a(&bytes)
}

fn collect_params<B: Backend, M: Module<B>>(model: &M) -> Vec<Tensor<B, 1>> {
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

/// Refuses a checkpoint directory holding anything its manifest does not list: a checkpoint is
/// written whole (`.partial`, then renamed) with exactly the files the manifest names, so
/// another file was put there by hand, and what it was meant to change would be ignored.
///
/// # Errors
/// [`TrainError::Checkpoint`] naming the first such entry (in name order), or the manifest or
/// directory that cannot be read.
pub(crate) fn refuse_unlisted_files(dir: &Path) -> Result<(), TrainError> {
    let listed =
        xfmr_io::read_manifest(dir).map_err(|e| TrainError::checkpoint(e.path, e.message))?;
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| TrainError::checkpoint(dir, e))? {
        names.push(
            entry
                .map_err(|e| TrainError::checkpoint(dir, e))?
                .file_name(),
        );
    }
    names.sort();
    let unlisted = names.into_iter().find(|name| {
        name.to_str()
            .is_none_or(|n| n != xfmr_io::MANIFEST_FILE && !listed.contains_key(n))
    });
    match unlisted {
        Some(name) => Err(TrainError::checkpoint(
            dir.join(name),
            "is not listed in the checkpoint's manifest: a checkpoint holds only the files it \
             was written with (added by hand?); remove it, or resume from another checkpoint",
        )),
        None => Ok(()),
    }
}

/// Reads a checkpoint's training state (`trainer.json`), the model configuration inside
/// (`objective.model`) brought up to date first, as an earlier xfmr may have written it
/// ([`checkpoint::upgrade_config`]).
pub(crate) fn read_state<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TrainError> {
    let text = fs::read_to_string(path).map_err(|e| TrainError::checkpoint(path, e))?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| TrainError::checkpoint(path, e))?;
    crate::spec::upgrade_objective(&mut value);
    serde_json::from_value(value).map_err(|e| TrainError::checkpoint(path, e))
}

impl<B: AutodiffBackend, O: Objective> Trainer<B, O>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    /// Writes a checkpoint of the current state into `<run_dir>/checkpoints/step-NNNNNNNN`
    /// ([`RunDir::checkpoint_dir`])
    /// (atomically: a `.partial` directory renamed when complete), then removes checkpoints
    /// beyond the newest `keep_checkpoints`. Returns the checkpoint's directory.
    ///
    /// # Errors
    /// [`TrainError::Checkpoint`], [`TrainError::Io`] or [`TrainError::Model`] naming the file
    /// that could not be written.
    pub fn save_checkpoint(&self, run_dir: &Path) -> Result<PathBuf, TrainError> {
        let dir = RunDir::new(run_dir).checkpoint_dir(self.progress.step);
        checkpoint::save_with::<B, O::Config, TrainError>(
            self.model(),
            self.objective.model(),
            &dir,
            |partial| {
                let optimizer = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
                    .record(self.optim.to_record(), ())
                    .map_err(|e| TrainError::checkpoint(partial.join(OPTIMIZER_FILE), e))?;
                xfmr_io::write_atomic(&partial.join(OPTIMIZER_FILE), &optimizer)?;
                let state = TrainerState {
                    objective: self.objective.clone(),
                    config: self.config.clone(),
                    progress: self.progress,
                    examples: Some(self.examples.len()),
                };
                let json = serde_json::to_vec_pretty(&state)
                    .map_err(|e| TrainError::checkpoint(partial.join(TRAINER_FILE), e))?;
                Ok(xfmr_io::write_atomic(&partial.join(TRAINER_FILE), &json)?)
            },
        )?;
        for old in RunDir::new(run_dir)
            .checkpoints()?
            .iter()
            .rev()
            .skip(self.config.keep_checkpoints)
        {
            fs::remove_dir_all(&old.1).map_err(|e| TrainError::checkpoint(&old.1, e))?;
        }
        Ok(dir)
    }
}
