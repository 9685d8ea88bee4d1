//! The one token sampler on host logits, shared by every decoding loop: the library's
//! searches ([`generate`](super::generate)), the quantised model's loop in `xfmr-llm` and the
//! server's engine. What llama.cpp's `common/sampling` is to its CLI and server.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::SampleOptions;

/// Chooses one sequence's next tokens from its logits, `[vocab]` on the host: greedy or
/// sampled (temperature, top-k, top-p) from its own seeded generator, after adding a
/// per-token bias (OpenAI's `logit_bias`) and forbidding the end tokens before a minimum
/// length.
///
/// Each sequence has its own sampler, so that a server decoding many requests in one batch
/// draws for each as if it were alone; a batch that should share one generator (the
/// library's [`generate`](super::generate)) uses one sampler for all its rows, in row order.
///
/// The order of the rules on a row of logits `z`:
/// 1. `z[id] += bias` for each `(id, bias)` of [`with_logit_bias`](Self::with_logit_bias);
/// 2. `z[end] = -inf` for each end id while fewer than `min_len` tokens were generated
///    ([`with_min_len`](Self::with_min_len));
/// 3. greedy: the first maximum of `z`; sampling: a draw from `softmax(z)` restricted by
///    top-k, tempered, restricted by top-p (see [`SampleOptions`]).
///
/// NaN logits are never chosen while a number is possible; when no token is possible (every
/// logit `-inf` or NaN, a bias of `-inf` on all) the first id is returned.
#[derive(Debug, Clone)]
pub struct Sampler {
    sample: Option<SampleOptions>,
    rng: ChaCha8Rng,
    bias: Vec<(u32, f32)>,
    min_len: usize,
    end_ids: Vec<u32>,
}

impl Sampler {
    /// Greedy (`None`: the most probable token, the lowest id on ties) or sampled under
    /// temperature, top-k and top-p, from a generator seeded with `sample.seed`.
    pub fn new(sample: Option<SampleOptions>) -> Self {
        let seed = sample.as_ref().map_or(0, |s| s.seed);
        Self {
            sample,
            rng: ChaCha8Rng::seed_from_u64(seed),
            bias: Vec::new(),
            min_len: 0,
            end_ids: Vec::new(),
        }
    }

    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::new(None)
    }

    /// With `bias` added to these tokens' logits before every choice (`-inf` bans a token;
    /// ids outside the logits are ignored).
    pub fn with_logit_bias(mut self, bias: Vec<(u32, f32)>) -> Self {
        self.bias = bias;
        self
    }

    /// With the tokens `end_ids` forbidden until `min_len` tokens were generated.
    pub fn with_min_len(mut self, min_len: usize, end_ids: Vec<u32>) -> Self {
        self.min_len = min_len;
        self.end_ids = end_ids;
        self
    }

    /// Applies the bias and the minimum length to `logits` (`[vocab]`) in place, for a
    /// sequence that has generated `generated` tokens so far (rules 1 and 2 above).
    pub fn shape(&self, logits: &mut [f32], generated: usize) {
        for &(id, bias) in &self.bias {
            if let Some(z) = logits.get_mut(id as usize) {
                *z += bias;
            }
        }
        if generated < self.min_len {
            for &id in &self.end_ids {
                if let Some(z) = logits.get_mut(id as usize) {
                    *z = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The next token of `logits` (`[vocab]`) for a sequence that has generated `generated`
    /// tokens: the rules above, `logits` left shaped by rules 1 and 2.
    pub fn choose(&mut self, logits: &mut [f32], generated: usize) -> u32 {
        self.shape(logits, generated);
        self.choose_shaped(logits)
    }

    /// The next token of `logits` already [`shape`](Self::shape)d: greedy takes their
    /// argmax directly (the log-softmax is monotonic), sampling draws from
    /// [`log_softmax_host`] of them.
    pub fn choose_shaped(&mut self, logits: &[f32]) -> u32 {
        match &self.sample {
            None => argmax(logits) as u32,
            Some(_) => self.choose_log_probs(&log_softmax_host(logits)),
        }
    }

    /// The next token of log-probabilities (`[vocab]`, normalised or not; no bias or
    /// minimum length applied).
    pub fn choose_log_probs(&mut self, log_probs: &[f64]) -> u32 {
        match &self.sample {
            None => argmax(log_probs) as u32,
            Some(s) => draw(log_probs, s, &mut self.rng) as u32,
        }
    }
}

/// `log softmax(logits)` on the host, in `f64`. A NaN logit counts as `-inf` (impossible);
/// when some logits are `+inf`, they share the whole probability.
pub fn log_softmax_host(logits: &[f32]) -> Vec<f64> {
    let value = |v: f32| {
        if v.is_nan() {
            f64::NEG_INFINITY
        } else {
            f64::from(v)
        }
    };
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(value(v)));
    if max == f64::INFINITY {
        let count = logits.iter().filter(|&&v| v == f32::INFINITY).count() as f64;
        return logits
            .iter()
            .map(|&v| {
                if v == f32::INFINITY {
                    -count.ln()
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
    }
    let total: f64 = logits.iter().map(|&v| (value(v) - max).exp()).sum();
    let shift = max + total.ln();
    logits.iter().map(|&v| value(v) - shift).collect()
}

/// Index of the largest value, the first on ties; NaN is never chosen over a number (and
/// index 0 is returned when there is none).
pub(super) fn argmax<T: PartialOrd + Copy>(row: &[T]) -> usize {
    let mut best: Option<usize> = None;
    for (i, &v) in row.iter().enumerate() {
        // Only NaN is unordered against itself.
        let number = v.partial_cmp(&v).is_some();
        if number && best.is_none_or(|b| v > row[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

/// The `n` most probable token ids (all of them for `None`), sorted by descending
/// log-probability, ties to the lower id; impossible tokens (-inf) are left out.
pub(super) fn ranked(row: &[f64], n: Option<usize>) -> Vec<usize> {
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
    if ids.is_empty() {
        // Every token impossible (`-inf` or NaN everywhere): what greedy decoding gives.
        return argmax(log_probs);
    }
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
