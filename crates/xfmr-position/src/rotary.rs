//! Rotary position embedding (RoPE; Su et al., 2021), an extension beyond the paper.
//!
//! Each pair of features `(a, b)` of a query or key at position `p` is rotated by the angle
//! `p·θ_i`, `θ_i = base^(-2i/d)`:
//!
//! ```text
//! a' = a cos(pθ_i) − b sin(pθ_i),   b' = b cos(pθ_i) + a sin(pθ_i)
//! ```
//!
//! Rotations preserve norms, and `R(p)q · R(p')k` depends only on `p − p'`. Apply it to queries
//! and keys after projection and before attention, with `offset = cache.len()` while decoding
//! through a key/value cache: cached keys keep the rotation of their own positions.
//! `RotaryEncoding` implements `xfmr_attention::QkRotation`, so
//! `MhaInput::self_attn(x).rotary(rope)` does exactly that, cached or not.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::{InvalidConfig, QkRotation};

use crate::{check_base, host_tensor, PositionError};

/// Which features form a rotated pair.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum RotaryLayout {
    /// Feature `i` pairs with `i + d/2` (GPT-NeoX, Hugging Face LLaMA).
    HalfSplit,
    /// Feature `2i` pairs with `2i + 1` (RoFormer, the original paper; GPT-J).
    Interleaved,
}

/// Configuration of [`RotaryEncoding`].
#[derive(Config, Debug)]
pub struct RotaryConfig {
    /// Width of one head (`d_k`); must be even.
    pub head_dim: usize,
    /// Frequency base. Default: 10000.
    #[config(default = 10000.0)]
    pub base: f64,
    /// Pairing of features. Default: `HalfSplit`.
    #[config(default = "RotaryLayout::HalfSplit")]
    pub layout: RotaryLayout,
}

impl RotaryConfig {
    /// Builds the encoding.
    ///
    /// # Errors
    /// A zero or odd `head_dim`, or `base <= 1`.
    pub fn init(&self) -> Result<RotaryEncoding, PositionError> {
        InvalidConfig::positive("head_dim", self.head_dim)?;
        InvalidConfig::check(
            self.head_dim.is_multiple_of(2),
            "head_dim",
            self.head_dim,
            "must be even (rotated in pairs)",
        )?;
        check_base(self.base)?;
        Ok(RotaryEncoding {
            head_dim: self.head_dim,
            base: self.base,
            layout: self.layout,
        })
    }
}

/// Rotary position embedding. Stateless: angles are computed for the positions requested, so
/// there is no maximum length.
#[derive(Module, Debug, Clone)]
pub struct RotaryEncoding {
    /// Width of one head.
    pub head_dim: usize,
    /// Frequency base.
    pub base: f64,
    /// Pairing of features.
    pub layout: RotaryLayout,
}

impl RotaryEncoding {
    /// Rotates `x` (queries or keys) at positions `offset..offset + seq`.
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`
    /// - output: `[batch, heads, seq, head_dim]`
    ///
    /// # Panics
    /// If the last dimension is not `head_dim`.
    pub fn apply<B: Backend>(&self, x: Tensor<B, 4>, offset: usize) -> Tensor<B, 4> {
        let [batch, heads, seq, d] = x.dims();
        assert_eq!(
            d, self.head_dim,
            "RotaryEncoding::apply: last dimension {d} is not head_dim {}",
            self.head_dim
        );
        let half = d / 2;
        // cos/sin per position and feature, in the layout's feature order: [seq, d].
        let (mut cos, mut sin) = (Vec::with_capacity(seq * d), Vec::with_capacity(seq * d));
        for pos in offset..offset + seq {
            for col in 0..d {
                let pair = match self.layout {
                    RotaryLayout::HalfSplit => col % half,
                    RotaryLayout::Interleaved => col / 2,
                };
                let angle = pos as f64 * self.base.powf(-2.0 * pair as f64 / d as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let device = x.device();
        let cos = host_tensor::<B, 4>(cos, [1, 1, seq, d], &device);
        let sin = host_tensor::<B, 4>(sin, [1, 1, seq, d], &device);
        // rotate(x) holds, at each feature, the partner's value with the sign of the rotation:
        // out = x ⊙ cos + rotate(x) ⊙ sin.
        let rotated = match self.layout {
            RotaryLayout::HalfSplit => {
                let first = x.clone().narrow(3, 0, half);
                let second = x.clone().narrow(3, half, half);
                Tensor::cat(vec![second.neg(), first], 3)
            }
            RotaryLayout::Interleaved => {
                // (B, h, T, d) -> (B, h, T, d/2, 2): the pairs side by side.
                let pairs = x.clone().reshape([batch, heads, seq, half, 2]);
                let even = pairs.clone().narrow(4, 0, 1);
                let odd = pairs.narrow(4, 1, 1);
                Tensor::cat(vec![odd.neg(), even], 4).reshape([batch, heads, seq, d])
            }
        };
        x * cos.expand([batch, heads, seq, d]) + rotated * sin.expand([batch, heads, seq, d])
    }
}

impl<B: Backend> QkRotation<B> for RotaryEncoding {
    fn rotate(&self, x: Tensor<B, 4>, offset: usize) -> Tensor<B, 4> {
        self.apply(x, offset)
    }
}
