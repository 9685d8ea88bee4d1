//! What can go wrong while training, checkpointing or evaluating.

use std::path::PathBuf;

use thiserror::Error;
use xfmr_io::IoError;
use xfmr_models::ModelError;

use xfmr_translate::{DataError, TokenizerError, TranslateError};

/// What can go wrong while training, checkpointing or evaluating.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TrainError {
    /// From the model (configuration, sequence length, files). A missing, incomplete or corrupt
    /// checkpoint (`ModelError::Checkpoint`) is a [`TrainError::Checkpoint`] instead.
    #[error(transparent)]
    Model(ModelError),
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
    /// Another replica of a data-parallel run did not answer in time, or burn's collective
    /// failed.
    #[error(
        "rank {rank} of {nodes}, device {device} of {devices}: {what}: {problem} (waiting for \
         replica(s) {waiting_for:?}); restart every rank: they resume from the last checkpoint"
    )]
    Peer {
        /// This process's rank.
        rank: u32,
        /// Processes in the run.
        nodes: u32,
        /// This replica's device in its process.
        device: u32,
        /// Replicas (devices) per process.
        devices: u32,
        /// The replicas (`rank · devices + device`) this one was waiting for.
        waiting_for: Vec<u32>,
        /// The operation (joining, the all-reduce of step N, ...).
        what: String,
        /// What went wrong.
        problem: String,
    },
    /// A training example the objective cannot use.
    #[error("training example {index}: {problem}")]
    InvalidExample {
        /// Its index in the training set.
        index: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A file of the run (metrics, configuration) that cannot be read or written.
    #[error("{}: {problem}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// Another replica of this process failed (its error, as text: the thread's error moves
    /// no further).
    #[error("a replica failed: {0}")]
    Replica(String),
    /// From translation (a source beyond the model's positions, ...): the translation errors
    /// without a variant of their own here (a model, tokenizer, file or option error arrives as
    /// [`TrainError::Model`], [`TrainError::Tokenizer`], [`TrainError::Io`] or
    /// [`TrainError::InvalidConfig`]). Boxed: it would double every `Result`'s size.
    #[error(transparent)]
    Translate(Box<TranslateError>),
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
    /// An [`TrainError::Io`] error about `path`.
    pub fn io(path: impl Into<PathBuf>, problem: impl ToString) -> Self {
        Self::Io {
            path: path.into(),
            problem: problem.to_string(),
        }
    }

    pub(crate) fn checkpoint(path: impl Into<PathBuf>, problem: impl ToString) -> Self {
        Self::Checkpoint {
            path: path.into(),
            problem: problem.to_string(),
        }
    }
}

/// [`TrainError::Checkpoint`] for `ModelError::Checkpoint`, else [`TrainError::Model`].
impl From<ModelError> for TrainError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Checkpoint { path, problem } => Self::Checkpoint { path, problem },
            other => Self::Model(other),
        }
    }
}

/// [`TrainError::Io`].
impl From<IoError> for TrainError {
    fn from(e: IoError) -> Self {
        Self::Io {
            path: e.path,
            problem: e.message,
        }
    }
}

/// The shared kinds as this enum's own variants ([`TrainError::Model`], ...), the rest as
/// [`TrainError::Translate`].
impl From<TranslateError> for TrainError {
    fn from(e: TranslateError) -> Self {
        match e {
            TranslateError::Model(e) => e.into(),
            TranslateError::Tokenizer(e) => Self::Tokenizer(e),
            TranslateError::Io { path, problem } => Self::Io { path, problem },
            TranslateError::InvalidConfig {
                field,
                value,
                expected,
            } => Self::InvalidConfig {
                field,
                value,
                expected,
            },
            other => Self::Translate(Box::new(other)),
        }
    }
}
