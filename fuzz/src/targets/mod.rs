//! The fuzz targets, one file each; [`crate::TARGETS`] lists them with what each one feeds.

pub mod chat_template;
pub mod checkpoint;
pub mod gguf;
pub mod gguf_blocks;
pub mod gguf_tokenizer;
pub mod hf_config;
pub mod manifest;
pub mod metrics;
pub mod metrics_log;
pub mod model_config;
pub mod safetensors;
pub mod serve;
pub mod tokenizer_json;
pub mod tsv;

use std::path::PathBuf;
use std::sync::OnceLock;

/// A directory of this process's own for the targets that read files (one input at a time).
pub(crate) fn scratch_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("xfmr-fuzz-")
            .tempdir()
            .expect("a temporary directory")
            .keep();
        dir
    })
}
