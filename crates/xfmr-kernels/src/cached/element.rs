//! What a key/value cache holds: [`CachePrecision`] (the choice, at run time) and
//! [`CacheElement`] (the element types, `f32` and `f16`, for which the kernel is compiled).

use half::f16;
use half::slice::HalfFloatSliceExt;

/// The number type a [`HeadCache`](super::HeadCache) keeps its keys and values in (as
/// llama.cpp's `--cache-type-k`/`--cache-type-v`). The arithmetic is `f32` either way: `f16`
/// elements are widened, exactly, as they are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CachePrecision {
    /// IEEE half precision (11 significant bits, each element rounded to the nearest),
    /// llama.cpp's default: half the memory of `f32` and half the bytes a decoding step reads,
    /// where attention over the cache is bound by memory (eight sequences decoding together,
    /// or one long one: `docs/benchmarks.md`). A departure from attention in `f32`
    /// throughout: each cached element carries a relative error of at most 2⁻¹¹ in `f16`'s
    /// normal range (magnitudes from 2⁻¹⁴ to 65,504), an absolute one of at most 2⁻²⁵ below
    /// it, and a magnitude of 65,520 or more becomes infinite.
    #[default]
    F16,
    /// The keys and values as computed: attention exactly as in `f32` (reference paths).
    F32,
}

impl CachePrecision {
    /// Bytes per cached element: 2 or 4.
    pub fn bytes(self) -> usize {
        match self {
            Self::F16 => 2,
            Self::F32 => 4,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// An element type of a key/value cache: `f32` or `f16` (sealed: the kernel's loads are
/// written for these two).
pub trait CacheElement: Copy + Default + PartialEq + std::fmt::Debug + sealed::Sealed {
    /// The [`CachePrecision`] this type is.
    const PRECISION: CachePrecision;

    /// The element as `f32` (exact for both types).
    fn to_f32(self) -> f32;

    /// `dst[i] ← src[i]` rounded to this type (`vcvtps2ph` for `f16` where the CPU has F16C).
    ///
    /// # Panics
    /// If the lengths differ.
    fn store(dst: &mut [Self], src: &[f32]);
}

impl CacheElement for f32 {
    const PRECISION: CachePrecision = CachePrecision::F32;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    fn store(dst: &mut [Self], src: &[f32]) {
        dst.copy_from_slice(src);
    }
}

impl CacheElement for f16 {
    const PRECISION: CachePrecision = CachePrecision::F16;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    fn store(dst: &mut [Self], src: &[f32]) {
        dst.convert_from_f32_slice(src);
    }
}
