//! xfmr's own attention kernel for the `flex` CPU backend (f32, inference): the whole of
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
//! This is the only module of the workspace with `unsafe` code: the two `gemm::gemm` calls
//! (through [`product`]), whose pointers and strides are checked against the buffers' lengths
//! first ([`View::check`]).

use std::any::{Any, TypeId};

use burn::backend::flex::{Flex, FlexTensor};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Tensor, TensorPrimitive};
use rayon::prelude::*;

use crate::AttnMask;

/// Most floats of one task's score block (256 KiB: it stays in L2 between the two products).
const SCRATCH_FLOATS: usize = 64 * 1024;

/// Whether the kernel runs on backend `B` for tensors of dtype `dtype`: the `flex` backend
/// itself (not under `Autodiff`), f32.
pub(crate) fn supported<B: Backend>(dtype: DType) -> bool {
    TypeId::of::<B>() == TypeId::of::<Flex>() && dtype == DType::F32
}

/// `x` as type `U`; the caller has checked that `T` is `U`.
fn same<T: 'static, U: 'static>(x: T) -> U {
    *(Box::new(x) as Box<dyn Any>)
        .downcast::<U>()
        .unwrap_or_else(|_| unreachable!("the caller checked the types"))
}

fn to_flex<B: Backend, const D: usize>(t: Tensor<B, D>) -> FlexTensor {
    let t = same::<B::FloatTensorPrimitive, FlexTensor>(t.into_primitive().tensor());
    if t.layout().has_positive_strides() {
        t
    } else {
        t.to_contiguous()
    }
}

/// A strided 4-D view into an f32 buffer: element `[i, j, k, l]` is at
/// `offset + i·s₀ + j·s₁ + k·s₂ + l·s₃`.
struct View<'a> {
    data: &'a [f32],
    offset: usize,
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<'a> View<'a> {
    fn of(t: &'a FlexTensor) -> Self {
        let layout = t.layout();
        let mut dims = [0; 4];
        let mut strides = [0; 4];
        for d in 0..4 {
            dims[d] = layout.shape()[d];
            // Non-negative: `to_flex` made the tensor contiguous otherwise.
            strides[d] = layout.strides()[d] as usize;
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
    fn at(&self, i: usize, j: usize) -> usize {
        self.offset + i * self.strides[0] + j * self.strides[1]
    }
}

/// A mask or bias read back to the host with broadcast strides (0 along its size-1 dimensions).
struct Broadcast<T> {
    data: Vec<T>,
    strides: [usize; 4],
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
    fn row(&self, b: usize, h: usize, q: usize) -> usize {
        b * self.strides[0] + h * self.strides[1] + q * self.strides[2]
    }
}

fn mask_on_host<B: Backend>(mask: AttnMask<B>) -> Broadcast<bool> {
    let t: Tensor<B, 4, Bool> = mask.into_tensor();
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

/// The context `[batch, heads, seq_q, d_v]` of scaled dot-product attention, computed on the
/// host by this module's kernel. Shapes already checked by the caller; [`supported`] holds.
///
/// The result is stored `[batch, seq_q, heads, d_v]` and returned as its `swap_dims(1, 2)` view:
/// multi-head attention's head merge (`swap_dims(1, 2)` then a reshape to `[batch, seq_q,
/// heads·d_v]`) is then free.
pub(crate) fn attention<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    mask: Option<AttnMask<B>>,
    bias: Option<Tensor<B, 4>>,
    scale: Option<f64>,
) -> Tensor<B, 4> {
    let [batch, heads, seq_q, d_k] = query.dims();
    let [_, heads_kv, seq_k, _] = key.dims();
    let [_, _, _, d_v] = value.dims();
    let scale = crate::sdpa::scale_or_default(scale, d_k) as f32;
    let mask = mask.map(mask_on_host);
    let bias = bias.map(bias_on_host);
    let (q, k, v) = (to_flex(query), to_flex(key), to_flex(value));
    let (q, k, v) = (View::of(&q), View::of(&k), View::of(&v));
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
    if !out.is_empty() {
        out.par_chunks_mut(seq_q * row_len)
            .enumerate()
            .for_each(|(b, sequence)| {
                sequence
                    .par_chunks_mut(rows * row_len)
                    .enumerate()
                    .for_each(|(block, out_block)| {
                        let task = Task {
                            b,
                            q0: block * rows,
                            rows: out_block.len() / row_len,
                        };
                        task.run(&shape, &q, &k, &v, mask.as_ref(), bias.as_ref(), out_block);
                    });
            });
    }
    let data = burn::tensor::TensorData::new(out, [batch, seq_q, heads, d_v]);
    let flex = FlexTensor::from_data(data);
    let out: Tensor<B, 4> = Tensor::from_primitive(TensorPrimitive::Float(same::<
        FlexTensor,
        B::FloatTensorPrimitive,
    >(flex)));
    out.swap_dims(1, 2)
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
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        shape: &Shape,
        q: &View,
        k: &View,
        v: &View,
        mask: Option<&Broadcast<bool>>,
        bias: Option<&Broadcast<f32>>,
        out: &mut [f32],
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
                inverse[r] = if max == f32::NEG_INFINITY {
                    row.fill(0.0); // every key ignored: a zero row
                    0.0
                } else {
                    1.0 / exp_shifted(row, max).max(f32::MIN_POSITIVE)
                };
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
                );
            }
            for (r, inv) in inverse.iter().enumerate() {
                let at = r * row_len + h * d_v;
                out[at..at + d_v].iter_mut().for_each(|x| *x *= inv);
            }
        }
    }
}

/// `dst ← scale · lhs · rhs` for `[m, n, k]`, on the calling thread: `dst` is `m × n` with
/// column stride 1 and row stride `dst.1`; `lhs` (`m × k`) and `rhs` (`k × n`) are
/// `(pointer, row stride, column stride)`. `dst` is written, never read.
///
/// # Safety
/// Every element the three strided matrices address lies in a live allocation, and `dst`
/// aliases neither operand nor memory another thread touches meanwhile.
unsafe fn product(
    [m, n, k]: [usize; 3],
    dst: (*mut f32, usize),
    lhs: (*const f32, usize, usize),
    rhs: (*const f32, usize, usize),
    scale: f32,
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
            false,
            lhs.0,
            lhs.2 as isize,
            lhs.1 as isize,
            rhs.0,
            rhs.2 as isize,
            rhs.1 as isize,
            0.0,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The maximum of a non-empty row (`-∞` if every entry is); lanes of 16 so that it vectorises.
fn row_max(row: &[f32]) -> f32 {
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

/// Lanes of the vectorised loops (an AVX-512 register of f32).
const LANES: usize = 16;

/// `x ← exp(x - max)` over `row`, returning the sum. `max` is the row's (finite) maximum, so every
/// argument is `≤ 0`; arguments below `-87` (and `-∞`, ignored keys) give exactly 0.
///
/// `exp(t) = 2ⁿ · p(r)` with `n = round(t / ln 2)`, `r = t - n ln 2` (in two parts, Cody and
/// Waite) and `p` Cephes' polynomial for `expf` on `|r| ≤ ln 2 / 2`: within 2 ulp of the
/// correctly rounded value. Written without branches over lanes of 16 and compiled for AVX-512
/// or AVX2 when the CPU has them (chosen at run time; the same operations in the same order on
/// every path, so the result does not depend on the CPU): libm's scalar `expf` was 8% of the
/// attention layer's time.
pub(crate) fn exp_shifted(row: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, the only feature the function is compiled for.
            return unsafe { exp_shifted_avx512(row, max) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, the only feature the function is compiled for.
            return unsafe { exp_shifted_avx2(row, max) };
        }
    }
    exp_shifted_portable(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn exp_shifted_avx512(row: &mut [f32], max: f32) -> f32 {
    exp_shifted_portable(row, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn exp_shifted_avx2(row: &mut [f32], max: f32) -> f32 {
    exp_shifted_portable(row, max)
}

#[inline(always)]
fn exp_shifted_portable(row: &mut [f32], max: f32) -> f32 {
    let mut sums = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for (x, sum) in chunk.iter_mut().zip(sums.iter_mut()) {
            *x = exp_nonpositive(*x - max);
            *sum += *x;
        }
    }
    for (x, sum) in chunks.into_remainder().iter_mut().zip(sums.iter_mut()) {
        *x = exp_nonpositive(*x - max);
        *sum += *x;
    }
    sums.iter().sum()
}

/// `exp(t)` for `t ≤ 0` (see [`exp_shifted`]); 0 below -87, where `2ⁿ` would be subnormal.
/// Integer and bit operations only, so that it vectorises (no saturating casts, no branches).
/// Public (as `xfmr_attention::exp_nonpositive`, feature `flex`) for the other CPU kernels of
/// the workspace (xfmr-blocks' GELU).
#[inline(always)]
pub fn exp_nonpositive(t: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to the nearest integer (|t·log₂e| < 2²²), which then sits in the
    // low mantissa bits: ROUND's bits are 0x4B40_0000.
    const ROUND: f32 = 12_582_912.0;
    let clamped = if t > -87.0 { t } else { -87.0 };
    let shifted = clamped * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes' 5.0000001201e-1, which rounds to 0.5 in f32
    let e = p * r * r + r + 1.0;
    // 2ⁿ from the exponent bits: n is in [-126, 0] here.
    let n_bits = shifted.to_bits().wrapping_sub(0x4B40_0000);
    let two_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    // All ones where t ≥ -87, zero below (and for -∞): the result or exactly 0.
    let keep = 0u32.wrapping_sub((t >= -87.0) as u32);
    f32::from_bits((e * two_n).to_bits() & keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised exponential against std's `exp` over its whole domain (a step of 1e-3
    /// from -90 to 0): relative error within 4 ulp (4 · 2⁻²³ ≈ 4.8e-7); exact 0 below -87.
    #[test]
    fn exp_shifted_matches_std_exp() {
        let xs: Vec<f32> = (0..=90_000).map(|i| -(i as f32) * 1e-3).collect();
        let mut row = xs.clone();
        let sum = exp_shifted(&mut row, 0.0);
        let mut expected_sum = 0.0f64;
        for (x, got) in xs.iter().zip(&row) {
            if *x < -87.0 {
                assert_eq!(*got, 0.0, "exp({x})");
                continue;
            }
            let want = (*x as f64).exp();
            expected_sum += want;
            let rel = ((*got as f64 - want) / want).abs();
            assert!(
                rel <= 4.0 * f32::EPSILON as f64,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert!(((sum as f64 - expected_sum) / expected_sum).abs() < 1e-5);
        let mut ignored = [f32::NEG_INFINITY, 0.0];
        assert_eq!(exp_shifted(&mut ignored, 0.0), 1.0);
        assert_eq!(ignored, [0.0, 1.0]);
    }
}
