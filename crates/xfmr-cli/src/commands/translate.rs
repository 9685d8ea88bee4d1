//! `xfmr translate`: sentences (arguments, or stdin lines) through a trained run.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{Context, Result};
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{Transformer, TransformerConfig};
use xfmr_train::translate::translate;
use xfmr_train::Task;

use crate::backend::{with_backend, BackendArg};
use crate::runs::{finite, length_penalty, load_run};
use crate::translation::{options, strategy, TRANSLATION_BATCH};

/// Options of `xfmr translate`.
#[derive(clap::Args)]
pub struct Args {
    /// Run directory of `xfmr train`.
    #[arg(long, default_value = "runs/es-en")]
    run: PathBuf,
    /// Beam size (1: greedy).
    #[arg(long, default_value_t = 4)]
    beam: usize,
    /// Candidates printed per sentence, with their scores.
    #[arg(long, default_value_t = 1)]
    n_best: usize,
    /// Beam search's length penalty α (GNMT: log-probability / ((5 + length) / 6)^α).
    /// Default: the one `xfmr train` chose for the run on its validation split
    /// (`decoding.json`), else the paper's 0.6.
    #[arg(long, value_parser = finite)]
    length_penalty: Option<f64>,
    #[command(flatten)]
    backend: BackendArg,
    /// Sentences to translate (none: read stdin).
    sentences: Vec<String>,
}

/// Runs `xfmr translate`.
pub fn run(args: Args) -> Result<()> {
    with_backend!(
        args.backend.resolve(),
        "translate",
        wgpu = xfmr::backend::WgpuUnfused,
        |B| translate_on::<B>(&args)
    )
}

fn translate_on<B: Backend>(args: &Args) -> Result<()> {
    let (model, tokenizer): (Transformer<B>, _) =
        load_run::<B, TransformerConfig>(&args.run, Task::Translation, "translate")?;
    let alpha = length_penalty(&args.run, args.length_penalty)?;
    let lines: Vec<String> = if args.sentences.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("stdin")?
    } else {
        args.sentences.clone()
    };
    let sources: Vec<&str> = lines.iter().map(String::as_str).collect();
    let out = translate(
        &model,
        &tokenizer,
        &sources,
        &options(strategy(args.beam, args.n_best, alpha), &tokenizer),
        TRANSLATION_BATCH,
    )?;
    for candidates in out {
        if args.n_best <= 1 {
            println!(
                "{}",
                candidates.first().map(|c| c.text.as_str()).unwrap_or("")
            );
        } else {
            for c in candidates {
                println!("{:.3}\t{}", c.score, c.text);
            }
            println!();
        }
    }
    Ok(())
}
