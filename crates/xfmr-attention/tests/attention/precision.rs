//! `xfmr_attention::linear` under each matmul precision: `bf16` products on flex against
//! burn's `f32` product.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use xfmr_testing::{to_vec, TestRng};

/// How a test's operand is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Contiguous, row-major.
    Contiguous,
    /// A view at an offset into a larger buffer (`narrow` of the first dimension).
    Offset,
    /// Transposed in storage: x's two leading dimensions swapped (its rows do not merge into
    /// one stride, so the glue copies it); W held `[out, in]` as PyTorch stores it.
    Transposed,
}

/// `xfmr_attention::linear` under each [`MatmulPrecision`]: `F32` (the default) is exactly
/// `Linear::forward` on flex and ndarray; `Bf16` is exactly `forward` on ndarray (no `bf16`
/// products there) and on flex takes xfmr's kernel where the CPU multiplies `bf16` in hardware
/// (`takes_bf16_products` agrees with the CPU probe), every element within the kernel's bound
/// `(2⁻⁷ + 2⁻¹⁶ + (k+1)·2⁻²⁴)·(Σ|x||W| + |b|)` of the exact product plus the `f32` product's
/// own error `(k+1)·2⁻²⁴·(Σ|x||W| + |b|)`; inputs and weights contiguous, at an offset into a
/// larger buffer, transposed, and with a leading dimension of one. The setting is restored
/// after the closure.
///
/// Compiled only with this crate's `flex` feature (as `flex_kernel_equals_reference`); `.ci/run`
/// fails when the test did not run.
#[cfg(feature = "flex")]
#[test]
fn bf16_linear_on_flex_takes_the_kernel_within_bound() {
    use xfmr_attention::{
        linear, matmul_precision, takes_bf16_products, with_matmul_precision, MatmulPrecision,
    };

    assert_eq!(
        takes_bf16_products::<Flex>(),
        xfmr_kernels::cpu::has_bf16_products()
    );
    assert!(!takes_bf16_products::<NdArray>());
    assert!(!takes_bf16_products::<Autodiff<Flex>>());
    eprintln!(
        "bf16 products on flex: {} ({:?})",
        takes_bf16_products::<Flex>(),
        xfmr_kernels::cpu::Bf16Level::detect()
    );
    fn case<B: Backend>(d_in: usize, d_out: usize, rows: [usize; 2], x: Layout, w: Layout) {
        let device = Default::default();
        let mut rng = TestRng::new((d_in * 31 + d_out) as u64);
        let weight = match w {
            Layout::Contiguous => rng.tensor::<B, 2>([d_in, d_out], 0.5, &device),
            Layout::Offset => rng
                .tensor::<B, 2>([d_in + 3, d_out], 0.5, &device)
                .narrow(0, 2, d_in),
            Layout::Transposed => rng
                .tensor::<B, 2>([d_out + 2, d_in], 0.5, &device)
                .narrow(0, 1, d_out)
                .transpose(),
        };
        let bias = rng.tensor::<B, 1>([d_out], 0.5, &device);
        let layer = Linear {
            weight: Param::from_tensor(weight.clone()),
            bias: Some(Param::from_tensor(bias.clone())),
        };
        let [r0, r1] = rows;
        let x = match x {
            Layout::Contiguous => rng.tensor::<B, 3>([r0, r1, d_in], 1.0, &device),
            Layout::Offset => rng
                .tensor::<B, 3>([r0 + 2, r1, d_in], 1.0, &device)
                .narrow(0, 1, r0),
            Layout::Transposed => rng
                .tensor::<B, 3>([r1, r0, d_in], 1.0, &device)
                .swap_dims(0, 1),
        };
        let exact = layer.forward(x.clone());
        assert_eq!(to_vec(&linear(&layer, x.clone())), to_vec(&exact));
        let fast = with_matmul_precision(MatmulPrecision::Bf16, || {
            assert_eq!(matmul_precision(), MatmulPrecision::Bf16);
            linear(&layer, x.clone())
        });
        assert_eq!(matmul_precision(), MatmulPrecision::F32);
        assert_eq!(fast.dims(), exact.dims());
        if !takes_bf16_products::<B>() {
            assert_eq!(to_vec(&fast), to_vec(&exact));
            return;
        }
        let mass = x.abs().matmul(weight.abs().unsqueeze()) + bias.abs().unsqueeze();
        let eps = 2f64.powi(-24);
        let k1 = d_in as f64 + 1.0;
        let factor = 2f64.powi(-7) + 2f64.powi(-16) + 2.0 * k1 * eps;
        let (fast, exact, mass) = (to_vec(&fast), to_vec(&exact), to_vec(&mass));
        let mut changed = false;
        for ((f, e), m) in fast.iter().zip(&exact).zip(&mass) {
            assert!((f - e).abs() <= factor * m, "{f} vs {e} (mass {m})");
            changed |= f != e;
        }
        assert!(
            changed,
            "the bf16 kernel ran (some product differs from f32)"
        );
    }
    use Layout::*;
    for (x, w) in [
        (Contiguous, Contiguous),
        (Offset, Offset),
        (Transposed, Transposed),
        (Contiguous, Transposed),
    ] {
        case::<Flex>(70, 50, [3, 5], x, w);
        case::<Flex>(384, 96, [2, 40], x, w);
        // A leading dimension of one (any stride).
        case::<Flex>(64, 40, [1, 33], x, w);
        case::<NdArray>(70, 50, [3, 5], x, w);
    }
}
