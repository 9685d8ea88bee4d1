//! The pretrained models the commands load (`embed`, `similarity`, `generate`, `serve`):
//! where each is found, and the sentence model's options.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use xfmr::attention::{takes_bf16_products, MatmulPrecision};
use xfmr::burn::tensor::backend::Backend;
use xfmr_llm::fetch as llm_fetch;
use xfmr_sentence::{fetch, SentenceEncoder};

use crate::backend::BackendArg;

/// Where the sentence model is and what runs it.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// Model directory (default: $XFMR_MINILM_DIR, else the cache `fetch-model` fills).
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    #[command(flatten)]
    pub backend: BackendArg,
    /// Sentences per forward pass.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// What the encoder's products may compute in: `f32`, or `bf16` (factors rounded to bf16,
    /// sums in f32: faster on the flex backend of a CPU with AMX or AVX-512 BF16, f32
    /// elsewhere).
    #[arg(long, default_value = "f32")]
    pub precision: MatmulPrecision,
}

impl ModelArgs {
    /// `--precision` for backend `B` ([`precision_for`]).
    pub(crate) fn precision_for<B: Backend>(&self) -> MatmulPrecision {
        precision_for::<B>(self.precision, "--precision")
    }
}

/// `precision` (the value of option `flag`) for backend `B`, with a note on stderr when `bf16`
/// was asked for where it changes nothing.
pub(crate) fn precision_for<B: Backend>(precision: MatmulPrecision, flag: &str) -> MatmulPrecision {
    if precision == MatmulPrecision::Bf16 && !takes_bf16_products::<B>() {
        eprintln!(
            "{flag} bf16: f32 products (bf16 ones need the flex backend and a CPU with AMX or \
             AVX-512 BF16)"
        );
    }
    precision
}

/// The sentence model of `args` (MiniLM from the cache unless `--model-dir`).
pub(crate) fn load_encoder<B: Backend>(args: &ModelArgs) -> Result<SentenceEncoder<B>> {
    let dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => fetch::find_minilm().ok_or_else(|| {
            anyhow!("no model found: run `xfmr fetch-model minilm` or pass --model-dir")
        })?,
    };
    let mut encoder = SentenceEncoder::<B>::from_dir(&dir, &Default::default())?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1, got 0");
    }
    encoder.batch_size = args.batch_size;
    encoder.precision = args.precision_for::<B>();
    Ok(encoder)
}

/// The GGUF file `--model` / `--llm` names: `smollm2` (the file `xfmr fetch-model smollm2` puts
/// in the cache) or a file's path.
pub(crate) fn gguf_path(model: &str) -> Result<PathBuf> {
    if model == "smollm2" {
        return llm_fetch::find_smollm2().ok_or_else(|| {
            anyhow!(
                "SmolLM2 is not in the cache: run `xfmr fetch-model smollm2` first (or pass \
                 --model FILE.gguf)"
            )
        });
    }
    let path = PathBuf::from(model);
    if path.is_file() {
        Ok(path)
    } else {
        Err(anyhow!(
            "--model {model:?}: neither `smollm2` nor an existing GGUF file"
        ))
    }
}
