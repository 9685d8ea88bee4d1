//! The paper's sinusoidal encoding (§3.5).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::InvalidConfig;

use crate::{check_base, host_tensor, PositionError};

/// Configuration of [`SinusoidalEncoding`].
#[derive(Config, Debug)]
pub struct SinusoidalConfig {
    /// Width of the encoding (the model width when added to embeddings).
    pub d_model: usize,
    /// Rows precomputed at `init`; positions beyond are computed on the fly. Default: 5000.
    #[config(default = 5000)]
    pub max_len: usize,
    /// Base of the wavelengths' geometric progression. Default: 10000 (paper).
    #[config(default = 10000.0)]
    pub base: f64,
}

impl SinusoidalConfig {
    /// Builds the encoding, precomputing `max_len` rows.
    ///
    /// # Errors
    /// Zero `d_model`, or `base <= 1`.
    pub fn init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<SinusoidalEncoding<B>, PositionError> {
        InvalidConfig::positive("d_model", self.d_model)?;
        check_base(self.base)?;
        let table = sinusoidal_table(0, self.max_len, self.d_model, self.base);
        Ok(SinusoidalEncoding {
            table: host_tensor(table, [self.max_len, self.d_model], device),
            d_model: self.d_model,
            base: self.base,
        })
    }
}

/// Rows `offset..offset + len` of the sinusoidal table, row-major `[len, d_model]`, computed in
/// `f64` and rounded to `f32`:
///
/// ```text
/// PE(pos, 2i)   = sin(pos / base^(2i / d_model))
/// PE(pos, 2i+1) = cos(pos / base^(2i / d_model))
/// ```
///
/// An odd `d_model` keeps the sine of its last, unpaired column.
pub fn sinusoidal_table(offset: usize, len: usize, d_model: usize, base: f64) -> Vec<f32> {
    let mut table = Vec::with_capacity(len * d_model);
    for pos in offset..offset + len {
        for col in 0..d_model {
            let pair = (col / 2) as f64;
            let angle = pos as f64 / base.powf(2.0 * pair / d_model as f64);
            table.push(if col % 2 == 0 {
                angle.sin()
            } else {
                angle.cos()
            } as f32);
        }
    }
    table
}

/// The fixed sinusoidal encoding. The table is a constant of the module, not a parameter: it is
/// neither trained nor written to records.
#[derive(Module, Debug)]
pub struct SinusoidalEncoding<B: Backend> {
    /// Precomputed rows `[max_len, d_model]`.
    pub table: Tensor<B, 2>,
    /// Encoding width.
    pub d_model: usize,
    /// Wavelength base.
    pub base: f64,
}

impl<B: Backend> SinusoidalEncoding<B> {
    /// Number of precomputed rows.
    pub fn max_len(&self) -> usize {
        self.table.dims()[0]
    }

    /// Encodings of positions `offset..offset + seq_len`. Rows beyond the precomputed table are
    /// computed on the fly (the formula has no maximum length), so this never fails.
    ///
    /// # Shapes
    /// - output: `[seq_len, d_model]`
    pub fn encoding(&self, seq_len: usize, offset: usize) -> Tensor<B, 2> {
        if offset + seq_len <= self.max_len() {
            self.table.clone().narrow(0, offset, seq_len)
        } else {
            let rows = sinusoidal_table(offset, seq_len, self.d_model, self.base);
            host_tensor(rows, [seq_len, self.d_model], &self.table.device())
        }
    }
}
