//! `xfmr embed`: sentence embeddings, from all-MiniLM-L6-v2 or (`--run`) the encoder of an
//! `xfmr train --task mlm` run, through `xfmr-sentence`'s batching and pooling either way.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::{EncoderOnly, EncoderOnlyConfig, Pooling};
use xfmr_sentence::Embedder;
use xfmr_train::inference::encoder_ids;
use xfmr_train::Task;
use xfmr_translate::SubwordTokenizer;

use crate::backend::with_backend;
use crate::pretrained::{load_encoder, ModelArgs};
use crate::runs::load_run;

/// Options of `xfmr embed`.
#[derive(clap::Args)]
pub struct Args {
    /// Sentences (or use --file).
    sentences: Vec<String>,
    /// Read sentences from this file, one per line.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Write `[{"sentence": ..., "embedding": [...]}, ...]` to this file instead of stdout.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The run directory of `xfmr train --task mlm`, whose encoder embeds instead of
    /// MiniLM.
    #[arg(long, conflicts_with = "model_dir")]
    run: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
}

/// Runs `xfmr embed`.
pub fn run(mut args: Args) -> Result<()> {
    if let Some(file) = &args.file {
        let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
        args.sentences.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(String::from),
        );
    }
    if args.sentences.is_empty() {
        bail!("no sentences: pass them as arguments or with --file");
    }
    with_backend!(args.model.backend.resolve(), "embed", |B| embed::<B>(&args))
}

fn embed<B: Backend>(args: &Args) -> Result<()> {
    let sentences: Vec<&str> = args.sentences.iter().map(String::as_str).collect();
    // The load and the embedding call timed apart: the second is what the benchmarks compare
    // (benches/compare_embed.py times sentence-transformers' `encode` the same way).
    let start = Instant::now();
    let (embeddings, embedding_s) = match &args.run {
        Some(run) => {
            let (model, tokenizer): (EncoderOnly<B>, _) =
                load_run::<B, EncoderOnlyConfig>(run, Task::Mlm, "embed --run")?;
            eprintln!(
                "loaded {} in {:.2} s",
                run.display(),
                start.elapsed().as_secs_f64()
            );
            let start = Instant::now();
            let embeddings = embed_run(&model, &tokenizer, &sentences, &args.model)?;
            (embeddings, start.elapsed().as_secs_f64())
        }
        None => {
            let encoder = load_encoder::<B>(&args.model)?;
            eprintln!("loaded the model in {:.2} s", start.elapsed().as_secs_f64());
            let start = Instant::now();
            let embeddings = encoder.embed(&sentences)?;
            (embeddings, start.elapsed().as_secs_f64())
        }
    };
    eprintln!(
        "embedded {} sentences in {embedding_s:.2} s ({:.1} sentences/s)",
        sentences.len(),
        sentences.len() as f64 / embedding_s
    );
    match &args.json {
        Some(path) => {
            let rows: Vec<serde_json::Value> = sentences
                .iter()
                .zip(&embeddings)
                .map(|(s, e)| serde_json::json!({ "sentence": s, "embedding": e }))
                .collect();
            let text = serde_json::to_string(&rows)?;
            Ok(xfmr::io::write_atomic(path, text.as_bytes())?)
        }
        None => {
            for e in &embeddings {
                println!("{}", serde_json::to_string(e)?);
            }
            Ok(())
        }
    }
}

/// Sentence embeddings from an `mlm` run: its encoder over `[bos] + sentence + [eos]` (what it
/// read in training), mean-pooled over the real tokens and L2-normalised (as
/// sentence-transformers pools MiniLM), `--batch-size` sentences per pass, in `--precision`.
fn embed_run<B: Backend>(
    model: &EncoderOnly<B>,
    tokenizer: &SubwordTokenizer,
    sentences: &[&str],
    args: &ModelArgs,
) -> Result<Vec<Vec<f32>>> {
    let ids = sentences
        .iter()
        .map(|s| encoder_ids(tokenizer, s))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Embedder::new(model, &Default::default())
        .with_pooling(Pooling::Mean)
        .with_normalize(true)
        .with_batch_size(args.batch_size)
        .with_precision(args.precision_for::<B>())
        .embed_ids(&ids)?)
}
