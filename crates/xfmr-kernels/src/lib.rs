//! # xfmr-kernels
//!
//! xfmr's own host kernels, in one internal crate below `xfmr-attention`, `xfmr-blocks` and
//! `xfmr-models` (their `flex` feature pulls it in, with its own `flex`) and `xfmr-llm` (the
//! quantised products, the cached attention, SwiGLU's gate; no feature); nothing else should
//! depend on it. Two parts:
//!
//! **Host kernels on plain slices**, which need no burn (always built):
//!
//! - [`attend_cached`] and [`cached_probabilities`]: one query position's attention over a
//!   key/value cache for the query heads sharing a key/value head (decoding), register-tiled,
//!   over a [`HeadCache`] (keys in transposed blocks of [`KEY_BLOCK`] positions, values as rows);
//! - [`dropout_mask`]: dropout masks from a counter-based hash, in parallel (training);
//! - [`exp_shifted`] and [`exp_nonpositive`]: a vectorised `exp` for softmax rows;
//! - [`gelu_in_place`]: exact GELU, vectorised, and [`gelu_backward_in_place`], its derivative
//!   times an incoming gradient (training);
//! - [`smoothed_cross_entropy_row`]: the label-smoothed cross-entropy of one row of logits and
//!   its gradient in closed form, in place ([`Smoothing`]; training);
//! - [`norm_rows`]: LayerNorm and RMSNorm row by row in place ([`RowNorm`]), and
//!   [`norm_rows_backward`], their gradients (training);
//! - [`silu_mul`]: SwiGLU's `silu(g)·u`, vectorised (xfmr-llm's quantised model);
//! - [`bf16`]: matrix products with `bf16` factors and `f32` sums on weights packed once
//!   ([`bf16::PackedBf16`]), on AMX, AVX-512 BF16 or in plain Rust, for callers that permit
//!   `bf16` products (PyTorch's `"medium"` float32 matmul precision);
//! - [`quant`]: ggml's quantised block formats, their dequantisation, and matrix products on
//!   the blocks with `i8`-quantised activations (llama.cpp's scheme);
//! - [`cpu`]: the CPU feature probe, run once, and the levels every kernel with SIMD copies
//!   dispatches on with one `match` ([`cpu::FloatLevel`]: AVX-512F / AVX2, each with FMA /
//!   portable for the `f32` loops; [`cpu::DotLevel`]: AVX-512 VNNI / AVX-VNNI / AVX2 /
//!   portable for the quantised products; [`cpu::Bf16Level`]: AMX / AVX-512 BF16 / portable for [`bf16`]).
//!
//! **The glue to burn's flex backend** (feature `flex`, which turns on burn with its `flex` and
//! `autodiff` features; `src/flex/`): `attention` (the whole of `softmax(QKᵀ·s + M + A) V` per
//! block of query rows), `attention_autodiff` (the same as one operation of `Autodiff<Flex>`'s
//! graph, with a backward kernel of its own), `gelu` (exact GELU) and `gelu_autodiff` (the same
//! as one operation of the graph), `smoothed_cross_entropy` (the training loss, one operation
//! of the graph under autodiff), `linear_bf16` (`x·W + b` with `bf16` products) and
//! `linear_bf16_autodiff` (the same as one operation of the graph, its backward's products in
//! `bf16` too) and `norm` (LayerNorm and RMSNorm) and `norm_autodiff` (the
//! same as one operation of the graph) over the host kernels above, and the checks
//! generic code asks first: `runs_on::<B>(dtype)` (`Flex` itself, f32) and
//! `runs_on_autodiff::<B>(dtype)` (`Autodiff<Flex>`, f32). Callers take burn's generic path
//! where they do not hold; the kernels assert them again in debug builds.
//!
//! **Attention under autodiff on the GPU backends** (features `wgpu` and `cuda`, which turn on
//! burn with that backend and `autodiff`; `src/gpu/`): `gpu_attention_autodiff`, one operation
//! of `Autodiff<I>`'s graph over a GPU backend `I` with FlashAttention-2's backward from each
//! row's saved log-sum-exp, written with `I`'s own tensor operations (no `unsafe`), and its
//! check `runs_on_gpu_autodiff::<B>(dtype)` (`Autodiff<Wgpu>`, `Autodiff<Cuda>` and their
//! unfused `CubeBackend`s, f32).
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed per item. Every `unsafe` site (file, function,
//! how many, why it is sound) is in ONE place, the inventory `SAFETY.md` beside this crate's
//! `Cargo.toml`; the test `architecture_safety_inventory_lists_every_unsafe_site`
//! (`tests/architecture.rs`) checks it against the sources both ways.

pub mod bf16;
pub mod cpu;

mod cached;
mod dropout;
mod exp;
#[cfg(feature = "flex")]
mod flex;
mod gelu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
mod loss;
mod norm;
mod norm_backward;
pub mod quant;
mod silu;

pub use cached::{
    attend_cached, cached_probabilities, CacheElement, CachePrecision, CachedHead, HeadCache,
    HeadView, KEY_BLOCK,
};
pub use dropout::dropout_mask;
pub use exp::{exp_nonpositive, exp_shifted};
#[cfg(feature = "flex")]
pub use flex::{
    attention, attention_autodiff, gelu, gelu_autodiff, linear_bf16, linear_bf16_autodiff, norm,
    norm_autodiff, runs_on, runs_on_autodiff, smoothed_cross_entropy, SmoothedCrossEntropy,
};
pub use gelu::{gelu_backward_in_place, gelu_in_place};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use gpu::{gpu_attention_autodiff, runs_on_gpu_autodiff};
pub use loss::{smoothed_cross_entropy_row, Smoothing};
pub use norm::{norm_rows, RowNorm};
pub use norm_backward::norm_rows_backward;
pub use silu::silu_mul;

/// The next value of a SplitMix64 stream (Steele, Lea and Flood, 2014) whose state is `state`
/// (advanced): the dropout masks' keys, the seeds of a thread's dropout stream
/// (`xfmr_attention::with_dropout_seed`) and the tests' deterministic random bits.
///
/// ```
/// let mut state = 7;
/// let (a, b) = (xfmr_kernels::splitmix64(&mut state), xfmr_kernels::splitmix64(&mut state));
/// assert_ne!(a, b);
/// assert_eq!(state, 7u64.wrapping_add(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(2)));
/// ```
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
