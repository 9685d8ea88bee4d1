//! The size checks every model configuration shares: each size against its bound
//! ([`xfmr_blocks::limits`]), then the model's total values, with checked arithmetic, before
//! anything is allocated. The families' `validate` methods call [`check_sizes`].

use xfmr_attention::InvalidConfig;
use xfmr_blocks::limits::{
    layer_values_bound, MAX_LAYERS, MAX_LEN, MAX_MODEL_VALUES, MAX_TABLE_VALUES, MAX_VOCAB,
};
use xfmr_blocks::{BlockError, LayerConfig, PositionEncoding};

use crate::ModelError;

/// What a family's configuration holds beyond its [`LayerConfig`], for [`check_sizes`].
pub(crate) struct Sizes<'a> {
    /// The layer configuration (its fields are reported as `layer.<field>`).
    pub layer: &'a LayerConfig,
    /// Where positions enter (the model's `positions`).
    pub positions: &'a PositionEncoding,
    /// `max_len`.
    pub max_len: usize,
    /// Each stack's layer count, by field name.
    pub stacks: &'a [(&'static str, usize)],
    /// Each vocabulary-sized count (token vocabularies, segment types, classes), by field
    /// name, with whether zero is allowed (no such table).
    pub vocabularies: &'a [(&'static str, usize, bool)],
    /// The rows of every `d_model`-wide table proportional to a vocabulary (embeddings, an
    /// untied output projection; an MLM bias or a classifier counted as such a table, an upper
    /// bound).
    pub table_rows: &'a [usize],
    /// Square `d_model × d_model` matrices outside the stacks (a pooler, an MLM head).
    pub extra_squares: u64,
}

/// Checks a configuration's sizes: the layer's ([`LayerConfig::validate`], as
/// `layer.d_model`...), its dropout probabilities, norm ε and RoPE base, every stack's layer count (1 to
/// [`MAX_LAYERS`]), every vocabulary (1 to [`MAX_VOCAB`]), `max_len` (1 to [`MAX_LEN`]), a
/// sinusoidal table (`max_len × d_model` ≤ [`MAX_TABLE_VALUES`]) and the model's values in
/// all (≤ [`MAX_MODEL_VALUES`]).
///
/// # Errors
/// [`ModelError::InvalidConfig`] naming the first field out of range (dotted for the layer's:
/// `layer.d_model`) and its value; `model size` for a model too large in all.
pub(crate) fn check_sizes(sizes: &Sizes) -> Result<(), ModelError> {
    let layer = sizes.layer;
    layer.validate().map_err(layer_error)?;
    InvalidConfig::dropout("layer.dropout", layer.dropout)?;
    InvalidConfig::dropout("layer.attention_dropout", layer.attention_dropout)?;
    InvalidConfig::dropout("layer.ffn_dropout", layer.ffn_dropout)?;
    InvalidConfig::check(
        layer.norm_eps > 0.0 && layer.norm_eps.is_finite(),
        "layer.norm_eps",
        layer.norm_eps,
        "a positive, finite number",
    )?;
    if let PositionEncoding::Rotary { theta, .. } = *sizes.positions {
        InvalidConfig::check(
            theta > 1.0 && theta.is_finite(),
            "positions.theta",
            theta,
            "a finite frequency base greater than 1",
        )?;
    }
    for &(field, n) in sizes.stacks {
        InvalidConfig::positive(field, n)?;
        InvalidConfig::check(
            n <= MAX_LAYERS,
            field,
            n,
            "at most 1024 layers (xfmr_blocks::limits::MAX_LAYERS)",
        )?;
    }
    for &(field, n, zero_allowed) in sizes.vocabularies {
        if !zero_allowed {
            InvalidConfig::positive(field, n)?;
        }
        InvalidConfig::check(
            n <= MAX_VOCAB,
            field,
            n,
            "at most 16777216 (xfmr_blocks::limits::MAX_VOCAB)",
        )?;
    }
    InvalidConfig::positive("max_len", sizes.max_len)?;
    InvalidConfig::check(
        sizes.max_len <= MAX_LEN,
        "max_len",
        sizes.max_len,
        "at most 1048576 positions (xfmr_blocks::limits::MAX_LEN)",
    )?;
    // Every factor is bounded now (d_model ≤ 2^16, d_ff ≤ 2^18, layers ≤ 2^10, vocabularies
    // ≤ 2^24, max_len ≤ 2^20): the products below stay far inside a u64, and are checked all
    // the same.
    let d = layer.d_model as u64;
    let position_rows = sizes.max_len as u64;
    let positions = position_rows.checked_mul(d);
    if *sizes.positions == PositionEncoding::Sinusoidal {
        let table = positions.filter(|&n| n <= MAX_TABLE_VALUES);
        if table.is_none() {
            return Err(ModelError::InvalidConfig {
                field: "max_len",
                value: format!(
                    "{} (a sinusoidal table of {} × layer.d_model {} values)",
                    sizes.max_len, sizes.max_len, layer.d_model
                ),
                expected: "max_len × layer.d_model at most 2^28 values \
                           (xfmr_blocks::limits::MAX_TABLE_VALUES)",
            });
        }
    }
    let layers: u64 = sizes.stacks.iter().map(|&(_, n)| n as u64).sum();
    let rows = sizes
        .table_rows
        .iter()
        .try_fold(0u64, |sum, &n| sum.checked_add(n as u64));
    let total = layer_values_bound(layer.d_model, layer.d_ff)
        .and_then(|per_layer| per_layer.checked_mul(layers))
        .and_then(|n| n.checked_add(rows?.checked_mul(d)?))
        .and_then(|n| n.checked_add(positions?))
        .and_then(|n| n.checked_add(sizes.extra_squares.checked_mul(d.checked_mul(d)?)?));
    match total {
        Some(n) if n <= MAX_MODEL_VALUES => Ok(()),
        total => Err(ModelError::InvalidConfig {
            field: "model size",
            value: format!(
                "{} values (layer.d_model {}, layer.d_ff {}, {layers} layers, {} vocabulary \
                 rows, max_len {})",
                total.map_or("more than 2^64".to_string(), |n| format!("{n}")),
                layer.d_model,
                layer.d_ff,
                rows.map_or("more than 2^64".to_string(), |n| format!("{n}")),
                sizes.max_len,
            ),
            expected: "a model of at most 2^32 parameters and fixed table values \
                       (xfmr_blocks::limits::MAX_MODEL_VALUES)",
        }),
    }
}

/// A layer's [`BlockError::InvalidConfig`] as the model's, its field under `layer.`.
pub(crate) fn layer_error(e: BlockError) -> ModelError {
    match e {
        BlockError::InvalidConfig {
            field,
            value,
            expected,
        } => ModelError::InvalidConfig {
            field: match field {
                "d_model" => "layer.d_model",
                "d_ff" => "layer.d_ff",
                "n_heads" => "layer.n_heads",
                "n_kv_heads" => "layer.n_kv_heads",
                other => other,
            },
            value: xfmr_io::compact_numbers(&value),
            expected,
        },
        other => ModelError::Block(other),
    }
}
