//! What can go wrong translating, choosing the decoding or reading its file.

use std::path::PathBuf;

use thiserror::Error;
use xfmr_io::IoError;
use xfmr_models::ModelError;

use crate::tokenizer::TokenizerError;

/// What can go wrong translating, choosing beam search's length penalty, or reading and writing
/// the decoding choice.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TranslateError {
    /// From the model (an id outside its vocabulary, a cancelled generation, invalid options).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// From the tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A file of the run (the decoding choice) that cannot be read, parsed or written.
    #[error("{}: {problem}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// A source sentence longer than a translation model's positions hold
    /// ([`SourceLimit`](crate::translate::SourceLimit)): refused before its quadratic
    /// attention is spent on it.
    #[error(
        "source {index}: {}, more than the {max_tokens} tokens (end token included) the model's \
         positions hold",
        source_length(*.tokens, *.bytes)
    )]
    SourceTooLong {
        /// Its index among the sources translated together (0-based).
        index: usize,
        /// Its tokens, end token included; `None` when it was refused on its byte length
        /// alone, without tokenising it.
        tokens: Option<usize>,
        /// Its length in bytes.
        bytes: usize,
        /// The most tokens a source may have.
        max_tokens: usize,
    },
    /// An option outside its range.
    #[error("invalid translation option {field} = {value}: {expected}")]
    InvalidConfig {
        /// The option.
        field: &'static str,
        /// Its value.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
}

/// "1030 tokens", or "8500000 bytes" for a source refused unread.
fn source_length(tokens: Option<usize>, bytes: usize) -> String {
    match tokens {
        Some(n) => format!("{n} tokens"),
        None => format!("{bytes} bytes"),
    }
}

impl TranslateError {
    /// An [`TranslateError::Io`] error about `path`.
    pub fn io(path: impl Into<PathBuf>, problem: impl ToString) -> Self {
        Self::Io {
            path: path.into(),
            problem: problem.to_string(),
        }
    }
}

/// [`TranslateError::Io`].
impl From<IoError> for TranslateError {
    fn from(e: IoError) -> Self {
        Self::Io {
            path: e.path,
            problem: e.message,
        }
    }
}
