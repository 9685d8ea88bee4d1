//! Typed errors of the blocks.

use thiserror::Error;
use xfmr_attention::AttentionError;
use xfmr_position::PositionError;

/// What can be wrong with a block configuration or a weight import.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum BlockError {
    /// From the attention sublayers.
    #[error(transparent)]
    Attention(#[from] AttentionError),
    /// From the position encodings.
    #[error(transparent)]
    Position(#[from] PositionError),
    /// A configuration value out of its range (a zero width, a dropout probability outside
    /// `[0, 1)`, a norm ε that is not positive): the same variant, with the same fields, as
    /// every xfmr crate's error.
    #[error("invalid configuration: `{field}` = {value}: {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A state dict could not be read.
    #[error("cannot read state dict: {0}")]
    Read(String),
    /// A state-dict tensor of an element type that cannot be read as floats on its own.
    #[error("tensor `{name}` has element type {dtype}, which cannot be read as floats without its block scales (floats of 16 bits or more, integers and booleans can)")]
    UnsupportedDtype {
        /// The tensor's name.
        name: String,
        /// Its element type, as safetensors names it.
        dtype: String,
    },
    /// A state dict does not match the module.
    #[error("state dict does not match the module: {}", .0.summary())]
    Import(ImportReport),
}

impl From<xfmr_attention::InvalidConfig> for BlockError {
    fn from(e: xfmr_attention::InvalidConfig) -> Self {
        Self::InvalidConfig {
            field: e.field,
            value: e.value,
            expected: e.expected,
        }
    }
}

/// The mismatches between a state dict and a module, all listed at once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImportReport {
    /// Tensors the module needs that the state dict lacks, with the expected shapes.
    pub missing: Vec<(String, Vec<usize>)>,
    /// Tensors of the state dict (under the imported prefix) that the module does not use.
    pub unexpected: Vec<String>,
    /// Tensors present with the wrong shape: name, expected, found.
    pub wrong_shape: Vec<(String, Vec<usize>, Vec<usize>)>,
    /// Other problems (bias switches, unsupported options), one line each.
    pub other: Vec<String>,
}

impl ImportReport {
    /// Whether nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty()
            && self.unexpected.is_empty()
            && self.wrong_shape.is_empty()
            && self.other.is_empty()
    }

    /// One line naming every problem.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            let names: Vec<String> = self
                .missing
                .iter()
                .map(|(n, s)| format!("{n} {s:?}"))
                .collect();
            parts.push(format!("missing: {}", names.join(", ")));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!("unexpected: {}", self.unexpected.join(", ")));
        }
        if !self.wrong_shape.is_empty() {
            let names: Vec<String> = self
                .wrong_shape
                .iter()
                .map(|(n, e, f)| format!("{n} (expected {e:?}, found {f:?})"))
                .collect();
            parts.push(format!("wrong shape: {}", names.join(", ")));
        }
        parts.extend(self.other.iter().cloned());
        parts.join("; ")
    }
}
