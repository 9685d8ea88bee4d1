//! Saving and loading whole models: a directory holding `config.json` (the model's
//! configuration, serde JSON) and `model.mpk` (burn's named MessagePack record, full
//! precision). Each file is written to a temporary name in the same directory and renamed, so
//! a crash never leaves a half-written file behind.

use std::fs;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{backend::Backend, Bool, Int, Tensor};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

use crate::{
    DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig, ModelError, Transformer,
    TransformerConfig,
};

/// File name of the configuration inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the weights inside a checkpoint directory.
pub const WEIGHTS_FILE: &str = "model.mpk";

/// A model configuration that can build its model: what a checkpoint stores.
pub trait ModelConfig: Serialize + DeserializeOwned {
    /// The model it builds, on any backend.
    type Model<B: Backend>: Module<B>;

    /// Builds the model with fresh weights.
    ///
    /// # Errors
    /// An invalid configuration.
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<Self::Model<B>, ModelError>;
}

impl ModelConfig for TransformerConfig {
    type Model<B: Backend> = Transformer<B>;
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<Transformer<B>, ModelError> {
        self.init(device)
    }
}

impl ModelConfig for DecoderOnlyConfig {
    type Model<B: Backend> = DecoderOnly<B>;
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<DecoderOnly<B>, ModelError> {
        self.init(device)
    }
}

impl ModelConfig for EncoderOnlyConfig {
    type Model<B: Backend> = EncoderOnly<B>;
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<EncoderOnly<B>, ModelError> {
        self.init(device)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so
/// that `path` holds either its old content or all of `bytes`, never a part.
///
/// # Errors
/// [`ModelError::Io`] naming the file that could not be written or renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    fs::write(&tmp, bytes).map_err(|e| ModelError::io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ModelError::io(path, e)
    })
}

/// Saves `model` and its `config` into directory `dir` (created if needed).
///
/// # Errors
/// [`ModelError::Io`] naming the file that could not be written.
pub fn save<B: Backend, C: ModelConfig>(
    model: &C::Model<B>,
    config: &C,
    dir: &Path,
) -> Result<(), ModelError> {
    fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let json = serde_json::to_vec_pretty(config).map_err(|e| ModelError::io(dir, e))?;
    // burn 0.21 gives a clone of a not-yet-initialised lazy parameter its own lazy state, which
    // draws other values: initialise every parameter first, so the clone (and the record) hold
    // the values the caller's model will use.
    model.visit(&mut Materialise);
    let bytes = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
        .record(model.clone().into_record(), ())
        .map_err(|e| ModelError::io(dir.join(WEIGHTS_FILE), e))?;
    // Weights first: a config is never left pointing at weights of another model.
    write_atomic(&dir.join(WEIGHTS_FILE), &bytes)?;
    write_atomic(&dir.join(CONFIG_FILE), &json)
}

/// Initialises every lazy parameter of a module in place.
struct Materialise;

impl<B: Backend> ModuleVisitor<B> for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let _ = param.val();
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        let _ = param.val();
    }
}

/// Reads the configuration stored in a checkpoint.
///
/// # Errors
/// [`ModelError::Io`] if the file is missing or is not a configuration of this kind.
pub fn load_config<C: ModelConfig>(dir: &Path) -> Result<C, ModelError> {
    let path = dir.join(CONFIG_FILE);
    let text = fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::io(&path, e))
}

/// Loads a checkpoint with the configuration it was saved with.
///
/// # Errors
/// [`ModelError::Io`] for unreadable files.
pub fn load<B: Backend, C: ModelConfig>(
    dir: &Path,
    device: &B::Device,
) -> Result<(C, C::Model<B>), ModelError> {
    let config: C = load_config(dir)?;
    let model = load_weights(dir, &config, device)?;
    Ok((config, model))
}

/// Loads a checkpoint that must have been saved with `expected`.
///
/// # Errors
/// [`ModelError::ConfigMismatch`] naming the first field (dotted path) whose value differs,
/// and [`ModelError::Io`] for unreadable files.
pub fn load_expecting<B: Backend, C: ModelConfig>(
    dir: &Path,
    expected: &C,
    device: &B::Device,
) -> Result<C::Model<B>, ModelError> {
    let found: C = load_config(dir)?;
    let to_value = |c: &C| serde_json::to_value(c).map_err(|e| ModelError::io(dir, e));
    if let Some((field, want, got)) = first_difference(&to_value(expected)?, &to_value(&found)?, "")
    {
        return Err(ModelError::ConfigMismatch {
            path: dir.to_path_buf(),
            field,
            expected: want,
            found: got,
        });
    }
    load_weights(dir, &found, device)
}

fn load_weights<B: Backend, C: ModelConfig>(
    dir: &Path,
    config: &C,
    device: &B::Device,
) -> Result<C::Model<B>, ModelError> {
    let path: PathBuf = dir.join(WEIGHTS_FILE);
    let bytes = fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
    let record = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, device)
        .map_err(|e| ModelError::io(&path, e))?;
    Ok(config.init_model::<B>(device)?.load_record(record))
}

/// The first differing field of two JSON values, as (dotted path, expected, found).
fn first_difference(
    expected: &Value,
    found: &Value,
    path: &str,
) -> Option<(String, String, String)> {
    match (expected, found) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let null = Value::Null;
                first_difference(a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null), &sub)
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some((path.to_string(), a.to_string(), b.to_string())),
    }
}
