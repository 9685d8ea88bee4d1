//! The backend every command runs on: one `--backend` option with one default, `auto`, resolved
//! by one function ([`BackendKind::resolve`]), and the macro that runs a command's body on the
//! chosen backend's type. Resolving first points cubecl's caches (autotune results, CUDA's
//! compiled kernels) at the user's cache directory ([`kernel_cache`]), before any GPU backend
//! is probed.

use std::sync::OnceLock;

use clap::ValueEnum;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use xfmr::burn::tensor::backend::Backend;
use xfmr_train::kernel_cache::{kernel_cache_dir, use_kernel_cache, KernelCache};

/// A burn backend compiled into this binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The fastest this machine has among those compiled in: CUDA when an NVIDIA device
    /// answers, else wgpu on a real GPU adapter (discrete, integrated or virtual; not a
    /// software Vulkan driver), else flex, else ndarray.
    Auto,
    /// burn-ndarray (CPU).
    Ndarray,
    /// burn-flex (CPU).
    Flex,
    /// burn-wgpu (GPU, or CPU through a software Vulkan driver).
    Wgpu,
    /// burn-cuda (NVIDIA GPUs; the `cuda` feature; needs the driver, NVRTC and the CUDA headers
    /// at run time, see the README).
    Cuda,
}

/// `--backend`, the same option with the same default for every command.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct BackendArg {
    /// Backend to run on. Default for every command: `auto`, the fastest compiled into this
    /// binary and present on this machine (CUDA when an NVIDIA device answers, else wgpu on a
    /// real GPU adapter, else flex, else ndarray).
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    pub backend: BackendKind,
}

impl BackendArg {
    /// The backend to run on, `auto` resolved on this machine.
    pub fn resolve(self) -> BackendKind {
        self.backend.resolve()
    }
}

impl BackendKind {
    /// The backend `self` names: `auto` resolved on this machine (see [`BackendKind::Auto`]).
    /// Sets cubecl's caches first ([`kernel_cache`]).
    pub fn resolve(self) -> Self {
        kernel_cache();
        if self != Self::Auto {
            return self;
        }
        #[cfg(feature = "cuda")]
        if quietly(|| <xfmr::burn::backend::Cuda as Backend>::device_count(0)).unwrap_or(0) > 0 {
            return Self::Cuda;
        }
        // wgpu's device kinds: 0 discrete, 1 integrated, 2 virtual GPUs (3 is a CPU adapter).
        #[cfg(feature = "wgpu")]
        if (0..3).any(|kind| {
            quietly(|| <xfmr::burn::backend::Wgpu as Backend>::device_count(kind)).unwrap_or(0) > 0
        }) {
            return Self::Wgpu;
        }
        if cfg!(feature = "flex") {
            Self::Flex
        } else {
            Self::Ndarray
        }
    }

    /// Whether the backend runs on the CPU (ndarray, flex): its one device can host a
    /// replica per core.
    pub fn is_cpu(self) -> bool {
        matches!(self, Self::Ndarray | Self::Flex)
    }

    /// The `--backend` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ndarray => "ndarray",
            Self::Flex => "flex",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }
}

/// cubecl's caches in `$XFMR_CACHE_DIR/cubecl` (else `$XDG_CACHE_HOME/xfmr/cubecl`, else
/// `~/.cache/xfmr/cubecl`) unless a `cubecl.toml` of the user's decides
/// ([`xfmr_train::kernel_cache`]); done once, on the first call, which must come before any
/// GPU backend runs: every command resolves its backend first.
pub fn kernel_cache() -> &'static KernelCache {
    static DONE: OnceLock<KernelCache> = OnceLock::new();
    DONE.get_or_init(|| use_kernel_cache(&kernel_cache_dir()))
}

/// `probe()`, or `None` when it panics (a missing driver library), without the panic message.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn quietly<T>(probe: impl FnOnce() -> T + std::panic::UnwindSafe) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(probe).ok();
    std::panic::set_hook(hook);
    result
}

/// Runs `$body` with `B` bound to the backend `$kind` names (resolved if `auto`), or says how
/// to compile it in. `wgpu` is burn's fused `Wgpu` by default; commands that decode through a
/// key/value cache pass `wgpu = xfmr::backend::WgpuUnfused` (fusion decodes wrongly there:
/// tracel-ai/burn#5257).
macro_rules! with_backend {
    ($kind:expr, $command:literal, |$b:ident| $body:expr) => {
        $crate::backend::with_backend!($kind, $command, wgpu = xfmr::burn::backend::Wgpu, |$b| {
            $body
        })
    };
    ($kind:expr, $command:literal, wgpu = $wgpu:ty, |$b:ident| $body:expr) => {
        match $crate::backend::BackendKind::resolve($kind) {
            #[cfg(feature = "ndarray")]
            $crate::backend::BackendKind::Ndarray => {
                type $b = xfmr::burn::backend::NdArray;
                $body
            }
            #[cfg(feature = "flex")]
            $crate::backend::BackendKind::Flex => {
                type $b = xfmr::burn::backend::Flex;
                $body
            }
            #[cfg(feature = "wgpu")]
            $crate::backend::BackendKind::Wgpu => {
                type $b = $wgpu;
                $body
            }
            #[cfg(feature = "cuda")]
            $crate::backend::BackendKind::Cuda => {
                type $b = xfmr::burn::backend::Cuda;
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err(anyhow::anyhow!(
                "the {name} backend is not compiled into this binary: rebuild with \
                 `cargo run --release -p xfmr-cli --features {name} -- {} --backend {name}`",
                $command,
                name = other.name()
            )),
        }
    };
}
pub(crate) use with_backend;
