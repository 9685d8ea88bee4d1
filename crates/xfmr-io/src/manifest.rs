//! Directories published atomically, with a manifest of their files' sizes and hashes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{fnv1a, write_atomic, IoError};

/// File name of the manifest inside a published directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// What a manifest records of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    /// Its size in bytes.
    pub bytes: u64,
    /// Its [`fnv1a`] hash, 16 lower-case hex digits.
    pub fnv1a: String,
}

impl FileSum {
    /// The size and hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            bytes: bytes.len() as u64,
            fnv1a: format!("{:016x}", fnv1a(bytes)),
        }
    }
}

/// Writes directory `dir` atomically: `fill` writes files into an empty staging directory
/// `<dir>.partial` (a left-over one is removed first), a [`MANIFEST_FILE`] listing every file
/// `fill` wrote is added, and the staging directory is renamed to `dir`, replacing an older
/// published one. A reader sees the whole directory or none.
///
/// `fill` may write plain files only (no subdirectories). If `fill` fails, the staging
/// directory is removed and its error returned.
///
/// # Errors
/// `fill`'s error, or an [`IoError`] naming the file or directory that could not be written;
/// an existing `dir` that is neither empty nor a published directory (it has no manifest) is
/// refused, not replaced.
pub fn publish<E: From<IoError>>(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let name = dir
        .file_name()
        .ok_or_else(|| IoError::new(dir, "not a directory name"))?;
    let mut partial_name = OsString::from(name);
    partial_name.push(".partial");
    let partial = dir.with_file_name(partial_name);
    check_replaceable(dir)?;
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(|e| IoError::new(&partial, e))?;
    }
    fs::create_dir_all(&partial).map_err(|e| IoError::new(&partial, e))?;
    if let Err(e) = fill(&partial) {
        let _ = fs::remove_dir_all(&partial);
        return Err(e);
    }
    let mut names = Vec::new();
    for entry in fs::read_dir(&partial).map_err(|e| IoError::new(&partial, e))? {
        let entry = entry.map_err(|e| IoError::new(&partial, e))?;
        let path = entry.path();
        let file_name = entry.file_name();
        let file_name = file_name
            .to_str()
            .ok_or_else(|| IoError::new(&path, "file name is not UTF-8"))?;
        if !path.is_file() {
            return Err(IoError::new(&path, "only plain files can be published").into());
        }
        if file_name != MANIFEST_FILE {
            names.push(file_name.to_string());
        }
    }
    names.sort();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    write_manifest(&partial, &names)?;
    // Replacing: the old directory is moved aside before the new one is renamed in, and
    // removed only after, so a crash in between leaves a complete copy under one of the names.
    let mut old_name = OsString::from(name);
    old_name.push(format!(".old{}", std::process::id()));
    let old = dir.with_file_name(old_name);
    let replaced = dir.exists();
    if replaced {
        fs::rename(dir, &old).map_err(|e| IoError::new(dir, e))?;
    }
    fs::rename(&partial, dir).map_err(|e| IoError::new(dir, e))?;
    if replaced {
        fs::remove_dir_all(&old).map_err(|e| IoError::new(&old, e))?;
    }
    Ok(())
}

/// `dir` may be replaced: it does not exist, is empty, or is a published directory.
fn check_replaceable(dir: &Path) -> Result<(), IoError> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        return Err(IoError::new(dir, "exists and is not a directory"));
    }
    let empty = fs::read_dir(dir)
        .map_err(|e| IoError::new(dir, e))?
        .next()
        .is_none();
    // A model directory saved before checkpoints carried manifests holds exactly these two.
    let legacy = || -> Result<bool, IoError> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .map_err(|e| IoError::new(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        Ok(names == ["config.json", "model.mpk"])
    };
    if empty || dir.join(MANIFEST_FILE).is_file() || legacy()? {
        Ok(())
    } else {
        Err(IoError::new(
            dir,
            format!("exists, is not empty and has no {MANIFEST_FILE}: refusing to replace it"),
        ))
    }
}

/// Writes `<dir>/manifest.json` (atomically) with the size and hash of each of `names`, files
/// of `dir`.
///
/// # Errors
/// An [`IoError`] naming the file that could not be read or written.
pub fn write_manifest(dir: &Path, names: &[&str]) -> Result<(), IoError> {
    let mut files = BTreeMap::new();
    for &name in names {
        let path = dir.join(name);
        let bytes = fs::read(&path).map_err(|e| IoError::new(&path, e))?;
        files.insert(name.to_string(), FileSum::of(&bytes));
    }
    let path = dir.join(MANIFEST_FILE);
    let json = serde_json::to_vec_pretty(&files).map_err(|e| IoError::new(&path, e))?;
    write_atomic(&path, &json)
}

/// The manifest of directory `dir`: file name → size and hash.
///
/// # Errors
/// An [`IoError`] naming the manifest if it is missing or not a manifest (a listed name that is
/// not a plain file name included).
pub fn read_manifest(dir: &Path) -> Result<BTreeMap<String, FileSum>, IoError> {
    let path = dir.join(MANIFEST_FILE);
    let text = fs::read_to_string(&path).map_err(|e| IoError::new(&path, e))?;
    let files: BTreeMap<String, FileSum> =
        serde_json::from_str(&text).map_err(|e| IoError::new(&path, e))?;
    if let Some(name) = files.keys().find(|n| !is_plain_name(n)) {
        return Err(IoError::new(
            &path,
            format!("lists {name:?}, not a file name"),
        ));
    }
    Ok(files)
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\'])
}

/// Checks directory `dir` against its manifest: the manifest lists every one of `required`,
/// and every file it lists is present with the recorded size and hash.
///
/// # Errors
/// An [`IoError`] naming what is wrong: `dir` (not a directory), the manifest (missing,
/// unreadable, a required file not listed), or the first file that is missing, of another size
/// (truncated) or of another hash (corrupt).
pub fn verify_manifest(dir: &Path, required: &[&str]) -> Result<(), IoError> {
    if !dir.is_dir() {
        let mut expected = vec![MANIFEST_FILE];
        expected.extend(required);
        return Err(IoError::new(
            dir,
            format!(
                "no such directory (expected one holding {})",
                expected.join(", ")
            ),
        ));
    }
    let files = read_manifest(dir)?;
    if let Some(name) = required.iter().find(|n| !files.contains_key(**n)) {
        return Err(IoError::new(
            dir.join(MANIFEST_FILE),
            format!("does not list {name}"),
        ));
    }
    for (name, sum) in &files {
        let path: PathBuf = dir.join(name);
        let bytes = fs::read(&path).map_err(|e| IoError::new(&path, e))?;
        let found = FileSum::of(&bytes);
        if found.bytes != sum.bytes {
            return Err(IoError::new(
                &path,
                format!(
                    "{} bytes, the manifest says {} (truncated?)",
                    found.bytes, sum.bytes
                ),
            ));
        }
        if found.fnv1a != sum.fnv1a {
            return Err(IoError::new(
                &path,
                format!(
                    "checksum {}, the manifest says {} (corrupt)",
                    found.fnv1a, sum.fnv1a
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A published directory verifies; a truncated or missing file, or a required file the
    /// manifest does not list, is an error naming it; a failed fill leaves nothing behind.
    #[test]
    fn publish_verify_and_detect_damage() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ckpt");
        let fill = |s: &Path| -> Result<(), IoError> {
            write_atomic(&s.join("a.bin"), &[7; 100])?;
            write_atomic(&s.join("b.json"), b"{}")
        };
        publish(&dir, fill).unwrap();
        publish(&dir, fill).unwrap(); // replaces its own earlier version
        verify_manifest(&dir, &["a.bin", "b.json"]).unwrap();
        let mut names: Vec<_> = fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["ckpt"], "no staging directory left");

        let err = verify_manifest(&dir, &["c.bin"]).unwrap_err();
        assert!(err.path.ends_with(MANIFEST_FILE), "{err}");
        fs::write(dir.join("a.bin"), [7; 50]).unwrap();
        let err = verify_manifest(&dir, &[]).unwrap_err();
        assert!(
            err.path.ends_with("a.bin") && err.message.contains("truncated"),
            "{err}"
        );
        // A failing fill: no staging directory left, the old directory untouched.
        let failed = publish(&dir, |_| Err(IoError::new("x", "no")));
        assert_eq!(failed.unwrap_err().message, "no");
        assert!(!root.path().join("ckpt.partial").exists());
        assert_eq!(fs::read(dir.join("a.bin")).unwrap(), [7; 50]);

        fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
        let err = verify_manifest(&dir, &[]).unwrap_err();
        assert!(err.path.ends_with(MANIFEST_FILE), "{err}");
        // A directory that is not a published one is not replaced.
        let err = publish(&dir, fill).unwrap_err();
        assert!(err.message.contains("refusing"), "{err}");
    }
}
