//! Token-count batches of an objective's examples, the objective's draws, and the validation
//! loss.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::ElementConversion;
use xfmr_models::ladder::BatchShape;
use xfmr_translate::data::SplitMix64;

use super::{TrainConfig, TrainError};
use crate::data::token_batches;
use crate::objective::{smoothed_loss, ModelOf, Objective};

/// Token-count batches of `examples` by the objective's padded lengths
/// ([`token_batches`]), or on `config.ladder` ([`LengthLadder::batches`](crate::ladder::LengthLadder::batches)).
pub(crate) fn batches_of<O: Objective>(
    objective: &O,
    examples: &[O::Example],
    config: &TrainConfig,
) -> Vec<Vec<usize>> {
    let lengths: Vec<(usize, usize)> = examples.iter().map(|e| objective.lengths(e)).collect();
    match config.ladder {
        Some(ladder) => ladder.batches(&lengths, config.max_tokens, objective.max_positions()),
        None => token_batches(&lengths, config.max_tokens),
    }
}

/// The shape micro-batch `indices` is padded to on `config.ladder` (`None` without one), for
/// one of `replicas` data-parallel replicas: each pads its share of the rows to
/// `⌈rows / replicas⌉`, so that every replica meets the same shapes.
pub(crate) fn shape_of<O: Objective>(
    objective: &O,
    examples: &[O::Example],
    config: &TrainConfig,
    indices: &[usize],
    replicas: usize,
) -> Option<BatchShape> {
    let ladder = config.ladder?;
    let longest = indices
        .iter()
        .map(|&i| {
            let (input, output) = objective.lengths(&examples[i]);
            input.max(output)
        })
        .max()
        .unwrap_or(0);
    let shape = ladder.shape(longest, config.max_tokens, objective.max_positions());
    Some(BatchShape {
        rows: shape.rows.div_ceil(replicas.max(1)),
        ..shape
    })
}

/// The draw of example `index` at step `step` of a run seeded `seed` (see
/// [`crate::objective`]): independent of which replica reads the example.
pub(crate) fn draw(seed: u64, step: u64, index: usize) -> u64 {
    let mixed = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (index as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    SplitMix64(mixed).next()
}

/// The step number validation draws with (a step no run reaches), so that validation masks
/// stay the same across evaluations.
const VALIDATION_STEP: u64 = u64::MAX;

/// Validation loss: the label-smoothed loss and the negative log-likelihood per predicted token
/// over a set of examples, without dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalLoss {
    /// Label-smoothed loss per predicted token.
    pub loss: f64,
    /// Negative log-likelihood per predicted token.
    pub nll: f64,
    /// Tokens predicted.
    pub tokens: usize,
    /// Predicted tokens whose target the model ranks first.
    pub correct: usize,
}

impl EvalLoss {
    /// Perplexity, `exp(nll)`.
    pub fn perplexity(&self) -> f64 {
        self.nll.exp()
    }

    /// Token accuracy: the share of predicted tokens whose target the model ranks first
    /// (for `--task mlm`, BERT's masked-token accuracy).
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.tokens.max(1) as f64
    }
}

/// The loss and token accuracy of `model` on `examples` under `objective` (inference mode: call it on
/// [`AutodiffModule::valid`](burn::module::AutodiffModule::valid) of the trained model, or on a
/// loaded one), batched as training is (`config.max_tokens`, `config.ladder`); the objective's draws (masking) depend on
/// `config.seed` and the example's index only, so every evaluation of a run scores the same
/// task.
///
/// # Errors
/// No examples; a sequence longer than a learned position table.
pub fn evaluate_loss<B: Backend, O: Objective>(
    objective: &O,
    model: &ModelOf<O, B>,
    config: &TrainConfig,
    examples: &[O::Example],
) -> Result<EvalLoss, TrainError> {
    let device = model.devices().into_iter().next().unwrap_or_default();
    let (mut loss, mut nll, mut tokens, mut correct) = (0.0, 0.0, 0, 0);
    for indices in batches_of(objective, examples, config) {
        let rows: Vec<&O::Example> = indices.iter().map(|&i| &examples[i]).collect();
        let draws: Vec<u64> = indices
            .iter()
            .map(|&i| draw(config.seed, VALIDATION_STEP, i))
            .collect();
        let shape = shape_of(objective, examples, config, &indices, 1);
        let outputs = objective.outputs(model, &rows, &draws, shape, &device)?;
        correct += outputs.correct(objective.pad_id());
        let out = smoothed_loss(
            outputs.logits,
            outputs.targets,
            objective.pad_id(),
            objective.label_smoothing(),
        )?;
        loss += out.loss.into_scalar().elem::<f64>() * out.tokens as f64;
        nll += out.nll.into_scalar().elem::<f64>() * out.tokens as f64;
        tokens += out.tokens;
    }
    if tokens == 0 {
        return Err(TrainError::InvalidConfig {
            field: "examples",
            value: "0".into(),
            expected: "at least one example to evaluate",
        });
    }
    Ok(EvalLoss {
        loss: loss / tokens as f64,
        nll: nll / tokens as f64,
        tokens,
        correct,
    })
}
