//! The CPU features the kernels dispatch on, probed once (as candle-core's and ggml-cpu's CPU
//! feature probes are): [`features`], and the three ladders of levels the kernels choose from,
//! [`FloatLevel`] (the `f32` loops: [`exp_shifted`](crate::exp_shifted),
//! [`attend_cached`](crate::attend_cached),
//! [`gelu_in_place`](crate::gelu_in_place), [`norm_rows`](crate::norm_rows) and
//! [`norm_rows_backward`](crate::norm_rows_backward), [`silu_mul`](crate::silu_mul),
//! [`dropout_mask`](crate::dropout_mask), the loss's rows,
//! the activation quantisation of [`quant`](crate::quant)) and [`DotLevel`] (the integer products
//! of [`quant`](crate::quant), re-exported there as `quant::Path`) and [`Bf16Level`] (the
//! products with `bf16` factors of [`bf16`](crate::bf16)).
//!
//! This module is the only place that asks the CPU what it has (`is_x86_feature_detected!`,
//! and for AMX, which the standard library cannot detect on stable Rust, `cpuid` and the
//! OS's leave to use the tiles),
//! and every kernel with SIMD copies dispatches the same way, ggml-cpu style (the generic code
//! beside `#[target_feature]` copies or an `x86` module):
//!
//! ```text
//! pub fn kernel(args) -> R {
//!     kernel_on(FloatLevel::detect(), args)
//! }
//!
//! /// The tests call this with every level the CPU has and compare with `Portable`.
//! fn kernel_on(level: FloatLevel, args) -> R {
//!     level.assert_available();
//!     match level {
//!         // SAFETY: the level is available (asserted above): the CPU has AVX-512F and AVX2.
//!         FloatLevel::Avx512 => unsafe { kernel_avx512(args) },
//!         // SAFETY: as above, AVX2.
//!         FloatLevel::Avx2 => unsafe { kernel_avx2(args) },
//!         _ => kernel_portable(args),
//!     }
//! }
//! ```
//!
//! (`quant`'s products take the level as an argument instead: `QuantizedMatrix::matmul_fused`
//! asserts it once per product, then `on_simd_path!` matches on it per row.) The levels of a
//! ladder are cumulative: each has every feature of the levels below it.

use std::sync::OnceLock;

/// The CPU features the kernels use, as [`features`] found them (all `false` off x86).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Features {
    /// AVX2 (256-bit integer and float vectors).
    pub avx2: bool,
    /// FMA (fused multiply-add).
    pub fma: bool,
    /// F16C (`f16` ↔ `f32` conversions).
    pub f16c: bool,
    /// AVX-512 Foundation (512-bit vectors).
    pub avx512f: bool,
    /// AVX-512 VL (AVX-512 instructions on 256-bit registers).
    pub avx512vl: bool,
    /// AVX-512 BW (byte and word elements, their masks and shuffles on 512-bit registers).
    pub avx512bw: bool,
    /// AVX-512 VNNI (`vpdpbusd`, EVEX-encoded).
    pub avx512vnni: bool,
    /// AVX-VNNI (`vpdpbusd`, VEX-encoded).
    pub avxvnni: bool,
    /// AVX-512 BF16 (`vdpbf16ps`: pairs of `bf16` products summed into `f32` lanes).
    pub avx512bf16: bool,
    /// AMX with its BF16 products (`tdpbf16ps` on 16×32 tiles), as `cpuid` reports them (Linux
    /// x86_64 only). Using the tiles also needs the OS's leave, which the process asks for on
    /// the first use of [`Bf16Level::Amx`] (its [`available`](Bf16Level::available)).
    pub amx_bf16: bool,
}

impl Features {
    /// Asks the CPU (and the OS, for the registers' state): `is_x86_feature_detected!` on x86,
    /// nothing elsewhere.
    fn probe() -> Self {
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        {
            use std::arch::is_x86_feature_detected as has;
            Self {
                avx2: has!("avx2"),
                fma: has!("fma"),
                f16c: has!("f16c"),
                avx512f: has!("avx512f"),
                avx512vl: has!("avx512vl"),
                avx512bw: has!("avx512bw"),
                avx512vnni: has!("avx512vnni"),
                avxvnni: has!("avxvnni"),
                avx512bf16: has!("avx512bf16") && has!("avx512f"),
                amx_bf16: amx_in_cpu(),
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "x86")))]
        {
            Self {
                amx_bf16: amx_in_cpu(),
                ..Self::default()
            }
        }
    }
}

/// Whether the CPU has AMX's tiles and BF16 products (`cpuid` leaf 7: `AMX-TILE`, EDX bit 24;
/// `AMX-BF16`, bit 22). `false` outside Linux on x86_64 (the only system xfmr asks for the
/// tiles on).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unsafe_code)]
fn amx_in_cpu() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: `cpuid` reads the CPU's identification, nothing else; every x86_64 CPU has it
    // and leaf 7 (asked only where leaf 0 says it exists). (Safe functions in newer
    // toolchains, `unsafe` in older ones: the block keeps both building.)
    #[allow(unused_unsafe)]
    let leaf7 = unsafe {
        if __cpuid(0).eax < 7 {
            return false;
        }
        __cpuid_count(7, 0)
    };
    leaf7.edx & (1 << 24) != 0 && leaf7.edx & (1 << 22) != 0
}

/// No AMX outside Linux on x86_64 (the permission is asked for through Linux's `arch_prctl`).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_in_cpu() -> bool {
    false
}

/// Whether Linux lets this process use the AMX tile data: asked once, on the first call
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, which a kernel without AMX support
/// refuses; the leave lasts for the process, every thread). Asked only when a caller wants
/// [`Bf16Level::Amx`], not by every program that probes the CPU: the leave raises the signal
/// stack every thread needs.
#[allow(unsafe_code)]
fn amx_permitted() -> bool {
    static PERMITTED: OnceLock<bool> = OnceLock::new();
    *PERMITTED.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            /// `arch_prctl`'s request for an extended state component (Linux 5.16).
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            /// The AMX tile data's state component.
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: `arch_prctl` with this request reads two integers and changes only the
            // process's permitted state components; no memory is passed.
            features().amx_bf16
                && unsafe {
                    libc::syscall(
                        libc::SYS_arch_prctl,
                        ARCH_REQ_XCOMP_PERM,
                        XFEATURE_XTILEDATA,
                    ) == 0
                }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// The probe's result and the best level of each ladder, computed once.
struct Probe {
    features: Features,
    float: FloatLevel,
    dot: DotLevel,
}

fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let features = Features::probe();
        Probe {
            features,
            float: FloatLevel::best(features),
            dot: DotLevel::best(features),
        }
    })
}

/// This CPU's features: probed on the first call (of this or of a level's `detect` or
/// `available`), the same value after.
pub fn features() -> Features {
    probe().features
}

/// The levels of the `f32` loops, each compiled from the same portable code with
/// `#[target_feature]` (the cached attention's block scores written with intrinsics that do
/// the portable loops' operations; the same operations in the same order on every level, so
/// the results do not depend on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatLevel {
    /// AVX-512F, with AVX2 and FMA (the loops on 512-bit registers).
    Avx512,
    /// AVX2 and FMA (every AVX2 CPU but a few early ones has FMA; the cached attention's
    /// copies are compiled with it, so that its fused multiply-adds are single instructions).
    Avx2,
    /// Plain Rust (any CPU).
    Portable,
}

impl FloatLevel {
    /// Every level, best first.
    pub const ALL: [Self; 3] = [Self::Avx512, Self::Avx2, Self::Portable];

    /// The best level this CPU has (probed once).
    pub fn detect() -> Self {
        probe().float
    }

    /// Whether this CPU has every feature the level's code is compiled for.
    pub fn available(self) -> bool {
        self.supported_by(features())
    }

    /// Whether a CPU with `features` has every feature of the level.
    pub fn supported_by(self, features: Features) -> bool {
        match self {
            Self::Avx512 => features.avx512f && features.avx2 && features.fma,
            Self::Avx2 => features.avx2 && features.fma,
            Self::Portable => true,
        }
    }

    /// Panics unless the level is [`available`](Self::available): the check each dispatch
    /// makes before it calls the level's `#[target_feature]` code.
    #[track_caller]
    pub fn assert_available(self) {
        assert!(self.available(), "{self:?} is not available on this CPU");
    }

    fn best(features: Features) -> Self {
        Self::ALL
            .into_iter()
            .find(|level| level.supported_by(features))
            .unwrap_or(Self::Portable)
    }
}

/// The levels of the quantised products (`quant::Path`), by the instruction that multiplies
/// `u8` by `i8` quants: each has AVX2, FMA and F16C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DotLevel {
    /// `vpdpbusd` on 256- and 512-bit registers (AVX-512 VNNI with VL and BW; every CPU with
    /// AVX-512 VNNI has both).
    Avx512Vnni,
    /// `vpdpbusd` on 256-bit registers (AVX-VNNI, VEX-encoded).
    AvxVnni,
    /// `u8`/`i8` widened to `i16` and `vpmaddwd` (AVX2 and FMA).
    Avx2,
    /// Plain Rust (any CPU).
    Portable,
}

impl DotLevel {
    /// Every level, best first.
    pub const ALL: [Self; 4] = [Self::Avx512Vnni, Self::AvxVnni, Self::Avx2, Self::Portable];

    /// The best level this CPU has (probed once).
    pub fn detect() -> Self {
        probe().dot
    }

    /// Whether this CPU has every feature the level's functions enable.
    pub fn available(self) -> bool {
        self.supported_by(features())
    }

    /// Whether a CPU with `features` has every feature of the level.
    pub fn supported_by(self, features: Features) -> bool {
        let Features {
            avx2,
            fma,
            f16c,
            avx512f,
            avx512vl,
            avx512bw,
            avx512vnni,
            avxvnni,
            ..
        } = features;
        let simd = avx2 && fma && f16c;
        match self {
            Self::Avx512Vnni => simd && avx512f && avx512vnni && avx512vl && avx512bw,
            Self::AvxVnni => simd && avxvnni,
            Self::Avx2 => simd,
            Self::Portable => true,
        }
    }

    /// Panics unless the level is [`available`](Self::available).
    #[track_caller]
    pub fn assert_available(self) {
        assert!(self.available(), "{self:?} is not available on this CPU");
    }

    fn best(features: Features) -> Self {
        Self::ALL
            .into_iter()
            .find(|level| level.supported_by(features))
            .unwrap_or(Self::Portable)
    }
}

/// The levels of the products with `bf16` factors and `f32` sums ([`bf16`](crate::bf16)), by
/// the instruction that multiplies: each gives every product exactly (a `bf16` has 8 bits of
/// mantissa, their product fits an `f32`) and sums in `f32`, in its own order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bf16Level {
    /// AMX: `tdpbf16ps` on tiles of 16 rows by 32 `bf16` (Intel Xeon since Sapphire Rapids).
    Amx,
    /// AVX-512 BF16: `vdpbf16ps` on 512-bit registers (AMD Zen 4 and later, Intel Cooper Lake
    /// and Sapphire Rapids and later).
    Avx512Bf16,
    /// Plain Rust (any CPU): the same products in `f32`, slower than the `f32` matrix product
    /// itself, so callers that may choose take `bf16` only on the levels above
    /// ([`has_bf16_products`]).
    Portable,
}

impl Bf16Level {
    /// Every level, best first.
    pub const ALL: [Self; 3] = [Self::Amx, Self::Avx512Bf16, Self::Portable];

    /// The best level this CPU has (probed once; for AMX, the OS's leave asked for then).
    pub fn detect() -> Self {
        static BEST: OnceLock<Bf16Level> = OnceLock::new();
        *BEST.get_or_init(|| {
            Self::ALL
                .into_iter()
                .find(|level| level.available())
                .unwrap_or(Self::Portable)
        })
    }

    /// Whether this CPU has every feature the level's code uses, and for [`Amx`](Self::Amx)
    /// the OS lets this process use the tiles (asked on the first call).
    pub fn available(self) -> bool {
        self.supported_by(features()) && (self != Self::Amx || amx_permitted())
    }

    /// Whether a CPU with `features` has every feature of the level (AMX's kernel converts its
    /// activations with AVX-512 BF16, which every AMX CPU has; the OS's leave aside).
    pub fn supported_by(self, features: Features) -> bool {
        match self {
            Self::Amx => features.amx_bf16 && features.avx512bf16,
            Self::Avx512Bf16 => features.avx512bf16,
            Self::Portable => true,
        }
    }

    /// Panics unless the level is [`available`](Self::available).
    #[track_caller]
    pub fn assert_available(self) {
        assert!(self.available(), "{self:?} is not available on this CPU");
    }

    /// The best level a CPU with `features` has, the OS's leave aside (the tests' model of
    /// [`detect`](Self::detect)).
    #[cfg(test)]
    fn best(features: Features) -> Self {
        Self::ALL
            .into_iter()
            .find(|level| level.supported_by(features))
            .unwrap_or(Self::Portable)
    }
}

/// Whether this CPU multiplies `bf16` in hardware ([`Bf16Level::Amx`] or
/// [`Bf16Level::Avx512Bf16`]): where it does not, a product in `bf16` is no faster than in
/// `f32`, and callers asked for `bf16` products keep `f32` ones.
pub fn has_bf16_products() -> bool {
    Bf16Level::detect() != Bf16Level::Portable
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe is cached and agrees with itself; the detected levels are available and the
    /// best available ones; no feature gives only `Portable`, every feature every level; the
    /// levels are cumulative (a level's features include every lower level's).
    #[test]
    fn levels_follow_the_probed_features() {
        assert_eq!(features(), features());
        assert!(FloatLevel::detect().available() && DotLevel::detect().available());
        assert_eq!(
            FloatLevel::detect(),
            FloatLevel::ALL.into_iter().find(|l| l.available()).unwrap()
        );
        assert_eq!(
            DotLevel::detect(),
            DotLevel::ALL.into_iter().find(|l| l.available()).unwrap()
        );
        let all = Features {
            avx2: true,
            fma: true,
            f16c: true,
            avx512f: true,
            avx512vl: true,
            avx512bw: true,
            avx512vnni: true,
            avxvnni: true,
            avx512bf16: true,
            amx_bf16: true,
        };
        assert_eq!(Bf16Level::best(Features::default()), Bf16Level::Portable);
        assert_eq!(Bf16Level::best(all), Bf16Level::Amx);
        assert_eq!(
            Bf16Level::best(Features {
                amx_bf16: false,
                ..all
            }),
            Bf16Level::Avx512Bf16
        );
        assert!(Bf16Level::detect().available());
        assert_eq!(
            Bf16Level::detect(),
            Bf16Level::ALL.into_iter().find(|l| l.available()).unwrap()
        );
        assert_eq!(FloatLevel::best(Features::default()), FloatLevel::Portable);
        assert_eq!(DotLevel::best(Features::default()), DotLevel::Portable);
        assert_eq!(FloatLevel::best(all), FloatLevel::Avx512);
        assert_eq!(DotLevel::best(all), DotLevel::Avx512Vnni);
        // The float levels' copies use fused multiply-adds: without FMA, the portable loops.
        let no_fma = Features { fma: false, ..all };
        assert_eq!(FloatLevel::best(no_fma), FloatLevel::Portable);
        // Alder Lake: AVX-VNNI without AVX-512.
        let alder = Features {
            avx512f: false,
            avx512vl: false,
            avx512bw: false,
            avx512vnni: false,
            avx512bf16: false,
            amx_bf16: false,
            ..all
        };
        assert_eq!(FloatLevel::best(alder), FloatLevel::Avx2);
        assert_eq!(DotLevel::best(alder), DotLevel::AvxVnni);
        // Skylake-X: AVX-512F without VNNI.
        let skylake = Features {
            avx512vnni: false,
            avxvnni: false,
            avx512bf16: false,
            amx_bf16: false,
            ..all
        };
        assert_eq!(FloatLevel::best(skylake), FloatLevel::Avx512);
        assert_eq!(DotLevel::best(skylake), DotLevel::Avx2);
        assert_eq!(Bf16Level::best(skylake), Bf16Level::Portable);
        for f in [all, alder, skylake, Features::default()] {
            for pair in Bf16Level::ALL.windows(2) {
                assert!(!pair[0].supported_by(f) || pair[1].supported_by(f));
            }
            for pair in FloatLevel::ALL.windows(2) {
                assert!(!pair[0].supported_by(f) || pair[1].supported_by(f));
            }
            for pair in DotLevel::ALL[1..].windows(2) {
                assert!(!pair[0].supported_by(f) || pair[1].supported_by(f));
            }
            assert!(!DotLevel::Avx512Vnni.supported_by(f) || DotLevel::Avx2.supported_by(f));
        }
    }
}
