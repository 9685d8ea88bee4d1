//! Saving and loading whole models. A checkpoint is a directory holding `config.json` (the
//! model's configuration, serde JSON), `model.mpk` (burn's named MessagePack record, full
//! precision) and `manifest.json` (the size and FNV-1a hash of every file in it), published
//! atomically through [`xfmr_io::publish`]: written into `<dir>.partial`, the manifest added,
//! then renamed to `dir`. Loading checks the manifest before anything is decoded, so a killed
//! writer, a truncated copy or a flipped byte is a [`ModelError::Checkpoint`] naming the file,
//! never a half-loaded model.
//!
//! A checkpoint's configuration is outside data (the manifest catches damage, not a file
//! written that way): loading checks its sizes against their bounds ([`crate::limits`]) and
//! every saved tensor's shape against the one it implies ([`check_weights`]) before a
//! parameter is allocated, so an edited `config.json` is a typed error naming the field or the
//! tensor, never an abort or a panic.
//!
//! Callers that keep more in the same directory (the trainer: its optimiser state and progress)
//! add their files with [`save_with`]; the manifest lists them and [`load`] checks them too.

use std::fs;
use std::panic::AssertUnwindSafe;
use std::path::Path;

use burn::module::{Module, ModuleVisitor, Param};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder};
use burn::tensor::{backend::Backend, Bool, Int, Tensor};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use xfmr_io::IoError;

pub use xfmr_io::MANIFEST_FILE;

pub use crate::record_shapes::{module_shapes, saved_tensors, SavedTensor};
use crate::{
    record_shapes, DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig, ModelError,
    Transformer, TransformerConfig,
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

    /// Checks the configuration's sizes against their bounds before anything is allocated
    /// ([`crate::limits`]); loading calls it before it reads the weights. Default: nothing to
    /// check (a configuration whose `init_model` allocates nothing by its sizes).
    ///
    /// # Errors
    /// [`ModelError::InvalidConfig`] naming the field out of its range.
    fn validate(&self) -> Result<(), ModelError> {
        Ok(())
    }
}

impl ModelConfig for TransformerConfig {
    type Model<B: Backend> = Transformer<B>;
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<Transformer<B>, ModelError> {
        self.init(device)
    }
    fn validate(&self) -> Result<(), ModelError> {
        TransformerConfig::validate(self)
    }
}

impl ModelConfig for DecoderOnlyConfig {
    type Model<B: Backend> = DecoderOnly<B>;
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<DecoderOnly<B>, ModelError> {
        self.init(device)
    }
    fn validate(&self) -> Result<(), ModelError> {
        DecoderOnlyConfig::validate(self)
    }
}

impl ModelConfig for EncoderOnlyConfig {
    type Model<B: Backend> = EncoderOnly<B>;
    fn init_model<B: Backend>(&self, device: &B::Device) -> Result<EncoderOnly<B>, ModelError> {
        self.init(device)
    }
    fn validate(&self) -> Result<(), ModelError> {
        EncoderOnlyConfig::validate(self)
    }
}

/// Saves `model` and its `config` as checkpoint directory `dir` (its parent directories are
/// created if needed; an older checkpoint there is replaced).
///
/// # Errors
/// [`ModelError::Io`] naming the file that could not be written (or `dir`, if it exists and is
/// neither empty nor a checkpoint: it is not replaced); [`ModelError::Json`] if the
/// configuration does not serialise.
pub fn save<B: Backend, C: ModelConfig>(
    model: &C::Model<B>,
    config: &C,
    dir: &Path,
) -> Result<(), ModelError> {
    save_with::<B, C, ModelError>(model, config, dir, |_| Ok(()))
}

/// [`save`], with `extra` writing further files into the staging directory it is given before
/// the checkpoint is published: the manifest lists them too, and [`load`] checks them.
///
/// # Errors
/// As [`save`], and `extra`'s error.
pub fn save_with<B: Backend, C: ModelConfig, E: From<ModelError>>(
    model: &C::Model<B>,
    config: &C,
    dir: &Path,
    extra: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let json = serde_json::to_vec_pretty(config)
        .map_err(|e| ModelError::json(dir.join(CONFIG_FILE), e))?;
    // The record is taken of a clone: its parameters must hold the values the caller's model
    // will use.
    materialise(model);
    let bytes = NamedMpkBytesRecorder::<FullPrecisionSettings>::default()
        .record(model.clone().into_record(), ())
        .map_err(|e| ModelError::io(dir.join(WEIGHTS_FILE), e))?;
    /// A failure of the writing itself, or of `extra`.
    enum Failed<E> {
        Io(IoError),
        Extra(E),
    }
    impl<E> From<IoError> for Failed<E> {
        fn from(e: IoError) -> Self {
            Self::Io(e)
        }
    }
    xfmr_io::publish(dir, |staging| {
        xfmr_io::write_atomic(&staging.join(WEIGHTS_FILE), &bytes)?;
        xfmr_io::write_atomic(&staging.join(CONFIG_FILE), &json)?;
        extra(staging).map_err(Failed::Extra)
    })
    .map_err(|failed| match failed {
        Failed::Io(e) => ModelError::from(e).into(),
        Failed::Extra(e) => e,
    })
}

/// Initialises every parameter of `module` in place, in the module's visiting order.
///
/// burn 0.21 initialises a parameter lazily, on its first use, and a clone of a parameter that
/// is still lazy gets its own lazy state, which draws other values. Call this before cloning a
/// module whose clone must hold the same values ([`save`] records a clone), or to fix when the
/// initial values are drawn (the trainer draws them before its first step, so that they do not
/// depend on the dropout masks drawn during it).
pub fn materialise<B: Backend, M: Module<B>>(module: &M) {
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
    module.visit(&mut Materialise);
}

/// A checkpoint directory that [`verify`] has checked against its manifest: its files can be
/// read and decoded without hashing them again (a resumed trainer reads its own state from the
/// directory, then loads the model through this).
#[derive(Debug, Clone, Copy)]
pub struct Verified<'a> {
    dir: &'a Path,
}

impl Verified<'_> {
    /// The directory.
    pub fn dir(&self) -> &Path {
        self.dir
    }

    /// [`load_expecting`] without checking the manifest again.
    ///
    /// # Errors
    /// As [`load_expecting`], but for the manifest.
    pub fn load_expecting<B: Backend, C: ModelConfig>(
        &self,
        expected: &C,
        device: &B::Device,
    ) -> Result<C::Model<B>, ModelError> {
        let dir = self.dir;
        let found: C = read_config(dir)?;
        let path = dir.join(CONFIG_FILE);
        let to_value = |c: &C| serde_json::to_value(c).map_err(|e| ModelError::json(&path, e));
        if let Some((field, want, got)) =
            first_difference(&to_value(expected)?, &to_value(&found)?, "")
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
}

/// Checks checkpoint directory `dir` against its manifest: it lists `config.json` and
/// `model.mpk`, and every file it lists (those added by [`save_with`] too) is present with the
/// recorded size and hash. [`load`], [`load_expecting`] and [`load_config`] call it first.
///
/// # Errors
/// [`ModelError::Checkpoint`] naming the directory, the manifest or the file that is missing,
/// truncated or corrupt.
pub fn verify(dir: &Path) -> Result<Verified<'_>, ModelError> {
    let manifest = dir.join(xfmr_io::MANIFEST_FILE);
    if !manifest.exists() && dir.join(CONFIG_FILE).is_file() && dir.join(WEIGHTS_FILE).is_file() {
        return Err(ModelError::checkpoint(
            manifest,
            "missing: a checkpoint written before checkpoints carried manifests, whose weights \
             cannot be checked; save the model again (`checkpoint::save` replaces such a \
             directory) from the program that trained it",
        ));
    }
    xfmr_io::verify_manifest(dir, &[CONFIG_FILE, WEIGHTS_FILE])
        .map_err(|e| ModelError::checkpoint(e.path, e.message))?;
    Ok(Verified { dir })
}

/// Reads the configuration stored in a checkpoint, after [`verify`].
///
/// # Errors
/// As [`verify`]; [`ModelError::Json`] if the file is not a configuration of this kind.
pub fn load_config<C: ModelConfig>(dir: &Path) -> Result<C, ModelError> {
    verify(dir)?;
    read_config(dir)
}

fn read_config<C: ModelConfig>(dir: &Path) -> Result<C, ModelError> {
    let path = dir.join(CONFIG_FILE);
    let text = fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let mut value: Value = serde_json::from_str(&text).map_err(|e| ModelError::json(&path, e))?;
    upgrade_config(&mut value);
    serde_json::from_value(value).map_err(|e| ModelError::json(&path, e))
}

/// Brings a model configuration (JSON) written by an earlier xfmr up to date, in place, and
/// says whether anything changed. Checkpoint loading ([`load`], [`load_config`],
/// [`load_expecting`]), a run's specification (`xfmr_train::RunSpec::read`) and a
/// checkpoint's training state (`trainer.json`, read on resume) call it, so runs and
/// checkpoints written before a change still load and resume; a configuration read another
/// way (burn's `Config::load`) is not upgraded. The changes, oldest first:
///
/// - 2026-12-03: `positions` moved from the layer (`layer.positions`, which a single layer
///   ignored for the absolute kinds) to the model (`positions`); the value is kept as it was.
///
/// Anything that is not such a configuration is left alone (its own error comes when it is
/// read as one).
pub fn upgrade_config(config: &mut Value) -> bool {
    let Some(object) = config.as_object_mut() else {
        return false;
    };
    let moved = object
        .get_mut("layer")
        .and_then(Value::as_object_mut)
        .and_then(|layer| layer.remove("positions"));
    match moved {
        Some(positions) => {
            object.entry("positions").or_insert(positions);
            true
        }
        None => false,
    }
}

/// Loads a checkpoint with the configuration it was saved with, after [`verify`].
///
/// # Errors
/// As [`verify`]; [`ModelError::Json`] for a configuration of another kind,
/// [`ModelError::Checkpoint`] for weights that do not decode.
pub fn load<B: Backend, C: ModelConfig>(
    dir: &Path,
    device: &B::Device,
) -> Result<(C, C::Model<B>), ModelError> {
    verify(dir)?;
    let config: C = read_config(dir)?;
    let model = load_weights(dir, &config, device)?;
    Ok((config, model))
}

/// Loads a checkpoint that must have been saved with `expected`, after [`verify`].
///
/// # Errors
/// [`ModelError::ConfigMismatch`] naming the first field (dotted path) whose value differs;
/// otherwise as [`load`].
pub fn load_expecting<B: Backend, C: ModelConfig>(
    dir: &Path,
    expected: &C,
    device: &B::Device,
) -> Result<C::Model<B>, ModelError> {
    verify(dir)?.load_expecting(expected, device)
}

/// Loads the weights of `dir` into a model of `config`, in an order that allocates nothing a
/// hostile configuration asks for: the configuration's sizes are checked against their bounds
/// ([`ModelConfig::validate`]); the model is built with lazily initialised parameters (no
/// parameter is allocated; a sinusoidal table is, within its bound); every tensor of the
/// record is compared, by path and shape, with the one the model needs, from the record's
/// MessagePack structure ([`check_weights`]); only then is the record decoded and loaded.
fn load_weights<B: Backend, C: ModelConfig>(
    dir: &Path,
    config: &C,
    device: &B::Device,
) -> Result<C::Model<B>, ModelError> {
    config.validate()?;
    let path = dir.join(WEIGHTS_FILE);
    let bytes = fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
    let model = config.init_model::<B>(device)?;
    check_weights::<B, _>(&model, &bytes, &path)?;
    let record = decode_record(bytes, device)
        .map_err(|e| ModelError::checkpoint(&path, format!("not a model record: {e}")))?;
    // The shapes agree, so burn's loader has no reason to panic (a `Vec` of another length,
    // a tensor of another shape); a panic left in it is caught all the same, as a last
    // resort, and reported as the file's.
    std::panic::catch_unwind(AssertUnwindSafe(|| model.load_record(record))).map_err(|panic| {
        ModelError::checkpoint(
            &path,
            format!(
                "weights that do not fit the model ({})",
                xfmr_io::panic_message(&*panic)
            ),
        )
    })
}

/// Compares the tensors of a saved record (`bytes`, burn's named MessagePack as [`save`]
/// writes it) with those `model` needs, by record path and shape, before the record is decoded:
/// the model may be freshly built with lazily initialised parameters, which this does not
/// allocate.
///
/// # Errors
/// [`ModelError::WeightsMismatch`] naming the first tensor (its record path, e.g.
/// `encoder.layers.3.ffn.linear1.weight`) whose saved shape differs from the one the model
/// needs, that the record lacks (fewer layers saved than configured: the note says how many
/// of each stack each side has) or that the model has no place for;
/// [`ModelError::Checkpoint`] naming `path` when the bytes are not such a record.
pub fn check_weights<B: Backend, M: Module<B>>(
    model: &M,
    bytes: &[u8],
    path: &Path,
) -> Result<(), ModelError> {
    let saved = record_shapes::saved_tensors(bytes)
        .map_err(|e| ModelError::checkpoint(path, format!("not a model record: {e}")))?;
    let expected = record_shapes::module_shapes(model);
    let Some((tensor, want, found)) = record_shapes::first_mismatch(&expected, &saved) else {
        return Ok(());
    };
    let note = layer_counts(&tensor, &expected, &saved).unwrap_or_default();
    Err(ModelError::WeightsMismatch {
        path: path.to_path_buf(),
        tensor,
        expected: want,
        found,
        note,
    })
}

/// For a tensor under a stack's `layers.<i>.`, how many layers the configuration and the
/// weights have in that stack: "the configuration has 1000 layers in `encoder.layers`, the
/// weights 2".
fn layer_counts(
    tensor: &str,
    expected: &[(String, Vec<usize>)],
    saved: &[record_shapes::SavedTensor],
) -> Option<String> {
    let at = tensor.find("layers.")? + "layers.".len();
    let stack = &tensor[..at];
    let count = |paths: &mut dyn Iterator<Item = &str>| -> usize {
        paths
            .filter_map(|p| {
                p.strip_prefix(stack)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .map(|i| i + 1)
            .max()
            .unwrap_or(0)
    };
    let configured = count(&mut expected.iter().map(|(p, _)| p.as_str()));
    let held = count(&mut saved.iter().map(|t| t.path.as_str()));
    let stack = stack.trim_end_matches('.');
    (configured != held).then(|| {
        format!("the configuration has {configured} layers in `{stack}`, the weights {held}")
    })
}

/// Decodes a record written as [`save`] writes them (burn's named MessagePack, full precision),
/// as `Recorder::load` does, but a record whose tensor data contradicts itself (a shape that
/// does not match its bytes, which burn's backends assert on) is an error, not a panic: the
/// bytes are a file's. (Found by fuzzing, `fuzz/src/targets/checkpoint.rs`; burn's panic
/// message still reaches the panic hook, so it is printed on stderr.)
///
/// # Errors
/// Why the bytes are not a record of type `R`.
pub fn decode_record<B: Backend, R: Record<B>>(
    bytes: Vec<u8>,
    device: &B::Device,
) -> Result<R, String> {
    let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::default();
    match std::panic::catch_unwind(AssertUnwindSafe(|| recorder.load::<R>(bytes, device))) {
        Ok(decoded) => decoded.map_err(|e| e.to_string()),
        Err(panic) => Err(format!(
            "tensor data that contradicts itself ({})",
            xfmr_io::panic_message(&*panic)
        )),
    }
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
