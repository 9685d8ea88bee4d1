//! cubecl's caches in a per-user directory: the autotune results of burn's GPU backends (wgpu,
//! CUDA) and CUDA's compiled kernels (PTX), kept in `<cache>/cubecl` ([`kernel_cache_dir`]:
//! `$XFMR_CACHE_DIR/cubecl`, else `$XDG_CACHE_HOME/xfmr/cubecl`, else `~/.cache/xfmr/cubecl`)
//! and reused by the next run, `xfmr serve` and any other command on the same machine.
//!
//! **Why.** cubecl's default puts its autotune cache in the `target/` directory of the nearest
//! `Cargo.toml` above the working directory (a repository's build directory, or, outside one,
//! the system's cache directory), and keeps no compiled kernels at all: every CUDA process
//! compiles every kernel again (195 s of a run's first step). Compiled WGSL is not cached by
//! cubecl on any platform: wgpu compiles its shaders again in each process, only its autotune
//! results are kept.
//!
//! **How.** cubecl reads its configuration once per process (the first time a runtime asks for
//! it, `CubeClRuntimeConfig::get`), from a `cubecl.toml` / `CubeCL.toml` (or the `[cubecl]`
//! section of a `burn.toml`) in the working directory or one above, else its defaults, then the
//! `CUBECL_*` environment variables; after that it cannot be changed. [`use_kernel_cache`] sets
//! it first: cubecl's defaults and environment overrides with both caches pointed at the
//! directory. It leaves the configuration alone where the user has a configuration file of
//! their own (that file decides, caches included) and where cubecl has already read it (a GPU
//! backend ran before the call): call it at the start of the program, before any backend is
//! probed. The CLI does so for every command.
//!
//! Layout (cubecl's): `<dir>/autotune/<cubecl version>/<device>/…` and, for CUDA,
//! `<dir>/cuda/<cubecl version>/ptx…`. Deleting the directory is safe: it is filled again.

use std::path::{Path, PathBuf};

use cubecl_runtime::config::cache::CacheConfig;
use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};

/// The cubecl cache directory's name inside [`xfmr_io::default_cache_dir`].
pub const KERNEL_CACHE_SUBDIR: &str = "cubecl";

/// `<per-user cache>/cubecl`: `$XFMR_CACHE_DIR/cubecl`, else `$XDG_CACHE_HOME/xfmr/cubecl`,
/// else `~/.cache/xfmr/cubecl` ([`xfmr_io::default_cache_dir`]).
pub fn kernel_cache_dir() -> PathBuf {
    xfmr_io::default_cache_dir().join(KERNEL_CACHE_SUBDIR)
}

/// What [`use_kernel_cache`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// cubecl's autotune results and CUDA's compiled kernels now live in this directory.
    Set(PathBuf),
    /// The user's cubecl configuration file (this one) decides where cubecl caches: left
    /// alone.
    UserConfig(PathBuf),
    /// cubecl's configuration was already read or set in this process: left as it is.
    AlreadySet,
}

/// Points cubecl's autotune cache and CUDA's kernel cache at `dir` (see the module docs),
/// unless a `cubecl.toml`, `CubeCL.toml` or a `burn.toml` with a `[cubecl]` section sits in the
/// working directory or above it, or cubecl's configuration is already fixed in this process.
/// The `CUBECL_*` environment variables (logging, autotune level) still apply. Nothing is
/// created until cubecl writes there.
pub fn use_kernel_cache(dir: &Path) -> KernelCache {
    if let Some(file) = user_config_file() {
        return KernelCache::UserConfig(file);
    }
    let mut config = CubeClRuntimeConfig::default().override_from_env();
    config.autotune.cache = CacheConfig::File(dir.to_owned());
    config.compilation.cache = Some(CacheConfig::File(dir.to_owned()));
    // Set under the lock cubecl reads it with: no window between the check and the set.
    let mut slot = CubeClRuntimeConfig::storage().lock();
    if slot.is_some() {
        return KernelCache::AlreadySet;
    }
    *slot = Some(std::sync::Arc::new(config));
    KernelCache::Set(dir.to_owned())
}

/// The configuration file cubecl would read, searched as cubecl searches: `cubecl.toml` or
/// `CubeCL.toml`, else a `burn.toml` / `Burn.toml` with a `[cubecl…]` table, in the working
/// directory, then in each directory above.
fn user_config_file() -> Option<PathBuf> {
    let mut dir = std::env::current_dir().ok()?;
    loop {
        for name in ["cubecl.toml", "CubeCL.toml"] {
            if dir.join(name).is_file() {
                return Some(dir.join(name));
            }
        }
        for name in ["burn.toml", "Burn.toml"] {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().any(|l| l.trim_start().starts_with("[cubecl")) {
                return Some(path);
            }
        }
        if !dir.pop() {
            return None;
        }
    }
}
