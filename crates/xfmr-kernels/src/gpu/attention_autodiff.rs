//! The operation behind [`gpu_attention_autodiff`](super::gpu_attention_autodiff), generic over
//! the inner backend `I` of `Autodiff<I>`, written with `I`'s own tensor operations (which
//! autodiff does not see: the whole attention is one node of the graph).
//!
//! Forward, per head, with `S = s·QKᵀ + M` (`M`: `-∞` where ignored):
//!
//! ```text
//! m   = max_j S_ij                    (clamped to f32::MIN: finite even for a fully ignored row)
//! l   = Σ_j exp(S_ij − m)
//! O   = exp(S − m) V / max(l, f32::MIN_POSITIVE)
//! lse = m + ln max(l, f32::MIN_POSITIVE)
//! ```
//!
//! A fully ignored row (`S = -∞` throughout) has `l = 0`, `O = 0` and `lse = f32::MIN`, which
//! stands for `-∞`: `P = exp(-∞ − f32::MIN) = 0` below, so its output and its gradients are 0.
//! No step computes with `-∞` beyond `exp` and the mask: `ln 0` is undefined in SPIR-V's
//! `GLSL.std.450`, and cubecl's maximum reduction starts from `f32::MIN` (the maximum of a row
//! of `-∞` is `f32::MIN` there, not `-∞`).
//!
//! Backward, given `dO` (FlashAttention-2's, Dao 2023, without its tiling):
//!
//! ```text
//! P  = exp(S − lse)                   (recomputed; 0 where ignored)
//! dV = Pᵀ dO
//! dP = dO Vᵀ
//! D  = rowsum(dO ∘ O)                 (= Σ_j P_ij dP_ij: softmax's backward)
//! dS = P ∘ (dP − D)
//! dQ = s · dS K
//! dK = s · dSᵀ Q
//! ```
//!
//! Grouped key/value heads: the `g = heads / heads_kv` query heads sharing a key/value head
//! are consecutive, so `[batch, heads, seq_q, ·]` reshaped to `[batch, heads_kv, g·seq_q, ·]`
//! stacks their rows; `QKᵀ`, `dO Vᵀ` and `dS K` are then one product per key/value head, and
//! `Pᵀ dO` and `dSᵀ Q` over the stacked rows sum the `dV`, `dK` of the group.

use std::fmt;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::{Backend, BackendTypes};
use burn::tensor::{Bool, Tensor, TensorPrimitive};

use super::same;

/// The float tensor of `Autodiff<I>`: `I`'s tensor and its node in the graph.
type AutodiffTensor<I> = <Autodiff<I> as BackendTypes>::FloatTensorPrimitive;

/// The operation on `Autodiff<I>`, reached from generic code where `B` is `Autodiff<I>` (the
/// caller has compared their `TypeId`s). Shapes as
/// [`gpu_attention_autodiff`](super::gpu_attention_autodiff).
pub(super) fn attention<B: Backend, I: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    scale: f32,
) -> Tensor<B, 4> {
    let tracked = |t: Tensor<B, 4>| {
        same::<B::FloatTensorPrimitive, AutodiffTensor<I>>(t.into_primitive().tensor())
    };
    let (q, k, v) = (tracked(query), tracked(key), tracked(value));
    let inner = |t: &AutodiffTensor<I>| {
        Tensor::<I, 4>::from_primitive(TensorPrimitive::Float(t.primitive.clone()))
    };
    let (q_inner, k_inner, v_inner) = (inner(&q), inner(&k), inner(&v));
    let mask = mask.map(|m| {
        Tensor::<I, 4, Bool>::from_primitive(
            same::<B::BoolTensorPrimitive, I::BoolTensorPrimitive>(m.into_primitive()),
        )
    });
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let prepared =
        <AttentionBackward as Backward<I, 3>>::prepare::<NoCheckpointing>(AttentionBackward, nodes)
            .compute_bound()
            .stateful();
    let out = match prepared {
        OpsKind::Tracked(prep) => {
            let (out, lse) = forward(&q_inner, &k_inner, &v_inner, mask.clone(), scale, true);
            let state = Saved {
                q: q_inner,
                k: k_inner,
                v: v_inner,
                out: out.clone(),
                lse: lse.expect("asked for the log-sum-exp"),
                mask,
                scale,
            };
            prep.finish(state, out.into_primitive().tensor())
        }
        OpsKind::UnTracked(prep) => {
            let (out, _) = forward(&q_inner, &k_inner, &v_inner, mask, scale, false);
            prep.finish(out.into_primitive().tensor())
        }
    };
    Tensor::from_primitive(TensorPrimitive::Float(same::<
        AutodiffTensor<I>,
        B::FloatTensorPrimitive,
    >(out)))
}

/// The operation's node in burn's graph.
#[derive(Debug)]
struct AttentionBackward;

/// What the backward pass reads: the inputs (`[batch, heads(_kv), seq, d]`), the output, each
/// row's log-sum-exp `[batch, heads, seq_q, 1]`, the mask and the scale.
#[derive(Clone)]
struct Saved<I: Backend> {
    q: Tensor<I, 4>,
    k: Tensor<I, 4>,
    v: Tensor<I, 4>,
    out: Tensor<I, 4>,
    lse: Tensor<I, 4>,
    mask: Option<Tensor<I, 4, Bool>>,
    scale: f32,
}

impl<I: Backend> fmt::Debug for Saved<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saved")
            .field("q", &self.q.dims())
            .field("k", &self.k.dims())
            .field("v", &self.v.dims())
            .field("mask", &self.mask.as_ref().map(|m| m.dims()))
            .field("scale", &self.scale)
            .finish()
    }
}

impl<I: Backend> Backward<I, 3> for AttentionBackward {
    type State = Saved<I>;

    fn backward(self, ops: Ops<Saved<I>, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad =
            Tensor::<I, 4>::from_primitive(TensorPrimitive::Float(grads.consume::<I>(&ops.node)));
        let [dq, dk, dv] = backward(ops.state, grad);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<I>(node.id, grad.into_primitive().tensor());
            }
        }
    }
}

/// The output `[batch, heads, seq_q, d_v]` and, if `with_lse`, each row's log-sum-exp
/// `[batch, heads, seq_q, 1]` (`f32::MIN`, standing for `-∞`, for a row whose keys are all
/// ignored).
fn forward<I: Backend>(
    q: &Tensor<I, 4>,
    k: &Tensor<I, 4>,
    v: &Tensor<I, 4>,
    mask: Option<Tensor<I, 4, Bool>>,
    scale: f32,
    with_lse: bool,
) -> (Tensor<I, 4>, Option<Tensor<I, 4>>) {
    let scores = scores(q.clone(), k.clone(), mask, scale);
    // A finite maximum: a fully ignored row gives exp(-∞ − MIN) = 0, not NaN.
    let max = scores.clone().max_dim(3).clamp_min(f32::MIN);
    let numerator = (scores - max.clone()).exp();
    let sum = numerator.clone().sum_dim(3);
    let sum = sum.clamp_min(f32::MIN_POSITIVE);
    let out = grouped_matmul(numerator, v.clone()) / sum.clone();
    let lse = with_lse.then(|| max + sum.log());
    (out, lse)
}

/// `[dQ, dK, dV]` from the saved state and `dO` `[batch, heads, seq_q, d_v]`.
fn backward<I: Backend>(saved: Saved<I>, grad: Tensor<I, 4>) -> [Tensor<I, 4>; 3] {
    let Saved {
        q,
        k,
        v,
        out,
        lse,
        mask,
        scale,
    } = saved;
    let [batch, heads, seq_q, d_k] = q.dims();
    let [_, heads_kv, seq_k, _] = k.dims();
    let d_v = v.dims()[3];
    assert_eq!(
        grad.dims(),
        [batch, heads, seq_q, d_v],
        "attention backward: the output's gradient has another shape than the output"
    );
    let group = heads / heads_kv;
    // The rows of the query heads sharing a key/value head, stacked:
    // (B, h, Tq, n) -> (B, h_kv, g·Tq, n).
    let stacked = |t: Tensor<I, 4>| {
        let n = t.dims()[3];
        t.reshape([batch, heads_kv, group * seq_q, n])
    };
    // P = exp(S − lse)  (B, h, Tq, Tk); 0 where S = -∞ (lse is finite, f32::MIN on a fully
    // ignored row)
    let p = (scores(q.clone(), k.clone(), mask, scale) - lse).exp();
    // dV = Pᵀ dO, summed over the group: (B, h_kv, Tk, g·Tq) @ (B, h_kv, g·Tq, d_v)
    let dv = stacked(p.clone())
        .swap_dims(2, 3)
        .matmul(stacked(grad.clone()));
    // dP = dO Vᵀ  (B, h, Tq, Tk)
    let dp = grouped_matmul(grad.clone(), v.swap_dims(2, 3));
    // D = rowsum(dO ∘ O)  (B, h, Tq, 1)
    let d = (grad * out).sum_dim(3);
    let ds = p * (dp - d);
    // dQ = s·dS K  (B, h, Tq, d_k)
    let dq = grouped_matmul(ds.clone(), k).mul_scalar(scale);
    // dK = s·dSᵀ Q, summed over the group: (B, h_kv, Tk, g·Tq) @ (B, h_kv, g·Tq, d_k)
    let dk = stacked(ds)
        .swap_dims(2, 3)
        .matmul(stacked(q))
        .mul_scalar(scale);
    debug_assert_eq!(dk.dims(), [batch, heads_kv, seq_k, d_k]);
    debug_assert_eq!(dv.dims(), [batch, heads_kv, seq_k, d_v]);
    [dq, dk, dv]
}

/// `S = s·QKᵀ + M` `[batch, heads, seq_q, seq_k]`, `-∞` where the mask is `true`.
fn scores<I: Backend>(
    q: Tensor<I, 4>,
    k: Tensor<I, 4>,
    mask: Option<Tensor<I, 4, Bool>>,
    scale: f32,
) -> Tensor<I, 4> {
    let scores = grouped_matmul(q, k.swap_dims(2, 3)).mul_scalar(scale);
    match mask {
        Some(mask) => {
            let shape = scores.dims();
            scores.mask_fill(mask.expand(shape), f32::NEG_INFINITY)
        }
        None => scores,
    }
}

/// `lhs @ rhs` where `rhs` has `h_kv` heads shared by groups of `h / h_kv` consecutive heads of
/// `lhs`: `[batch, h, m, k] @ [batch, h_kv, k, n] -> [batch, h, m, n]`, one product per
/// key/value head over the group's stacked rows.
fn grouped_matmul<I: Backend>(lhs: Tensor<I, 4>, rhs: Tensor<I, 4>) -> Tensor<I, 4> {
    let [batch, heads, m, k] = lhs.dims();
    let [_, heads_kv, _, n] = rhs.dims();
    if heads == heads_kv {
        return lhs.matmul(rhs);
    }
    let group = heads / heads_kv;
    lhs.reshape([batch, heads_kv, group * m, k])
        .matmul(rhs)
        .reshape([batch, heads, m, n])
}
