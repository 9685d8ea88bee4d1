//! # xfmr-position
//!
//! Positional information for Transformers, generic over burn backends. Self-attention is
//! permutation-equivariant; these modules give it order.
//!
//! - [`SinusoidalEncoding`]: the paper's fixed encoding (§3.5),
//!   `PE(pos, 2i) = sin(pos / base^(2i/d))`, `PE(pos, 2i+1) = cos(pos / base^(2i/d))`,
//!   interleaved as in the paper. Not trained, not saved.
//! - [`LearnedPositionEmbedding`]: a trained table (BERT, GPT-2), loadable from a checkpoint.
//! - [`RotaryEncoding`] (RoPE, an extension): rotates query/key pairs by position-dependent angles,
//!   so that `q·k` depends only on the relative offset.
//! - [`Alibi`] (an extension): per-head linear biases for the attention crate's additive `bias`.
//! - [`PositionInjection`]: how positions join token embeddings: added (paper) or concatenated,
//!   followed by dropout (paper: 0.1).
//!
//! Every encoding takes an `offset` so that step `t` of incremental decoding gets position `t`.
//!
//! ```
//! use burn::backend::NdArray;
//! use burn::tensor::Tensor;
//! use xfmr_position::{PositionInjectionConfig, SinusoidalConfig};
//!
//! let device = Default::default();
//! let pe = SinusoidalConfig::new(4).init::<NdArray>(&device).unwrap();
//! // Position 1: [sin(1), cos(1), sin(1/100), cos(1/100)] for d_model = 4.
//! let row: Vec<f32> = pe.encoding(1, 1).into_data().to_vec().unwrap();
//! assert!((row[0] - 1f32.sin()).abs() < 1e-6 && (row[3] - 0.01f32.cos()).abs() < 1e-6);
//!
//! // The paper adds positions to the (scaled) token embeddings, then applies dropout.
//! let inject = PositionInjectionConfig::new(4, 4).init().unwrap();
//! let tokens = Tensor::<NdArray, 3>::zeros([2, 3, 4], &device);
//! let x = inject.forward(tokens, pe.encoding(3, 0));
//! assert_eq!(x.dims(), [2, 3, inject.d_output]);
//! ```

#![warn(missing_docs)]

mod alibi;
mod error;
mod inject;
mod learned;
mod rotary;
mod sinusoidal;

pub use alibi::{alibi_slopes, Alibi, AlibiConfig};
pub use error::PositionError;
pub use inject::{PositionCombine, PositionInjection, PositionInjectionConfig};
pub use learned::{LearnedPositionConfig, LearnedPositionEmbedding};
pub use rotary::{RotaryConfig, RotaryEncoding, RotaryLayout};
pub use sinusoidal::{sinusoidal_table, SinusoidalConfig, SinusoidalEncoding};

use burn::tensor::{backend::Backend, Element, Tensor, TensorData};

/// A float tensor of the backend's float type from host values.
pub(crate) fn host_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    let dtype = <B::FloatElem as Element>::dtype();
    Tensor::from_data(
        TensorData::new(values, shape).convert_dtype(dtype),
        (device, dtype),
    )
}

/// A sinusoid or rotation base: greater than 1 (not NaN).
pub(crate) fn check_base(base: f64) -> Result<(), xfmr_attention::InvalidConfig> {
    xfmr_attention::InvalidConfig::check(base > 1.0, "base", base, "must be greater than 1")
}
