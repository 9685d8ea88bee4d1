//! Generation: greedy, beam search and sampling, batched, always through a key/value cache.
//!
//! Any model that can take one decoding step from a state implements [`IncrementalDecoder`]
//! ([`Transformer`](crate::Transformer) and [`DecoderOnly`](crate::DecoderOnly) do); the search
//! itself runs on the host over the step's logits, `[batch, vocab]` per step. Tokens are
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

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor};

use crate::{int_tensor, ModelError};

mod beam;
mod cancel;
mod options;
mod sampler;

pub use cancel::{Cancel, CancelOnDrop};
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
/// # Errors
/// As [`generate`].
pub fn generate_streaming<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, ModelError> {
    let vocab = model.vocab_size();
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
            let generation = beam::beam_search(model, state, first, options, beam)?;
            for (row, best) in generation.best_tokens().iter().enumerate() {
                best.iter().for_each(|&t| on_token(row, t));
            }
            Ok(generation)
        }
        Strategy::Greedy => sample_or_greedy(model, state, first, options, None, on_token),
        Strategy::Sample(sample) => {
            sample_or_greedy(model, state, first, options, Some(sample), on_token)
        }
    }
}

/// Host copy of a step: log-probabilities `[batch][vocab]` (with the end token forbidden before
/// `min_len`) and the attention rows.
fn host_step<B: Backend>(
    step: Step<B>,
    generated: usize,
    options: &GenerationOptions,
) -> (Vec<Vec<f64>>, Option<Vec<Vec<f32>>>) {
    let [batch, vocab] = step.logits.dims();
    let mut logits = step.logits;
    if generated < options.min_len {
        // -inf on the end token before the softmax, so the others renormalise.
        let device = logits.device();
        let mut bias = vec![0f32; vocab];
        bias[options.eos_id as usize] = f32::NEG_INFINITY;
        let bias = Tensor::<B, 1>::from_data(
            burn::tensor::TensorData::new(bias, [vocab]).convert_dtype(logits.dtype()),
            (&device, logits.dtype()),
        );
        logits = logits + bias.unsqueeze::<2>();
    }
    let values = log_softmax(logits, 1)
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .expect("float logits");
    let rows = values
        .chunks(vocab)
        .map(<[f64]>::to_vec)
        .collect::<Vec<_>>();
    debug_assert_eq!(rows.len(), batch);
    let attention = step.attention.map(|a| {
        let [_, src] = a.dims();
        a.into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("float weights")
            .chunks(src)
            .map(<[f32]>::to_vec)
            .collect()
    });
    (rows, attention)
}

fn token_tensor<B: Backend>(rows: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    int_tensor::<B, 2>(
        rows.iter().map(|&t| t as i64).collect(),
        [rows.len(), 1],
        device,
    )
}

fn first_tensor<B: Backend>(first: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2, Int> {
    let width = first[0].len();
    int_tensor::<B, 2>(
        first.iter().flatten().map(|&t| t as i64).collect(),
        [first.len(), width],
        device,
    )
}

fn sample_or_greedy<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    mut state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    sample: Option<&SampleOptions>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<Generation, ModelError> {
    let batch = first.len();
    let device = model.device();
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
    let mut input = first_tensor::<B>(&first, &device);
    for t in 0..options.max_len {
        options.check_cancelled()?;
        let step = model.step(&mut state, input, options.return_attention)?;
        let (log_probs, attention) = host_step(step, t, options);
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
        input = token_tensor::<B>(&next, &device);
    }
    for hyp in &mut out {
        hyp.score = hyp.log_prob;
    }
    Ok(Generation {
        hypotheses: out.into_iter().map(|h| vec![h]).collect(),
    })
}
