//! What to generate and how: the search strategy and its options.

use super::Cancel;
use serde::{Deserialize, Serialize};

use crate::ModelError;

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
    /// Stops the search between two decoding steps with [`ModelError::Cancelled`] once
    /// cancelled (its client went away, its deadline passed). Not serialised.
    #[serde(skip)]
    pub cancel: Option<Cancel>,
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
            cancel: None,
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

    /// Stopped by `cancel` ([`GenerationOptions::cancel`]).
    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Returning cross-attention weights.
    pub fn with_attention(mut self) -> Self {
        self.return_attention = true;
        self
    }

    /// `Err(ModelError::Cancelled)` when [`GenerationOptions::cancel`] says the work should
    /// stop; `Ok` without a token. What every search calls before each decoding step, and
    /// translation before each batch of sources.
    ///
    /// # Errors
    /// [`ModelError::Cancelled`].
    pub fn check_cancelled(&self) -> Result<(), ModelError> {
        self.cancel.as_ref().map_or(Ok(()), Cancel::check)
    }

    /// Checks the options for a model of `vocab` tokens: the end and padding ids inside it,
    /// `min_len <= max_len`, a beam of at least one with `1 ..= beam_size` returned and a
    /// finite length penalty, a positive finite temperature, `top_k >= 1`, `top_p` in
    /// `(0, 1]`. Every search calls it first.
    ///
    /// # Errors
    /// [`ModelError::InvalidOption`] naming the field, its value and what was expected.
    pub fn validate(&self, vocab: usize) -> Result<(), ModelError> {
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
