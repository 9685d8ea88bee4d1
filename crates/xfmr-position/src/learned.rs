//! Learned absolute positions (BERT, GPT-2).

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::InvalidConfig;

use crate::PositionError;

/// Configuration of [`LearnedPositionEmbedding`].
#[derive(Config, Debug)]
pub struct LearnedPositionConfig {
    /// Number of positions (rows).
    pub max_len: usize,
    /// Width of each position vector.
    pub d_model: usize,
    /// Initialiser. Default: normal(0, 0.02), as BERT and GPT-2.
    #[config(default = "Initializer::Normal { mean: 0.0, std: 0.02 }")]
    pub initializer: Initializer,
}

impl LearnedPositionConfig {
    /// Builds the table.
    ///
    /// # Errors
    /// A zero `max_len` or `d_model`.
    pub fn init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<LearnedPositionEmbedding<B>, PositionError> {
        InvalidConfig::positive("max_len", self.max_len)?;
        InvalidConfig::positive("d_model", self.d_model)?;
        Ok(LearnedPositionEmbedding {
            table: self.initializer.init_with(
                [self.max_len, self.d_model],
                Some(self.d_model),
                Some(self.d_model),
                device,
            ),
        })
    }
}

/// A trained table of absolute position vectors; saved with the model.
#[derive(Module, Debug)]
pub struct LearnedPositionEmbedding<B: Backend> {
    /// `[max_len, d_model]`.
    pub table: Param<Tensor<B, 2>>,
}

impl<B: Backend> LearnedPositionEmbedding<B> {
    /// A module holding a pretrained table (e.g. `position_embeddings.weight` of a BERT
    /// checkpoint).
    ///
    /// # Shapes
    /// - `table`: `[max_len, d_model]`
    pub fn from_pretrained(table: Tensor<B, 2>) -> Self {
        Self {
            table: Param::from_tensor(table),
        }
    }

    /// Replaces the table with a pretrained one of the same shape.
    ///
    /// # Errors
    /// [`PositionError::TableShape`] if the shapes differ.
    pub fn load_table(mut self, table: Tensor<B, 2>) -> Result<Self, PositionError> {
        let [max_len, d_model] = self.table.dims();
        if table.dims() != [max_len, d_model] {
            return Err(PositionError::TableShape {
                actual: table.dims().to_vec(),
                d_model,
            });
        }
        // `require_grad`: `Param::initialized` inherits the flag from the tensor.
        self.table = Param::initialized(self.table.id, table.require_grad());
        Ok(self)
    }

    /// Number of positions.
    pub fn max_len(&self) -> usize {
        self.table.dims()[0]
    }

    /// Vectors of positions `offset..offset + seq_len`.
    ///
    /// # Shapes
    /// - output: `[seq_len, d_model]`
    ///
    /// # Errors
    /// [`PositionError::SequenceTooLong`] naming both lengths when the positions run past the
    /// table (a learned table cannot be extended).
    pub fn encoding(&self, seq_len: usize, offset: usize) -> Result<Tensor<B, 2>, PositionError> {
        let max_len = self.max_len();
        if offset + seq_len > max_len {
            return Err(PositionError::SequenceTooLong {
                seq_len,
                offset,
                max_len,
            });
        }
        Ok(self.table.val().narrow(0, offset, seq_len))
    }
}
