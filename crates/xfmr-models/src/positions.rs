//! Absolute positions for the models: the paper's sinusoids or a learned table.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Int, Tensor};
use xfmr_position::{
    LearnedPositionConfig, LearnedPositionEmbedding, SinusoidalConfig, SinusoidalEncoding,
};

use crate::{int_tensor, ModelError};

/// Which absolute position vectors a model adds to its token embeddings.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum PositionKind {
    /// Fixed sinusoids (paper §3.5): no parameters, any length.
    Sinusoidal,
    /// A trained table of `max_len` rows (BERT, GPT-2): sequences are limited to `max_len`.
    Learned,
}

/// The position vectors of a model (one of the two kinds).
#[derive(Module, Debug)]
pub struct Positions<B: Backend> {
    /// Set for [`PositionKind::Sinusoidal`].
    pub sinusoidal: Option<SinusoidalEncoding<B>>,
    /// Set for [`PositionKind::Learned`].
    pub learned: Option<LearnedPositionEmbedding<B>>,
}

impl<B: Backend> Positions<B> {
    pub(crate) fn init(
        kind: PositionKind,
        max_len: usize,
        d_model: usize,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Ok(match kind {
            PositionKind::Sinusoidal => Self {
                sinusoidal: Some(
                    SinusoidalConfig::new(d_model)
                        .with_max_len(max_len)
                        .init(device)?,
                ),
                learned: None,
            },
            PositionKind::Learned => Self {
                sinusoidal: None,
                learned: Some(LearnedPositionConfig::new(max_len, d_model).init(device)?),
            },
        })
    }

    /// Vectors of positions `offset..offset + seq_len`, shared by the batch.
    ///
    /// # Shapes
    /// - output: `[seq_len, d_model]`
    ///
    /// # Errors
    /// [`ModelError::Position`] past the end of a learned table.
    pub fn range(&self, seq_len: usize, offset: usize) -> Result<Tensor<B, 2>, ModelError> {
        match (&self.sinusoidal, &self.learned) {
            (Some(s), _) => Ok(s.encoding(seq_len, offset)),
            (None, Some(l)) => Ok(l.encoding(seq_len, offset)?),
            (None, None) => unreachable!("Positions holds one kind"),
        }
    }

    /// Vectors at per-row positions (left-padded batches, where each row starts elsewhere).
    ///
    /// # Shapes
    /// - `positions`: `batch` rows of `seq` positions each
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// [`ModelError::Position`] past the end of a learned table.
    pub fn gather(&self, positions: &[Vec<usize>]) -> Result<Tensor<B, 3>, ModelError> {
        let batch = positions.len();
        let seq = positions.first().map_or(0, Vec::len);
        let max = positions.iter().flatten().copied().max().unwrap_or(0);
        let table = self.range(max + 1, 0)?;
        let [_, d_model] = table.dims();
        let flat: Vec<i64> = positions.iter().flatten().map(|&p| p as i64).collect();
        let ids: Tensor<B, 1, Int> =
            int_tensor::<B, 2>(flat, [batch, seq], &table.device()).reshape([batch * seq]);
        Ok(table.select(0, ids).reshape([batch, seq, d_model]))
    }
}
