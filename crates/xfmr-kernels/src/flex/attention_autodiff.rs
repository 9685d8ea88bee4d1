//! Attention as one operation of burn's autodiff graph on `Autodiff<Flex>` (training on the
//! CPU): the forward of [`attention()`](crate::attention) that also keeps each row's
//! log-sum-exp, and a backward kernel of its own, so that neither pass materialises the
//! `[batch, heads, seq_q, seq_k]` weights as tensors or copies the head-split views.
//!
//! With `S = s·QKᵀ + M` (`M`: `-∞` where ignored), `P = softmax(S)` and `O = P V`, the
//! backward pass of a head, given `dO`, is
//!
//! ```text
//! P  = exp(S − lse)                  (recomputed from the saved row log-sum-exp)
//! dV = Pᵀ dO
//! dP = dO Vᵀ
//! dS = P ∘ (dP − D),  D_i = Σ_d dO_id O_id   (= Σ_j P_ij dP_ij: softmax's backward)
//! dQ = s · dS K
//! dK = s · dSᵀ Q
//! ```
//!
//! (FlashAttention-2's backward, Dao 2023, without its tiling of the keys: a task holds one
//! block of query rows against all keys.) A row whose keys are all ignored has `lse = -∞`,
//! `P = 0` and contributes nothing. Grouped key/value heads sum the `dK`, `dV` of the query
//! heads sharing them.
//!
//! One task per sequence of the batch (rayon, flex's pool), head after head and block after
//! block of query rows, so each task owns its slices of `dQ`, `dK` and `dV`. The gradients are
//! stored `[batch, seq, heads, d]` and returned as their `[batch, heads, seq, d]` views: the
//! backward of multi-head attention's head split (`reshape` then `swap_dims(1, 2)`) is then free
//! of copies, as the forward's head merge is.
//!
//! The unsafe code is the five `gemm` calls (through [`product`]), bounded as the forward's are
//! (see the crate's SAFETY inventory, SAFETY.md).

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::{Flex, FlexTensor};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Tensor, TensorData};
use rayon::prelude::*;

use super::attention::{forward, mask_on_host, product, readable, Broadcast, View, SCRATCH_FLOATS};
use super::{autodiff_primitive, from_autodiff};
use crate::exp::exp_from_lse;

/// The backend [`attention_autodiff`] runs on: flex under burn's autodiff, without
/// checkpointing (the default `Autodiff<Flex>`).
type AutodiffFlex = Autodiff<Flex>;

/// Whether [`attention_autodiff`] runs on backend `B` for tensors of `dtype`:
/// `Autodiff<Flex>` (burn's default, no checkpointing), f32.
pub fn runs_on_autodiff<B: Backend>(dtype: DType) -> bool {
    TypeId::of::<B>() == TypeId::of::<AutodiffFlex>() && dtype == DType::F32
}

/// Scaled dot-product attention `softmax(QKᵀ·scale + M) V` as one differentiable operation of
/// `Autodiff<Flex>`: the forward of [`attention()`](crate::attention) and the backward kernel
/// of this module (the module docs give its math). Values equal
/// [`attention()`](crate::attention)'s; gradients equal those of burn's autodiff through the
/// decomposed operations up to f32 rounding (tested against it and against f64 finite
/// differences in `xfmr-attention`).
///
/// The caller has checked the shapes and that [`runs_on_autodiff`] holds (asserted in debug
/// builds; the bounds the unsafe products rely on are checked in every build), and that
/// `heads`, `d_k` and `d_v` are not 0. No additive bias and no dropout on the weights: the
/// caller takes burn's generic path for those.
///
/// # Shapes
/// - `query`: `[batch, heads, seq_q, d_k]`
/// - `key`: `[batch, heads_kv, seq_k, d_k]`, `heads_kv` dividing `heads`
/// - `value`: `[batch, heads_kv, seq_k, d_v]`
/// - `mask` (`true` = ignored): broadcastable to `[batch, heads, seq_q, seq_k]`; a row whose
///   keys are all ignored is zero, and so is its gradient
/// - output: `[batch, heads, seq_q, d_v]` (stored `[batch, seq_q, heads, d_v]`)
pub fn attention_autodiff<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    scale: f32,
) -> Tensor<B, 4> {
    debug_assert!(
        runs_on_autodiff::<B>(query.dtype()),
        "xfmr_kernels::attention_autodiff: not an Autodiff<Flex> f32 tensor"
    );
    let mask = mask.map(mask_on_host).map(Arc::new);
    let (q, k, v) = (
        autodiff_primitive(query),
        autodiff_primitive(key),
        autodiff_primitive(value),
    );
    let (q_flex, k_flex, v_flex) = (
        readable(q.primitive.clone()),
        readable(k.primitive.clone()),
        readable(v.primitive.clone()),
    );
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let prepared = AttentionBackward
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful();
    // The log-sum-exp only when the backward will need it.
    let tracked = matches!(prepared, OpsKind::Tracked(_));
    let (out, lse) = forward(
        &q_flex,
        &k_flex,
        &v_flex,
        mask.as_deref(),
        None,
        scale,
        tracked,
    );
    let out = match prepared {
        OpsKind::Tracked(prep) => {
            let state = Saved {
                q: q_flex,
                k: k_flex,
                v: v_flex,
                out: out.clone(),
                lse: Arc::new(lse.expect("asked for the log-sum-exp")),
                mask,
                scale,
            };
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    from_autodiff(out)
}

/// The operation's node in burn's graph.
#[derive(Debug)]
struct AttentionBackward;

/// What the backward pass reads: the inputs, the output, each row's log-sum-exp (indexed
/// `(b·seq_q + q)·heads + h`), the mask and the scale.
#[derive(Clone)]
struct Saved {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    out: FlexTensor,
    lse: Arc<Vec<f32>>,
    mask: Option<Arc<Broadcast<bool>>>,
    scale: f32,
}

impl fmt::Debug for Saved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saved")
            .field("q", &self.q)
            .field("k", &self.k)
            .field("v", &self.v)
            .field("masked", &self.mask.is_some())
            .field("scale", &self.scale)
            .finish()
    }
}

impl Backward<Flex, 3> for AttentionBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad = readable(grads.consume::<Flex>(&ops.node));
        let [dq, dk, dv] = backward(&ops.state, &grad);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

/// `[dQ, dK, dV]` from the saved state and `dO` `[batch, heads, seq_q, d_v]`.
#[allow(unsafe_code)]
fn backward(saved: &Saved, grad: &FlexTensor) -> [FlexTensor; 3] {
    let (q, k, v) = (View::of(&saved.q), View::of(&saved.k), View::of(&saved.v));
    let (o, g) = (View::of(&saved.out), View::of(grad));
    let [batch, heads, seq_q, d_k] = q.dims;
    let [_, heads_kv, seq_k, _] = k.dims;
    let d_v = v.dims[3];
    assert_eq!(
        g.dims,
        [batch, heads, seq_q, d_v],
        "attention backward: the output's gradient has another shape than the output"
    );
    assert_eq!(o.dims, g.dims);
    let group = heads / heads_kv;
    let scale = saved.scale;
    let rows_max = (SCRATCH_FLOATS / seq_k.max(1)).clamp(1, seq_q.max(1));

    let mut dq = vec![0.0f32; batch * seq_q * heads * d_k];
    let mut dk = vec![0.0f32; batch * seq_k * heads_kv * d_k];
    let mut dv = vec![0.0f32; batch * seq_k * heads_kv * d_v];
    assert!(
        heads > 0 && d_k > 0 && d_v > 0,
        "attention backward: heads {heads}, d_k {d_k}, d_v {d_v} (the caller takes another path for 0)"
    );
    if batch * seq_q * seq_k > 0 {
        dq.par_chunks_mut(seq_q * heads * d_k)
            .zip(dk.par_chunks_mut(seq_k * heads_kv * d_k))
            .zip(dv.par_chunks_mut(seq_k * heads_kv * d_v))
            .enumerate()
            .for_each(|(b, ((dq, dk), dv))| {
                // P, then dP and dS, of one block of query rows against every key.
                let mut p = vec![0.0f32; rows_max * seq_k];
                let mut ds = vec![0.0f32; rows_max * seq_k];
                for h in 0..heads {
                    let h_kv = h / group;
                    let (k_at, v_at) = (k.at(b, h_kv), v.at(b, h_kv));
                    for q0 in (0..seq_q).step_by(rows_max) {
                        let rows = rows_max.min(seq_q - q0);
                        let (p, ds) = (&mut p[..rows * seq_k], &mut ds[..rows * seq_k]);
                        let q_at = q.at(b, h) + q0 * q.strides[2];
                        let g_at = g.at(b, h) + q0 * g.strides[2];
                        // SAFETY (all five products): `View::check` bounds every element of the
                        // q, k, v and dO views inside their buffers, rows `q0..q0 + rows` are
                        // query rows, `p` and `ds` hold `rows × seq_k` floats (row stride
                        // seq_k); the destinations are this task's own slices: `p`, `ds`, and
                        // `dq`, `dk`, `dv` of sequence `b`, whose extents bound every element
                        // written (`dq`: (q0 + r)·heads·d_k + h·d_k + j < seq_q·heads·d_k;
                        // `dk`: i·heads_kv·d_k + h_kv·d_k + j < seq_k·heads_kv·d_k; `dv`
                        // likewise with d_v). No destination aliases an operand.
                        unsafe {
                            // S = s·Q_blk Kᵀ
                            product(
                                [rows, seq_k, d_k],
                                (p.as_mut_ptr(), seq_k),
                                (q.data.as_ptr().add(q_at), q.strides[2], q.strides[3]),
                                (k.data.as_ptr().add(k_at), k.strides[3], k.strides[2]),
                                scale,
                                false,
                            );
                        }
                        for (r, row) in p.chunks_exact_mut(seq_k).enumerate() {
                            let query = q0 + r;
                            let lse = saved.lse[(b * seq_q + query) * heads + h];
                            if lse == f32::NEG_INFINITY {
                                row.fill(0.0); // every key ignored
                                continue;
                            }
                            // P = exp(S − lse): ≤ 0 but for rounding (the forward's S may have
                            // summed in another order).
                            exp_from_lse(row, lse);
                            if let Some(mask) = saved.mask.as_deref() {
                                let at = mask.row(b, h, query);
                                let step = mask.strides[3];
                                for (j, s) in row.iter_mut().enumerate() {
                                    if mask.data[at + j * step] {
                                        *s = 0.0;
                                    }
                                }
                            }
                        }
                        unsafe {
                            // dV_h += Pᵀ dO_blk
                            product(
                                [seq_k, d_v, rows],
                                (dv.as_mut_ptr().add(h_kv * d_v), heads_kv * d_v),
                                (p.as_ptr(), 1, seq_k),
                                (g.data.as_ptr().add(g_at), g.strides[2], g.strides[3]),
                                1.0,
                                true,
                            );
                            // dP = dO_blk Vᵀ
                            product(
                                [rows, seq_k, d_v],
                                (ds.as_mut_ptr(), seq_k),
                                (g.data.as_ptr().add(g_at), g.strides[2], g.strides[3]),
                                (v.data.as_ptr().add(v_at), v.strides[3], v.strides[2]),
                                1.0,
                                false,
                            );
                        }
                        // dS = P ∘ (dP − D), D = rowsum(dO ∘ O)
                        for (r, (ds, p)) in ds
                            .chunks_exact_mut(seq_k)
                            .zip(p.chunks_exact(seq_k))
                            .enumerate()
                        {
                            let o_at = o.at(b, h) + (q0 + r) * o.strides[2];
                            let g_row = g_at + r * g.strides[2];
                            let d: f32 = (0..d_v)
                                .map(|j| {
                                    o.data[o_at + j * o.strides[3]]
                                        * g.data[g_row + j * g.strides[3]]
                                })
                                .sum();
                            ds.iter_mut().zip(p).for_each(|(x, &p)| *x = p * (*x - d));
                        }
                        unsafe {
                            // dQ_blk = s·dS K
                            product(
                                [rows, d_k, seq_k],
                                (dq.as_mut_ptr().add((q0 * heads + h) * d_k), heads * d_k),
                                (ds.as_ptr(), seq_k, 1),
                                (k.data.as_ptr().add(k_at), k.strides[2], k.strides[3]),
                                scale,
                                false,
                            );
                            // dK_h += s·dSᵀ Q_blk
                            product(
                                [seq_k, d_k, rows],
                                (dk.as_mut_ptr().add(h_kv * d_k), heads_kv * d_k),
                                (ds.as_ptr(), 1, seq_k),
                                (q.data.as_ptr().add(q_at), q.strides[2], q.strides[3]),
                                scale,
                                true,
                            );
                        }
                    }
                }
            });
    }
    let view = |data: Vec<f32>, dims: [usize; 4]| {
        FlexTensor::from_data(TensorData::new(data, dims)).transpose(1, 2)
    };
    [
        view(dq, [batch, seq_q, heads, d_k]),
        view(dk, [batch, seq_k, heads_kv, d_k]),
        view(dv, [batch, seq_k, heads_kv, d_v]),
    ]
}
