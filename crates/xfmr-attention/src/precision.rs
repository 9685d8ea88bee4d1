//! What the matrix products of the layers' `Linear` projections may compute in: the
//! [`MatmulPrecision`] a caller permits for what runs inside [`with_matmul_precision`], and
//! [`linear`], the one call every projection of the xfmr crates goes through ([`project`]
//! for a weight that is not a `Linear`'s, such as a tied embedding table's transpose).
//!
//! As PyTorch's `torch.set_float32_matmul_precision("medium")` and JAX's
//! `default_matmul_precision`, the setting is a permission, not a format: the tensors stay
//! `f32`, and a product may round its factors to `bf16` (summing in `f32`) where that is
//! faster, which on xfmr's side is burn's `flex` backend on a CPU that multiplies `bf16` in
//! hardware (AMX or AVX-512 BF16; [`takes_bf16_products`]). Elsewhere it is the `f32`
//! product, as by default. Under `Autodiff<Flex>` (training) the backward's products are
//! `bf16` products too, while the parameters, their gradients and the optimiser's state stay
//! `f32`, as under PyTorch's autocast. Each element then differs from the exact product
//! `x·W + b` by at most `(2⁻⁷ + 2⁻¹⁶ + (k+1)·2⁻²⁴) · (Σₗ |x_l|·|W_lj| + |b_j|)` (inner size
//! `k`; bf16's unit roundoff is 2⁻⁸ per factor; the kernel's tests hold every CPU path to it),
//! where the `f32` product's own error is within `(k+1)·2⁻²⁴` of the same sum.
//! Outside autodiff a product of fewer than [`BF16_MIN_ROWS`] rows stays `f32` (the `bf16`
//! kernel packs the weights on every call, which a few rows cannot repay).
//!
//! The setting is the calling thread's and lasts for the closure (burn's CPU backends run a
//! forward pass on the thread that calls it; their workers inherit nothing): a server can run
//! one model with `bf16` products beside another without them on threads of its own. Not from
//! inside a rayon job: a worker waiting in one of flex's parallel loops may run another job
//! meanwhile, which would then see this setting.

use std::cell::Cell;

use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// What the `Linear` projections' products may compute in, for the calling thread inside
/// [`with_matmul_precision`]: a permission, as PyTorch's `set_float32_matmul_precision`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MatmulPrecision {
    /// `f32` factors and sums (burn's own product): the default.
    #[default]
    F32,
    /// Factors rounded to `bf16`, sums in `f32`, where [`takes_bf16_products`] holds; the `f32`
    /// product elsewhere.
    Bf16,
}

impl std::str::FromStr for MatmulPrecision {
    type Err = String;

    /// `f32` or `bf16` (a command line's `--precision`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            other => Err(format!(
                "unknown matmul precision {other:?} (expected f32 or bf16)"
            )),
        }
    }
}

impl std::fmt::Display for MatmulPrecision {
    /// `f32` or `bf16`, as [`FromStr`](std::str::FromStr) reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

thread_local! {
    static PRECISION: Cell<MatmulPrecision> = const { Cell::new(MatmulPrecision::F32) };
}

/// The precision the calling thread's projections run with now ([`MatmulPrecision::F32`]
/// outside [`with_matmul_precision`]).
pub fn matmul_precision() -> MatmulPrecision {
    PRECISION.with(Cell::get)
}

/// Runs `f` with `precision` permitted for the calling thread's projections, and restores the
/// previous setting after it (also when `f` panics). Nested calls take the innermost.
///
/// ```
/// use xfmr_attention::{matmul_precision, with_matmul_precision, MatmulPrecision};
///
/// let inside = with_matmul_precision(MatmulPrecision::Bf16, matmul_precision);
/// assert_eq!(inside, MatmulPrecision::Bf16);
/// assert_eq!(matmul_precision(), MatmulPrecision::F32);
/// ```
pub fn with_matmul_precision<R>(precision: MatmulPrecision, f: impl FnOnce() -> R) -> R {
    struct Restore(MatmulPrecision);
    impl Drop for Restore {
        fn drop(&mut self) {
            PRECISION.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PRECISION.with(|p| p.replace(precision)));
    f()
}

/// Whether [`MatmulPrecision::Bf16`] changes anything for tensors of backend `B`: `B` is
/// burn's `Flex` or `Autodiff<Flex>` (this crate built with its `flex` feature, f32 tensors)
/// and the CPU multiplies `bf16` in hardware (AMX or AVX-512 BF16). Under `Autodiff<Flex>` the
/// backward's products (`∂ℓ/∂x = G·Wᵀ`, `∂ℓ/∂W = xᵀ·G`) are `bf16` products too; the
/// parameters, their gradients and the optimiser's state stay `f32`. `false` for every other
/// backend.
pub fn takes_bf16_products<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    {
        let f32 = burn::tensor::DType::F32;
        (xfmr_kernels::runs_on::<B>(f32) || xfmr_kernels::runs_on_autodiff::<B>(f32))
            && xfmr_kernels::cpu::has_bf16_products()
    }
    #[cfg(not(feature = "flex"))]
    {
        false
    }
}

/// Whether [`project`] takes xfmr's `bf16` kernel for `x` now: [`MatmulPrecision::Bf16`]
/// permitted, `f32` values, [`takes_bf16_products`] for `B`, and under autodiff always,
/// outside it from [`BF16_MIN_ROWS`] rows on.
fn takes_kernel<B: Backend, const D: usize>(x: &Tensor<B, D>) -> bool {
    #[cfg(feature = "flex")]
    {
        let rows = || x.dims()[..D - 1].iter().product::<usize>();
        matmul_precision() == MatmulPrecision::Bf16
            && x.dtype() == burn::tensor::DType::F32
            && takes_bf16_products::<B>()
            && (!xfmr_kernels::runs_on::<B>(x.dtype()) || rows() >= BF16_MIN_ROWS)
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = x;
        false
    }
}

/// `x·W + b` through `linear`, with the products the calling thread's [`matmul_precision`]
/// permits: `linear.forward(x)` unless the precision is [`MatmulPrecision::Bf16`] and
/// [`takes_bf16_products`] holds for `B`, then [`project`] (its `bf16` kernel from
/// [`BF16_MIN_ROWS`] rows on, outside autodiff). Every projection of
/// attention, the feed-forward blocks and the models' heads goes through it.
///
/// # Shapes
/// - `x`: `[..., d_in]`; output: `[..., d_out]`
pub fn linear<B: Backend, const D: usize>(linear: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    if takes_kernel(&x) {
        return project(
            x,
            linear.weight.val(),
            linear.bias.as_ref().map(|b| b.val()),
        );
    }
    linear.forward(x)
}

/// The fewest rows of `x` (all its dimensions but the last, multiplied) for which
/// [`project`] outside autodiff takes the `bf16` kernel: the kernel packs the weights into
/// `bf16` pairs on every call, which costs about as much as an `f32` product of ~128 rows, so
/// fewer rows (decoding's one row per sequence and step, a short sentence) keep burn's `f32`
/// product, never slower than `MatmulPrecision::F32`. Measured on the Intel Xeon kind (AMX;
/// 2 threads, 2026-12-04, `docs/benchmarks.md`), the `f32` call's time over the `bf16` one's:
/// 0.09–0.33 at 1 row (a `[512, 37,000]` projection 6.5 ms against 25), 0.60–1.35 at 128
/// rows, 0.97–2.33 at 256, 1.39–3.47 at 1,024. Training's products (thousands of rows) are
/// not gated.
pub const BF16_MIN_ROWS: usize = 128;

/// `x·W + b` for any weight tensor (a tied embedding table's transpose, say), with the
/// products the calling thread's [`matmul_precision`] permits: xfmr's `bf16` kernel where it
/// is [`MatmulPrecision::Bf16`] and [`takes_bf16_products`] holds for `B` (weights packed per
/// call, `f32` sums; under `Autodiff<Flex>` one operation of the graph whose backward's
/// products are `bf16` too) and, outside autodiff, `x` has at least [`BF16_MIN_ROWS`] rows;
/// burn's `x.matmul(W) + b` otherwise.
///
/// # Shapes
/// - `x`: `[..., d_in]`
/// - `weight`: `[d_in, d_out]` (any layout: a transposed view is read in place); `bias`:
///   `[d_out]`
/// - output: `[..., d_out]`
pub fn project<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    #[cfg(feature = "flex")]
    if takes_kernel(&x) {
        return if xfmr_kernels::runs_on::<B>(x.dtype()) {
            xfmr_kernels::linear_bf16(x, weight, bias)
        } else {
            xfmr_kernels::linear_bf16_autodiff(x, weight, bias)
        };
    }
    if D == 1 {
        // `matmul` wants a matrix: `[d_in]` as one row.
        return project(x.unsqueeze::<2>(), weight, bias).squeeze_dim(0);
    }
    let out = x.matmul(weight.unsqueeze());
    match bias {
        Some(bias) => out + bias.unsqueeze(),
        None => out,
    }
}
