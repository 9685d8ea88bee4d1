//! How positions join token embeddings: added (the paper) or concatenated.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::InvalidConfig;

use crate::PositionError;

/// How position vectors join token embeddings.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum PositionCombine {
    /// `x + PE` (paper §3.5): same width, meaning and position share one space.
    Add,
    /// `[x ; PE]`: meaning and position in separate subspaces, at the price of width
    /// (`d_model + d_position`): the next layer must be configured with
    /// [`PositionInjectionConfig::d_output`].
    Concat,
}

/// Configuration of [`PositionInjection`].
#[derive(Config, Debug)]
pub struct PositionInjectionConfig {
    /// Width of the token embeddings.
    pub d_model: usize,
    /// Width of the position vectors (must equal `d_model` for `Add`).
    pub d_position: usize,
    /// How they combine. Default: `Add` (paper).
    #[config(default = "PositionCombine::Add")]
    pub combine: PositionCombine,
    /// Dropout on the result. Default: 0.1 (paper, `P_drop`).
    #[config(default = 0.1)]
    pub dropout: f64,
}

impl PositionInjectionConfig {
    /// Width of the output: `d_model` for `Add`, `d_model + d_position` for `Concat`.
    pub fn d_output(&self) -> usize {
        match self.combine {
            PositionCombine::Add => self.d_model,
            PositionCombine::Concat => self.d_model + self.d_position,
        }
    }

    /// Builds the module.
    ///
    /// # Errors
    /// Unequal widths with `Add`, dropout outside `[0, 1)`.
    pub fn init(&self) -> Result<PositionInjection, PositionError> {
        if self.combine == PositionCombine::Add && self.d_model != self.d_position {
            return Err(PositionError::WidthMismatch {
                d_model: self.d_model,
                d_position: self.d_position,
            });
        }
        InvalidConfig::dropout("dropout", self.dropout)?;
        Ok(PositionInjection {
            combine: self.combine,
            dropout: DropoutConfig::new(self.dropout).init(),
            d_output: self.d_output(),
        })
    }
}

/// Joins position vectors to token embeddings, then applies dropout.
#[derive(Module, Debug, Clone)]
pub struct PositionInjection {
    /// How they combine.
    pub combine: PositionCombine,
    /// Dropout on the result.
    pub dropout: Dropout,
    /// Output width.
    pub d_output: usize,
}

impl PositionInjection {
    /// `dropout(x + PE)` or `dropout([x ; PE])`, the same positions for every sequence.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - `positions`: `[seq, d_position]`
    /// - output: `[batch, seq, d_output]`
    ///
    /// # Panics
    /// If the sequence lengths differ.
    pub fn forward<B: Backend>(&self, x: Tensor<B, 3>, positions: Tensor<B, 2>) -> Tensor<B, 3> {
        let [batch, seq, _] = x.dims();
        let [pos_seq, d_position] = positions.dims();
        assert_eq!(
            seq, pos_seq,
            "PositionInjection: {seq} tokens but {pos_seq} positions"
        );
        let positions = positions.unsqueeze_dim::<3>(0);
        let joined = match self.combine {
            PositionCombine::Add => x + positions,
            PositionCombine::Concat => {
                Tensor::cat(vec![x, positions.expand([batch, seq, d_position])], 2)
            }
        };
        self.dropout.forward(joined)
    }
}
