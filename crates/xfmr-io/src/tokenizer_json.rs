//! Hugging Face `tokenizer.json` files, read so that a malformed file is an error.
//!
//! The tokenizers library (0.22) panics on some malformed files instead of returning an error:
//! its decoder section is read through an `expect` ("Helper"), so a file cut or garbled inside
//! that section aborts the program (found by fuzzing, `fuzz/src/targets/tokenizer_json.rs`).
//! [`load`] checks the file is JSON first (the error names the line and column) and turns any
//! panic left in the library's reading into an error too.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use tokenizers::Tokenizer;

use crate::IoError;

/// Reads `path` as a `tokenizer.json`.
///
/// # Errors
/// An [`IoError`] naming the file: unreadable, not JSON (with the line and column), or not a
/// tokenizer (the library's error, or its panic's message).
pub fn load(path: &Path) -> Result<Tokenizer, IoError> {
    let text = std::fs::read_to_string(path).map_err(|e| IoError::new(path, e))?;
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| IoError::new(path, format!("not JSON: {e}")))?;
    match catch_unwind(AssertUnwindSafe(|| text.parse::<Tokenizer>())) {
        Ok(parsed) => parsed.map_err(|e| IoError::new(path, e)),
        Err(panic) => Err(IoError::new(
            path,
            format!("not a tokenizer ({})", crate::panic_message(&*panic)),
        )),
    }
}
