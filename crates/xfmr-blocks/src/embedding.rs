//! Token embeddings scaled by √d_model (paper §3.4).

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::{backend::Backend, Int, Tensor};

use xfmr_attention::InvalidConfig;

use crate::BlockError;

/// Configuration of [`TokenEmbedding`].
#[derive(Config, Debug)]
pub struct TokenEmbeddingConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Embedding width.
    pub d_model: usize,
    /// Multiply embeddings by √d_model (paper). Default: true.
    #[config(default = true)]
    pub scale: bool,
    /// Initialiser. Default: normal(0, d_model^-½), so that scaled embeddings have unit variance.
    #[config(default = "None")]
    pub initializer: Option<Initializer>,
}

impl TokenEmbeddingConfig {
    /// Builds the table.
    ///
    /// # Errors
    /// Zero sizes.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<TokenEmbedding<B>, BlockError> {
        InvalidConfig::positive("vocab_size", self.vocab_size)?;
        InvalidConfig::positive("d_model", self.d_model)?;
        let init = self.initializer.clone().unwrap_or(Initializer::Normal {
            mean: 0.0,
            std: (self.d_model as f64).powf(-0.5),
        });
        Ok(TokenEmbedding {
            weight: init.init([self.vocab_size, self.d_model], device),
            scale: if self.scale {
                (self.d_model as f64).sqrt()
            } else {
                1.0
            },
        })
    }
}

/// A token embedding table. The same table can serve as the output projection (weight tying,
/// paper §3.4) through [`TokenEmbedding::logits`]: share the module between source, target and
/// output by using one instance.
#[derive(Module, Debug)]
pub struct TokenEmbedding<B: Backend> {
    /// `[vocab_size, d_model]`.
    pub weight: Param<Tensor<B, 2>>,
    /// Factor applied to looked-up rows (√d_model, or 1).
    pub scale: f64,
}

impl<B: Backend> TokenEmbedding<B> {
    /// Looks up and scales.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = ids.dims();
        let [_, d_model] = self.weight.dims();
        let rows = self.weight.val().select(0, ids.reshape([batch * seq]));
        rows.reshape([batch, seq, d_model]).mul_scalar(self.scale)
    }

    /// Tied output projection: `x Eᵀ` (no scale); for more than 16 rows with the products the
    /// calling thread's matmul precision permits ([`xfmr_attention::project`]).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab_size]`
    pub fn logits(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        let [vocab, _] = self.weight.dims();
        let rows = batch * seq;
        let x = x.reshape([rows, d_model]);
        let logits = if rows <= 16 {
            // Few rows (decoding): `(E xᵀ)ᵀ` keeps the large table as the left, row-major
            // operand, which the CPU backends multiply faster for a few rows; `x Eᵀ` wins for
            // many (the crossover is measured in docs/benchmarks.md).
            self.weight.val().matmul(x.transpose()).transpose()
        } else {
            // `x Eᵀ` with the products the thread's matmul precision permits.
            xfmr_attention::project(x, self.weight.val().transpose(), None)
        };
        logits.reshape([batch, seq, vocab])
    }
}
