//! `xfmr eval`: BLEU and chrF (as sacreBLEU computes them) of a trained run on a TSV file.

use std::path::PathBuf;

use anyhow::Result;
use xfmr::burn::tensor::backend::Backend;
use xfmr::io::write_atomic;
use xfmr::models::{Transformer, TransformerConfig};
use xfmr_train::Task;
use xfmr_translate::data::{self, Pair};
use xfmr_translate::translate::{score, score_by_source_length, translate_ids};

use crate::backend::{with_backend, BackendArg};
use crate::runs::{finite, length_penalty, load_run};
use crate::translation::{
    encode_limited, options, print_bleu, print_buckets, strategy, LENGTH_EDGES, TRANSLATION_BATCH,
};

/// Options of `xfmr eval`.
#[derive(clap::Args)]
pub struct Args {
    /// Run directory of `xfmr train`.
    #[arg(long, default_value = "runs/es-en")]
    run: PathBuf,
    /// `source<TAB>reference` file.
    tsv: PathBuf,
    /// Beam size (1: greedy).
    #[arg(long, default_value_t = 4)]
    beam: usize,
    /// Beam search's length penalty α (GNMT: log-probability / ((5 + length) / 6)^α).
    /// Default: the one `xfmr train` chose for the run on its validation split
    /// (`decoding.json`), else the paper's 0.6.
    #[arg(long, value_parser = finite)]
    length_penalty: Option<f64>,
    /// Only the first N pairs.
    #[arg(long)]
    limit: Option<usize>,
    /// Write the hypotheses here, one per line.
    #[arg(long)]
    hypotheses: Option<PathBuf>,
    /// Truncate a source longer than the model takes (its position table's rows, end token
    /// included) to its first tokens, instead of refusing it with its line; how many were
    /// truncated is said on stderr. Its reference is kept whole.
    #[arg(long)]
    truncate: bool,
    #[command(flatten)]
    backend: BackendArg,
}

/// Runs `xfmr eval`.
pub fn run(args: Args) -> Result<()> {
    with_backend!(
        args.backend.resolve(),
        "eval",
        wgpu = xfmr::backend::WgpuUnfused,
        |B| eval_on::<B>(&args)
    )
}

fn eval_on<B: Backend>(args: &Args) -> Result<()> {
    let (model, tokenizer): (Transformer<B>, _) =
        load_run::<B, TransformerConfig>(&args.run, Task::Translation, "eval")?;
    let (beam, tsv) = (args.beam, &args.tsv);
    let alpha = length_penalty(&args.run, args.length_penalty)?;
    let (lines, pairs): (Vec<usize>, Vec<Pair>) = data::read_tsv_numbered(tsv)?
        .into_iter()
        .take(args.limit.unwrap_or(usize::MAX))
        .unzip();
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    let refs: Vec<String> = pairs.iter().map(|p| p.tgt.clone()).collect();
    let place = |i: usize| format!("{}:{}", tsv.display(), lines[i]);
    let ids = encode_limited(&model, &tokenizer, &sources, args.truncate, place)?;
    let hyps: Vec<String> = translate_ids(
        &model,
        &tokenizer,
        &ids,
        &options(strategy(beam, 1, alpha), &tokenizer),
        TRANSLATION_BATCH,
    )?
    .into_iter()
    .map(|c| c.into_iter().next().map(|c| c.text).unwrap_or_default())
    .collect();
    let scores = score(&hyps, &refs)?;
    println!(
        "{}: {} sentences, {}: BLEU {:.2}  chrF {:.2}",
        tsv.display(),
        pairs.len(),
        match beam {
            0 | 1 => "greedy".to_string(),
            _ => format!("beam {beam}, length penalty {alpha}"),
        },
        scores.bleu.score,
        scores.chrf
    );
    print_bleu(&scores.bleu);
    print_buckets(&score_by_source_length(
        &sources,
        &hyps,
        &refs,
        &LENGTH_EDGES,
    )?);
    if let Some(path) = &args.hypotheses {
        write_atomic(path, (hyps.join("\n") + "\n").as_bytes())?;
    }
    Ok(())
}
