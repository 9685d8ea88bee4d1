//! Typed errors of the positional encodings.

use thiserror::Error;

/// What can be wrong with a positional-encoding configuration or request.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum PositionError {
    /// A dimension that must be positive is zero.
    #[error("`{name}` must be positive, got 0")]
    ZeroDim {
        /// Which dimension.
        name: &'static str,
    },
    /// A dimension that must be even is odd (rotary pairs).
    #[error("`{name}` must be even, got {value}")]
    OddDim {
        /// Which dimension.
        name: &'static str,
        /// Its value.
        value: usize,
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
    /// Dropout probability outside `[0, 1)`.
    #[error("dropout probability must be in [0, 1), got {prob}")]
    InvalidDropout {
        /// The rejected probability.
        prob: f64,
    },
    /// A base that must be greater than 1.
    #[error("base must be > 1, got {base}")]
    InvalidBase {
        /// The rejected base.
        base: f64,
    },
}
