//! The norm under `Autodiff<Flex>`: xfmr's row kernels as one operation of the graph, against
//! burn's composition on `Autodiff<NdArray>`. Compiled only with this crate's `flex` feature;
//! `.ci/run` fails when the test did not run.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Param;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use xfmr_blocks::{Norm, NormConfig, NormKind};

/// A norm with these γ and (if given, also for an RMSNorm: a public field `init` never sets for
/// one) β.
fn norm<B: AutodiffBackend>(kind: NormKind, gammas: &[f32], betas: Option<&[f32]>) -> Norm<B> {
    let device = Default::default();
    let mut n = NormConfig::new(gammas.len())
        .with_kind(kind)
        .with_eps(1e-5)
        .init::<B>(&device)
        .unwrap();
    n.gamma = Param::from_tensor(Tensor::from_floats(gammas, &device));
    n.beta = betas.map(|b| Param::from_tensor(Tensor::from_floats(b, &device)));
    n
}

/// What [`run`] returns, in order.
const OUTPUTS: [&str; 4] = ["value", "∂x", "∂γ", "∂β"];

/// The output and the gradients of `Σ w · norm(x)` with respect to `x`, γ and β (empty where
/// there is no β).
fn run<B: AutodiffBackend>(
    n: &Norm<B>,
    xs: &[f32],
    ws: &[f32],
    shape: [usize; 3],
) -> [Vec<f32>; 4] {
    let device = Default::default();
    let x = Tensor::<B, 1>::from_floats(xs, &device)
        .reshape(shape)
        .require_grad();
    let y = n.forward(x.clone());
    let w = Tensor::<B, 1>::from_floats(ws, &device).reshape(shape);
    let grads = (y.clone() * w).sum().backward();
    let values = |t: Tensor<B::InnerBackend, 1>| t.into_data().to_vec::<f32>().unwrap();
    let n_all = xs.len();
    [
        values(y.inner().reshape([n_all])),
        values(x.grad(&grads).expect("x is tracked").reshape([n_all])),
        values(n.gamma.val().grad(&grads).expect("γ is tracked")),
        n.beta
            .as_ref()
            .map(|b| values(b.val().grad(&grads).expect("β is tracked")))
            .unwrap_or_default(),
    ]
}

/// `Norm::forward` on `Autodiff<Flex>` is `xfmr_kernels::norm_autodiff`: its value is
/// `xfmr_kernels::norm`'s on `Flex` bit for bit, its gradients with respect to `x`, γ and β are
/// `xfmr_kernels::norm_rows_backward`'s called directly bit for bit (ten rows: one parallel
/// block, so the same sums; the proof of the path), for LayerNorm with β and RMSNorm, under an
/// incoming gradient that is not uniform. They agree with burn's composition on
/// `Autodiff<NdArray>` within 2e-5 absolute plus 2e-5 relative (the two sum in different
/// orders; γ's gradient sums over the rows) and differ from it somewhere. An RMSNorm given a β
/// keeps burn's path, within the same bound.
#[test]
fn norm_on_autodiff_flex_takes_the_kernel() {
    type Train = Autodiff<Flex>;
    let (batch, seq, d) = (2, 5, 384);
    let shape = [batch, seq, d];
    let xs: Vec<f32> = (0..batch * seq * d)
        .map(|i| ((i * 7_919 % 1_013) as f32 - 506.0) * 0.013 + (i / d) as f32 * 0.5)
        .collect();
    let ws: Vec<f32> = (0..xs.len()).map(|i| (i % 13) as f32 * 0.2 - 1.1).collect();
    let gammas: Vec<f32> = (0..d).map(|j| 0.5 + (j % 7) as f32 * 0.25).collect();
    let betas: Vec<f32> = (0..d).map(|j| (j % 5) as f32 * 0.1 - 0.2).collect();
    let assert_close = |what: &str, got: &[f32], want: &[f32]| {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 2e-5 + 2e-5 * b.abs(),
                "{what} element {i}: Autodiff<Flex> {a}, Autodiff<NdArray> {b}"
            );
        }
    };
    for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
        let rms = kind == NormKind::RmsNorm;
        let beta = (!rms).then_some(betas.as_slice());
        let ours = run(&norm::<Train>(kind, &gammas, beta), &xs, &ws, shape);

        let flex: Vec<f32> = xfmr_kernels::norm(
            Tensor::<Flex, 1>::from_floats(xs.as_slice(), &Default::default()).reshape(shape),
            Tensor::from_floats(gammas.as_slice(), &Default::default()),
            beta.map(|b| Tensor::from_floats(b, &Default::default())),
            1e-5,
            rms,
        )
        .into_data()
        .to_vec()
        .unwrap();
        assert_eq!(ours[0], flex, "{kind:?}: the value is not the kernel's");
        let mut dx = ws.clone();
        let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
        xfmr_kernels::norm_rows_backward(&xs, &mut dx, &gammas, rms, 1e-5, &mut dgamma, &mut dbeta);
        let kernel = [dx, dgamma, if rms { Vec::new() } else { dbeta }];
        for (what, (got, want)) in OUTPUTS[1..].iter().zip(ours[1..].iter().zip(&kernel)) {
            assert_eq!(got, want, "{kind:?} {what}: not the kernel's");
        }

        let composed = run(
            &norm::<Autodiff<NdArray>>(kind, &gammas, beta),
            &xs,
            &ws,
            shape,
        );
        for (what, (got, want)) in OUTPUTS.iter().zip(ours.iter().zip(&composed)) {
            assert_close(&format!("{kind:?} {what}"), got, want);
        }
        assert_ne!(
            ours, composed,
            "{kind:?}: the kernel and the composition agree bit for bit: no proof of the path"
        );
    }
    let beta = Some(betas.as_slice());
    let flex = run(
        &norm::<Train>(NormKind::RmsNorm, &gammas, beta),
        &xs,
        &ws,
        shape,
    );
    let ndarray = run(
        &norm::<Autodiff<NdArray>>(NormKind::RmsNorm, &gammas, beta),
        &xs,
        &ws,
        shape,
    );
    for (what, (got, want)) in OUTPUTS.iter().zip(flex.iter().zip(&ndarray)) {
        assert_close(&format!("RMSNorm with β, {what}"), got, want);
    }
}
