//! Typed errors of the GGUF reader.

use thiserror::Error;

use super::GgmlType;

/// What can be wrong with a GGUF file. Offsets are byte offsets from the start of the file.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum GgufError {
    /// Not a GGUF file.
    #[error("not a GGUF file: magic {found:?} at offset 0, expected \"GGUF\"")]
    BadMagic {
        /// The first bytes.
        found: Vec<u8>,
    },
    /// A format version this reader does not know.
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    UnsupportedVersion(u32),
    /// The file ends inside something.
    #[error("truncated: {what} at offset {offset} needs {needed} bytes, {available} remain")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where.
        offset: u64,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },
    /// A malformed header entry (bad value type, invalid UTF-8, too many dimensions...).
    #[error("malformed {what} at offset {offset}: {reason}")]
    Malformed {
        /// The key, tensor or structure.
        what: String,
        /// Where.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A tensor type id ggml does not define.
    #[error(
        "tensor {tensor:?} (directory entry at offset {offset}): unknown ggml type id {type_id}"
    )]
    UnknownType {
        /// The tensor.
        tensor: String,
        /// Its directory entry.
        offset: u64,
        /// The type id.
        type_id: u32,
    },
    /// A ggml type this reader cannot dequantise.
    #[error("tensor {tensor:?}: type {ty} cannot be dequantised here (F32, F16, BF16, Q4_0, Q4_1 and Q8_0 can)")]
    UnsupportedType {
        /// The tensor.
        tensor: String,
        /// The type.
        ty: GgmlType,
    },
    /// A tensor whose data does not fit the file or its type.
    #[error("tensor {tensor:?}: data at offset {offset}: {reason}")]
    BadTensor {
        /// The tensor.
        tensor: String,
        /// Absolute offset of its data.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// No tensor of that name.
    #[error("no tensor named {0:?}")]
    NoTensor(String),
    /// A metadata key that is absent or of another type than needed.
    #[error("metadata {key:?}: {reason}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The file could not be read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
}

impl GgufError {
    /// A [`GgufError::Metadata`] about `key`.
    pub fn metadata(key: &str, reason: impl Into<String>) -> Self {
        Self::Metadata {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
