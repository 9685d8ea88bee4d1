//! `xfmr_attention::linear` and `project` under each matmul precision: `bf16` products on
//! flex against burn's `f32` product, and under `Autodiff<Flex>` their gradients against the
//! exact ones.

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
/// (`takes_bf16_products` agrees with the CPU probe) for inputs of at least `BF16_MIN_ROWS`
/// rows, every element within the kernel's bound
/// `(2⁻⁷ + 2⁻¹⁶ + (k+1)·2⁻²⁴)·(Σ|x||W| + |b|)` of the exact product plus the `f32` product's
/// own error `(k+1)·2⁻²⁴·(Σ|x||W| + |b|)`, and is exactly `forward` for fewer rows (15 and
/// 127; 128 and 129 take the kernel); inputs and weights contiguous, at an offset into a
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
        BF16_MIN_ROWS,
    };

    assert_eq!(
        takes_bf16_products::<Flex>(),
        xfmr_kernels::cpu::has_bf16_products()
    );
    assert!(!takes_bf16_products::<NdArray>());
    assert_eq!(
        takes_bf16_products::<Autodiff<Flex>>(),
        xfmr_kernels::cpu::has_bf16_products()
    );
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
        if !takes_bf16_products::<B>() || r0 * r1 < BF16_MIN_ROWS {
            // No bf16 products on this backend or CPU, or too few rows to repay the packing.
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
        // Below BF16_MIN_ROWS (128): burn's f32 product, exactly.
        case::<Flex>(70, 50, [3, 5], x, w);
        case::<Flex>(70, 50, [1, 127], x, w);
        // From it on: the kernel.
        case::<Flex>(70, 50, [3, 43], x, w);
        case::<Flex>(384, 96, [2, 64], x, w);
        // A leading dimension of one (any stride).
        case::<Flex>(64, 40, [1, 130], x, w);
        case::<NdArray>(70, 50, [3, 43], x, w);
    }
}

/// `xfmr_attention::project` under `Bf16` on `Autodiff<Flex>` (training): the output and the
/// gradients of `ℓ = Σ y ⊙ G` (so `∂ℓ/∂y = G` exactly) with respect to `x`, `W` and `b`, each
/// element within the `bf16` kernel's bound of the exact (f64) value for its inner size `K`:
/// `(2⁻⁷ + 2⁻¹⁶ + (K+1)·2⁻²⁴)·mass`, where the mass is `Σ|x||W| + |b|` (y, `K` = d_in),
/// `Σ|G||W|` (∂x, `K` = d_out) and `Σ|x||G|` (∂W, `K` = rows); `∂b`, summed in `f32`, within
/// `(rows+1)·2⁻²⁴·Σ|G|`. Some gradient element differs from the `f32` run's (the kernel ran)
/// where `takes_bf16_products` holds, and everything equals it elsewhere. Cases: contiguous
/// leaves with a bias; `W` as the transpose of a `[d_out, d_in]` leaf (as a tied embedding's
/// output projection) without one; a bias, but only `W` tracked (`x` and `b` constants, as
/// the first layer's input is: the backward computes `∂W` alone).
#[cfg(feature = "flex")]
#[test]
fn bf16_linear_autodiff_gradients_within_bound() {
    use burn::tensor::Tensor;
    use xfmr_attention::{project, takes_bf16_products, with_matmul_precision, MatmulPrecision};
    type A = Autodiff<Flex>;

    let kernel = takes_bf16_products::<A>();
    assert_eq!(kernel, xfmr_kernels::cpu::has_bf16_products());
    let device = Default::default();
    for (case, (rows, d_in, d_out, transposed, with_bias, tracked)) in [
        ([2, 7], 70, 50, false, true, true),
        ([3, 40], 96, 33, true, false, true),
        ([4, 9], 33, 17, false, true, false),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = TestRng::new(7 + case as u64);
        let m = rows[0] * rows[1];
        let x = rng.tensor::<A, 3>([rows[0], rows[1], d_in], 1.0, &device);
        let w_leaf = if transposed {
            rng.tensor::<A, 2>([d_out, d_in], 0.5, &device)
        } else {
            rng.tensor::<A, 2>([d_in, d_out], 0.5, &device)
        };
        let b = rng.tensor::<A, 1>([d_out], 0.5, &device);
        let g = rng.tensor::<A, 3>([rows[0], rows[1], d_out], 1.0, &device);
        // Host copies, row-major: x [m, d_in], w [d_in, d_out], g [m, d_out].
        let (xs, gs, bs) = (to_vec(&x), to_vec(&g), to_vec(&b));
        let w_host = to_vec(&w_leaf);
        let ws: Vec<f64> = if transposed {
            (0..d_in * d_out)
                .map(|i| w_host[(i % d_out) * d_in + i / d_out])
                .collect()
        } else {
            w_host
        };
        let bs: Vec<f64> = if with_bias { bs } else { vec![0.0; d_out] };
        let run = |precision| {
            let track = |t: Tensor<A, 3>| if tracked { t.require_grad() } else { t };
            let (x, w_leaf) = (track(x.clone()), w_leaf.clone().require_grad());
            let b = if tracked {
                b.clone().require_grad()
            } else {
                b.clone()
            };
            let w = if transposed {
                w_leaf.clone().transpose()
            } else {
                w_leaf.clone()
            };
            let bias = with_bias.then(|| b.clone());
            let y: Tensor<A, 3> = with_matmul_precision(precision, || project(x.clone(), w, bias));
            let grads = (y.clone() * g.clone()).sum().backward();
            let dw = w_leaf.grad(&grads).expect("∂W");
            let dw = if transposed { dw.transpose() } else { dw };
            assert_eq!(x.grad(&grads).is_some(), tracked, "∂x only for a tracked x");
            [
                to_vec(&y),
                x.grad(&grads).map(|dx| to_vec(&dx)).unwrap_or_default(),
                to_vec(&dw),
                if with_bias && tracked {
                    to_vec(&b.grad(&grads).expect("∂b"))
                } else {
                    Vec::new()
                },
            ]
        };
        let f32_run = run(MatmulPrecision::F32);
        let bf16_run = run(MatmulPrecision::Bf16);
        if !kernel {
            assert_eq!(bf16_run, f32_run, "no bf16 products: the f32 path");
            continue;
        }
        let eps = 2f64.powi(-24);
        let factor = |inner: usize| 2f64.powi(-7) + 2f64.powi(-16) + (inner as f64 + 1.0) * eps;
        // (exact, mass) of each element.
        let exact_y = (0..m * d_out).map(|e| {
            let (i, j) = (e / d_out, e % d_out);
            (0..d_in).fold((bs[j], bs[j].abs()), |(s, a), l| {
                let p = xs[i * d_in + l] * ws[l * d_out + j];
                (s + p, a + p.abs())
            })
        });
        let exact_dx = (0..m * d_in).map(|e| {
            let (i, l) = (e / d_in, e % d_in);
            (0..d_out).fold((0.0, 0.0), |(s, a), j| {
                let p = gs[i * d_out + j] * ws[l * d_out + j];
                (s + p, a + p.abs())
            })
        });
        let exact_dw = (0..d_in * d_out).map(|e| {
            let (l, j) = (e / d_out, e % d_out);
            (0..m).fold((0.0, 0.0), |(s, a), i| {
                let p = xs[i * d_in + l] * gs[i * d_out + j];
                (s + p, a + p.abs())
            })
        });
        let exact: [Vec<(f64, f64)>; 3] =
            [exact_y.collect(), exact_dx.collect(), exact_dw.collect()];
        for ((name, inner), (got, want)) in [("y", d_in), ("∂x", d_out), ("∂W", m)]
            .into_iter()
            .zip(bf16_run.iter().zip(&exact))
            .filter(|((name, _), _)| tracked || *name != "∂x")
        {
            assert_eq!(got.len(), want.len(), "{name}: size");
            for (e, (g, (w, mass))) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= factor(inner) * mass,
                    "case {case}: {name}[{e}] = {g}, exact {w} (mass {mass})"
                );
            }
        }
        if with_bias && tracked {
            for (j, got) in bf16_run[3].iter().enumerate() {
                let column = (0..m).map(|i| gs[i * d_out + j]);
                let (sum, mass) = column.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
                assert!(
                    (got - sum).abs() <= (m as f64 + 1.0) * eps * mass,
                    "case {case}: ∂b[{j}] = {got}, exact {sum}"
                );
            }
        }
        for (name, (fast, slow)) in ["∂x", "∂W"]
            .iter()
            .zip(bf16_run[1..3].iter().zip(&f32_run[1..3]))
            .filter(|(name, _)| tracked || **name != "∂x")
        {
            assert_ne!(
                fast, slow,
                "case {case}: {name} the same as f32's: no bf16 kernel ran"
            );
        }
    }
}
