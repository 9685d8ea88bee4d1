//! xfmr's own attention kernel for the `flex` CPU backend (f32; also the forward of
//! [`attention_autodiff`](crate::attention_autodiff) when training): the whole of
//! `softmax(QKᵀ·s + M + A) V` per (sequence, block of query rows), in one task, without
//! materialising the `[batch, heads, seq_q, seq_k]` scores.
//!
//! For each task, on one thread, head after head:
//! 1. `S = s · Q_blk K_hᵀ` into a scratch block of at most [`SCRATCH_FLOATS`] floats (one
//!    `gemm` call that reads `Q` and `K` through their strides: the head-split views of
//!    multi-head attention are never copied);
//! 2. per row, in place: ignored keys set to `-∞`, the bias added, the maximum `m` found, then
//!    `exp(S - m)` and its sum `z` in one vectorisable pass ([`exp_shifted`]);
//! 3. `O_blk = (exp(S - m) V_h) / z` (a second `gemm`, then one scaling of the `[rows, d_v]`
//!    block); a row whose keys are all ignored is zero.
//!
//! Tasks run on rayon's pool (flex's own). Keys and values of grouped-query attention are read
//! from their shared head (`h / (heads / heads_kv)`), never repeated.
//!
//! The unsafe code is the two `gemm::gemm` calls (through [`product`]), whose pointers and
//! strides are checked against the buffers' lengths first ([`View::check`]); see the crate's
//! SAFETY inventory (SAFETY.md).

use burn::backend::flex::FlexTensor;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Tensor, TensorPrimitive};
use rayon::prelude::*;

use super::same;
use crate::exp::{exp_shifted, LANES};

/// Most floats of one task's score block (256 KiB: it stays in L2 between the two products).
pub(crate) const SCRATCH_FLOATS: usize = 64 * 1024;

fn to_flex<B: Backend, const D: usize>(t: Tensor<B, D>) -> FlexTensor {
    readable(same::<B::FloatTensorPrimitive, FlexTensor>(
        t.into_primitive().tensor(),
    ))
}

/// `t` itself when its strides are non-negative (what [`View`] reads), else a contiguous copy.
pub(crate) fn readable(t: FlexTensor) -> FlexTensor {
    if t.layout().has_positive_strides() {
        t
    } else {
        t.to_contiguous()
    }
}

/// A strided 4-D view into an f32 buffer: element `[i, j, k, l]` is at
/// `offset + i·s₀ + j·s₁ + k·s₂ + l·s₃`.
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) offset: usize,
    pub(crate) dims: [usize; 4],
    pub(crate) strides: [usize; 4],
}

impl<'a> View<'a> {
    pub(crate) fn of(t: &'a FlexTensor) -> Self {
        let layout = t.layout();
        let mut dims = [0; 4];
        let mut strides = [0; 4];
        for d in 0..4 {
            dims[d] = layout.shape()[d];
            // Non-negative: `readable` made the tensor contiguous otherwise.
            let stride = layout.strides()[d];
            assert!(stride >= 0, "attention kernel: a negative stride {stride}");
            strides[d] = stride as usize;
        }
        let view = Self {
            data: t.storage::<f32>(),
            offset: layout.start_offset(),
            dims,
            strides,
        };
        view.check();
        view
    }

    /// Every element of the view lies inside the buffer: the bound the `gemm` calls rely on.
    fn check(&self) {
        if self.dims.contains(&0) {
            return;
        }
        let last = self.offset
            + (0..4)
                .map(|d| (self.dims[d] - 1) * self.strides[d])
                .sum::<usize>();
        assert!(
            last < self.data.len(),
            "attention kernel: a view of {:?} (strides {:?}, offset {}) reaches element {last} \
             of a buffer of {}",
            self.dims,
            self.strides,
            self.offset,
            self.data.len()
        );
    }

    /// Offset of `[i, j, 0, 0]`.
    pub(crate) fn at(&self, i: usize, j: usize) -> usize {
        self.offset + i * self.strides[0] + j * self.strides[1]
    }
}

/// A mask or bias read back to the host with broadcast strides (0 along its size-1 dimensions).
pub(crate) struct Broadcast<T> {
    pub(crate) data: Vec<T>,
    pub(crate) strides: [usize; 4],
}

impl<T> Broadcast<T> {
    fn new(data: Vec<T>, dims: [usize; 4]) -> Self {
        let mut strides = [0; 4];
        let mut stride = 1;
        for d in (0..4).rev() {
            strides[d] = if dims[d] == 1 { 0 } else { stride };
            stride *= dims[d];
        }
        Self { data, strides }
    }

    /// Offset of `[b, h, q, 0]`.
    pub(crate) fn row(&self, b: usize, h: usize, q: usize) -> usize {
        b * self.strides[0] + h * self.strides[1] + q * self.strides[2]
    }
}

pub(crate) fn mask_on_host<B: Backend>(t: Tensor<B, 4, Bool>) -> Broadcast<bool> {
    let dims = t.dims();
    let data = t.into_data();
    // Bool tensors read back as `Bool` or, when an op produced them in flex's byte storage, as
    // `U8` (0 / 1).
    let data = match data.dtype {
        DType::U8 => data
            .to_vec::<u8>()
            .expect("dtype checked")
            .into_iter()
            .map(|x| x != 0)
            .collect(),
        _ => data
            .to_vec::<bool>()
            .expect("a bool tensor reads back as bool or u8"),
    };
    Broadcast::new(data, dims)
}

fn bias_on_host<B: Backend>(bias: Tensor<B, 4>) -> Broadcast<f32> {
    let dims = bias.dims();
    let data = bias
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("converted to f32");
    Broadcast::new(data, dims)
}

/// The context `softmax(QKᵀ·scale + M + A) V` of scaled dot-product attention, computed on the
/// host; a query row whose keys are all ignored is zero.
///
/// The caller has checked the shapes and that [`runs_on`](crate::runs_on) holds (both asserted
/// in debug builds; the bounds the unsafe products rely on are checked in every build).
///
/// The result is stored `[batch, seq_q, heads, d_v]` and returned as its `swap_dims(1, 2)` view:
/// multi-head attention's head merge (`swap_dims(1, 2)` then a reshape to `[batch, seq_q,
/// heads·d_v]`) is then free.
///
/// # Shapes
/// - `query`: `[batch, heads, seq_q, d_k]`
/// - `key`: `[batch, heads_kv, seq_k, d_k]`, `heads_kv` dividing `heads`
/// - `value`: `[batch, heads_kv, seq_k, d_v]`
/// - `mask` (`true` = ignored) and `bias`: broadcastable to `[batch, heads, seq_q, seq_k]`
/// - output: `[batch, heads, seq_q, d_v]`
pub fn attention<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    bias: Option<Tensor<B, 4>>,
    scale: f32,
) -> Tensor<B, 4> {
    debug_assert!(
        crate::runs_on::<B>(query.dtype()),
        "xfmr_kernels::attention: not a flex f32 tensor"
    );
    let mask = mask.map(mask_on_host);
    let bias = bias.map(bias_on_host);
    let (q, k, v) = (to_flex(query), to_flex(key), to_flex(value));
    let (out, _) = forward(&q, &k, &v, mask.as_ref(), bias.as_ref(), scale, false);
    Tensor::from_primitive(TensorPrimitive::Float(same::<
        FlexTensor,
        B::FloatTensorPrimitive,
    >(out)))
}

/// The attention of [`attention`] on flex tensors `[batch, heads, seq_q, d_k]`, `[batch,
/// heads_kv, seq_k, d_k]`, `[batch, heads_kv, seq_k, d_v]` (non-negative strides: see
/// [`readable`]) and host masks: the context, stored `[batch, seq_q, heads, d_v]` and returned
/// as its `[batch, heads, seq_q, d_v]` view, and, when `with_lse`, each row's log-sum-exp
/// `ln Σ_k exp(s_qk)` (`-∞` for a row whose keys are all ignored; left 0 when there are no keys
/// or `d_v` is 0, where the backward has nothing to compute), indexed
/// `(b·seq_q + q)·heads + h` (what the backward pass of
/// [`attention_autodiff`](crate::attention_autodiff) recomputes the weights from).
pub(crate) fn forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    mask: Option<&Broadcast<bool>>,
    bias: Option<&Broadcast<f32>>,
    scale: f32,
    with_lse: bool,
) -> (FlexTensor, Option<Vec<f32>>) {
    let (q, k, v) = (View::of(q), View::of(k), View::of(v));
    let [batch, heads, seq_q, d_k] = q.dims;
    let [_, heads_kv, seq_k, _] = k.dims;
    let d_v = v.dims[3];
    assert!(
        k.dims[0] == batch
            && k.dims[3] == d_k
            && heads_kv > 0
            && heads % heads_kv == 0
            && v.dims[..3] == k.dims[..3],
        "xfmr_kernels::attention: query {:?}, key {:?}, value {:?} disagree",
        q.dims,
        k.dims,
        v.dims
    );
    let shape = Shape {
        heads,
        group: heads / heads_kv,
        seq_k,
        d_k,
        d_v,
        scale,
    };

    // Blocks of query rows: a score block of at most SCRATCH_FLOATS, and at least two tasks
    // per thread where the rows allow it.
    let mut rows = (SCRATCH_FLOATS / seq_k.max(1)).clamp(1, seq_q.max(1));
    let tasks = |rows: usize| batch * seq_q.div_ceil(rows);
    while rows > 1 && tasks(rows) < 2 * rayon::current_num_threads() {
        rows = rows.div_ceil(2);
    }
    let row_len = heads * d_v;
    let mut out = vec![0.0f32; batch * seq_q * row_len];
    // One entry per (row, head), in the output's row order.
    let mut lse = vec![0.0f32; if with_lse { batch * seq_q * heads } else { 0 }];
    if !out.is_empty() {
        let run = |b: usize, block: usize, out_block: &mut [f32], lse_block: Option<&mut [f32]>| {
            let task = Task {
                b,
                q0: block * rows,
                rows: out_block.len() / row_len,
            };
            task.run(&shape, &q, &k, &v, mask, bias, out_block, lse_block);
        };
        if with_lse {
            out.par_chunks_mut(seq_q * row_len)
                .zip(lse.par_chunks_mut(seq_q * heads))
                .enumerate()
                .for_each(|(b, (sequence, lse))| {
                    sequence
                        .par_chunks_mut(rows * row_len)
                        .zip(lse.par_chunks_mut(rows * heads))
                        .enumerate()
                        .for_each(|(block, (out_block, lse_block))| {
                            run(b, block, out_block, Some(lse_block))
                        });
                });
        } else {
            out.par_chunks_mut(seq_q * row_len)
                .enumerate()
                .for_each(|(b, sequence)| {
                    sequence
                        .par_chunks_mut(rows * row_len)
                        .enumerate()
                        .for_each(|(block, out_block)| run(b, block, out_block, None));
                });
        }
    }
    let data = burn::tensor::TensorData::new(out, [batch, seq_q, heads, d_v]);
    let out = FlexTensor::from_data(data).transpose(1, 2);
    (out, with_lse.then_some(lse))
}

/// What every task shares: the head counts, lengths, widths and the scale.
struct Shape {
    heads: usize,
    /// Query heads per key/value head.
    group: usize,
    seq_k: usize,
    d_k: usize,
    d_v: usize,
    scale: f32,
}

/// A block of query rows `q0..q0 + rows` of sequence `b`, every head.
struct Task {
    b: usize,
    q0: usize,
    rows: usize,
}

impl Task {
    /// Writes the block's context into `out`: `[rows, heads, d_v]`, row-major.
    #[allow(clippy::too_many_arguments, unsafe_code)]
    fn run(
        &self,
        shape: &Shape,
        q: &View,
        k: &View,
        v: &View,
        mask: Option<&Broadcast<bool>>,
        bias: Option<&Broadcast<f32>>,
        out: &mut [f32],
        mut lse: Option<&mut [f32]>,
    ) {
        let Shape {
            heads,
            group,
            seq_k,
            d_k,
            d_v,
            scale,
        } = *shape;
        let rows = self.rows;
        let row_len = heads * d_v;
        assert_eq!(out.len(), rows * row_len);
        if seq_k == 0 {
            return; // no keys: every row is fully ignored, zero
        }
        // The extents the unsafe products read, inside the views `View::check` bounded.
        debug_assert!(self.q0 + rows <= q.dims[2] && seq_k == k.dims[2] && seq_k == v.dims[2]);
        debug_assert!(d_k == q.dims[3] && d_k == k.dims[3] && d_v == v.dims[3]);
        let mut scores = vec![0.0f32; rows * seq_k];
        let mut inverse = vec![0.0f32; rows];
        for h in 0..heads {
            let h_kv = h / group;
            let q_at = q.at(self.b, h) + self.q0 * q.strides[2];
            let k_at = k.at(self.b, h_kv);
            // SAFETY: `View::check` bounds every element of the query, key and value views
            // inside their buffers, and rows `q0..q0 + rows` are query rows; `scores` holds
            // `rows × seq_k` floats, written row-major (row stride seq_k) and owned by this task,
            // so nothing read aliases it.
            unsafe {
                product(
                    [rows, seq_k, d_k],
                    (scores.as_mut_ptr(), seq_k),
                    (q.data.as_ptr().add(q_at), q.strides[2], q.strides[3]),
                    // Kᵀ: its row index runs over d_k, its column index over the keys.
                    (k.data.as_ptr().add(k_at), k.strides[3], k.strides[2]),
                    scale,
                    false,
                );
            }

            for (r, row) in scores.chunks_exact_mut(seq_k).enumerate() {
                let query = self.q0 + r;
                if let Some(mask) = mask {
                    let at = mask.row(self.b, h, query);
                    let step = mask.strides[3];
                    for (j, s) in row.iter_mut().enumerate() {
                        if mask.data[at + j * step] {
                            *s = f32::NEG_INFINITY;
                        }
                    }
                }
                if let Some(bias) = bias {
                    let at = bias.row(self.b, h, query);
                    let step = bias.strides[3];
                    for (j, s) in row.iter_mut().enumerate() {
                        *s += bias.data[at + j * step];
                    }
                }
                let max = row_max(row);
                let (inv, log_sum) = if max == f32::NEG_INFINITY {
                    row.fill(0.0); // every key ignored: a zero row
                    (0.0, f32::NEG_INFINITY)
                } else {
                    let sum = exp_shifted(row, max).max(f32::MIN_POSITIVE);
                    (1.0 / sum, max + sum.ln())
                };
                inverse[r] = inv;
                if let Some(lse) = lse.as_deref_mut() {
                    lse[r * heads + h] = log_sum;
                }
            }

            let v_at = v.at(self.b, h_kv);
            // SAFETY: `scores` holds `rows × seq_k` floats (row-major), the value view is bounded
            // by `View::check`, and the product's element (r, d) is written at
            // `h·d_v + r·heads·d_v + d < rows·heads·d_v = out.len()` (asserted above); `out` is
            // this task's own block, disjoint from every other task's.
            unsafe {
                product(
                    [rows, d_v, seq_k],
                    (out.as_mut_ptr().add(h * d_v), row_len),
                    (scores.as_ptr(), seq_k, 1),
                    (v.data.as_ptr().add(v_at), v.strides[2], v.strides[3]),
                    1.0,
                    false,
                );
            }
            for (r, inv) in inverse.iter().enumerate() {
                let at = r * row_len + h * d_v;
                out[at..at + d_v].iter_mut().for_each(|x| *x *= inv);
            }
        }
    }
}

/// `dst ← scale · lhs · rhs` (or, with `accumulate`, `dst ← dst + scale · lhs · rhs`) for
/// `[m, n, k]`, on the calling thread: `dst` is `m × n` with column stride 1 and row stride
/// `dst.1`; `lhs` (`m × k`) and `rhs` (`k × n`) are `(pointer, row stride, column stride)`.
/// Without `accumulate`, `dst` is written, never read.
///
/// # Safety
/// Every element the three strided matrices address lies in a live allocation, and `dst`
/// aliases neither operand nor memory another thread touches meanwhile.
#[allow(unsafe_code)]
pub(crate) unsafe fn product(
    [m, n, k]: [usize; 3],
    dst: (*mut f32, usize),
    lhs: (*const f32, usize, usize),
    rhs: (*const f32, usize, usize),
    scale: f32,
    accumulate: bool,
) {
    // SAFETY: the caller's contract is gemm's.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0,
            1,
            dst.1 as isize,
            accumulate,
            lhs.0,
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0,
            rhs.2 as isize,
            rhs.1 as isize,
            if accumulate { 1.0 } else { 0.0 },
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The maximum of a non-empty row (`-∞` if every entry is); lanes of 16 so that it vectorises.
pub(crate) fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(chunks.remainder()) {
        max = if x > max { x } else { max };
    }
    max
}
