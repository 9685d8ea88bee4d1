//! `xfmr attention`: PNG heatmaps of a sentence's encoder self-attention and cross-attention
//! over its translation.

use std::path::PathBuf;

use anyhow::Result;
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{Transformer, TransformerConfig};
use xfmr_train::Task;

use crate::backend::{with_backend, BackendArg};
use crate::runs::load_run;
use crate::translation::attention_maps;

/// Options of `xfmr attention`.
#[derive(clap::Args)]
pub struct Args {
    /// Run directory of `xfmr train`.
    #[arg(long, default_value = "runs/es-en")]
    run: PathBuf,
    /// Output directory.
    #[arg(long, default_value = "attention")]
    out: PathBuf,
    #[command(flatten)]
    backend: BackendArg,
    /// The source sentence.
    sentence: String,
}

/// Runs `xfmr attention`.
pub fn run(args: Args) -> Result<()> {
    with_backend!(
        args.backend.resolve(),
        "attention",
        wgpu = xfmr::backend::WgpuUnfused,
        |B| attention_on::<B>(&args)
    )
}

fn attention_on<B: Backend>(args: &Args) -> Result<()> {
    let (model, tokenizer): (Transformer<B>, _) =
        load_run::<B, TransformerConfig>(&args.run, Task::Translation, "attention")?;
    let files = attention_maps(&model, &tokenizer, &args.sentence, &args.out)?;
    println!("{files} attention maps written to {}", args.out.display());
    Ok(())
}
