//! The language models of `lm` and `mlm` runs put to use: continuing text with the causal
//! model ([`CausalLm`](crate::CausalLm)'s [`DecoderOnly`]), filling in masks with the masked
//! one ([`MaskedLm`](crate::MaskedLm)'s [`EncoderOnly`]), and the token ids each reads as it
//! read them in training. (A translation run's model translates through
//! `xfmr_translate::translate`.)

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use thiserror::Error;
use xfmr_models::framed;
use xfmr_models::{DecoderOnly, EncoderOnly, GenerationOptions, Strategy};
use xfmr_translate::tokenizer::{SubwordTokenizer, MASK};

use crate::trainer::TrainError;

/// `[bos] + text`: a prompt of the causal model, which learnt to continue what follows the
/// start token.
///
/// # Errors
/// [`TrainError::Tokenizer`] if the text cannot be encoded.
pub fn prompt_ids(tokenizer: &SubwordTokenizer, text: &str) -> Result<Vec<u32>, TrainError> {
    Ok(framed(
        Some(tokenizer.bos_id()),
        &tokenizer.encode(text)?,
        None,
    ))
}

/// `[bos] + text + [eos]`: what the masked model's encoder read in training (BERT's
/// `[CLS] … [SEP]`).
///
/// # Errors
/// [`TrainError::Tokenizer`] if the text cannot be encoded.
pub fn encoder_ids(tokenizer: &SubwordTokenizer, text: &str) -> Result<Vec<u32>, TrainError> {
    let (bos, eos) = (tokenizer.bos_id(), tokenizer.eos_id());
    Ok(framed(Some(bos), &tokenizer.encode(text)?, Some(eos)))
}

/// Continues each prompt with `strategy`, at most `max_tokens` tokens (stopping at the end
/// token), as one left-padded batch; returns the continuations' text (without the prompts).
///
/// # Errors
/// Encoding or decoding; the model's errors (an invalid strategy, a context longer than a
/// learned position table).
pub fn continue_text<B: Backend>(
    model: &DecoderOnly<B>,
    tokenizer: &SubwordTokenizer,
    prompts: &[&str],
    strategy: Strategy,
    max_tokens: usize,
) -> Result<Vec<String>, TrainError> {
    let ids = prompts
        .iter()
        .map(|p| prompt_ids(tokenizer, p))
        .collect::<Result<Vec<_>, _>>()?;
    let options = GenerationOptions::greedy(max_tokens, tokenizer.eos_id(), tokenizer.pad_id())
        .with_strategy(strategy);
    let out = model.generate(&ids, &options)?;
    out.best_tokens()
        .iter()
        .map(|t| Ok(tokenizer.decode(t)?))
        .collect()
}

/// One candidate for a masked position.
#[derive(Debug, Clone, PartialEq)]
pub struct Filler {
    /// Its token id.
    pub id: u32,
    /// Its subword piece (empty for an id without one).
    pub piece: String,
    /// Its probability at the position (the softmax of the masked model's logits).
    pub probability: f32,
}

/// Why masks cannot be filled in.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FillMaskError {
    /// The vocabulary has no mask token: not an `mlm` run's.
    #[error("the run's vocabulary has no {} token", MASK)]
    NoMaskToken,
    /// The text holds no mask token.
    #[error("{text:?} has no {} to fill in", MASK)]
    NoMask {
        /// The text.
        text: String,
    },
    /// Encoding the text, or the model.
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// The `k` most probable tokens for each [`MASK`] of `text`, in the order of the masks, most
/// probable first: the masked model reads `[bos] + text + [eos]` ([`encoder_ids`]) and its MLM
/// head's softmax ranks the vocabulary at each masked position.
///
/// # Errors
/// [`FillMaskError::NoMaskToken`] for a vocabulary without the mask token,
/// [`FillMaskError::NoMask`] for a text without one; encoding and the model's errors (a text
/// longer than the position table).
///
/// # Panics
/// If the model has no MLM head (`EncoderOnlyConfig::mlm_head`; an `mlm` run's has).
pub fn fill_mask<B: Backend>(
    model: &EncoderOnly<B>,
    tokenizer: &SubwordTokenizer,
    text: &str,
    k: usize,
    device: &B::Device,
) -> Result<Vec<Vec<Filler>>, FillMaskError> {
    let mask = tokenizer.mask_id().ok_or(FillMaskError::NoMaskToken)?;
    let ids = encoder_ids(tokenizer, text)?;
    let positions: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == mask).collect();
    if positions.is_empty() {
        return Err(FillMaskError::NoMask { text: text.into() });
    }
    let n = ids.len();
    let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), device);
    let hidden = model.forward(ids, None, None).map_err(TrainError::from)?;
    let logits = model.mlm_logits(hidden).map_err(TrainError::from)?;
    let vocab = logits.dims()[2];
    let probs: Vec<f32> = softmax(logits.reshape([n, vocab]), 1)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32 data after the conversion");
    Ok(positions
        .iter()
        .map(|&i| {
            let row = &probs[i * vocab..(i + 1) * vocab];
            let mut ranked: Vec<(u32, f32)> = (0u32..).zip(row.iter().copied()).collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            ranked
                .into_iter()
                .take(k)
                .map(|(id, probability)| Filler {
                    id,
                    piece: tokenizer.piece(id).unwrap_or_default(),
                    probability,
                })
                .collect()
        })
        .collect())
}
