//! `xfmr translate`: sentences (arguments, `--input` lines, or stdin lines) through a trained
//! run.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{Context, Result};
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{Transformer, TransformerConfig};
use xfmr_train::Task;
use xfmr_translate::data::UTF8_BOM;
use xfmr_translate::translate::translate_ids;

use crate::backend::{with_backend, BackendArg};
use crate::runs::{finite, length_penalty, load_run};
use crate::translation::{encode_limited, options, strategy, TRANSLATION_BATCH};

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
    /// Read the sentences from this file, one per line (instead of stdin).
    #[arg(long, short = 'i', conflicts_with = "sentences")]
    input: Option<PathBuf>,
    /// Truncate a sentence longer than the model takes (its position table's rows, end token
    /// included) to its first tokens, instead of refusing it with its line; how many were
    /// truncated is said on stderr.
    #[arg(long)]
    truncate: bool,
    #[command(flatten)]
    backend: BackendArg,
    /// Sentences to translate (none: read `--input`, else stdin).
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

/// Lines of `reader` (`name` names it in errors), a byte-order mark at the start skipped.
fn read_lines(reader: impl BufRead, name: &str) -> Result<Vec<String>> {
    let mut lines = reader
        .lines()
        .enumerate()
        .map(|(i, line)| line.with_context(|| format!("{name}:{}", i + 1)))
        .collect::<Result<Vec<String>>>()?;
    if let Some(first) = lines.first_mut() {
        let bom = std::str::from_utf8(UTF8_BOM).expect("the BOM is UTF-8");
        if let Some(rest) = first.strip_prefix(bom) {
            *first = rest.to_owned();
        }
    }
    Ok(lines)
}

fn translate_on<B: Backend>(args: &Args) -> Result<()> {
    let (model, tokenizer): (Transformer<B>, _) =
        load_run::<B, TransformerConfig>(&args.run, Task::Translation, "translate")?;
    let alpha = length_penalty(&args.run, args.length_penalty)?;
    let (lines, origin): (Vec<String>, Option<String>) = match (&args.input, &args.sentences) {
        (Some(path), _) => {
            let name = path.display().to_string();
            let file = std::fs::File::open(path).with_context(|| name.clone())?;
            (
                read_lines(std::io::BufReader::new(file), &name)?,
                Some(name),
            )
        }
        (None, sentences) if sentences.is_empty() => (
            read_lines(std::io::stdin().lock(), "<stdin>")?,
            Some("<stdin>".to_owned()),
        ),
        (None, sentences) => (sentences.clone(), None),
    };
    let sources: Vec<&str> = lines.iter().map(String::as_str).collect();
    let place = |i: usize| match &origin {
        Some(name) => format!("{name}:{}", i + 1),
        None => format!("sentence {}", i + 1),
    };
    let ids = encode_limited(&model, &tokenizer, &sources, args.truncate, place)?;
    let out = translate_ids(
        &model,
        &tokenizer,
        &ids,
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
