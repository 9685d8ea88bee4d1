//! Typed errors of the positional encodings.

use thiserror::Error;

/// What can be wrong with a positional-encoding configuration or request.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum PositionError {
    /// A configuration value out of its range (a zero width, an odd rotary width, a base not
    /// above 1, a dropout probability outside `[0, 1)`): the same variant, with the same
    /// fields, as every xfmr crate's error.
    #[error("invalid configuration: `{field}` = {value}: {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// Positions requested beyond a fixed table.
    #[error(
        "positions {offset}..{end} exceed the table's maximum length {max_len} \
         (sequence length {seq_len} at offset {offset})",
        end = offset + seq_len
    )]
    SequenceTooLong {
        /// Requested sequence length.
        seq_len: usize,
        /// Position of its first element.
        offset: usize,
        /// Rows in the table.
        max_len: usize,
    },
    /// A pretrained table of the wrong shape.
    #[error("position table has shape {actual:?}, expected [max_len, {d_model}]")]
    TableShape {
        /// Shape given.
        actual: Vec<usize>,
        /// Expected width.
        d_model: usize,
    },
    /// Adding positions to tokens needs equal widths.
    #[error("cannot add positions of width {d_position} to tokens of width {d_model}: use equal widths or concatenation")]
    WidthMismatch {
        /// Token width.
        d_model: usize,
        /// Position width.
        d_position: usize,
    },
}

impl From<xfmr_attention::InvalidConfig> for PositionError {
    fn from(e: xfmr_attention::InvalidConfig) -> Self {
        Self::InvalidConfig {
            field: e.field,
            value: e.value,
            expected: e.expected,
        }
    }
}
