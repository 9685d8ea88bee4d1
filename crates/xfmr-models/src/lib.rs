//! # xfmr-models
//!
//! Whole models on the xfmr blocks, generic over burn backends:
//!
//! - [`Transformer`]: the paper's encoder-decoder translation model, with the `base` and `big`
//!   presets, teacher-forced training ([`shift_right`], [`LabelSmoothedCrossEntropy`]: the
//!   label-smoothed loss every family trains with) and translation through the decoder's
//!   key/value cache.
//! - [`EncoderOnly`]: BERT-like (token + learned position + segment embeddings, embedding
//!   LayerNorm, post-norm GELU encoder), with pooling and MLM / classification heads, and
//!   [`hf`] import of Hugging Face BERT checkpoints.
//! - [`DecoderOnly`]: a GPT-like causal language model (pre-norm, tied output); inputs whose
//!   logits are too large for one device buffer through [`DecoderOnly::forward_chunks`],
//!   [`DecoderOnly::last_logits`] and [`DecoderOnly::token_log_probs`].
//! - [`generate`]: greedy, beam search (GNMT length penalty) and seeded sampling (temperature,
//!   top-k, top-p), batched, for any [`IncrementalDecoder`].
//! - [`ladder`]: batch shapes that compile once: batches padded to a ladder of lengths and
//!   row counts ([`ladder::LengthLadder`]), for the GPU backends; training and translation
//!   batch through it.
//! - [`checkpoint`]: save and load a model with its configuration, a directory published
//!   atomically with a size/hash manifest (through `xfmr-io`) and verified before it is decoded;
//!   a configuration mismatch is a typed error naming the field. Loading checks the
//!   configuration's sizes ([`limits`]) and every saved tensor's shape against the one the
//!   configuration implies before a parameter is allocated.
//!
//! ```
//! use burn::backend::NdArray;
//! use xfmr_models::{GenerationOptions, TransformerConfig};
//!
//! let device = Default::default();
//! let model = TransformerConfig::tiny(32).init::<NdArray>(&device).unwrap();
//! // Translate two sentences (ids 3.. are words; 0 pad, 1 start, 2 end).
//! let out = model
//!     .generate(&[vec![5, 6, 7], vec![8, 9]], 1, &GenerationOptions::greedy(10, 2, 0))
//!     .unwrap();
//! assert_eq!(out.hypotheses.len(), 2);
//! ```

#![warn(missing_docs)]

mod batch;
pub mod checkpoint;
mod decoder_only;
mod device;
mod encoder_only;
mod error;
pub mod generate;
pub mod hf;
pub mod ladder;
mod loss;
#[cfg(feature = "autodiff")]
mod loss_op;
mod record_shapes;
mod sizes;
mod transformer;

pub use batch::{framed, pad_rows, padded_ids, PadSide};
pub use decoder_only::{DecoderOnly, DecoderOnlyConfig, LmState};
pub use device::DEVICE_BUFFER_BYTES;
pub use encoder_only::{l2_normalize, EncoderOnly, EncoderOnlyConfig, MlmHead, Pooling};
pub use error::ModelError;
pub use generate::{
    BeamOptions, Generation, GenerationOptions, Hypothesis, IncrementalDecoder, SampleOptions,
    Strategy,
};
pub use loss::{
    shift_right, LabelSmoothedCrossEntropy, LabelSmoothedCrossEntropyConfig, SmoothedLoss,
    SmoothingMass,
};
pub use transformer::{AttentionMaps, Memory, Seq2SeqState, Transformer, TransformerConfig};
/// The largest sizes a model configuration may ask for, checked by each configuration's
/// `validate` before anything is allocated (`xfmr_blocks::limits`, re-exported).
pub use xfmr_blocks::limits;

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use device::{check_fits, Extent};

/// An integer tensor from host values.
pub(crate) fn int_tensor<B: Backend, const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// The most bytes of logits one vocabulary product may write: 64 MiB, half of
/// [`DEVICE_BUFFER_BYTES`] (128 MiB, WebGPU's default largest storage-buffer binding, which is
/// all that some adapters allow: lavapipe, Mesa's CPU Vulkan driver, among them). A larger
/// product there panics in burn's matmul autotune ("Memory page 0 doesn't exist"), or, where
/// only its result is too large, leaves stale memory in it. The vocabulary projections multiply
/// their rows in chunks within this (the other operand is the weight, which exists already);
/// the chunk size to give [`DecoderOnly::forward_chunks`].
pub const LOGITS_CHUNK_BYTES: usize = 64 << 20;

/// Rows of `[rows, width]` values of `elem_bytes` bytes each that fit in `max_bytes` (at
/// least one).
pub(crate) fn rows_within(width: usize, elem_bytes: usize, max_bytes: usize) -> usize {
    (max_bytes / (width * elem_bytes).max(1)).max(1)
}

/// Vocabulary size of [`vocab_logits`]'s projection.
pub(crate) fn vocab_of<B: Backend>(
    output: Option<&burn::nn::Linear<B>>,
    table: &xfmr_blocks::TokenEmbedding<B>,
) -> usize {
    match output {
        Some(linear) => linear.weight.dims()[1],
        None => table.weight.dims()[0],
    }
}

/// The vocabulary tables of a model: the embedding `table`, and `output`'s weight when the
/// projection is untied, as [`device::Extent`]s for [`device::check_fits`].
pub(crate) fn table_extents<B: Backend>(
    output: Option<&burn::nn::Linear<B>>,
    table: &xfmr_blocks::TokenEmbedding<B>,
) -> Vec<Extent> {
    let mut extents = vec![Extent::weight("token embedding", &table.weight.val())];
    if let Some(linear) = output {
        extents.push(Extent::weight("output projection", &linear.weight.val()));
    }
    extents
}

/// Vocabulary logits of `h` `[batch, seq, d_model]` → `[batch, seq, vocab]`: through
/// `output` when the model has an untied projection, else through the tied embedding `table`
/// (paper §3.4). The `batch · seq` rows are multiplied in chunks whose logits fit in
/// [`LOGITS_CHUNK_BYTES`], then concatenated. When the result or a table exceeds
/// [`DEVICE_BUFFER_BYTES`], the device is synchronised and a failure to hold them is
/// [`ModelError::TooLargeForDevice`] (see `device.rs`), never stale values.
pub(crate) fn vocab_logits<B: Backend>(
    output: Option<&burn::nn::Linear<B>>,
    table: &xfmr_blocks::TokenEmbedding<B>,
    h: Tensor<B, 3>,
) -> Result<Tensor<B, 3>, ModelError> {
    vocab_logits_within(output, table, h, LOGITS_CHUNK_BYTES)
}

/// [`vocab_logits`] with products of at most `max_bytes` of logits each (at least one row).
pub(crate) fn vocab_logits_within<B: Backend>(
    output: Option<&burn::nn::Linear<B>>,
    table: &xfmr_blocks::TokenEmbedding<B>,
    h: Tensor<B, 3>,
    max_bytes: usize,
) -> Result<Tensor<B, 3>, ModelError> {
    let device = h.device();
    let logits = project_rows(output, table, h, max_bytes);
    let mut extents = table_extents(output, table);
    extents.push(Extent::logits(&logits));
    check_fits::<B>(&device, extents)?;
    Ok(logits)
}

/// [`vocab_logits_within`] without the device check: for callers that bound the result
/// within [`DEVICE_BUFFER_BYTES`] and have checked the tables.
pub(crate) fn project_rows<B: Backend>(
    output: Option<&burn::nn::Linear<B>>,
    table: &xfmr_blocks::TokenEmbedding<B>,
    h: Tensor<B, 3>,
    max_bytes: usize,
) -> Tensor<B, 3> {
    let [batch, seq, d] = h.dims();
    let vocab = vocab_of(output, table);
    let rows = batch * seq;
    let step = rows_within(vocab, h.dtype().size(), max_bytes);
    // (B, T, d) -> (B·T, d): one 2-D product per chunk.
    let h = h.reshape([rows, d]);
    let project = |h: Tensor<B, 2>| -> Tensor<B, 2> {
        match output {
            Some(linear) => xfmr_attention::linear(linear, h),
            None => {
                let n = h.dims()[0];
                table.logits(h.reshape([1, n, d])).reshape([n, vocab])
            }
        }
    };
    let logits = if rows <= step {
        project(h)
    } else {
        let chunks = (0..rows)
            .step_by(step)
            .map(|start| project(h.clone().narrow(0, start, step.min(rows - start))))
            .collect();
        Tensor::cat(chunks, 0)
    };
    logits.reshape([batch, seq, vocab])
}

pub(crate) fn check_pad_id(pad_id: u32, vocab: usize) -> Result<(), ModelError> {
    if pad_id as usize >= vocab {
        return Err(ModelError::InvalidConfig {
            field: "pad_id",
            value: pad_id.to_string(),
            expected: "an id inside the vocabulary (both vocabularies for a Transformer)",
        });
    }
    Ok(())
}

/// Checks that every id is below `vocab`: the one check of the decoding paths that take ids
/// from outside (prompts, fed tokens), here and in `xfmr-llm`'s quantised model.
///
/// # Errors
/// [`ModelError::InvalidInput`] naming the first id outside: "`{what}` id 9 is outside the
/// vocabulary of 8".
pub fn check_vocabulary<'a>(
    ids: impl IntoIterator<Item = &'a u32>,
    vocab: usize,
    what: &str,
) -> Result<(), ModelError> {
    match ids.into_iter().find(|&&id| id as usize >= vocab) {
        Some(id) => Err(ModelError::InvalidInput(format!(
            "{what} id {id} is outside the vocabulary of {vocab}"
        ))),
        None => Ok(()),
    }
}

/// Every id of `rows` must be below `vocab`, and there must be at least one row.
pub(crate) fn check_ids(what: &str, rows: &[Vec<u32>], vocab: usize) -> Result<(), ModelError> {
    if rows.is_empty() {
        return Err(ModelError::InvalidInput(format!("no {what} sequences")));
    }
    for (i, row) in rows.iter().enumerate() {
        if let Some(&id) = row.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::InvalidInput(format!(
                "{what} {i} holds id {id}, outside the vocabulary of {vocab}"
            )));
        }
    }
    Ok(())
}
