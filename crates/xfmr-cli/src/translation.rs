//! What the translation commands share (`translate`, `eval`, `attention`, and `train` at the
//! end of a translation run): the decoding options of the flags, the scores broken down by
//! source length, and the attention maps as pictures.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::ladder::SourceBatches;
use xfmr::models::{BeamOptions, GenerationOptions, Strategy, Transformer};
use xfmr_translate::translate::{
    encode_sources, sacrebleu_line, translate_best, translation_attention, LengthBucket, Overlong,
    SourceLimit,
};
use xfmr_translate::{BleuScore, SubwordTokenizer, TranslateError};

use crate::plot;

/// The source-length ranges (characters) the scores are broken down by: the embedded set's
/// Spanish verses run from 11 to 575 characters, 121 on average.
pub(crate) const LENGTH_EDGES: [usize; 4] = [50, 100, 150, 200];

/// The longest translation generated, in tokens.
pub(crate) const MAX_TRANSLATION_TOKENS: usize = 128;

/// Sentences translated per batch.
pub(crate) const TRANSLATION_BATCH: usize = 32;

/// One line per source-length range: sentences, BLEU, brevity penalty.
pub(crate) fn print_buckets(buckets: &[LengthBucket]) {
    for b in buckets {
        println!(
            "    source {:>3}–{:<3} chars: {:>4} sentences, BLEU {:5.2}, brevity penalty {:.3}",
            b.min_chars,
            b.max_chars.map_or(String::new(), |m| (m - 1).to_string()),
            b.sentences,
            b.scores.bleu.score,
            b.scores.bleu.bp
        );
    }
}

/// The BLEU line as sacreBLEU prints it, indented under the command's summary line.
pub(crate) fn print_bleu(bleu: &BleuScore) {
    println!("    {}", sacrebleu_line(bleu));
}

/// Encodes `sources` for `model` under its source limit ([`SourceLimit::of_model`]), truncating
/// longer ones when `truncate` (and saying on stderr how many), else refusing the first with an
/// error naming where it came from: `place(i)` names source `i` (`file:line`).
pub(crate) fn encode_limited<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sources: &[&str],
    truncate: bool,
    place: impl Fn(usize) -> String,
) -> Result<Vec<Vec<u32>>> {
    let overlong = match truncate {
        true => Overlong::Truncate,
        false => Overlong::Refuse,
    };
    let limit = SourceLimit::of_model(model).with_overlong(overlong);
    let encoded = match encode_sources(tokenizer, sources, limit) {
        Ok(encoded) => encoded,
        Err(e @ TranslateError::SourceTooLong { index, .. }) => bail!(
            "{}: {e}; `--truncate` keeps its first {} tokens instead",
            place(index),
            limit.max_tokens.saturating_sub(1)
        ),
        Err(e) => return Err(e.into()),
    };
    if let Some(&first) = encoded.truncated.first() {
        eprintln!(
            "truncated {} of {} sources to the model's {} tokens (end token included), the \
             first at {}",
            encoded.truncated.len(),
            sources.len(),
            limit.max_tokens,
            place(first)
        );
    }
    Ok(encoded.ids)
}

/// Greedy for `beam ≤ 1`, else beam search (length penalty `alpha`) returning `n_best`
/// hypotheses.
pub(crate) fn strategy(beam: usize, n_best: usize, alpha: f64) -> Strategy {
    if beam > 1 {
        Strategy::Beam(BeamOptions {
            beam_size: beam,
            length_penalty: alpha,
            n_best: n_best.clamp(1, beam),
        })
    } else {
        Strategy::Greedy
    }
}

/// Generation options of `strategy` with the vocabulary's end and padding ids.
pub(crate) fn options(strategy: Strategy, tokenizer: &SubwordTokenizer) -> GenerationOptions {
    GenerationOptions::greedy(
        MAX_TRANSLATION_TOKENS,
        tokenizer.eos_id(),
        tokenizer.pad_id(),
    )
    .with_strategy(strategy)
}

/// The best translation of each source, in source batches as `batches` says
/// (`TRANSLATION_BATCH.into()`: 32 sentences, each batch padded to its longest source).
pub(crate) fn translate_texts<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sources: &[&str],
    strategy: Strategy,
    batches: SourceBatches,
) -> Result<Vec<String>> {
    Ok(translate_best(
        model,
        tokenizer,
        sources,
        &options(strategy, tokenizer),
        batches,
    )?)
}

/// Translates `sentence` greedily, then draws every layer's and head's encoder self-attention
/// and decoder cross-attention over that translation into `out`. Returns the number of files
/// written.
pub(crate) fn attention_maps<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sentence: &str,
    out: &Path,
) -> Result<usize> {
    let maps = translation_attention(model, tokenizer, sentence, 64)?;
    fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let mut files = 0;
    for (kind, stem, layers, rows) in [
        (
            "encoder self-attention",
            "encoder",
            &maps.encoder,
            &maps.source,
        ),
        ("cross-attention", "cross", &maps.cross, &maps.target),
    ] {
        let (n_rows, n_cols) = (rows.len(), maps.source.len());
        for (l, values) in layers.iter().enumerate() {
            for h in 0..maps.heads {
                let grid: Vec<Vec<f32>> = (0..n_rows)
                    .map(|r| {
                        let at = (h * n_rows + r) * n_cols;
                        values[at..at + n_cols].to_vec()
                    })
                    .collect();
                let path = out.join(format!("{stem}-layer{}-head{}.png", l + 1, h + 1));
                let title = format!("{kind}, layer {}, head {}", l + 1, h + 1);
                plot::heatmap(&path, &title, rows, &maps.source, &grid)?;
                files += 1;
            }
        }
    }
    Ok(files)
}
