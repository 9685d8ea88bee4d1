//! The label-smoothed cross-entropy on flex tensors ([`smoothed_cross_entropy`]):
//! [`smoothed_cross_entropy_row`](crate::smoothed_cross_entropy_row) over parallel blocks of
//! rows, and under `Autodiff<Flex>` one operation of the graph whose state is the gradient the
//! forward pass already wrote over the logits.
//!
//! Forward and backward together read the `[tokens, vocab]` logits once and write them once
//! (the gradient, in place when nothing else holds the buffer); the backward pass returns that
//! buffer as it is when the loss's own gradient is 1 (a training step's), else scales it.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::{contiguous, from_autodiff, runs_on, runs_on_autodiff, same, AutodiffTensor};
use crate::loss::{smoothed_cross_entropy_row, Smoothing};

/// Floats per parallel task, at least (whole rows).
const CHUNK: usize = 64 * 1024;

/// What [`smoothed_cross_entropy`] returns.
#[derive(Debug, Clone)]
pub struct SmoothedCrossEntropy<B: Backend> {
    /// The loss averaged over the non-padding targets, `[1]`; under `Autodiff<Flex>` a node of
    /// the graph whose gradient with respect to the logits is `w · (p − q)`.
    pub loss: Tensor<B, 1>,
    /// The negative log-likelihood averaged over the non-padding targets.
    pub nll: f64,
    /// The non-padding targets.
    pub tokens: usize,
}

/// The label-smoothed cross-entropy of `logits` against `targets` (the loss of
/// [`smoothed_cross_entropy_row`](crate::smoothed_cross_entropy_row)'s docs), averaged over
/// the targets that are not `smoothing.pad`, with its gradient in closed form:
/// `∂L/∂z_tv = [y_t ≠ pad] / #{t : y_t ≠ pad} · (p_tv − q_tv)`. Rows in parallel blocks;
/// the sums over rows in row order, so the result does not depend on the threads.
///
/// On `Flex` the value only (the logits only read); on `Autodiff<Flex>` the loss is one node
/// of the graph (when the logits are tracked), the gradient written over the logits' own
/// buffer when nothing else holds it (else over a copy) and kept as the node's state. Only
/// first derivatives are right. A row holding a NaN or an infinity makes the loss NaN.
///
/// Only where [`runs_on`] or [`runs_on_autodiff`] holds for `logits` (asserted in all builds).
///
/// # Shapes
/// - `logits`: `[tokens, vocab]`; `targets`: `tokens` ids
///
/// # Panics
/// If `targets` is not as long as `logits` has rows, or a target is neither padding nor below
/// `vocab`; as [`smoothed_cross_entropy_row`](crate::smoothed_cross_entropy_row).
pub fn smoothed_cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: &[u32],
    smoothing: Smoothing,
) -> SmoothedCrossEntropy<B> {
    let dtype = logits.dtype();
    let device = logits.device();
    let [rows, _] = logits.dims();
    assert_eq!(
        targets.len(),
        rows,
        "smoothed_cross_entropy: {} targets for {rows} rows of logits",
        targets.len()
    );
    let tokens = targets.iter().filter(|&&t| t != smoothing.pad).count();
    let weight = 1.0 / tokens.max(1) as f32;
    let mean = |(loss, nll): (f64, f64)| (loss / tokens.max(1) as f64, nll / tokens.max(1) as f64);
    let value = |loss: f64| FlexTensor::from_data(TensorData::new(vec![loss as f32], [1]));
    let primitive = logits.into_primitive().tensor();
    if runs_on::<B>(dtype) {
        let (_, sums) = rows_of(same(primitive), targets, smoothing, None);
        let (loss, nll) = mean(sums);
        let loss = TensorData::new(vec![loss as f32], [1]);
        let loss = Tensor::from_data(loss, (&device, DType::F32));
        return SmoothedCrossEntropy { loss, nll, tokens };
    }
    assert!(
        runs_on_autodiff::<B>(dtype),
        "xfmr_kernels::smoothed_cross_entropy: not a flex or Autodiff<Flex> f32 tensor"
    );
    let tensor: AutodiffTensor = same(primitive);
    let prepared = LossBackward
        .prepare::<NoCheckpointing>([tensor.node.clone()])
        .compute_bound()
        .stateful();
    let (out, nll) = match prepared {
        OpsKind::Tracked(prep) => {
            let (gradient, sums) = rows_of(tensor.primitive, targets, smoothing, Some(weight));
            let (loss, nll) = mean(sums);
            let gradient = gradient.expect("rows_of returns the gradient it was asked for");
            (prep.finish(gradient, value(loss)), nll)
        }
        OpsKind::UnTracked(prep) => {
            let (_, sums) = rows_of(tensor.primitive, targets, smoothing, None);
            let (loss, nll) = mean(sums);
            (prep.finish(value(loss)), nll)
        }
    };
    let loss = from_autodiff(out);
    SmoothedCrossEntropy { loss, nll, tokens }
}

/// The rows of `z` `[n, V]` through the row kernel in parallel blocks, and the sums of the
/// rows' losses and NLLs, added in row order. With `weight`, `z` as a contiguous buffer of its
/// own overwritten by the gradient (copied first only when another tensor shares it); without,
/// `z` is only read (each row copied into a scratch row the kernel may overwrite) and `None`
/// is returned.
fn rows_of(
    z: FlexTensor,
    targets: &[u32],
    smoothing: Smoothing,
    weight: Option<f32>,
) -> (Option<FlexTensor>, (f64, f64)) {
    let vocab = z.layout().shape()[1];
    let per_task = (CHUNK / vocab.max(1)).max(1);
    let mut z = contiguous(z);
    let per_row: Vec<(f64, f64)> = match weight {
        _ if vocab == 0 => Vec::new(),
        Some(_) => z
            .storage_mut::<f32>()
            .par_chunks_mut(per_task * vocab)
            .zip(targets.par_chunks(per_task))
            .flat_map_iter(|(block, targets)| {
                block
                    .chunks_exact_mut(vocab)
                    .zip(targets)
                    .map(|(row, &target)| {
                        smoothed_cross_entropy_row(row, target, smoothing, weight)
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
        None => z
            .storage::<f32>()
            .par_chunks(per_task * vocab)
            .zip(targets.par_chunks(per_task))
            .flat_map_iter(|(block, targets)| {
                let mut scratch = vec![0.0f32; vocab];
                block
                    .chunks_exact(vocab)
                    .zip(targets)
                    .map(|(row, &target)| {
                        scratch.copy_from_slice(row);
                        smoothed_cross_entropy_row(&mut scratch, target, smoothing, None)
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
    };
    let sums = per_row
        .iter()
        .fold((0.0, 0.0), |(l, n), (row_l, row_n)| (l + row_l, n + row_n));
    (weight.map(|_| z), sums)
}

/// The operation's node in burn's graph; its state is `w · (p − q)` `[n, V]`.
#[derive(Debug)]
struct LossBackward;

impl Backward<Flex, 1> for LossBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [parent] = ops.parents;
        let upstream = grads.consume::<Flex>(&ops.node).into_data();
        let upstream = upstream.as_slice::<f32>().expect("an f32 loss")[0];
        let Some(parent) = parent else { return };
        let mut gradient = ops.state;
        if upstream != 1.0 {
            gradient
                .storage_mut::<f32>()
                .par_chunks_mut(CHUNK)
                .for_each(|chunk| chunk.iter_mut().for_each(|g| *g *= upstream));
        }
        grads.register::<Flex>(parent.id, gradient);
    }
}
