//! Position-wise feed-forward network (paper §3.3): `FFN(x) = act(x W₁ + b₁) W₂ + b₂`.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn::tensor::activation::{gelu, relu, silu};
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::{linear, InvalidConfig};

use crate::BlockError;

/// The feed-forward activation.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `max(0, x)` (paper).
    Relu,
    /// Exact GELU, `x Φ(x)` (BERT, GPT-2, PyTorch's `"gelu"`).
    Gelu,
    /// SwiGLU (Shazeer, 2020): `(silu(x W₁) ⊙ x W₃) W₂`, with a third, gating projection `W₃`
    /// whose weights are real parameters.
    SwiGlu,
}

/// Configuration of [`FeedForward`]. Every projection starts as PyTorch's `nn.Linear` and
/// burn's `LinearConfig` default: weight and bias uniform in `±1/√fan_in`.
#[derive(Config, Debug)]
pub struct FeedForwardConfig {
    /// Input and output width.
    pub d_model: usize,
    /// Inner width (paper: 2048 for d_model 512).
    pub d_ff: usize,
    /// Activation. Default: `Relu` (paper).
    #[config(default = "Activation::Relu")]
    pub activation: Activation,
    /// Dropout after the activation (PyTorch's and tensor2tensor's inner dropout; the paper
    /// names only the residual dropout). Default: 0.0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases on the projections. Default: true.
    #[config(default = true)]
    pub bias: bool,
}

impl FeedForwardConfig {
    /// Builds the network.
    ///
    /// # Errors
    /// Zero widths, dropout outside `[0, 1)`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<FeedForward<B>, BlockError> {
        InvalidConfig::positive("d_model", self.d_model)?;
        InvalidConfig::positive("d_ff", self.d_ff)?;
        InvalidConfig::dropout("dropout", self.dropout)?;
        let linear = |d_in, d_out| {
            LinearConfig::new(d_in, d_out)
                .with_bias(self.bias)
                .init(device)
        };
        Ok(FeedForward {
            linear1: linear(self.d_model, self.d_ff),
            linear2: linear(self.d_ff, self.d_model),
            gate: (self.activation == Activation::SwiGlu).then(|| linear(self.d_model, self.d_ff)),
            activation: self.activation,
            dropout: DropoutConfig::new(self.dropout).init(),
        })
    }
}

/// The position-wise feed-forward network. Built only by [`FeedForwardConfig::init`], which
/// gives a SwiGLU network its gate and no other network one: the activation and the gate are
/// private, so no other combination can exist (weight loaders reach the gate through
/// [`gate_mut`](Self::gate_mut), which cannot add or remove it).
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    /// `W₁`: `d_model → d_ff`.
    pub linear1: Linear<B>,
    /// `W₂`: `d_ff → d_model`.
    pub linear2: Linear<B>,
    /// `W₃`, the SwiGLU gate's second projection `d_model → d_ff`: present exactly when the
    /// activation is SwiGLU.
    gate: Option<Linear<B>>,
    activation: Activation,
    /// Dropout after the activation.
    pub dropout: Dropout,
}

impl<B: Backend> FeedForward<B> {
    /// The activation.
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// `W₃`, SwiGLU's gating projection `d_model → d_ff` (`None` for the other activations).
    pub fn gate(&self) -> Option<&Linear<B>> {
        self.gate.as_ref()
    }

    /// `W₃` to load weights into (`None` for the other activations).
    pub fn gate_mut(&mut self) -> Option<&mut Linear<B>> {
        self.gate.as_mut()
    }

    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq, d_model] = x.dims();
        // (B, T, d) -> (B·T, d): one 2-D product on the CPU backends.
        let x = x.reshape([batch * seq, d_model]);
        let hidden = linear(&self.linear1, x.clone());
        let hidden = match (self.activation, &self.gate) {
            (Activation::Relu, _) => relu(hidden),
            (Activation::Gelu, _) => exact_gelu(hidden),
            (Activation::SwiGlu, Some(gate)) => silu(hidden) * linear(gate, x),
            (Activation::SwiGlu, None) => {
                unreachable!("FeedForwardConfig::init gives SwiGLU a gate")
            }
        };
        let out = linear(&self.linear2, crate::dropout(&self.dropout, hidden));
        let d_out = out.dims()[1];
        out.reshape([batch, seq, d_out])
    }
}

/// Exact GELU, `x Φ(x) = ½ x (1 + erf(x / √2))`, with an exact gradient.
///
/// burn 0.21's `gelu` computes this forward, but its default backward is the derivative of the
/// *tanh approximation*: gradients through it are off by up to ~1e-3 relative (caught by the
/// `nn.Transformer` gradient parity test). Under autodiff the function is therefore composed from
/// `erf`, whose backward is exact; without autodiff burn's single operation is used. On the
/// `flex` backend (feature `flex`) a vectorised host kernel runs instead, whose `erf` is
/// Abramowitz and Stegun's 7.1.26 (absolute error ≤ 1.5e-7, as PyTorch's vectorised CPU
/// `erf`): on `Flex` itself, and on `Autodiff<Flex>` as one operation of the graph whose
/// backward is the exact derivative `Φ(x) + x φ(x)` in one pass (the composition's forward
/// and backward make about sixteen whole-tensor passes; libm's scalar `erff` alone was 6% of a
/// GPT-like training step on the CPU: docs/training.md).
pub fn exact_gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "flex")]
    if xfmr_kernels::runs_on_autodiff::<B>(x.dtype()) {
        return xfmr_kernels::gelu_autodiff(x);
    }
    if B::ad_enabled(&x.device()) {
        let cdf = x
            .clone()
            .div_scalar(std::f64::consts::SQRT_2)
            .erf()
            .add_scalar(1.0);
        x * cdf.mul_scalar(0.5)
    } else {
        #[cfg(feature = "flex")]
        if xfmr_kernels::runs_on::<B>(x.dtype()) {
            // On flex: a vectorised host kernel instead of one libm `erff` call per element
            // (docs/benchmarks.md).
            return xfmr_kernels::gelu(x);
        }
        gelu(x)
    }
}
