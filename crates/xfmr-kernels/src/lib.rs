//! # xfmr-kernels
//!
//! xfmr's own host kernels, in one internal crate below `xfmr-attention` and `xfmr-blocks`
//! (their `flex` feature pulls it in) and `xfmr-llm` (the quantised products); nothing else
//! should depend on it:
//!
//! - [`attention()`]: the whole of `softmax(QKᵀ·s + M + A) V` per block of query rows, reading
//!   multi-head attention's strided head views in place;
//! - [`attention_autodiff`]: the same as one operation of `Autodiff<Flex>`'s graph, with a
//!   backward kernel of its own (training on the CPU);
//! - [`attend_cached`] and [`cached_probabilities`]: one query position's attention over a
//!   key/value cache for the query heads sharing a key/value head (decoding), register-tiled;
//! - [`dropout_mask`]: dropout masks from a counter-based hash, in parallel (training);
//! - [`exp_shifted`] and [`exp_nonpositive`]: a vectorised `exp` for softmax rows;
//! - [`gelu`]: exact GELU, vectorised;
//! - [`silu_mul`]: SwiGLU's `silu(g)·u`, vectorised (xfmr-llm's quantised model);
//! - [`quant`]: ggml's quantised block formats, their dequantisation, and matrix products on
//!   the blocks with `i8`-quantised activations (llama.cpp's scheme), AVX-512 VNNI, AVX-VNNI
//!   and AVX2 paths chosen at run time beside a portable one. Host code on plain slices: it
//!   needs no backend.
//!
//! The flex kernels (attention, exp, GELU) run only where [`runs_on`] holds: the
//! `burn::backend::Flex` backend itself (not under `Autodiff`) with f32 tensors;
//! [`attention_autodiff`] only where [`runs_on_autodiff`] holds (`Autodiff<Flex>`, f32). Callers check
//! it and take burn's generic path otherwise; the kernels assert it again in debug builds.
//!
//! # SAFETY inventory
//!
//! `unsafe` is denied crate-wide and allowed on these items only (the same list is in
//! `Cargo.toml` and `docs/ARCHITECTURE.md`):
//!
//! | site | what is unsafe | why it is sound |
//! | --- | --- | --- |
//! | `attention::product` | `gemm::gemm` on raw pointers and strides | its `# Safety` contract is gemm's, passed on to the caller |
//! | `attention::Task::run`, first `product` | `S = s·Q_blk K_hᵀ` | `View::check` bounds every element of the views (asserted, all builds); the block's extent is asserted again in debug builds; `scores` is the task's own buffer |
//! | `attention::Task::run`, second `product` | `O_blk = exp(S - m) V_h` | as above for `V`; the output block is the task's own, disjoint chunk (`par_chunks_mut`) |
//! | `quant::dot::on_simd_path!` (used by `dot_row`, `dot_blocks`, `dot_blocks4`, `dot_rows4`, `dot_panel`) | its three calls of the `#[target_feature]` functions of `quant::dot::x86` | each for a `Path` that `Path::available` confirmed: it checks every feature those functions enable (AVX2, FMA, F16C, and AVX-VNNI or AVX-512 F/VNNI/VL); `QuantizedMatrix::matmul_fused`, their only caller, asserts it in all builds |
//! | `quant::dot::x86` (`quant/dot/x86.rs`) | SIMD intrinsics: unaligned loads | `products_*` load `[u8; 32]`/`[i8; 32]` arrays (whole, or 16 bytes at offsets 0 and 16); `blocks*`/`rows4*` load from `&[u8; N]` blocks obtained by a checked `try_into` after an all-builds length assert: 16 bytes at offset 2 of an 18-byte `Q4_0` block, at offset 4 of a 20-byte `Q4_1` block, 32 bytes at offset 2 of a 34-byte `Q8_0` block; `panel_*` load dwords at offsets 0 (the scales), 2 + 4k (`Q4_0`, k < 4), 4 + 4k (`Q4_1`, k < 4) and 2 + 4k (`Q8_0`, k < 8) of such blocks, and aligned 32-byte vectors of a `PanelBlock` (`#[repr(C, align(32))]`, its `q[k]`, `d` and `sum` at multiples of 32 bytes) |
//! | `attention_autodiff::backward`, its five `product` calls | `S = s·Q_blk K_hᵀ`, `dV_h += Pᵀ dO_blk`, `dP = dO_blk V_hᵀ`, `dQ_blk = s·dS K_h`, `dK_h += s·dSᵀ Q_blk` | `View::check` bounds the q, k, v and dO views (asserted, all builds); `p`, `ds` are the task's own `rows × seq_k` buffers; `dq`, `dk`, `dv` are the task's own slices of its sequence (`par_chunks_mut`), and the written extents are inside them (the comment at the call) |
//! | `cached::attend_cached`, `cached::cached_probabilities` | calls of the `#[target_feature(enable = "avx512f")]` and `"avx2"` copies of the portable kernel (safe Rust, every slice bounds-checked) | each after `is_x86_feature_detected!` for that feature |
//! | `quant::dot::quantize_blocks` | its call of the `#[target_feature(enable = "avx2")]` copy of the portable loop (safe Rust) | after `is_x86_feature_detected!("avx2")` |
//! | `exp::exp_shifted` | calls of the `#[target_feature(enable = "avx512f")]` and `"avx2"` copies | each after `is_x86_feature_detected!` for that feature |
//!
//! Everything else, `gelu` included, is safe Rust over public burn API (`into_data`,
//! `from_data`, flex's storage slices).

use std::any::{Any, TypeId};

use burn::backend::flex::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::DType;

mod attention;
mod attention_autodiff;
mod cached;
mod dropout;
mod exp;
mod gelu;
pub mod quant;
mod silu;

pub use attention::attention;
pub use attention_autodiff::{attention_autodiff, runs_on_autodiff};
pub use cached::{attend_cached, cached_probabilities, CachedHead};
pub use dropout::dropout_mask;
pub use exp::{exp_nonpositive, exp_shifted};
pub use gelu::gelu;
pub use silu::silu_mul;

/// Whether the kernels run on backend `B` for tensors of `dtype`: the `flex` backend itself
/// (not under `Autodiff`, whose tensors are another type), f32.
pub fn runs_on<B: Backend>(dtype: DType) -> bool {
    TypeId::of::<B>() == TypeId::of::<Flex>() && dtype == DType::F32
}

/// `x` as type `U`; the caller has checked that `T` is `U` ([`runs_on`]).
fn same<T: 'static, U: 'static>(x: T) -> U {
    *(Box::new(x) as Box<dyn Any>)
        .downcast::<U>()
        .unwrap_or_else(|_| panic!("xfmr-kernels: called where `runs_on` does not hold"))
}
