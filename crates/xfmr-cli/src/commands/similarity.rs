//! `xfmr similarity`: the cosine similarity of two sentences' embeddings (all-MiniLM-L6-v2).

use anyhow::Result;
use xfmr::burn::tensor::backend::Backend;
use xfmr_sentence::cosine;

use crate::backend::with_backend;
use crate::pretrained::{load_encoder, ModelArgs};

/// Options of `xfmr similarity`.
#[derive(clap::Args)]
pub struct Args {
    /// First sentence.
    a: String,
    /// Second sentence.
    b: String,
    #[command(flatten)]
    model: ModelArgs,
}

/// Runs `xfmr similarity`.
pub fn run(args: Args) -> Result<()> {
    with_backend!(args.model.backend.resolve(), "similarity", |B| {
        similarity::<B>(&args)
    })
}

fn similarity<B: Backend>(args: &Args) -> Result<()> {
    let encoder = load_encoder::<B>(&args.model)?;
    let e = encoder.embed(&[&args.a, &args.b])?;
    println!("{:.6}", cosine(&e[0], &e[1]));
    Ok(())
}
