//! ALiBi, attention with linear biases (Press et al., 2022), an extension beyond the paper.
//!
//! No position is added to the embeddings. Instead head `h` adds `-m_h · |i − j|` to the score of
//! query position `i` and key position `j`, with a head-specific slope `m_h`. The bias feeds
//! `xfmr-attention`'s additive `bias` input.

use burn::config::Config;
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::InvalidConfig;

use crate::{host_tensor, PositionError};

/// The published ALiBi slopes for `n_heads` heads.
///
/// For a power of two `n`: `m_h = 2^(-8h/n)`, `h = 1..=n` (a geometric sequence starting at
/// `2^(-8/n)`). Otherwise, with `p` the largest power of two below `n`: the `p` slopes of `p`
/// heads, then every other slope of `2p` heads (`2^(-4/p)`, `2^(-12/p)`, …) up to `n` in all.
/// This is the reference implementation's rule.
pub fn alibi_slopes(n_heads: usize) -> Vec<f64> {
    fn power_of_two(n: usize) -> Vec<f64> {
        (1..=n)
            .map(|h| 2f64.powf(-8.0 * h as f64 / n as f64))
            .collect()
    }
    if n_heads.is_power_of_two() {
        return power_of_two(n_heads);
    }
    let p = 1usize << (usize::BITS - 1 - n_heads.leading_zeros());
    let mut slopes = power_of_two(p);
    slopes.extend(power_of_two(2 * p).into_iter().step_by(2).take(n_heads - p));
    slopes
}

/// Configuration of [`Alibi`].
#[derive(Config, Debug)]
pub struct AlibiConfig {
    /// Number of attention heads.
    pub n_heads: usize,
}

impl AlibiConfig {
    /// Builds the bias generator.
    ///
    /// # Errors
    /// Zero heads.
    pub fn init(&self) -> Result<Alibi, PositionError> {
        InvalidConfig::positive("n_heads", self.n_heads)?;
        Ok(Alibi {
            slopes: alibi_slopes(self.n_heads),
        })
    }
}

/// ALiBi bias generator.
#[derive(Debug, Clone)]
pub struct Alibi {
    /// One slope per head.
    pub slopes: Vec<f64>,
}

impl Alibi {
    /// The additive bias `-m_h · |i − j|` for `seq_q` queries over `seq_k` keys, with queries
    /// aligned to the end of the keys (query `i` at position `seq_k − seq_q + i`), as in
    /// incremental decoding: the bias of one new token over a cache of `t` keys is the last row
    /// of the full bias. Combine it with a causal mask for decoder self-attention; the symmetric
    /// `|i − j|` also serves bidirectional encoders.
    ///
    /// # Shapes
    /// - output: `[1, n_heads, seq_q, seq_k]`
    pub fn bias<B: Backend>(&self, seq_q: usize, seq_k: usize, device: &B::Device) -> Tensor<B, 4> {
        let heads = self.slopes.len();
        let shift = seq_k as f64 - seq_q as f64;
        let mut values = Vec::with_capacity(heads * seq_q * seq_k);
        for &m in &self.slopes {
            for i in 0..seq_q {
                for j in 0..seq_k {
                    values.push((-m * (shift + i as f64 - j as f64).abs()) as f32);
                }
            }
        }
        host_tensor(values, [1, heads, seq_q, seq_k], device)
    }
}
