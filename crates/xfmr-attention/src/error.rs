//! Typed errors for configuration, masks, caches and weight import.

use thiserror::Error;

/// Everything that can be wrong with an attention configuration or its inputs, with the offending
/// values in the message.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum AttentionError {
    /// A configuration value out of its range (a zero width, a dropout probability outside
    /// `[0, 1)`, ...): the same variant, with the same fields, as every xfmr crate's error.
    #[error("invalid configuration: `{field}` = {value}: {expected}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// `d_model` does not split evenly into `n_heads` heads.
    #[error("d_model ({d_model}) must be divisible by n_heads ({n_heads})")]
    HeadsDoNotDivide {
        /// Model width.
        d_model: usize,
        /// Number of query heads.
        n_heads: usize,
    },
    /// Grouped-query attention needs `n_heads` to be a multiple of `n_kv_heads`.
    #[error("n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")]
    KvHeadsDoNotDivide {
        /// Number of query heads.
        n_heads: usize,
        /// Number of key/value heads.
        n_kv_heads: usize,
    },
    /// A mask (or bias) does not broadcast to the attention scores' shape.
    #[error(
        "{what} of shape {actual:?} does not broadcast to the attention scores \
         [batch, heads, seq_q, seq_k] = {expected:?} (each dimension must match or be 1)"
    )]
    MaskShape {
        /// `"mask"` or `"bias"`.
        what: &'static str,
        /// Shape given.
        actual: Vec<usize>,
        /// Shape of the scores.
        expected: Vec<usize>,
    },
    /// A sequence length is larger than the padded length it should fit in.
    #[error("length {length} of sequence {index} exceeds the padded length {seq_len}")]
    LengthTooLong {
        /// Which sequence of the batch.
        index: usize,
        /// Its length.
        length: usize,
        /// The padded length.
        seq_len: usize,
    },
    /// An input tensor has the wrong width or batch size.
    #[error("{what} has shape {actual:?}, expected {expected}")]
    InputShape {
        /// Which input.
        what: &'static str,
        /// Shape given.
        actual: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },
    /// A weight to import has the wrong shape.
    #[error("weight `{name}` has shape {actual:?}, expected {expected:?}")]
    WeightShape {
        /// Name of the tensor.
        name: String,
        /// Shape given.
        actual: Vec<usize>,
        /// Shape expected.
        expected: Vec<usize>,
    },
    /// A bias was given for a projection configured without one, or is missing for one
    /// configured with one.
    #[error("weight `{name}`: bias {} but the module is configured {}",
        if *.given { "given" } else { "missing" },
        if *.given { "without a bias" } else { "with a bias" })]
    BiasMismatch {
        /// Name of the projection.
        name: String,
        /// Whether the checkpoint had a bias.
        given: bool,
    },
    /// A rotation of queries and keys (RoPE) was given for cross-attention, where queries and keys
    /// come from different sequences whose positions do not relate.
    #[error("rotary position embeddings apply to self-attention only, not cross-attention")]
    RotaryCrossAttention,
    /// Cross-attention was given to a self-attention cache.
    #[error(
        "a key/value cache serves self-attention only: for cross-attention, project the memory \
         once with `project_memory` and attend with `MhaInput::cross_projected`"
    )]
    CachedCrossAttention,
    /// Truncating a cache to more entries than it holds.
    #[error("cannot truncate a key/value cache of length {len} to {requested}")]
    CacheTruncate {
        /// Current length.
        len: usize,
        /// Requested length.
        requested: usize,
    },
}

/// A configuration value out of its range, named: what every xfmr crate's `InvalidConfig`
/// error variant holds (`AttentionError::InvalidConfig`, `PositionError::InvalidConfig`,
/// `BlockError::InvalidConfig`, `ModelError::InvalidConfig`, ...), each converting from this.
/// The checks every layer shares are its constructors, so that a rule (what a dropout
/// probability may be) is written once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    /// The field.
    pub field: &'static str,
    /// Its value, as written.
    pub value: String,
    /// What is accepted.
    pub expected: &'static str,
}

impl InvalidConfig {
    /// `Ok` when `ok`, else the error naming `field`, its `value` and what is `expected`.
    pub fn check(
        ok: bool,
        field: &'static str,
        value: impl std::fmt::Display,
        expected: &'static str,
    ) -> Result<(), Self> {
        if ok {
            Ok(())
        } else {
            Err(Self {
                field,
                value: value.to_string(),
                expected,
            })
        }
    }

    /// A size that must be positive.
    pub fn positive(field: &'static str, value: usize) -> Result<(), Self> {
        Self::check(value > 0, field, value, "must be positive")
    }

    /// A dropout probability: in `[0, 1)` (burn's own constructor panics outside it; a
    /// configuration read from a file must not).
    pub fn dropout(field: &'static str, prob: f64) -> Result<(), Self> {
        Self::check(
            (0.0..1.0).contains(&prob),
            field,
            prob,
            "a dropout probability in [0, 1)",
        )
    }
}

impl From<InvalidConfig> for AttentionError {
    fn from(e: InvalidConfig) -> Self {
        Self::InvalidConfig {
            field: e.field,
            value: e.value,
            expected: e.expected,
        }
    }
}
