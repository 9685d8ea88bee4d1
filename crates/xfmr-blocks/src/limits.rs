//! The largest sizes a model configuration may ask for: the one place they are stated.
//!
//! A configuration is outside data (a checkpoint's `config.json`, a run's specification, a
//! Hugging Face `config.json`), and every size in it becomes an allocation: a `d_model` of 10¹²
//! must be a typed error naming the field, not a process aborted by the allocator. The bounds
//! are generous for real models (PaLM 540B: `d_model` 18,432, `d_ff` 73,728, 118 layers, a
//! 256k vocabulary; Llama 3.1 405B: 126 layers, 128k positions) and small enough that the size
//! arithmetic below cannot overflow a `u64`:
//!
//! | field | bound |
//! |---|---|
//! | `d_model` | [`MAX_D_MODEL`] = 65,536 |
//! | `d_ff` | [`MAX_D_FF`] = 262,144 |
//! | `n_heads`, `n_kv_heads` | at most `d_model` (a head is at least one feature wide) |
//! | layers of one stack | [`MAX_LAYERS`] = 1,024 |
//! | vocabularies, classes | [`MAX_VOCAB`] = 2²⁴ = 16,777,216 |
//! | `max_len` | [`MAX_LEN`] = 2²⁰ = 1,048,576 |
//! | a fixed (not saved) table: `max_len × d_model` sinusoids | [`MAX_TABLE_VALUES`] = 2²⁸ |
//! | every parameter and fixed table of a model together | [`MAX_MODEL_VALUES`] = 2³² |
//!
//! [`LayerConfig::validate`](crate::LayerConfig::validate) checks the layer's sizes; each
//! model configuration's `validate` (`xfmr_models`) checks its own and the totals, with
//! [`layer_values_bound`] and checked arithmetic, before anything is allocated.

/// The largest model width `d_model`.
pub const MAX_D_MODEL: usize = 1 << 16;
/// The largest feed-forward inner width `d_ff`.
pub const MAX_D_FF: usize = 1 << 18;
/// The most layers in one stack (an encoder, a decoder or a causal stack).
pub const MAX_LAYERS: usize = 1 << 10;
/// The largest vocabulary (token, segment or class count).
pub const MAX_VOCAB: usize = 1 << 24;
/// The most positions (`max_len`: rows of a position table, the longest sequence).
pub const MAX_LEN: usize = 1 << 20;
/// The most values in a table built when the model is built and never saved (the sinusoidal
/// position table, `max_len × d_model`): 2²⁸ values, 1 GiB of `f32`.
pub const MAX_TABLE_VALUES: u64 = 1 << 28;
/// The most values (parameters and fixed tables) in one model: 2³² values, 16 GiB of `f32`
/// (the paper's big model has 2.1·10⁸ parameters, BERT-large 3.4·10⁸, GPT-2 XL 1.6·10⁹).
pub const MAX_MODEL_VALUES: u64 = 1 << 32;

/// The values of one layer at most, for a layer of width `d_model` and feed-forward width
/// `d_ff`: four attention projections with biases for self-attention and four for
/// cross-attention, three feed-forward matrices (SwiGLU's) with biases, three norms. An upper
/// bound for every layer kind (encoder, decoder, causal), with checked arithmetic: `None` when
/// it overflows a `u64` (never, within [`MAX_D_MODEL`] and [`MAX_D_FF`]).
pub fn layer_values_bound(d_model: usize, d_ff: usize) -> Option<u64> {
    let d = d_model as u64;
    let f = d_ff as u64;
    // 8 projections d×d + 8 biases d; 3 matrices d×f + biases 2f + d; 3 norms of 2d.
    let attention = d
        .checked_mul(d)?
        .checked_mul(8)?
        .checked_add(d.checked_mul(8)?)?;
    let ffn = d
        .checked_mul(f)?
        .checked_mul(3)?
        .checked_add(f.checked_mul(2)?)?
        .checked_add(d)?;
    attention.checked_add(ffn)?.checked_add(d.checked_mul(6)?)
}
