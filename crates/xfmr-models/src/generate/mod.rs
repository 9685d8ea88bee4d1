//! Generation: greedy, beam search and sampling, batched, always through a key/value cache.
//!
//! Any model that can take one decoding step from a state implements [`IncrementalDecoder`]
//! ([`Transformer`](crate::Transformer) and [`DecoderOnly`](crate::DecoderOnly) do); the search
//! itself runs on the host ([`search`]) over [`HostSteps`], the step's logits `[batch, vocab]`
//! in host memory: tensor models reach it through the one adapter [`TensorSteps`], models that
//! compute on the host (`xfmr-llm`'s quantised Llama) implement it directly. Tokens are
//! chosen by [`Sampler`], the one sampler on host logits that `xfmr-llm`'s decoding loop and
//! the server share.
//!
//! Conventions:
//! - Output tokens exclude the start token, the prompt and the end-of-sequence token;
//!   [`Hypothesis::finished`] says whether the end-of-sequence token was produced.
//! - `log_prob` is the sum of the model's log-probabilities of the generated tokens, the
//!   end-of-sequence token included (temperature and top-k/top-p change which token is drawn,
//!   not how it is scored).
//! - Beam scores use the GNMT length penalty (Wu et al., 2016; tensor2tensor, the paper's
//!   `α = 0.6`): `score = log_prob / ((5 + len) / 6)^α`, `len` counting the end token.
//! - Every search checks [`GenerationOptions::cancel`] ([`Cancel`]) before each decoding step
//!   and returns [`ModelError::Cancelled`] once it is cancelled or past its deadline.

use burn::tensor::{backend::Backend, Int, Tensor};

use crate::ModelError;

mod beam;
mod cancel;
mod host;
mod options;
mod sampler;

pub use cancel::{Cancel, CancelOnDrop};
pub use host::{HostSteps, TensorSteps};
pub use options::{BeamOptions, GenerationOptions, SampleOptions, Strategy};
use sampler::ranked;
pub use sampler::{log_softmax_host, Sampler};

/// One decoding step's output.
#[derive(Debug, Clone)]
pub struct Step<B: Backend> {
    /// Logits of the next token for each row, `[batch, vocab]`.
    pub logits: Tensor<B, 2>,
    /// Cross-attention of the last query over the source (last decoder layer, averaged over
    /// heads), `[batch, seq_src]`, when requested and the model has cross-attention.
    pub attention: Option<Tensor<B, 2>>,
}

/// A model that decodes incrementally from a state holding its key/value caches.
pub trait IncrementalDecoder<B: Backend> {
    /// Caches and whatever else a step needs (encoder memory, padding).
    type State;

    /// Output vocabulary size.
    fn vocab_size(&self) -> usize;

    /// The device the model's parameters live on (where input tokens are created).
    fn device(&self) -> B::Device;

    /// Feeds `tokens` (`[batch, new]`, new ≥ 1) after everything fed so far and returns the
    /// logits that follow the last of them.
    ///
    /// # Errors
    /// A context longer than a learned position table.
    fn step(
        &self,
        state: &mut Self::State,
        tokens: Tensor<B, 2, Int>,
        need_attention: bool,
    ) -> Result<Step<B>, ModelError>;

    /// Reorders (or repeats) the state's rows: row `i` becomes old row `indices[i]`.
    fn reorder(&self, state: &mut Self::State, indices: &[usize]);
}

/// One generated sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// Generated ids (no start token, prompt or end token).
    pub tokens: Vec<u32>,
    /// Whether the end-of-sequence token was produced.
    pub finished: bool,
    /// Sum of the model's log-probabilities of the generated tokens (the end token included).
    pub log_prob: f64,
    /// Ranking score: `log_prob` for greedy and sampling, length-penalised for beam search.
    pub score: f64,
    /// Per generated token (aligned with `tokens`), the cross-attention over the source
    /// positions, when requested.
    pub attention: Option<Vec<Vec<f32>>>,
}

/// The result of [`generate`]: per input, its hypotheses best first (one for greedy and
/// sampling, `n_best` for beam search).
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Per input, best first.
    pub hypotheses: Vec<Vec<Hypothesis>>,
}

impl Generation {
    /// The best token sequence of each input.
    pub fn best_tokens(&self) -> Vec<Vec<u32>> {
        self.hypotheses
            .iter()
            .map(|h| h.first().map(|h| h.tokens.clone()).unwrap_or_default())
            .collect()
    }
}

/// GNMT length penalty `((5 + len) / 6)^α`.
pub fn length_penalty(len: usize, alpha: f64) -> f64 {
    ((5.0 + len as f64) / 6.0).powf(alpha)
}

/// Runs the strategy of `options` from `state`, feeding `first` (one row per sequence, equal
/// lengths: the start token, or left-padded prompts) as the first step.
///
/// Every strategy checks [`GenerationOptions::cancel`] before each decoding step: a cancelled
/// token (its client gone, its deadline passed) stops the search within one step.
///
/// # Errors
/// Invalid options, ids outside the vocabulary, a context longer than a learned position
/// table; [`ModelError::Cancelled`] once the options' token is cancelled.
pub fn generate<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
) -> Result<Generation, ModelError> {
    generate_streaming(model, state, first, options, &mut |_, _| {})
}

/// As [`generate`], calling `on_token(row, token)` for each token as soon as it is chosen
/// (end tokens not included), so that a caller can print text while it is generated. Greedy
/// decoding and sampling call it once per step and row; beam search, whose tokens are only
/// final when the search ends, calls it for the best hypothesis of each row at the end.
///
/// The search runs on the host ([`search`]) over the model's steps through [`TensorSteps`].
///
/// # Errors
/// As [`generate`].
pub fn generate_streaming<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, ModelError> {
    search(
        &mut TensorSteps::new(model, state),
        first,
        options,
        on_token,
    )
}

/// The strategy of `options` over any [`HostSteps`] (rows as `first` has them), calling
/// `on_token` as [`generate_streaming`] does: greedy decoding, sampling, or beam search, whose
/// `k` beams of every input are rows of one step (the model's weights are read once per step
/// for all of them, not once per beam).
///
/// # Errors
/// As [`generate`].
pub fn search(
    steps: &mut dyn HostSteps,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, ModelError> {
    let vocab = steps.vocab_size();
    options.validate(vocab)?;
    options.check_cancelled()?;
    crate::check_ids("first tokens", &first, vocab)?;
    let width = first.first().map_or(0, Vec::len);
    if width == 0 || first.iter().any(|r| r.len() != width) {
        return Err(ModelError::InvalidInput(
            "the first step needs one non-empty row of equal length per sequence".into(),
        ));
    }
    match &options.strategy {
        Strategy::Beam(beam) => {
            let generation = beam::beam_search(steps, first, options, beam)?;
            for (row, best) in generation.best_tokens().iter().enumerate() {
                best.iter().for_each(|&t| on_token(row, t));
            }
            Ok(generation)
        }
        Strategy::Greedy => sample_or_greedy(steps, first, options, None, on_token),
        Strategy::Sample(sample) => sample_or_greedy(steps, first, options, Some(sample), on_token),
    }
}

/// One step on the host: feeds `tokens` (`[rows, width]`) and returns the log-probabilities
/// `[rows][vocab]` (`f64`, with the end token forbidden before `min_len`) and the attention
/// rows.
#[allow(clippy::type_complexity)]
fn host_step(
    steps: &mut dyn HostSteps,
    tokens: &[u32],
    width: usize,
    generated: usize,
    options: &GenerationOptions,
) -> Result<(Vec<Vec<f64>>, Option<Vec<Vec<f32>>>), ModelError> {
    let vocab = steps.vocab_size();
    let rows = tokens.len() / width;
    let logits = steps.step(tokens, width, options.return_attention)?;
    if logits.len() != rows * vocab {
        return Err(ModelError::InvalidInput(format!(
            "a step of {rows} rows gave {} logits, not {rows} × {vocab}",
            logits.len()
        )));
    }
    let log_probs = logits
        .chunks_exact_mut(vocab)
        .map(|row| {
            if generated < options.min_len {
                // -inf on the end token before the softmax, so the others renormalise.
                row[options.eos_id as usize] = f32::NEG_INFINITY;
            }
            log_softmax_host(row)
        })
        .collect();
    Ok((log_probs, steps.take_attention()))
}

fn sample_or_greedy(
    steps: &mut dyn HostSteps,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    sample: Option<&SampleOptions>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, ModelError> {
    let batch = first.len();
    // One generator for the batch, drawn from in row order.
    let mut sampler = Sampler::new(sample.cloned());
    let mut out: Vec<Hypothesis> = (0..batch)
        .map(|_| Hypothesis {
            tokens: Vec::new(),
            finished: false,
            log_prob: 0.0,
            score: 0.0,
            attention: options.return_attention.then(Vec::new),
        })
        .collect();
    let width = first[0].len();
    let mut input: Vec<u32> = first.into_iter().flatten().collect();
    let mut input_width = width;
    for t in 0..options.max_len {
        options.check_cancelled()?;
        let (log_probs, attention) = host_step(steps, &input, input_width, t, options)?;
        let mut next = vec![options.pad_id; batch];
        for b in 0..batch {
            let hyp = &mut out[b];
            if hyp.finished {
                continue;
            }
            let token = sampler.choose_log_probs(&log_probs[b]) as usize;
            hyp.log_prob += log_probs[b][token];
            if token as u32 == options.eos_id {
                hyp.finished = true;
                continue;
            }
            hyp.tokens.push(token as u32);
            on_token(b, token as u32);
            if let (Some(rows), Some(attn)) = (hyp.attention.as_mut(), attention.as_ref()) {
                rows.push(attn[b].clone());
            }
            next[b] = token as u32;
        }
        if out.iter().all(|h| h.finished) {
            break;
        }
        input = next;
        input_width = 1;
    }
    for hyp in &mut out {
        hyp.score = hyp.log_prob;
    }
    Ok(Generation {
        hypotheses: out.into_iter().map(|h| vec![h]).collect(),
    })
}
