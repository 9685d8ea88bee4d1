//! Typed errors of the models.

use std::path::PathBuf;

use thiserror::Error;
use xfmr_blocks::BlockError;
use xfmr_io::IoError;

/// What can go wrong building, running, saving or loading a model.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// From the blocks (sizes, dropout, weight import, positions: a sequence longer than a
    /// learned table is `Block(BlockError::Position(..))`).
    #[error(transparent)]
    Block(#[from] BlockError),
    /// A configuration value out of its range.
    #[error("invalid configuration: `{field}` = {value}: {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A generation option out of its range.
    #[error("invalid generation option `{field}` = {value}: {expected}")]
    InvalidOption {
        /// The option.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A token id outside the vocabulary, or an empty input.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A tensor larger than the device holds in one buffer (on wgpu the adapter's
    /// `max_storage_buffer_binding_size`, 128 MiB on lavapipe; on CUDA a quarter of the
    /// device memory): logits of too many positions (or a vocabulary table whose allocation
    /// failed). burn's GPU backends neither allocate such a tensor nor fail the call that asks
    /// for it: the kernels touching it are skipped and their results hold stale memory. The models
    /// synchronise the device after a computation with a tensor over
    /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES) and return this error when it
    /// reports a failure, instead of those values.
    #[error(
        "{what} {shape:?} take {bytes} bytes, more than this device holds in one buffer (its \
         limit lies between {limit} bytes, which every backend holds, and {bytes}): {remedy}; \
         the device reported: {reported}"
    )]
    TooLargeForDevice {
        /// The tensor (`"logits"`, `"token embedding"`, ...).
        what: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its size in bytes.
        bytes: usize,
        /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES): what every backend holds.
        limit: usize,
        /// What to do instead.
        remedy: &'static str,
        /// The device's error, or why the computation was not attempted.
        reported: String,
    },
    /// A checkpoint was written for another configuration.
    #[error(
        "checkpoint {path} was saved with `{field}` = {found}, but the configuration asks for {expected}"
    )]
    ConfigMismatch {
        /// The checkpoint.
        path: PathBuf,
        /// The first differing field, dotted (`layer.d_model`).
        field: String,
        /// Value in the requested configuration.
        expected: String,
        /// Value in the checkpoint.
        found: String,
    },
    /// A checkpoint directory that is missing, incomplete or corrupt: no manifest, a file the
    /// manifest does not list or that is missing, of another size (truncated) or hash, or
    /// weights that do not decode.
    #[error("checkpoint {path}: {problem}")]
    Checkpoint {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A checkpoint's weights that do not fit its configuration, found before anything is
    /// allocated: a tensor the configuration implies whose saved shape differs, one the
    /// weights lack (fewer layers saved than configured), or one the configuration has no
    /// place for (more layers saved).
    #[error("checkpoint {path}: {}", weights_mismatch(tensor, expected.as_deref(), found.as_deref(), note))]
    WeightsMismatch {
        /// The weights file.
        path: PathBuf,
        /// The tensor's record path (`encoder.layers.3.ffn.linear1.weight`).
        tensor: String,
        /// Its shape as the configuration implies it; `None` if the configuration has no such
        /// tensor.
        expected: Option<Vec<usize>>,
        /// Its shape in the weights; `None` if they lack it.
        found: Option<Vec<usize>>,
        /// More about it (a layer count that differs), or empty.
        note: String,
    },
    /// A JSON file (a configuration) that cannot be parsed as, or a value that cannot be
    /// serialised to, what it should hold.
    #[error("{path}: JSON: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The work was stopped by its [`Cancel`](crate::generate::Cancel) token (its client went
    /// away or its deadline passed) before it finished.
    #[error("cancelled: the client went away or the deadline passed")]
    Cancelled,
    /// Reading or writing a file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

/// The text of [`ModelError::WeightsMismatch`].
fn weights_mismatch(
    tensor: &str,
    expected: Option<&[usize]>,
    found: Option<&[usize]>,
    note: &str,
) -> String {
    let what = match (expected, found) {
        (Some(e), Some(f)) => {
            format!("the configuration implies shape {e:?}, the weights hold {f:?}")
        }
        (Some(e), None) => format!("the configuration implies shape {e:?}, the weights lack it"),
        (None, Some(f)) => {
            format!("the weights hold shape {f:?}, which the configuration has no place for")
        }
        (None, None) => "no such tensor".to_string(),
    };
    let note = if note.is_empty() {
        String::new()
    } else {
        format!(" ({note})")
    };
    format!("tensor `{tensor}`: {what}{note}")
}

impl ModelError {
    /// An IO error naming the file (numbers of more than 20 digits written compactly,
    /// [`xfmr_io::compact_numbers`]).
    pub fn io(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.into(),
            message: xfmr_io::compact_numbers(&err.to_string()),
        }
    }

    /// A JSON error naming the file: a number too large for its field is quoted compactly
    /// (`1e308`, not serde's 309 digits; [`xfmr_io::compact_numbers`]).
    pub fn json(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Self::Json {
            path: path.into(),
            message: xfmr_io::compact_numbers(&err.to_string()),
        }
    }

    /// A missing, incomplete or corrupt checkpoint, naming the file or directory.
    pub fn checkpoint(path: impl Into<PathBuf>, problem: impl std::fmt::Display) -> Self {
        Self::Checkpoint {
            path: path.into(),
            problem: xfmr_io::compact_numbers(&problem.to_string()),
        }
    }
}

/// [`ModelError::InvalidConfig`] (a value of more than 20 digits, a float such as `1e308`
/// that Rust writes out in full, is written compactly).
impl From<xfmr_attention::InvalidConfig> for ModelError {
    fn from(e: xfmr_attention::InvalidConfig) -> Self {
        Self::InvalidConfig {
            field: e.field,
            value: xfmr_io::compact_numbers(&e.value),
            expected: e.expected,
        }
    }
}

/// [`ModelError::Io`].
impl From<IoError> for ModelError {
    fn from(e: IoError) -> Self {
        Self::Io {
            path: e.path,
            message: e.message,
        }
    }
}
