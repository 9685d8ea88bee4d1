//! What `xfmr train` shows at the end of a run, from the run's final model: test BLEU/chrF,
//! sample translations and attention maps (translation, after choosing beam search's length
//! penalty), continued prompts (`lm`), filled-in masks (`mlm`).

use std::time::Instant;

use anyhow::Result;
use serde_json::{json, Value};
use xfmr::burn::tensor::backend::Backend;
use xfmr::io::write_atomic;
use xfmr::models::ladder::SourceBatches;
use xfmr::models::{
    BeamOptions, DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig, SampleOptions,
    Strategy, Transformer, TransformerConfig,
};
use xfmr_train::inference::{continue_text, fill_mask};
use xfmr_train::{RunDir, Task};
use xfmr_translate::tokenizer::MASK;
use xfmr_translate::translate::{
    choose_length_penalty, score, score_by_source_length, DecodingChoice, LENGTH_PENALTIES,
};
use xfmr_translate::{Pair, SubwordTokenizer};

use crate::runs::load_run;
use crate::translation::{
    attention_maps, print_buckets, translate_texts, LENGTH_EDGES, MAX_TRANSLATION_TOKENS,
};

/// Validation pairs the length penalty is chosen on, at most: the first this many (the
/// embedded set's whole split; four beam searches over them take ~25-40 s on two cores).
const LENGTH_PENALTY_PAIRS: usize = 500;

/// The end of a translation run with test sentences: chooses beam search's length penalty on
/// (the first 500 pairs of) `valid` unless `given`, and records it in the run
/// (`decoding.json`; a given one too); then greedy and beam BLEU/chrF on `test` and a few
/// translations, and the attention maps of a short test sentence. Every search reads its
/// sources in `batches` (on a length ladder on the GPU backends: [`xfmr::models::ladder`]). With no test sentences it
/// does none of this, and, like a run without validation pairs or with greedy search only,
/// keeps no `decoding.json` of an earlier model.
pub(super) fn translation<B: Backend>(
    run: &RunDir,
    tokenizer: &SubwordTokenizer,
    valid: &[Pair],
    test: &[Pair],
    beam: usize,
    given: Option<f64>,
    batches: SourceBatches,
) -> Result<()> {
    let paper = BeamOptions::default().length_penalty;
    let root = run.root();
    if test.is_empty() {
        DecodingChoice::forget(root)?;
        return Ok(());
    }
    let (model, _): (Transformer<B>, _) =
        load_run::<B, TransformerConfig>(root, Task::Translation, "translate")?;
    let alpha = match given {
        Some(alpha) => {
            DecodingChoice {
                beam_size: beam.max(1),
                length_penalty: alpha,
                sentences: 0,
                tried: Vec::new(),
            }
            .save(root)?;
            alpha
        }
        None if beam < 2 || valid.is_empty() => {
            DecodingChoice::forget(root)?;
            paper
        }
        None => {
            let t = Instant::now();
            let valid = &valid[..valid.len().min(LENGTH_PENALTY_PAIRS)];
            let choice = choose_length_penalty(
                &model,
                tokenizer,
                valid,
                beam,
                &LENGTH_PENALTIES,
                MAX_TRANSLATION_TOKENS,
                batches,
            )?;
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
            choice.save(root)?;
            choice.length_penalty
        }
    };
    evaluate(&model, tokenizer, test, beam, alpha, run, batches)?;
    if let Some(sample) = test.iter().find(|p| p.src.split_whitespace().count() <= 10) {
        let dir = run.attention_dir();
        let files = attention_maps(&model, tokenizer, &sample.src, &dir)?;
        eprintln!(
            "attention maps ({files} PNGs) of \"{}\": {}",
            sample.src,
            dir.display()
        );
    }
    Ok(())
}

/// Greedy and beam (length penalty `alpha`) BLEU/chrF on `test`, overall and by source length,
/// hypotheses and scores written into the run (`test.greedy.txt`, `test.beam.txt`,
/// `results.json`), a few samples printed; sources read in `batches`.
fn evaluate<B: Backend>(
    model: &Transformer<B>,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
    beam: usize,
    alpha: f64,
    run: &RunDir,
    batches: SourceBatches,
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
        let hyps = translate_texts(model, tokenizer, &sources, strategy, batches)?;
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
        let path = run.test_translations_path(name);
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
                   "bleu_detail": xfmr_translate::translate::sacrebleu_line(&scores.bleu),
                   "seconds": seconds, "by_source_length": by_length});
        if name == "beam" {
            entry["beam_size"] = json!(beam.max(1));
            entry["length_penalty"] = json!(alpha);
        }
        results.insert(name.into(), entry);
        outputs.push(hyps);
    }
    let json = serde_json::to_vec_pretty(&Value::Object(results))?;
    write_atomic(&run.results_path(), &json)?;
    for i in 0..test.len().min(5) {
        println!("\nsource:    {}", test[i].src);
        println!("reference: {}", test[i].tgt);
        println!("greedy:    {}", outputs[0][i]);
        println!("beam:      {}", outputs[1][i]);
    }
    Ok(())
}

/// The end of an `lm` run: the first three words of a few test sentences continued, greedily
/// and sampled.
pub(super) fn lm<B: Backend>(
    run: &RunDir,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
) -> Result<()> {
    let (model, _): (DecoderOnly<B>, _) =
        load_run::<B, DecoderOnlyConfig>(run.root(), Task::Lm, "train")?;
    let prompts: Vec<String> = test
        .iter()
        .take(5)
        .map(|p| {
            p.tgt
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let prompts: Vec<&str> = prompts.iter().map(String::as_str).collect();
    if prompts.is_empty() {
        return Ok(());
    }
    let sampled = Strategy::Sample(SampleOptions {
        temperature: 0.8,
        top_k: None,
        top_p: Some(0.9),
        seed: 7,
    });
    for (name, strategy) in [
        ("greedy", Strategy::Greedy),
        ("sampled (T 0.8, top-p 0.9)", sampled),
    ] {
        println!("\n{name}:");
        for (prompt, text) in prompts
            .iter()
            .zip(continue_text(&model, tokenizer, &prompts, strategy, 40)?)
        {
            println!("  {prompt} | {text}");
        }
    }
    Ok(())
}

/// The end of an `mlm` run: one word of a few test sentences masked (the longest: more often a
/// content word than a short one), and what the model puts there.
pub(super) fn mlm<B: Backend>(
    run: &RunDir,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
) -> Result<()> {
    let (model, _): (EncoderOnly<B>, _) =
        load_run::<B, EncoderOnlyConfig>(run.root(), Task::Mlm, "train")?;
    let device = Default::default();
    println!();
    for pair in test.iter().take(5) {
        let words: Vec<&str> = pair.tgt.split_whitespace().collect();
        let Some((at, _)) = words.iter().enumerate().max_by_key(|(_, w)| w.len()) else {
            continue;
        };
        let masked: Vec<&str> = words
            .iter()
            .enumerate()
            .map(|(i, w)| if i == at { MASK } else { w })
            .collect();
        let text = masked.join(" ");
        let fills = fill_mask(&model, tokenizer, &text, 5, &device)?;
        let shown: Vec<String> = fills[0]
            .iter()
            .map(|f| format!("{} {:.2}", f.piece, f.probability))
            .collect();
        println!(
            "{text}\n  original {:?}; model: {}",
            words[at],
            shown.join("  ")
        );
    }
    Ok(())
}
