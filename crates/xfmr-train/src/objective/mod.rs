//! Training objectives: what a batch of examples costs a model. The [`Trainer`](crate::Trainer)
//! trains any model through the [`Objective`] trait (in the spirit of burn-train's
//! `TrainStep`/`ValidStep`: a batch in, a loss and token counts out); three are provided:
//!
//! | objective | model | example | predicts |
//! |---|---|---|---|
//! | [`Translation`] | the encoder-decoder [`Transformer`](xfmr_models::Transformer) | a source/target pair ([`Example`]) | each target token from the source and the targets before it (teacher forcing) |
//! | [`CausalLm`] | the GPT-like [`DecoderOnly`](xfmr_models::DecoderOnly) | a token sequence | each token from the ones before it |
//! | [`MaskedLm`] | the BERT-like [`EncoderOnly`](xfmr_models::EncoderOnly) with its MLM head | a token sequence | the tokens hidden by BERT's 15% / 80-10-10 masking |
//!
//! All three minimise xfmr-models' label-smoothed cross-entropy
//! ([`LabelSmoothedCrossEntropy`](xfmr_models::LabelSmoothedCrossEntropy)) over the tokens they
//! predict, padding left out of the average and of the smoothing mass.
//!
//! **Randomness.** An objective that draws (masking) draws from a `u64` the trainer derives from
//! the run's seed, the step and the example's index in the training set: a resumed run draws what
//! an uninterrupted one would, and data-parallel replicas draw for their rows what a single
//! process would.

use std::fmt::Debug;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor};
use serde::de::DeserializeOwned;
use serde::Serialize;
use xfmr_models::checkpoint::ModelConfig;
use xfmr_models::ladder::{fill, BatchShape};
use xfmr_models::{LabelSmoothedCrossEntropyConfig, SmoothedLoss};

use crate::TrainError;

mod lm;
mod mlm;
mod translation;

pub use lm::CausalLm;
pub use mlm::{mask_tokens, MaskedLm, Masking};
pub use translation::{encode_pairs, Example, Translation, TranslationBatch};

/// The model an objective trains, on backend `B`.
pub type ModelOf<O, B> = <<O as Objective>::Config as ModelConfig>::Model<B>;

/// A training objective: the model it trains and the loss of a batch of its examples.
///
/// The objective is part of a run's configuration: it is saved in every checkpoint
/// (`trainer.json`) and a resumed run uses the saved one.
pub trait Objective: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The configuration of the model trained (what checkpoints store beside the weights).
    type Config: ModelConfig + Clone + Debug + Send + Sync;
    /// One training example.
    type Example: Clone + Debug + Send + Sync;

    /// The model's configuration.
    fn model(&self) -> &Self::Config;

    /// The model width (the learning-rate schedule's `d_model`).
    fn d_model(&self) -> usize;

    /// Checks the objective's own options.
    ///
    /// # Errors
    /// [`TrainError::InvalidConfig`] naming the option.
    fn check(&self) -> Result<(), TrainError>;

    /// Checks one example; `Err` says what is wrong (e.g. `"id 77 ≥ vocabulary 40"`).
    ///
    /// # Errors
    /// What is wrong with the example.
    fn check_example(&self, example: &Self::Example) -> Result<(), String>;

    /// The example's padded lengths, `(input, output)` tokens, special tokens included: what
    /// token-count batching ([`token_batches`](crate::data::token_batches)) groups by.
    fn lengths(&self, example: &Self::Example) -> (usize, usize);

    /// How many tokens the example predicts with `draw` (the loss's denominator; the same
    /// count [`Objective::loss`] reports for it).
    fn targets(&self, example: &Self::Example, draw: u64) -> usize;

    /// The longest sequence the model's positions hold (a learned table's rows; `None`: no
    /// bound), which caps a [`LengthLadder`](xfmr_models::ladder::LengthLadder)'s padded length.
    /// Default: `None`.
    fn max_positions(&self) -> Option<usize> {
        None
    }

    /// The label smoothing ε of the objective's loss.
    fn label_smoothing(&self) -> f64;

    /// The padding id: targets equal to it are not predicted.
    fn pad_id(&self) -> u32;

    /// What `model` predicts for `batch` (one draw per example, see the module docs) and the
    /// targets it is scored against, padded to `shape` (every sequence to `shape.len` tokens,
    /// and rows that predict nothing up to `shape.rows`; see [`xfmr_models::ladder`]) or, with
    /// `None`, to the batch's longest sequence. Padding does not change the predictions of
    /// real targets.
    ///
    /// # Errors
    /// A sequence longer than a learned position table.
    fn outputs<B: Backend>(
        &self,
        model: &ModelOf<Self, B>,
        batch: &[&Self::Example],
        draws: &[u64],
        shape: Option<BatchShape>,
        device: &B::Device,
    ) -> Result<Outputs<B>, TrainError>;

    /// The loss of `model` on `batch`: the label-smoothed cross-entropy of
    /// [`Objective::outputs`] with [`Objective::label_smoothing`], padding out of the average
    /// and of the smoothing mass. Padding does not change the loss.
    ///
    /// # Errors
    /// As [`Objective::outputs`].
    fn loss<B: Backend>(
        &self,
        model: &ModelOf<Self, B>,
        batch: &[&Self::Example],
        draws: &[u64],
        shape: Option<BatchShape>,
        device: &B::Device,
    ) -> Result<BatchLoss<B>, TrainError> {
        let out = self.outputs(model, batch, draws, shape, device)?;
        Ok(BatchLoss {
            loss: smoothed_loss(
                out.logits,
                out.targets,
                self.pad_id(),
                self.label_smoothing(),
            )?,
            input_tokens: out.input_tokens,
        })
    }
}

/// What a model predicts for one batch, and the targets it is scored against.
#[derive(Debug, Clone)]
pub struct Outputs<B: Backend> {
    /// Logits, `[batch, seq, vocab]`; [`MaskedLm`]'s are `[1, chosen, vocab]`, the chosen
    /// positions only, in batch order.
    pub logits: Tensor<B, 3>,
    /// Target ids, `[batch, seq]` (`[1, chosen]` for [`MaskedLm`]); the padding id where nothing
    /// is predicted.
    pub targets: Tensor<B, 2, Int>,
    /// Non-padding input tokens read (the source side for translation).
    pub input_tokens: usize,
}

impl<B: Backend> Outputs<B> {
    /// How many targets that are not `pad` the logits rank first: the numerator of token accuracy.
    pub fn correct(&self, pad: u32) -> usize {
        let [batch, seq, _] = self.logits.dims();
        let predicted = self.logits.clone().argmax(2).reshape([batch, seq]);
        let real = self.targets.clone().not_equal_elem(pad as i64);
        let hits = predicted.equal(self.targets.clone()).int() * real.int();
        hits.sum().into_scalar().elem::<i64>() as usize
    }
}

/// The loss of one batch.
#[derive(Debug, Clone)]
pub struct BatchLoss<B: Backend> {
    /// The label-smoothed loss and the negative log-likelihood, averaged over the predicted
    /// tokens, and their count.
    pub loss: SmoothedLoss<B>,
    /// Non-padding input tokens read (the source side for translation).
    pub input_tokens: usize,
}

/// The loss every objective minimises: the label-smoothed cross-entropy with `epsilon`,
/// padding out of the average and of the smoothing mass.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`; `targets`: `[batch, seq]`
pub(crate) fn smoothed_loss<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    pad: u32,
    epsilon: f64,
) -> Result<SmoothedLoss<B>, TrainError> {
    let loss = LabelSmoothedCrossEntropyConfig::new(pad)
        .with_epsilon(epsilon)
        .init()?;
    Ok(loss.forward(logits, targets))
}

/// Checks that every id is below `vocab` and none is the padding id `pad` (the loss would not
/// count it, so its weight would be wrong).
pub(crate) fn check_ids<'a>(
    ids: impl IntoIterator<Item = &'a u32>,
    vocab: usize,
    pad: u32,
) -> Result<(), String> {
    match ids.into_iter().find(|&&t| t as usize >= vocab || t == pad) {
        Some(&id) if id == pad => Err(format!("id {id} is the padding id")),
        Some(id) => Err(format!("id {id} ≥ vocabulary {vocab}")),
        None => Ok(()),
    }
}

/// Checks that the special id `field` is inside the vocabulary and is not the padding id.
/// The model's padding id lies in the vocabulary.
pub(crate) fn check_pad(pad: u32, vocab: usize) -> Result<(), TrainError> {
    if (pad as usize) < vocab {
        return Ok(());
    }
    Err(TrainError::InvalidConfig {
        field: "model.pad_id",
        value: pad.to_string(),
        expected: "below the vocabulary size",
    })
}

pub(crate) fn check_special(
    field: &'static str,
    id: u32,
    vocab: usize,
    pad: u32,
) -> Result<(), TrainError> {
    let expected = if id as usize >= vocab {
        "below the vocabulary size"
    } else if id == pad {
        "not the padding id (padding is never predicted)"
    } else {
        return Ok(());
    };
    Err(TrainError::InvalidConfig {
        field,
        value: id.to_string(),
        expected,
    })
}

/// Checks that a sequence of `len` tokens fits a learned position table of `max_len` rows
/// (other position schemes have no bound).
pub(crate) fn check_length(
    len: usize,
    positions: &xfmr_blocks::PositionEncoding,
    max_len: usize,
) -> Result<(), String> {
    if matches!(positions, xfmr_blocks::PositionEncoding::Learned) && len > max_len {
        Err(format!(
            "{len} tokens (special ones included) exceed the model's learned position table of \
             {max_len}"
        ))
    } else {
        Ok(())
    }
}

/// The rows a learned position table of `max_len` bounds (see [`Objective::max_positions`]).
pub(crate) fn position_limit(
    positions: &xfmr_blocks::PositionEncoding,
    max_len: usize,
) -> Option<usize> {
    matches!(positions, xfmr_blocks::PositionEncoding::Learned).then_some(max_len)
}

/// Checks a label smoothing ε.
pub(crate) fn check_smoothing(epsilon: f64) -> Result<(), TrainError> {
    if (0.0..1.0).contains(&epsilon) {
        Ok(())
    } else {
        Err(TrainError::InvalidConfig {
            field: "label_smoothing",
            value: epsilon.to_string(),
            expected: "in [0, 1)",
        })
    }
}

/// `rows` id sequences right-padded with `pad` into a `[rows, longest]` tensor
/// ([`xfmr_models::padded_ids`]); with a `shape`, first padded to `shape.len` tokens and
/// completed with `filler` rows up to `shape.rows` (see [`xfmr_models::ladder`]).
pub(crate) fn padded<B: Backend>(
    mut rows: Vec<Vec<u32>>,
    pad: u32,
    filler: &[u32],
    shape: Option<BatchShape>,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    fill(&mut rows, pad, filler, shape);
    xfmr_models::padded_ids(&rows, pad, xfmr_models::PadSide::Right, device)
}
