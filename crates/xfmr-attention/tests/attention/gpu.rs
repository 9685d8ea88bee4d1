//! Training on the GPU backends: under `Autodiff<Wgpu>` (and the unfused
//! `Autodiff<CubeBackend<WgpuRuntime, ..>>`) `AttentionKernel::Auto` runs attention as one
//! operation of the autodiff graph with its own backward (`xfmr_kernels::gpu_attention_autodiff`).
//! Run on wgpu (lavapipe, Mesa's CPU Vulkan driver, in CI); compiled with this crate's `wgpu`
//! feature, which its dev-dependency on itself turns on. (Against f64 finite differences:
//! `tests/float64.rs`.)

use burn::backend::wgpu::{CubeBackend, WgpuRuntime};
use burn::backend::{Autodiff, Flex, NdArray, Wgpu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Tensor, TensorData};
use xfmr_attention::{
    attention_reference, scaled_dot_product_attention, AttentionKernel, AttentionOptions, AttnMask,
};
use xfmr_testing::{assert_tensors_close, to_vec, TestRng};

/// burn's `Wgpu` without fusion.
type WgpuCube = CubeBackend<WgpuRuntime, f32, i32, u32>;

/// One case: `(batch, heads, heads_kv, seq_q, seq_k, d_k, d_v)`, the mask, the scale.
struct Case {
    dims: [usize; 7],
    mask: Mask,
    scale: Option<f64>,
}

/// The masks of the cases.
#[derive(Debug, Clone, Copy)]
enum Mask {
    None,
    /// Key padding `[batch, 1, 1, seq_k]`: sequence `b` keeps `seq_k - b` keys.
    Padding,
    /// Look-ahead `[1, 1, seq_q, seq_k]` (the last query sees every key; with `seq_q > seq_k`
    /// the first `seq_q - seq_k` rows see none).
    Causal,
    /// `[batch, 1, seq_q, seq_k]`, a third of the keys ignored at random and every key of
    /// query row 0 of sequence 1.
    Random,
}

impl Mask {
    fn build<B: Backend>(
        self,
        rng: &mut TestRng,
        [batch, seq_q, seq_k]: [usize; 3],
    ) -> Option<AttnMask<B>> {
        let device = Default::default();
        match self {
            Mask::None => None,
            Mask::Padding => {
                let lengths: Vec<usize> = (0..batch).map(|b| seq_k - b).collect();
                Some(AttnMask::padding_from_lengths(&lengths, seq_k, &device).unwrap())
            }
            Mask::Causal => Some(AttnMask::causal(seq_q, seq_k, &device)),
            Mask::Random => {
                let mut ignored: Vec<bool> = (0..batch * seq_q * seq_k)
                    .map(|_| rng.below(3) == 0)
                    .collect();
                ignored[seq_q * seq_k..seq_q * seq_k + seq_k].fill(true);
                let data = TensorData::new(ignored, [batch, 1, seq_q, seq_k]);
                Some(AttnMask::from_tensor(Tensor::<B, 4, Bool>::from_data(
                    data, &device,
                )))
            }
        }
    }
}

/// Values and `[dQ, dK, dV]` of `sum(context ⊙ upstream)` with respect to leaves of shape
/// `[batch, seq, heads, d]` viewed as heads (as multi-head attention's projections are), so
/// the gradients pass back through the view: through `scaled_dot_product_attention` with
/// `kernel`, or through the reference path (`None`).
fn run<B: AutodiffBackend>(
    leaves: &[Tensor<B, 4>; 3],
    upstream: &Tensor<B, 4>,
    options: &AttentionOptions<B>,
    kernel: Option<AttentionKernel>,
) -> (Tensor<B::InnerBackend, 4>, [Tensor<B::InnerBackend, 4>; 3]) {
    let [q, k, v] = leaves.clone().map(|t| t.detach().require_grad());
    let view = |t: &Tensor<B, 4>| t.clone().swap_dims(1, 2);
    let (qh, kh, vh) = (view(&q), view(&k), view(&v));
    let context = match kernel {
        Some(kernel) => {
            scaled_dot_product_attention(qh, kh, vh, options.clone().with_kernel(kernel))
                .unwrap()
                .context
        }
        None => {
            attention_reference(qh, kh, vh, options.clone())
                .unwrap()
                .context
        }
    };
    let grads = (context.clone() * upstream.clone()).sum().backward();
    let grad = |t: &Tensor<B, 4>| t.grad(&grads).expect("a gradient");
    (context.inner(), [grad(&q), grad(&k), grad(&v)])
}

/// The operation against burn's autodiff through the reference path on backend `B`.
fn gradients_equal_reference<B: AutodiffBackend>(cases: &[Case]) {
    assert!(xfmr_kernels::runs_on_gpu_autodiff::<B>(DType::F32));
    let device = Default::default();
    let mut rng = TestRng::new(41);
    for (trial, case) in cases.iter().enumerate() {
        let [batch, heads, heads_kv, seq_q, seq_k, d_k, d_v] = case.dims;
        let what = format!("case {trial} {:?} {:?}", case.dims, case.mask);
        let leaves = [
            rng.tensor::<B, 4>([batch, seq_q, heads, d_k], 1.0, &device),
            rng.tensor::<B, 4>([batch, seq_k, heads_kv, d_k], 1.0, &device),
            rng.tensor::<B, 4>([batch, seq_k, heads_kv, d_v], 1.0, &device),
        ];
        let upstream = rng.tensor::<B, 4>([batch, heads, seq_q, d_v], 1.0, &device);
        let mut options = AttentionOptions::default();
        if let Some(mask) = case.mask.build::<B>(&mut rng, [batch, seq_q, seq_k]) {
            options = options.with_mask(mask);
        }
        if let Some(scale) = case.scale {
            options = options.with_scale(scale);
        }
        let (values, grads) = run(&leaves, &upstream, &options, Some(AttentionKernel::Auto));
        let (reference, reference_grads) = run(&leaves, &upstream, &options, None);
        assert_tensors_close(&values, &reference, 1e-5, 0.0, &format!("{what}: values"));
        for (name, (a, b)) in ["dQ", "dK", "dV"]
            .iter()
            .zip(grads.iter().zip(&reference_grads))
        {
            assert_tensors_close(a, b, 1e-4, 1e-4, &format!("{what}: {name}"));
        }
        // Fully ignored rows (every key of (b, q)): zero output, zero query gradient.
        let ignored: Vec<(usize, usize)> = match case.mask {
            Mask::Random => vec![(1, 0)],
            Mask::Causal => (0..batch)
                .flat_map(|b| (0..seq_q.saturating_sub(seq_k)).map(move |q| (b, q)))
                .collect(),
            _ => vec![],
        };
        for (b, q) in ignored {
            let row = values.clone().narrow(0, b, 1).narrow(2, q, 1);
            assert!(
                to_vec(&row).iter().all(|&x| x == 0.0),
                "{what}: row ({b}, {q}) {row}"
            );
            let dq_row = grads[0].clone().narrow(0, b, 1).narrow(1, q, 1);
            assert!(
                to_vec(&dq_row).iter().all(|&x| x == 0.0),
                "{what}: dQ row ({b}, {q}) {dq_row}"
            );
        }
    }
}

/// Under `Autodiff<Wgpu>` the operation's values equal burn's autodiff through the reference
/// path within 1e-5 absolute, and its gradients with respect to q, k and v within 1e-4
/// absolute + 1e-4 relative (f32 sums of a few dozen O(1) products taken in other orders).
/// A random mask `[batch, 1, seq_q, seq_k]` with a fully ignored row, key padding
/// `[batch, 1, 1, seq_k]` with a non-default scale, look-ahead `[1, 1, seq_q, seq_k]`, no mask
/// with `d_v ≠ d_k`; grouped key/value heads (4 on 2) and plain ones. Fully ignored rows have
/// exactly zero output and zero query gradient. Few shapes, so that lavapipe compiles and
/// tunes few kernels. (Not a look-ahead mask with `seq_q > seq_k`, whose first rows see no
/// key: there the reference path itself gives NaN under `Autodiff<Wgpu>` with fusion.)
#[test]
fn gpu_attention_autodiff_gradients_equal_reference() {
    gradients_equal_reference::<Autodiff<Wgpu>>(&[
        Case {
            dims: [2, 4, 2, 5, 7, 8, 8],
            mask: Mask::Random,
            scale: None,
        },
        Case {
            dims: [2, 4, 2, 5, 7, 8, 8],
            mask: Mask::Padding,
            scale: Some(0.3),
        },
        Case {
            dims: [2, 4, 2, 5, 7, 8, 8],
            mask: Mask::Causal,
            scale: None,
        },
        Case {
            dims: [2, 4, 4, 5, 7, 8, 4],
            mask: Mask::None,
            scale: None,
        },
    ]);
}

/// The same on the unfused `Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>` (burn's `Wgpu`
/// without its `fusion` feature), same tolerances: grouped heads, a fully ignored row.
#[test]
fn gpu_attention_autodiff_unfused_gradients_equal_reference() {
    gradients_equal_reference::<Autodiff<WgpuCube>>(&[Case {
        dims: [2, 4, 2, 5, 7, 8, 8],
        mask: Mask::Random,
        scale: None,
    }]);
}

/// The proof of the path: the check holds for `Autodiff<Wgpu>` and its unfused backend only
/// (not for `Wgpu` itself, autodiff on the CPU backends, or f16), and
/// `scaled_dot_product_attention` with `Auto` under `Autodiff<Wgpu>` gives the values and the
/// gradients of the operation called directly, bit for bit. Its forward computes the same sums
/// as burn's decomposed path (late normalisation), so the values alone would not tell them
/// apart; its backward does not, so the decomposed path's gradients differ from the
/// operation's in some bits, and `Auto`'s gradients must not.
#[test]
fn gpu_attention_autodiff_takes_the_operation() {
    type B = Autodiff<Wgpu>;
    assert!(xfmr_kernels::runs_on_gpu_autodiff::<B>(DType::F32));
    assert!(xfmr_kernels::runs_on_gpu_autodiff::<Autodiff<WgpuCube>>(
        DType::F32
    ));
    assert!(!xfmr_kernels::runs_on_gpu_autodiff::<B>(DType::F16));
    assert!(!xfmr_kernels::runs_on_gpu_autodiff::<Wgpu>(DType::F32));
    assert!(!xfmr_kernels::runs_on_gpu_autodiff::<Autodiff<NdArray<f32>>>(DType::F32));
    assert!(!xfmr_kernels::runs_on_gpu_autodiff::<Autodiff<Flex>>(
        DType::F32
    ));
    let device = Default::default();
    let mut rng = TestRng::new(43);
    let (batch, heads, heads_kv, seq_q, seq_k, d) = (2, 4, 2, 5, 7, 8);
    let leaves = [
        rng.tensor::<B, 4>([batch, seq_q, heads, d], 1.0, &device),
        rng.tensor::<B, 4>([batch, seq_k, heads_kv, d], 1.0, &device),
        rng.tensor::<B, 4>([batch, seq_k, heads_kv, d], 1.0, &device),
    ];
    let upstream = rng.tensor::<B, 4>([batch, heads, seq_q, d], 1.0, &device);
    let mask = Mask::Padding
        .build::<B>(&mut rng, [batch, seq_q, seq_k])
        .unwrap();
    let options = AttentionOptions::default().with_mask(mask.clone());
    let (auto, auto_grads) = run(&leaves, &upstream, &options, Some(AttentionKernel::Auto));
    let (decomposed, decomposed_grads) = run(
        &leaves,
        &upstream,
        &options,
        Some(AttentionKernel::Decomposed),
    );

    let [q, k, v] = leaves.clone().map(|t| t.require_grad());
    let view = |t: &Tensor<B, 4>| t.clone().swap_dims(1, 2);
    let direct = xfmr_kernels::gpu_attention_autodiff(
        view(&q),
        view(&k),
        view(&v),
        Some(mask.into_tensor()),
        1.0 / (d as f32).sqrt(),
    );
    let grads = (direct.clone() * upstream).sum().backward();
    let direct_grads = [&q, &k, &v].map(|t| t.grad(&grads).expect("a gradient"));
    assert_eq!(
        to_vec(&auto),
        to_vec(&direct.inner()),
        "values: Auto is not the operation"
    );
    for (name, (a, b)) in ["dQ", "dK", "dV"]
        .iter()
        .zip(auto_grads.iter().zip(&direct_grads))
    {
        assert_eq!(to_vec(a), to_vec(b), "{name}: Auto is not the operation");
    }
    assert_tensors_close(&decomposed, &auto, 1e-5, 0.0, "values: decomposed");
    let differ = auto_grads
        .iter()
        .zip(&decomposed_grads)
        .any(|(a, b)| to_vec(a) != to_vec(b));
    assert!(
        differ,
        "the decomposed path's gradients equal the operation's bit for bit: this test cannot \
         tell the paths apart"
    );
}
