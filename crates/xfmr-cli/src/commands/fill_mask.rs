//! `xfmr fill-mask`: the most probable tokens for each `<mask>` of a text, from an
//! `xfmr train --task mlm` run ([`xfmr_train::inference::fill_mask`]).

use std::path::PathBuf;

use anyhow::Result;
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{EncoderOnly, EncoderOnlyConfig};
use xfmr_train::inference::fill_mask;
use xfmr_train::Task;

use crate::backend::{with_backend, BackendArg};
use crate::runs::load_run;

/// Options of `xfmr fill-mask`.
#[derive(clap::Args)]
pub struct Args {
    /// Run directory of `xfmr train --task mlm`.
    #[arg(long, default_value = "runs/en-mlm")]
    run: PathBuf,
    /// Candidates shown per mask.
    #[arg(long, default_value_t = 5)]
    top: usize,
    #[command(flatten)]
    backend: BackendArg,
    /// Texts with `<mask>` where a token is to be filled in.
    #[arg(required = true)]
    texts: Vec<String>,
}

/// Runs `xfmr fill-mask`.
pub fn run(args: Args) -> Result<()> {
    with_backend!(args.backend.resolve(), "fill-mask", |B| fill::<B>(&args))
}

fn fill<B: Backend>(args: &Args) -> Result<()> {
    let (model, tokenizer): (EncoderOnly<B>, _) =
        load_run::<B, EncoderOnlyConfig>(&args.run, Task::Mlm, "fill-mask")?;
    let device = Default::default();
    for text in &args.texts {
        println!("{text}");
        let fills = fill_mask(&model, &tokenizer, text, args.top, &device)?;
        for (n, fillers) in fills.iter().enumerate() {
            let shown: Vec<String> = fillers
                .iter()
                .map(|f| format!("{} {:.3}", f.piece, f.probability))
                .collect();
            println!("  mask {}: {}", n + 1, shown.join("  "));
        }
    }
    Ok(())
}
