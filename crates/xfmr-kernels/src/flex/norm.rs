//! LayerNorm and RMSNorm on flex tensors: [`norm_rows`](crate::norm_rows) over parallel blocks
//! of rows ([`norm`]), and under `Autodiff<Flex>` one operation of the graph whose backward is
//! [`norm_rows_backward`](crate::norm_rows_backward) ([`norm_autodiff`]).

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::{autodiff_primitive, contiguous, from_autodiff};
use crate::norm::{norm_rows, RowNorm};
use crate::norm_backward::norm_rows_backward;

/// Values per parallel task, at least (whole rows).
const CHUNK: usize = 16 * 1024;

/// LayerNorm (`beta` given or not, `rms` false) or RMSNorm (`rms` true, `beta` ignored) over
/// the last dimension of `x`, scaled by `gamma`: [`norm_rows`](crate::norm_rows) on blocks of
/// rows in parallel, each row normalised while it sits in L1, in place on the tensor's own
/// buffer: `into_data` (no copy when nothing else holds it), `as_mut_slice`, `from_data`.
///
/// Only where [`runs_on`](crate::runs_on) holds for `x`, `gamma` and `beta` (asserted in
/// debug builds).
///
/// # Shapes
/// - `x`: `[..., d]`
/// - `gamma`, `beta`: `[d]`
/// - output: `x`'s shape
///
/// # Panics
/// If `gamma` or `beta` is not as long as `x`'s last dimension.
pub fn norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
    rms: bool,
) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on::<B>(x.dtype())
            && crate::runs_on::<B>(gamma.dtype())
            && beta.as_ref().is_none_or(|b| crate::runs_on::<B>(b.dtype())),
        "xfmr_kernels::norm: not flex f32 tensors"
    );
    let device = x.device();
    let width = x.dims()[D - 1];
    let host = |t: Tensor<B, 1>| {
        t.into_data()
            .into_vec::<f32>()
            .expect("runs_on: an f32 tensor")
    };
    let gamma = host(gamma);
    let beta = if rms { None } else { beta.map(host) };
    assert_eq!(gamma.len(), width, "norm: γ against rows of {width}");
    let norm = if rms {
        RowNorm::Rms
    } else {
        RowNorm::Layer {
            beta: beta.as_deref(),
        }
    };
    let mut data = x.into_data();
    data.as_mut_slice::<f32>()
        .expect("runs_on: an f32 tensor")
        .par_chunks_mut(rows_per_task(width) * width.max(1))
        .for_each(|rows| norm_rows(rows, &gamma, norm, eps as f32));
    Tensor::from_data(data, (&device, DType::F32))
}

/// LayerNorm (`beta` given or not) or RMSNorm (`rms`, `beta` ignored) over the last dimension
/// of `x` as one differentiable operation of `Autodiff<Flex>`: the forward of [`norm`] into a
/// new buffer (the input is the backward pass's state, shared, not copied), the backward
/// [`norm_rows_backward`](crate::norm_rows_backward) over blocks of rows in parallel, writing
/// `∂ℓ/∂x` over the incoming gradient's buffer and summing `∂ℓ/∂γ`, `∂ℓ/∂β` per block, the
/// blocks then added in order (so the result does not depend on the threads). burn's autodiff
/// of the composed LayerNorm makes nine whole-tensor passes forward and about twice as many
/// backward, each into a new buffer.
///
/// Only where [`runs_on_autodiff`](crate::runs_on_autodiff) holds for `x`, `gamma` and `beta`
/// (asserted in debug builds).
///
/// # Shapes
/// - `x`: `[..., d]`
/// - `gamma`, `beta`: `[d]`
/// - output: `x`'s shape
///
/// # Panics
/// If `gamma` or `beta` is not as long as `x`'s last dimension.
pub fn norm_autodiff<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
    rms: bool,
) -> Tensor<B, D> {
    debug_assert!(
        crate::runs_on_autodiff::<B>(x.dtype())
            && crate::runs_on_autodiff::<B>(gamma.dtype())
            && beta
                .as_ref()
                .is_none_or(|b| crate::runs_on_autodiff::<B>(b.dtype())),
        "xfmr_kernels::norm_autodiff: not Autodiff<Flex> f32 tensors"
    );
    let width = x.dims()[D - 1];
    let (x, gamma) = (autodiff_primitive(x), autodiff_primitive(gamma));
    let beta = if rms {
        None
    } else {
        beta.map(autodiff_primitive)
    };
    let host = |t: &FlexTensor| contiguous(t.clone()).storage::<f32>().to_vec();
    let gamma_host = Arc::new(host(&gamma.primitive));
    let beta_host = beta.as_ref().map(|b| host(&b.primitive));
    assert_eq!(gamma_host.len(), width, "norm: γ against rows of {width}");
    let norm = if rms {
        RowNorm::Rms
    } else {
        RowNorm::Layer {
            beta: beta_host.as_deref(),
        }
    };
    let input = contiguous(x.primitive.clone());
    let shape = input.layout().shape().clone();
    let mut out = input.storage::<f32>().to_vec();
    out.par_chunks_mut(rows_per_task(width) * width.max(1))
        .for_each(|rows| norm_rows(rows, &gamma_host, norm, eps as f32));
    let out = FlexTensor::from_data(TensorData::new(out, shape));
    let state = Saved {
        x: input,
        gamma: gamma_host,
        eps: eps as f32,
        rms,
    };
    // The node with parents `x`, γ and β if any (burn's node type cannot be named here, so a
    // macro rather than a function over both arities), the state kept when tracked.
    macro_rules! finish {
        ($n:literal, $nodes:expr) => {
            match NormBackward::<$n>
                .prepare::<NoCheckpointing>($nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(state, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        };
    }
    let out = match beta {
        Some(beta) => finish!(3, [x.node.clone(), gamma.node.clone(), beta.node.clone()]),
        None => finish!(2, [x.node.clone(), gamma.node.clone()]),
    };
    from_autodiff(out)
}

/// Rows per parallel task, at least one.
fn rows_per_task(width: usize) -> usize {
    (CHUNK / width.max(1)).max(1)
}

/// The operation's node in burn's graph, with `N` parents: `x`, γ and (`N` = 3) β.
#[derive(Debug)]
struct NormBackward<const N: usize>;

/// What the backward pass reads: the input (contiguous), γ on the host, ε and the kind.
#[derive(Debug, Clone)]
struct Saved {
    x: FlexTensor,
    gamma: Arc<Vec<f32>>,
    eps: f32,
    rms: bool,
}

impl<const N: usize> Backward<Flex, N> for NormBackward<N> {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let Saved { x, gamma, eps, rms } = ops.state;
        let width = gamma.len();
        let per_task = rows_per_task(width) * width.max(1);
        // Copy-on-write: a copy only when another tensor shares the incoming gradient.
        let mut grad = contiguous(grad);
        let partials: Vec<[Vec<f32>; 2]> = grad
            .storage_mut::<f32>()
            .par_chunks_mut(per_task)
            .zip(x.storage::<f32>().par_chunks(per_task))
            .map(|(g, x)| {
                let (mut dgamma, mut dbeta) = (vec![0.0f32; width], vec![0.0f32; width]);
                norm_rows_backward(x, g, &gamma, rms, eps, &mut dgamma, &mut dbeta);
                [dgamma, dbeta]
            })
            .collect();
        // The blocks' sums in block order.
        let mut sums = [vec![0.0f32; width], vec![0.0f32; width]];
        for partial in &partials {
            for (sum, part) in sums.iter_mut().zip(partial) {
                for (s, p) in sum.iter_mut().zip(part) {
                    *s += p;
                }
            }
        }
        let [dgamma, dbeta] = sums.map(|v| FlexTensor::from_data(TensorData::new(v, [width])));
        // The parents are x, γ and (N = 3) β, in that order.
        for (node, grad) in ops.parents.into_iter().zip([grad, dgamma, dbeta]) {
            if let Some(node) = node {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}
