//! Generation: greedy, beam search and sampling, batched, always through a key/value cache.
//!
//! Any model that can take one decoding step from a state implements [`IncrementalDecoder`]
//! ([`Transformer`](crate::Transformer) and [`DecoderOnly`](crate::DecoderOnly) do); the search
//! itself runs on the host over the step's logits, `[batch, vocab]` per step.
//!
//! Conventions:
//! - Output tokens exclude the start token, the prompt and the end-of-sequence token;
//!   [`Hypothesis::finished`] says whether the end-of-sequence token was produced.
//! - `log_prob` is the sum of the model's log-probabilities of the generated tokens, the
//!   end-of-sequence token included (temperature and top-k/top-p change which token is drawn,
//!   not how it is scored).
//! - Beam scores use the GNMT length penalty (Wu et al., 2016; tensor2tensor, the paper's
//!   `α = 0.6`): `score = log_prob / ((5 + len) / 6)^α`, `len` counting the end token.

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{int_tensor, ModelError};

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

/// How the next token is chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Strategy {
    /// The most probable token (the first one on ties).
    Greedy,
    /// Beam search.
    Beam(BeamOptions),
    /// Ancestral sampling.
    Sample(SampleOptions),
}

/// Beam search options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeamOptions {
    /// Hypotheses kept per input (paper: 4).
    pub beam_size: usize,
    /// GNMT length penalty exponent α (paper: 0.6; 0 = raw log-probability).
    pub length_penalty: f64,
    /// Hypotheses returned per input, best first (≤ `beam_size`).
    pub n_best: usize,
}

impl Default for BeamOptions {
    /// The paper's setting: beam 4, α = 0.6, the best hypothesis only.
    fn default() -> Self {
        Self {
            beam_size: 4,
            length_penalty: 0.6,
            n_best: 1,
        }
    }
}

/// Sampling options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleOptions {
    /// Logits are divided by it (< 1 sharper, > 1 flatter). Must be positive.
    pub temperature: f64,
    /// Keep only the `k` most probable tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most probable tokens whose probability reaches `p` (nucleus).
    pub top_p: Option<f64>,
    /// Seed of the ChaCha8 generator: the same seed gives the same tokens everywhere.
    pub seed: u64,
}

impl Default for SampleOptions {
    /// Plain sampling at temperature 1, seed 0.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }
}

/// What to generate and when to stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationOptions {
    /// The most tokens generated per sequence (the end token included).
    pub max_len: usize,
    /// The end token is forbidden before this many tokens were generated.
    pub min_len: usize,
    /// End-of-sequence id.
    pub eos_id: u32,
    /// Fed to sequences that already ended (batched decoding).
    pub pad_id: u32,
    /// Search strategy.
    pub strategy: Strategy,
    /// Also return the cross-attention over the source for each generated token.
    pub return_attention: bool,
}

impl GenerationOptions {
    /// Greedy decoding up to `max_len` tokens.
    pub fn greedy(max_len: usize, eos_id: u32, pad_id: u32) -> Self {
        Self {
            max_len,
            min_len: 0,
            eos_id,
            pad_id,
            strategy: Strategy::Greedy,
            return_attention: false,
        }
    }

    /// With another strategy.
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// With a minimum length.
    pub fn with_min_len(mut self, min_len: usize) -> Self {
        self.min_len = min_len;
        self
    }

    /// Returning cross-attention weights.
    pub fn with_attention(mut self) -> Self {
        self.return_attention = true;
        self
    }

    fn validate(&self, vocab: usize) -> Result<(), ModelError> {
        let bad = |field, value: String, expected| {
            Err(ModelError::InvalidOption {
                field,
                value,
                expected,
            })
        };
        if self.eos_id as usize >= vocab {
            return bad(
                "eos_id",
                self.eos_id.to_string(),
                "an id inside the vocabulary",
            );
        }
        if self.pad_id as usize >= vocab {
            return bad(
                "pad_id",
                self.pad_id.to_string(),
                "an id inside the vocabulary",
            );
        }
        if self.min_len > self.max_len {
            return bad(
                "min_len",
                format!("{} with max_len {}", self.min_len, self.max_len),
                "min_len <= max_len",
            );
        }
        match &self.strategy {
            Strategy::Greedy => {}
            Strategy::Beam(b) => {
                if b.beam_size == 0 {
                    return bad("beam_size", "0".into(), "at least 1");
                }
                if b.n_best == 0 || b.n_best > b.beam_size {
                    return bad(
                        "n_best",
                        format!("{} with beam_size {}", b.n_best, b.beam_size),
                        "1 ..= beam_size",
                    );
                }
                if !b.length_penalty.is_finite() {
                    return bad(
                        "length_penalty",
                        b.length_penalty.to_string(),
                        "a finite number",
                    );
                }
            }
            Strategy::Sample(s) => {
                if !(s.temperature > 0.0 && s.temperature.is_finite()) {
                    return bad(
                        "temperature",
                        s.temperature.to_string(),
                        "a positive finite number",
                    );
                }
                if s.top_k == Some(0) {
                    return bad("top_k", "0".into(), "at least 1");
                }
                if let Some(p) = s.top_p {
                    if !(p > 0.0 && p <= 1.0) {
                        return bad("top_p", p.to_string(), "in (0, 1]");
                    }
                }
            }
        }
        Ok(())
    }
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
/// # Errors
/// Invalid options, ids outside the vocabulary, a context longer than a learned position
/// table.
pub fn generate<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
) -> Result<Generation, ModelError> {
    let vocab = model.vocab_size();
    options.validate(vocab)?;
    crate::check_ids("first tokens", &first, vocab)?;
    let width = first.first().map_or(0, Vec::len);
    if width == 0 || first.iter().any(|r| r.len() != width) {
        return Err(ModelError::InvalidInput(
            "the first step needs one non-empty row of equal length per sequence".into(),
        ));
    }
    match &options.strategy {
        Strategy::Beam(beam) => beam_search(model, state, first, options, beam),
        Strategy::Greedy => sample_or_greedy(model, state, first, options, None),
        Strategy::Sample(sample) => sample_or_greedy(model, state, first, options, Some(sample)),
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

/// Index of the largest value, the first on ties.
fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// The `n` most probable token ids (all of them for `None`), sorted by descending
/// log-probability, ties to the lower id; impossible tokens (-inf) are left out.
fn ranked(row: &[f64], n: Option<usize>) -> Vec<usize> {
    let order = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    let mut ids: Vec<usize> = (0..row.len())
        .filter(|&i| row[i] > f64::NEG_INFINITY)
        .collect();
    if let Some(n) = n.filter(|&n| n > 0 && n < ids.len()) {
        // Partition first (linear), sort only the kept few: beam search asks for 2k of a
        // vocabulary of tens of thousands at every step.
        ids.select_nth_unstable_by(n - 1, order);
        ids.truncate(n);
    }
    ids.sort_by(order);
    ids
}

/// Draws a token from `log_probs` under temperature, top-k and top-p.
fn draw(log_probs: &[f64], options: &SampleOptions, rng: &mut ChaCha8Rng) -> usize {
    let mut ids = ranked(log_probs, options.top_k);
    // Tempered, renormalised probabilities of the kept ids.
    let max = log_probs[ids[0]] / options.temperature;
    let mut probs: Vec<f64> = ids
        .iter()
        .map(|&i| (log_probs[i] / options.temperature - max).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(top_p) = options.top_p {
        let mut cumulative = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            cumulative += p;
            if cumulative >= top_p {
                keep = i + 1;
                break;
            }
        }
        ids.truncate(keep);
        probs.truncate(keep);
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let u: f64 = rng.random();
    let mut cumulative = 0.0;
    for (i, p) in probs.iter().enumerate() {
        cumulative += p;
        if u < cumulative {
            return ids[i];
        }
    }
    *ids.last().expect("at least one candidate")
}

fn sample_or_greedy<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    mut state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    sample: Option<&SampleOptions>,
) -> Result<Generation, ModelError> {
    let batch = first.len();
    let device = model.device();
    let mut rng = ChaCha8Rng::seed_from_u64(sample.map_or(0, |s| s.seed));
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
        let step = model.step(&mut state, input, options.return_attention)?;
        let (log_probs, attention) = host_step(step, t, options);
        let mut next = vec![options.pad_id; batch];
        for b in 0..batch {
            let hyp = &mut out[b];
            if hyp.finished {
                continue;
            }
            let token = match sample {
                None => argmax(&log_probs[b]),
                Some(s) => draw(&log_probs[b], s, &mut rng),
            };
            hyp.log_prob += log_probs[b][token];
            if token as u32 == options.eos_id {
                hyp.finished = true;
                continue;
            }
            hyp.tokens.push(token as u32);
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

#[derive(Debug, Clone)]
struct Beam {
    tokens: Vec<u32>,
    log_prob: f64,
    attention: Vec<Vec<f32>>,
}

fn beam_search<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    mut state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
    beam: &BeamOptions,
) -> Result<Generation, ModelError> {
    let batch = first.len();
    let k = beam.beam_size;
    let device = model.device();
    let alpha = beam.length_penalty;
    let finish = |b: &Beam, len: usize, finished: bool| Hypothesis {
        tokens: b.tokens.clone(),
        finished,
        log_prob: b.log_prob,
        score: b.log_prob / length_penalty(len, alpha),
        attention: options.return_attention.then(|| b.attention.clone()),
    };
    // Row b·k + j is beam j of input b. At the start all k rows are copies: only beam 0 is
    // alive (the others at -inf), so the first expansion does not pick k copies of one token.
    let expand: Vec<usize> = (0..batch * k).map(|r| r / k).collect();
    model.reorder(&mut state, &expand);
    let mut beams: Vec<Vec<Beam>> = (0..batch)
        .map(|_| {
            (0..k)
                .map(|j| Beam {
                    tokens: Vec::new(),
                    log_prob: if j == 0 { 0.0 } else { f64::NEG_INFINITY },
                    attention: Vec::new(),
                })
                .collect()
        })
        .collect();
    let mut finished: Vec<Vec<Hypothesis>> = vec![Vec::new(); batch];
    let mut done = vec![false; batch];
    let rows: Vec<Vec<u32>> = expand.iter().map(|&b| first[b].clone()).collect();
    let mut input = first_tensor::<B>(&rows, &device);
    for t in 0..options.max_len {
        let step = model.step(&mut state, input, options.return_attention)?;
        let (log_probs, attention) = host_step(step, t, options);
        let mut reorder: Vec<usize> = (0..batch * k).collect();
        let mut next = vec![options.pad_id; batch * k];
        for b in 0..batch {
            if done[b] {
                continue;
            }
            // The 2k best continuations of every beam, then the 2k best overall: enough to
            // refill k beams even if k of them end.
            let mut candidates: Vec<(f64, usize, usize)> = Vec::with_capacity(2 * k * k);
            for (j, bm) in beams[b].iter().enumerate() {
                if bm.log_prob == f64::NEG_INFINITY {
                    continue;
                }
                let row = &log_probs[b * k + j];
                for token in ranked(row, Some(2 * k)) {
                    candidates.push((bm.log_prob + row[token], j, token));
                }
            }
            candidates.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
            let mut alive = Vec::with_capacity(k);
            for (rank, &(log_prob, j, token)) in candidates.iter().enumerate() {
                if alive.len() == k {
                    break;
                }
                let parent = &beams[b][j];
                if token as u32 == options.eos_id {
                    // Only an end among the k best counts (fairseq): the rest would not have
                    // survived the cut anyway.
                    if rank < k {
                        let ended = Beam {
                            log_prob,
                            ..parent.clone()
                        };
                        finished[b].push(finish(&ended, t + 1, true));
                    }
                    continue;
                }
                let mut child = parent.clone();
                child.tokens.push(token as u32);
                child.log_prob = log_prob;
                if let Some(attn) = attention.as_ref() {
                    child.attention.push(attn[b * k + j].clone());
                }
                reorder[b * k + alive.len()] = b * k + j;
                next[b * k + alive.len()] = token as u32;
                alive.push(child);
            }
            while alive.len() < k {
                // Fewer live continuations than beams (tiny vocabularies): dead fillers.
                reorder[b * k + alive.len()] = b * k;
                alive.push(Beam {
                    tokens: Vec::new(),
                    log_prob: f64::NEG_INFINITY,
                    attention: Vec::new(),
                });
            }
            beams[b] = alive;
            // Early stop: once k hypotheses ended, none alive can enter the k best
            // under fairseq's rule, which also makes beam 1 equal greedy.
            if finished[b].len() >= k {
                done[b] = true;
            }
        }
        if done.iter().all(|&d| d) {
            break;
        }
        model.reorder(&mut state, &reorder);
        input = token_tensor::<B>(&next, &device);
    }
    let hypotheses = (0..batch)
        .map(|b| {
            let mut all = std::mem::take(&mut finished[b]);
            if all.len() < beam.n_best {
                // Ran out of length: the live beams compete, unfinished.
                for bm in &beams[b] {
                    if bm.log_prob > f64::NEG_INFINITY {
                        all.push(finish(bm, bm.tokens.len(), false));
                    }
                }
            }
            all.sort_by(|x, y| y.score.total_cmp(&x.score));
            all.truncate(beam.n_best);
            all
        })
        .collect();
    Ok(Generation { hypotheses })
}
