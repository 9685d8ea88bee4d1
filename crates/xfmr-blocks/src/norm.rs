//! Layer normalisation and RMS normalisation, and where they sit.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use xfmr_attention::InvalidConfig;

use crate::BlockError;

/// Which normalisation.
#[derive(Config, Debug, Copy, PartialEq)]
pub enum NormKind {
    /// LayerNorm (Ba et al., 2016), the paper's: `(x − mean) / √(var + ε) · γ + β`.
    LayerNorm,
    /// RMSNorm (Zhang & Sennrich, 2019): `x / √(mean(x²) + ε) · γ`, no centring, no bias.
    RmsNorm,
}

/// Where the norm sits around each residual sublayer.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum NormPosition {
    /// The paper's "Add & Norm": `LayerNorm(x + Sublayer(x))`.
    Post,
    /// `x + Sublayer(LayerNorm(x))` (GPT-2 and later). Stacks usually end with a final norm.
    Pre,
}

/// Configuration of [`Norm`].
#[derive(Config, Debug)]
pub struct NormConfig {
    /// Width normalised over (the last dimension).
    pub d_model: usize,
    /// Kind. Default: `LayerNorm`.
    #[config(default = "NormKind::LayerNorm")]
    pub kind: NormKind,
    /// ε inside the square root. Default: 1e-5 (PyTorch's LayerNorm).
    #[config(default = 1e-5)]
    pub eps: f64,
}

impl NormConfig {
    /// Builds the norm with `γ = 1` (and `β = 0` for LayerNorm).
    ///
    /// # Errors
    /// Zero width or non-positive ε.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Norm<B>, BlockError> {
        InvalidConfig::positive("d_model", self.d_model)?;
        InvalidConfig::check(self.eps > 0.0, "eps", self.eps, "must be positive")?;
        Ok(Norm {
            gamma: Initializer::Ones.init([self.d_model], device),
            beta: (self.kind == NormKind::LayerNorm)
                .then(|| Initializer::Zeros.init([self.d_model], device)),
            kind: self.kind,
            eps: self.eps,
        })
    }
}

/// A row kernel's signature: `x`, γ, β, ε, whether RMSNorm.
#[cfg(feature = "flex")]
type NormKernel<B> =
    fn(Tensor<B, 3>, Tensor<B, 1>, Option<Tensor<B, 1>>, f64, bool) -> Tensor<B, 3>;

/// LayerNorm or RMSNorm over the last dimension.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    /// Scale γ `[d_model]`.
    pub gamma: Param<Tensor<B, 1>>,
    /// Shift β `[d_model]` (LayerNorm only).
    pub beta: Option<Param<Tensor<B, 1>>>,
    /// Kind.
    pub kind: NormKind,
    /// ε.
    pub eps: f64,
}

impl<B: Backend> Norm<B> {
    /// Normalises over the last dimension (biased variance, as PyTorch).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        // On flex, f32 throughout: each row normalised while it sits in L1, instead of the nine
        // whole-tensor operations below (docs/benchmarks-log.md, the Zen 5 section); under
        // autodiff one operation of the graph whose backward is a row kernel too
        // (docs/training.md).
        #[cfg(feature = "flex")]
        if let Some(kernel) = self.kernel(&x) {
            return kernel(
                x,
                self.gamma.val(),
                self.beta.as_ref().map(Param::val),
                self.eps,
                self.kind == NormKind::RmsNorm,
            );
        }
        let [batch, seq, d_model] = x.dims();
        let normalised = match self.kind {
            NormKind::LayerNorm => {
                let mean = x.clone().mean_dim(2);
                let centred = x - mean;
                let var = centred.clone().powi_scalar(2).mean_dim(2);
                centred / (var + self.eps).sqrt()
            }
            NormKind::RmsNorm => {
                let ms = x.clone().powi_scalar(2).mean_dim(2);
                x / (ms + self.eps).sqrt()
            }
        };
        // (B, T, d) -> (B·T, d), a view: γ and β broadcast over one axis instead of two, so
        // that autodiff sums each one's gradient in one reduction instead of two (one kernel
        // launch fewer per norm and training step on the fused GPU backends,
        // docs/benchmarks.md). The same arithmetic.
        let out = normalised.reshape([batch * seq, d_model]) * self.gamma.val().unsqueeze::<2>();
        let out = match &self.beta {
            Some(beta) => out + beta.val().unsqueeze::<2>(),
            None => out,
        };
        out.reshape([batch, seq, d_model])
    }

    /// xfmr's row kernel for `x` and this norm's parameters, if one runs on them: `norm` on
    /// `Flex`, `norm_autodiff` on `Autodiff<Flex>`, f32 throughout. None for an RMSNorm given
    /// a β (a public field), which the kernels do not add.
    #[cfg(feature = "flex")]
    fn kernel(&self, x: &Tensor<B, 3>) -> Option<NormKernel<B>> {
        let all = |runs_on: fn(burn::tensor::DType) -> bool| {
            runs_on(x.dtype())
                && runs_on(self.gamma.dtype())
                && self.beta.as_ref().is_none_or(|b| runs_on(b.dtype()))
        };
        if self.kind == NormKind::RmsNorm && self.beta.is_some() {
            None
        } else if all(xfmr_kernels::runs_on::<B>) {
            Some(xfmr_kernels::norm::<B, 3>)
        } else if all(xfmr_kernels::runs_on_autodiff::<B>) {
            Some(xfmr_kernels::norm_autodiff::<B, 3>)
        } else {
            None
        }
    }
}
