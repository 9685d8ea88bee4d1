//! The paper's main job from the command line, after training (`train.rs`): `translate`,
//! `eval`, `attention`, and `prepare-data` (which rebuilds the embedded Spanish→English set).

use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use std::time::Instant;

use serde_json::{json, Value};
use xfmr::burn::tensor::backend::Backend;
use xfmr::io::write_atomic;
use xfmr::models::{BeamOptions, GenerationOptions, Strategy, Transformer, TransformerConfig};
use xfmr_train::data::{self, Pair};
use xfmr_train::translate::{
    choose_length_penalty, score, score_by_source_length, translate, translate_best,
    translation_attention, DecodingChoice, LengthBucket, LENGTH_PENALTIES,
};
use xfmr_train::SubwordTokenizer;

use crate::plot;

/// Where a run directory keeps its BPE vocabulary.
pub(crate) fn tokenizer_path(run: &Path) -> PathBuf {
    run.join("tokenizer.json")
}

/// The source-length ranges (characters) the test scores are broken down by: the embedded set's
/// Spanish verses run from 11 to 575 characters, 121 on average.
const LENGTH_EDGES: [usize; 4] = [50, 100, 150, 200];

/// Greedy and beam (length penalty `alpha`) BLEU/chrF on `test`, overall and by source length,
/// hypotheses written under `out`, a few samples printed.
pub(crate) fn evaluate_and_show<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
    beam: usize,
    alpha: f64,
    out: &Path,
) -> Result<()> {
    let sources: Vec<&str> = test.iter().map(|p| p.src.as_str()).collect();
    let refs: Vec<String> = test.iter().map(|p| p.tgt.clone()).collect();
    let mut results = serde_json::Map::new();
    let mut outputs = Vec::new();
    for (name, strategy) in [
        ("greedy", Strategy::Greedy),
        (
            "beam",
            Strategy::Beam(BeamOptions {
                beam_size: beam.max(1),
                length_penalty: alpha,
                ..BeamOptions::default()
            }),
        ),
    ] {
        let t = Instant::now();
        let hyps = translate_texts(model, tokenizer, &sources, strategy)?;
        let scores = score(&hyps, &refs)?;
        let seconds = t.elapsed().as_secs_f64();
        let label = match name {
            "beam" => format!("beam {}, length penalty {alpha}", beam.max(1)),
            _ => name.to_string(),
        };
        println!(
            "test ({} sentences, {label}): BLEU {:.2}  chrF {:.2}  ({:.1} s)",
            test.len(),
            scores.bleu.score,
            scores.chrf,
            seconds
        );
        let buckets = score_by_source_length(&sources, &hyps, &refs, &LENGTH_EDGES)?;
        print_buckets(&buckets);
        let path = out.join(format!("test.{name}.txt"));
        write_atomic(&path, (hyps.join("\n") + "\n").as_bytes())?;
        let by_length: Vec<Value> = buckets
            .iter()
            .map(|b| {
                json!({"min_chars": b.min_chars, "max_chars": b.max_chars,
                       "sentences": b.sentences, "bleu": b.scores.bleu.score,
                       "bp": b.scores.bleu.bp, "chrf": b.scores.chrf})
            })
            .collect();
        let mut entry = json!({"bleu": scores.bleu.score, "chrf": scores.chrf,
                   "sentences": test.len(), "bp": scores.bleu.bp,
                   "bleu_detail": format!("{:?}", scores.bleu),
                   "seconds": seconds, "by_source_length": by_length});
        if name == "beam" {
            entry["beam_size"] = json!(beam.max(1));
            entry["length_penalty"] = json!(alpha);
        }
        results.insert(name.into(), entry);
        outputs.push(hyps);
    }
    let json = serde_json::to_vec_pretty(&Value::Object(results))?;
    write_atomic(&out.join("results.json"), &json)?;
    for i in 0..test.len().min(5) {
        println!("\nsource:    {}", test[i].src);
        println!("reference: {}", test[i].tgt);
        println!("greedy:    {}", outputs[0][i]);
        println!("beam:      {}", outputs[1][i]);
    }
    Ok(())
}

/// One line per source-length range: sentences, BLEU, brevity penalty.
fn print_buckets(buckets: &[LengthBucket]) {
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

/// Greedy for `beam ≤ 1`, else beam search (length penalty `alpha`) returning `n_best`
/// hypotheses.
fn strategy(beam: usize, n_best: usize, alpha: f64) -> Strategy {
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

fn options(strategy: Strategy, tokenizer: &SubwordTokenizer, max_len: usize) -> GenerationOptions {
    GenerationOptions::greedy(max_len, tokenizer.eos_id(), tokenizer.pad_id())
        .with_strategy(strategy)
}

fn translate_texts<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    sources: &[&str],
    strategy: Strategy,
) -> Result<Vec<String>> {
    Ok(translate_best(
        model,
        tokenizer,
        sources,
        &options(strategy, tokenizer, 128),
        32,
    )?)
}

/// The translation model of a run directory and its vocabulary.
fn load_run<B: Backend>(run: &Path) -> Result<(Transformer<B>, SubwordTokenizer)> {
    crate::lm::load_run::<B, TransformerConfig>(run, crate::spec::Task::Translation, "translate")
}

/// The length penalty of a run's beam search: `given`, else the one chosen for the run at the
/// end of its training (`decoding.json`), else the paper's 0.6.
fn length_penalty(run: &Path, given: Option<f64>) -> Result<f64> {
    Ok(match given {
        Some(alpha) => alpha,
        None => DecodingChoice::length_penalty_of(run)?,
    })
}

/// Validation pairs the length penalty is chosen on, at most: the first this many (the
/// embedded set's whole split; four beam searches over them take ~25-40 s on two cores).
const LENGTH_PENALTY_PAIRS: usize = 500;

/// What `xfmr train` does at the end of a translation run with test sentences, from the run's
/// final model: chooses beam search's length penalty on (the first 500 pairs of) `valid`
/// unless `given`, and records it in the run (`decoding.json`; a given one too); then greedy
/// and beam BLEU/chrF on `test` and a few translations, and the attention maps of a short test
/// sentence. With no test sentences it does none of this, and, like a run without validation
/// pairs or with greedy search only, keeps no `decoding.json` of an earlier model.
pub(crate) fn show_run<B: Backend>(
    run: &Path,
    tokenizer: &SubwordTokenizer,
    valid: &[Pair],
    test: &[Pair],
    beam: usize,
    given: Option<f64>,
) -> Result<()> {
    let paper = BeamOptions::default().length_penalty;
    if test.is_empty() {
        DecodingChoice::forget(run)?;
        return Ok(());
    }
    let (model, _) = load_run::<B>(run)?;
    let alpha = match given {
        Some(alpha) => {
            DecodingChoice {
                beam_size: beam.max(1),
                length_penalty: alpha,
                sentences: 0,
                tried: Vec::new(),
            }
            .save(run)?;
            alpha
        }
        None if beam < 2 || valid.is_empty() => {
            DecodingChoice::forget(run)?;
            paper
        }
        None => {
            let t = Instant::now();
            let valid = &valid[..valid.len().min(LENGTH_PENALTY_PAIRS)];
            let choice =
                choose_length_penalty(&model, tokenizer, valid, beam, &LENGTH_PENALTIES, 128)?;
            let tried: Vec<String> = choice
                .tried
                .iter()
                .map(|(alpha, bleu)| format!("{alpha} → {bleu:.2}"))
                .collect();
            println!(
                "length penalty on the validation split ({} sentences, beam {beam}, BLEU): {}; \
                 chosen α = {} ({:.1} s)",
                choice.sentences,
                tried.join(", "),
                choice.length_penalty,
                t.elapsed().as_secs_f64()
            );
            choice.save(run)?;
            choice.length_penalty
        }
    };
    evaluate_and_show(&model, tokenizer, test, beam, alpha, run)?;
    if let Some(sample) = test.iter().find(|p| p.src.split_whitespace().count() <= 10) {
        let dir = run.join("attention");
        let files = attention_maps(&model, tokenizer, &sample.src, &dir)?;
        eprintln!(
            "attention maps ({files} PNGs) of \"{}\": {}",
            sample.src,
            dir.display()
        );
    }
    Ok(())
}

/// `xfmr translate`.
pub fn translate_cmd<B: Backend>(
    run: &Path,
    sentences: &[String],
    beam: usize,
    n_best: usize,
    alpha: Option<f64>,
) -> Result<()> {
    let (model, tokenizer) = load_run::<B>(run)?;
    let alpha = length_penalty(run, alpha)?;
    let lines: Vec<String> = if sentences.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("stdin")?
    } else {
        sentences.to_vec()
    };
    let sources: Vec<&str> = lines.iter().map(String::as_str).collect();
    let out = translate(
        &model,
        &tokenizer,
        &sources,
        &options(strategy(beam, n_best, alpha), &tokenizer, 128),
        32,
    )?;
    for candidates in out {
        if n_best <= 1 {
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

/// `xfmr eval`.
pub fn eval_cmd<B: Backend>(
    run: &Path,
    tsv: &Path,
    beam: usize,
    alpha: Option<f64>,
    limit: Option<usize>,
    hypotheses: Option<&Path>,
) -> Result<()> {
    let (model, tokenizer) = load_run::<B>(run)?;
    let alpha = length_penalty(run, alpha)?;
    let pairs = data::read_tsv(tsv)?;
    let pairs: Vec<Pair> = pairs
        .into_iter()
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let sources: Vec<&str> = pairs.iter().map(|p| p.src.as_str()).collect();
    let refs: Vec<String> = pairs.iter().map(|p| p.tgt.clone()).collect();
    let hyps = translate_texts(&model, &tokenizer, &sources, strategy(beam, 1, alpha))?;
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
    println!("{:?}", scores.bleu);
    print_buckets(&score_by_source_length(
        &sources,
        &hyps,
        &refs,
        &LENGTH_EDGES,
    )?);
    if let Some(path) = hypotheses {
        write_atomic(path, (hyps.join("\n") + "\n").as_bytes())?;
    }
    Ok(())
}

/// `xfmr attention`: translates `sentence` greedily, then draws every layer's and head's encoder
/// self-attention and decoder cross-attention over that translation into `out`. Returns the
/// number of files written.
pub fn attention_maps<B: Backend>(
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

/// `xfmr attention` from a run directory.
pub fn attention_cmd<B: Backend>(run: &Path, sentence: &str, out: &Path) -> Result<()> {
    let (model, tokenizer) = load_run::<B>(run)?;
    let files = attention_maps(&model, &tokenizer, sentence, out)?;
    println!("{files} attention maps written to {}", out.display());
    Ok(())
}

/// `xfmr prepare-data`: the embedded set from the full corpus — pairs whose both sides have at
/// most `max_chars` characters, split with near-duplicates kept on one side.
pub fn prepare_data(
    input: &Path,
    out: &Path,
    max_chars: usize,
    valid: usize,
    test: usize,
    seed: u64,
) -> Result<()> {
    let pairs = data::read_tsv(input)?;
    let total = pairs.len();
    let short: Vec<Pair> = pairs
        .into_iter()
        .filter(|p| p.src.chars().count() <= max_chars && p.tgt.chars().count() <= max_chars)
        .collect();
    let kept = short.len();
    let splits = data::split(short, valid, test, seed)?;
    fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    for (name, pairs) in [
        ("train.tsv", &splits.train),
        ("valid.tsv", &splits.valid),
        ("test.tsv", &splits.test),
    ] {
        data::write_tsv(&out.join(name), pairs)?;
    }
    println!(
        "{}: {total} pairs, {kept} with both sides ≤ {max_chars} characters → train {}, valid {}, \
         test {} in {}",
        input.display(),
        splits.train.len(),
        splits.valid.len(),
        splits.test.len(),
        out.display()
    );
    Ok(())
}
