//! Training pairs, padded batches, their loss, and the validation loss.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use xfmr_models::Transformer;

use super::{TrainConfig, TrainError};
use crate::data::token_batches;
use crate::loss::{label_smoothed_loss, SmoothedLoss};

/// One training pair as token ids, without start or end tokens (the trainer adds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Source ids.
    pub src: Vec<u32>,
    /// Target ids.
    pub tgt: Vec<u32>,
}

/// A padded batch, ready for the model.
#[derive(Debug, Clone)]
pub struct Batch<B: Backend> {
    /// Sources followed by the end token, right-padded: `[rows, seq_src]`.
    pub src: Tensor<B, 2, Int>,
    /// The start token followed by the targets (teacher forcing): `[rows, seq_tgt]`.
    pub tgt_in: Tensor<B, 2, Int>,
    /// The targets followed by the end token: what each position predicts, `[rows, seq_tgt]`.
    pub tgt_out: Tensor<B, 2, Int>,
    /// Non-padding source tokens.
    pub src_tokens: usize,
    /// Non-padding target tokens (the loss's denominator).
    pub tgt_tokens: usize,
}

impl<B: Backend> Batch<B> {
    /// Pads `examples` into one batch with the given special ids.
    ///
    /// # Panics
    /// If `examples` is empty.
    pub fn new(
        examples: &[&Example],
        pad: usize,
        bos: usize,
        eos: usize,
        device: &B::Device,
    ) -> Self {
        assert!(!examples.is_empty(), "Batch::new: no examples");
        let rows = examples.len();
        let src_len = examples.iter().map(|e| e.src.len() + 1).max().unwrap_or(1);
        let tgt_len = examples.iter().map(|e| e.tgt.len() + 1).max().unwrap_or(1);
        let (pad, bos, eos) = (pad as i64, bos as i64, eos as i64);
        let padded = |ids: Vec<i64>, len: usize| {
            let n = ids.len();
            ids.into_iter().chain(std::iter::repeat_n(pad, len - n))
        };
        let tensor = |flat: Vec<i64>, len: usize| {
            Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [rows, len]), device)
        };
        fn ids(v: &[u32]) -> impl Iterator<Item = i64> + '_ {
            v.iter().map(|&t| t as i64)
        }
        let src: Vec<i64> = examples
            .iter()
            .flat_map(|e| padded(ids(&e.src).chain([eos]).collect(), src_len))
            .collect();
        let tgt_in: Vec<i64> = examples
            .iter()
            .flat_map(|e| padded([bos].into_iter().chain(ids(&e.tgt)).collect(), tgt_len))
            .collect();
        let tgt_out: Vec<i64> = examples
            .iter()
            .flat_map(|e| padded(ids(&e.tgt).chain([eos]).collect(), tgt_len))
            .collect();
        Self {
            src: tensor(src, src_len),
            tgt_in: tensor(tgt_in, tgt_len),
            tgt_out: tensor(tgt_out, tgt_len),
            src_tokens: examples.iter().map(|e| e.src.len() + 1).sum(),
            tgt_tokens: examples.iter().map(|e| e.tgt.len() + 1).sum(),
        }
    }
}

/// Token-count batches of `examples`, each pair counted with its end token.
pub(crate) fn batches_of(examples: &[Example], max_tokens: usize) -> Vec<Vec<usize>> {
    let lengths: Vec<(usize, usize)> = examples
        .iter()
        .map(|e| (e.src.len() + 1, e.tgt.len() + 1))
        .collect();
    token_batches(&lengths, max_tokens)
}

/// The label-smoothed loss of `model` on the pairs `indices` of `examples`, padded into one
/// batch, and the batch's source tokens.
pub(crate) fn batch_loss<B: Backend>(
    model: &Transformer<B>,
    config: &TrainConfig,
    examples: &[Example],
    indices: &[usize],
    device: &B::Device,
) -> Result<(SmoothedLoss<B>, usize), TrainError> {
    let rows: Vec<&Example> = indices.iter().map(|&i| &examples[i]).collect();
    let batch = Batch::<B>::new(
        &rows,
        config.model.pad_id,
        config.bos_id,
        config.eos_id,
        device,
    );
    let logits = model.forward(batch.src, batch.tgt_in)?;
    let out = label_smoothed_loss(
        logits,
        batch.tgt_out,
        config.model.pad_id,
        config.label_smoothing,
    );
    Ok((out, batch.src_tokens))
}

/// Validation loss: the label-smoothed loss and the negative log-likelihood per target token
/// over `examples`, without dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalLoss {
    /// Label-smoothed loss per target token.
    pub loss: f64,
    /// Negative log-likelihood per target token.
    pub nll: f64,
    /// Target tokens scored.
    pub tokens: usize,
}

impl EvalLoss {
    /// Perplexity, `exp(nll)`.
    pub fn perplexity(&self) -> f64 {
        self.nll.exp()
    }
}

/// The loss of `model` on `examples` (inference mode: call it on [`AutodiffModule::valid`](burn::module::AutodiffModule::valid) of
/// the trained model, or on a loaded one), batched by `max_tokens`.
///
/// # Errors
/// No examples; a sequence longer than a learned position table.
pub fn evaluate_loss<B: Backend>(
    model: &Transformer<B>,
    config: &TrainConfig,
    examples: &[Example],
) -> Result<EvalLoss, TrainError> {
    let device = model.src_embedding.weight.device();
    let (mut loss, mut nll, mut tokens) = (0.0, 0.0, 0);
    for indices in batches_of(examples, config.max_tokens) {
        let (out, _) = batch_loss(model, config, examples, &indices, &device)?;
        loss += out.loss.into_scalar().elem::<f64>() * out.tokens as f64;
        nll += out.nll.into_scalar().elem::<f64>() * out.tokens as f64;
        tokens += out.tokens;
    }
    if tokens == 0 {
        return Err(TrainError::InvalidConfig {
            field: "examples",
            value: "0".into(),
            expected: "at least one pair to evaluate",
        });
    }
    Ok(EvalLoss {
        loss: loss / tokens as f64,
        nll: nll / tokens as f64,
        tokens,
    })
}
