//! Where order enters the model: one [`PositionEncoding`] choice, realised either at the input
//! ([`Positions`]: vectors added to the token embeddings) or inside self-attention
//! ([`AttentionPositions`]: rotated queries/keys or additive score biases).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use xfmr_attention::MhaInput;
use xfmr_position::{
    Alibi, AlibiConfig, LearnedPositionConfig, LearnedPositionEmbedding, RotaryConfig,
    RotaryEncoding, RotaryLayout, SinusoidalConfig, SinusoidalEncoding,
};

use crate::BlockError;

/// How a model knows where each token is.
///
/// - `Sinusoidal` (paper §3.5) and `Learned` (BERT, GPT-2) are vectors added to the token
///   embeddings, built as [`Positions`].
/// - `Rotary` (RoPE; Su et al., 2021) and `Alibi` (Press et al., 2022) act inside every
///   self-attention sublayer, built as [`AttentionPositions`]; they see only relative offsets,
///   so a left-padded row decodes exactly as it would alone. Cross-attention gets neither.
/// - `None`: no position at all (self-attention is then permutation-equivariant).
#[derive(Config, Debug, PartialEq)]
pub enum PositionEncoding {
    /// No position information.
    None,
    /// Fixed sinusoids added to the embeddings (paper).
    Sinusoidal,
    /// A trained table added to the embeddings; sequences are limited to its rows.
    Learned,
    /// Rotary embeddings of queries and keys in self-attention.
    Rotary {
        /// Frequency base θ (10000 in RoFormer and LLaMA).
        theta: f64,
        /// Which features pair up (`HalfSplit` for Hugging Face LLaMA).
        layout: RotaryLayout,
    },
    /// Linear biases on self-attention scores.
    Alibi,
}

impl PositionEncoding {
    /// RoPE with θ = 10000 and half-split pairs (LLaMA, GPT-NeoX).
    pub fn rotary() -> Self {
        Self::Rotary {
            theta: 10000.0,
            layout: RotaryLayout::HalfSplit,
        }
    }

    /// The part a stack applies inside self-attention: `Rotary` and `Alibi` as they are, the
    /// absolute kinds (added to the embeddings instead) and `None` as `None`.
    pub fn in_attention(&self) -> Self {
        match self {
            Self::Rotary { .. } | Self::Alibi => self.clone(),
            Self::None | Self::Sinusoidal | Self::Learned => Self::None,
        }
    }

    /// The vectors added to the embeddings, for `Sinusoidal` and `Learned`; `None` otherwise.
    ///
    /// # Errors
    /// Zero `max_len` or `d_model`, or an odd `d_model` for sinusoids.
    pub fn init_input<B: Backend>(
        &self,
        max_len: usize,
        d_model: usize,
        device: &B::Device,
    ) -> Result<Option<Positions<B>>, BlockError> {
        Ok(match self {
            Self::Sinusoidal => Some(Positions::Sinusoidal(
                SinusoidalConfig::new(d_model)
                    .with_max_len(max_len)
                    .init(device)?,
            )),
            Self::Learned => Some(Positions::Learned(
                LearnedPositionConfig::new(max_len, d_model).init(device)?,
            )),
            Self::None | Self::Rotary { .. } | Self::Alibi => None,
        })
    }

    /// What self-attention applies, for `Rotary` and `Alibi`; `None` otherwise.
    ///
    /// # Errors
    /// An odd head width for RoPE, a base ≤ 1, zero heads.
    pub fn init_attention(
        &self,
        n_heads: usize,
        d_k: usize,
    ) -> Result<Option<AttentionPositions>, BlockError> {
        Ok(match *self {
            Self::Rotary { theta, layout } => Some(AttentionPositions::Rotary(
                RotaryConfig::new(d_k)
                    .with_base(theta)
                    .with_layout(layout)
                    .init()?,
            )),
            Self::Alibi => Some(AttentionPositions::Alibi(AlibiConfig::new(n_heads).init()?)),
            Self::None | Self::Sinusoidal | Self::Learned => None,
        })
    }
}

/// Position vectors added to token embeddings.
#[derive(Module, Debug)]
pub enum Positions<B: Backend> {
    /// The paper's fixed sinusoids: any length (computed past the table's end).
    Sinusoidal(SinusoidalEncoding<B>),
    /// A trained table (BERT, GPT-2): at most its number of rows.
    Learned(LearnedPositionEmbedding<B>),
}

impl<B: Backend> Positions<B> {
    /// Vectors of positions `offset..offset + seq_len`, shared by the batch.
    ///
    /// # Shapes
    /// - output: `[seq_len, d_model]`
    ///
    /// # Errors
    /// Positions past the end of a learned table.
    pub fn range(&self, seq_len: usize, offset: usize) -> Result<Tensor<B, 2>, BlockError> {
        match self {
            Self::Sinusoidal(s) => Ok(s.encoding(seq_len, offset)),
            Self::Learned(l) => Ok(l.encoding(seq_len, offset)?),
        }
    }

    /// Vectors at per-row positions (left-padded batches, where each row starts elsewhere).
    ///
    /// # Shapes
    /// - `positions`: `batch` rows of `seq` positions each
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// Positions past the end of a learned table.
    pub fn gather(&self, positions: &[Vec<usize>]) -> Result<Tensor<B, 3>, BlockError> {
        let batch = positions.len();
        let seq = positions.first().map_or(0, Vec::len);
        let max = positions.iter().flatten().copied().max().unwrap_or(0);
        let table = self.range(max + 1, 0)?;
        let [_, d_model] = table.dims();
        let flat: Vec<i64> = positions.iter().flatten().map(|&p| p as i64).collect();
        let ids =
            Tensor::<B, 1, Int>::from_data(TensorData::new(flat, [batch * seq]), &table.device());
        Ok(table.select(0, ids).reshape([batch, seq, d_model]))
    }
}

/// Adds the vectors of positions `offset..` to embeddings `x` (no-op without positions).
///
/// # Shapes
/// - `x`: `[batch, seq, d_model]`; output: the same
///
/// # Errors
/// Positions past the end of a learned table.
pub fn add_positions<B: Backend>(
    positions: Option<&Positions<B>>,
    x: Tensor<B, 3>,
    offset: usize,
) -> Result<Tensor<B, 3>, BlockError> {
    let Some(p) = positions else { return Ok(x) };
    let [batch, seq, d_model] = x.dims();
    let table = p.range(seq, offset)?;
    // As `[batch, seq·d_model] + [1, seq·d_model]`: one row shared by every sequence, a
    // broadcast burn-flex adds with SIMD; `[seq, d_model]` under a batch dimension took its
    // element-by-element strided path (3.6% of an lm training step's samples,
    // docs/training.md). The same sums.
    let flat = x.reshape([batch, seq * d_model]) + table.reshape([1, seq * d_model]);
    Ok(flat.reshape([batch, seq, d_model]))
}

/// Positions applied inside self-attention: they depend on query and key positions together.
#[derive(Debug, Clone)]
pub enum AttentionPositions {
    /// Rotates projected queries and keys at their absolute positions (cache length included).
    Rotary(RotaryEncoding),
    /// Adds `-m_h·|i − j|` to the scores of head `h`.
    Alibi(Alibi),
}

impl AttentionPositions {
    /// `input` with this scheme applied for `seq_q` new queries over `seq_k` keys (queries
    /// aligned to the end of the keys, as in cached decoding).
    pub(crate) fn apply<B: Backend>(
        &self,
        input: MhaInput<B>,
        seq_q: usize,
        seq_k: usize,
        device: &B::Device,
    ) -> MhaInput<B> {
        match self {
            Self::Rotary(rope) => input.rotary(rope.clone()),
            Self::Alibi(alibi) => input.bias(alibi.bias(seq_q, seq_k, device)),
        }
    }
}
