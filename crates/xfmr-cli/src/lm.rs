//! The language models `xfmr train --task lm|mlm` leaves in a run directory, put to use:
//! `xfmr generate --run` continues text with the GPT-like model, `xfmr fill-mask --run` and
//! `xfmr embed --run` use the BERT-like one; and what `train` shows at the end of such a run.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xfmr::burn::tensor::activation::softmax;
use xfmr::burn::tensor::backend::Backend;
use xfmr::burn::tensor::{Int, Tensor, TensorData};
use xfmr::models::checkpoint::ModelConfig;
use xfmr::models::{
    l2_normalize, DecoderOnly, DecoderOnlyConfig, EncoderOnly, EncoderOnlyConfig,
    GenerationOptions, Pooling, SampleOptions, Strategy,
};
use xfmr_train::data::Pair;
use xfmr_train::trainer;
use xfmr_train::SubwordTokenizer;

use crate::spec::{read_task, Task};

/// The task a run directory was trained for (the `task` of its `train-config.json`); a run
/// with a model or checkpoints but no task (written before `--task` existed) is a translation
/// run.
pub(crate) fn run_task(run: &Path) -> Result<Task> {
    let path = run.join("train-config.json");
    if !path.exists() {
        if run.join("model").is_dir() || run.join("checkpoints").is_dir() {
            return Ok(Task::Translation);
        }
        bail!(
            "{}: not a run of `xfmr train` (no train-config.json, model/ or checkpoints/; train \
             one with `xfmr train --out {}`)",
            run.display(),
            run.display()
        );
    }
    Ok(read_task(&path)?.unwrap_or(Task::Translation))
}

/// The model of run `run`, which must be a `task` run: its averaged final model, else its last
/// checkpoint; and its vocabulary.
pub(crate) fn load_run<B: Backend, C: ModelConfig>(
    run: &Path,
    task: Task,
    command: &str,
) -> Result<(C::Model<B>, SubwordTokenizer)> {
    let found = run_task(run)?;
    if found != task {
        bail!(
            "{} is a `--task {}` run; `xfmr {command}` needs a `--task {}` run \
             (`xfmr train --task {}`)",
            run.display(),
            found.name(),
            task.name(),
            task.name()
        );
    }
    trainer::load_run_model::<B, C>(run, &Default::default()).with_context(|| {
        format!(
            "{}: (train one with `xfmr train --task {} --out {}`)",
            run.display(),
            task.name(),
            run.display()
        )
    })
}

/// `[bos] + text` ids.
fn prompt_ids(tokenizer: &SubwordTokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = vec![tokenizer.bos_id()];
    ids.extend(tokenizer.encode(text)?);
    Ok(ids)
}

/// `[bos] + text + [eos]` ids: what the `mlm` run's encoder read in training.
fn encoder_ids(tokenizer: &SubwordTokenizer, text: &str) -> Result<Vec<i64>> {
    let mut ids = vec![tokenizer.bos_id() as i64];
    ids.extend(tokenizer.encode(text)?.into_iter().map(|t| t as i64));
    ids.push(tokenizer.eos_id() as i64);
    Ok(ids)
}

/// Continues each prompt with `strategy`, at most `max_tokens` tokens; the continuations'
/// text.
pub(crate) fn continue_text<B: Backend>(
    model: &DecoderOnly<B>,
    tokenizer: &SubwordTokenizer,
    prompts: &[&str],
    strategy: Strategy,
    max_tokens: usize,
) -> Result<Vec<String>> {
    let ids = prompts
        .iter()
        .map(|p| prompt_ids(tokenizer, p))
        .collect::<Result<Vec<_>>>()?;
    let options = GenerationOptions::greedy(max_tokens, tokenizer.eos_id(), tokenizer.pad_id())
        .with_strategy(strategy);
    let out = model.generate(&ids, &options)?;
    out.best_tokens()
        .iter()
        .map(|t| Ok(tokenizer.decode(t)?))
        .collect()
}

/// `xfmr generate --run DIR`: the run's GPT-like model continues each prompt.
pub fn generate_cmd<B: Backend>(run: &Path, args: &crate::generate::GenerateArgs) -> Result<()> {
    let (model, tokenizer) = load_run::<B, DecoderOnlyConfig>(run, Task::Lm, "generate --run")?;
    let strategy = if args.temperature > 0.0 {
        Strategy::Sample(SampleOptions {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        })
    } else {
        Strategy::Greedy
    };
    let prompts: Vec<&str> = args.prompts.iter().map(String::as_str).collect();
    let texts = continue_text(&model, &tokenizer, &prompts, strategy, args.max_tokens)?;
    for (prompt, text) in prompts.iter().zip(texts) {
        println!(
            "{prompt}{}{text}",
            if text.starts_with(' ') { "" } else { " " }
        );
    }
    Ok(())
}

/// Prompts for the end of an `lm` run: the first three words of test sentences.
pub(crate) fn show_lm_run<B: Backend>(
    run: &Path,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
) -> Result<()> {
    let (model, _) = load_run::<B, DecoderOnlyConfig>(run, Task::Lm, "train")?;
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

/// The `k` most probable fillers of each `<mask>` in `text`, as (piece, probability).
pub(crate) fn fill_mask<B: Backend>(
    model: &EncoderOnly<B>,
    tokenizer: &SubwordTokenizer,
    text: &str,
    k: usize,
) -> Result<Vec<Vec<(String, f32)>>> {
    let mask = tokenizer
        .mask_id()
        .context("the run's vocabulary has no <mask> token")?;
    let ids = encoder_ids(tokenizer, text)?;
    let positions: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == mask as i64).collect();
    if positions.is_empty() {
        bail!("{text:?} has no {} to fill in", xfmr_train::tokenizer::MASK);
    }
    let device = Default::default();
    let n = ids.len();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, n]), &device);
    let logits = model.mlm_logits(model.forward(ids, None, None)?);
    let vocab = logits.dims()[2];
    let probs: Vec<f32> = softmax(logits.reshape([n, vocab]), 1)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(positions
        .iter()
        .map(|&i| {
            let row = &probs[i * vocab..(i + 1) * vocab];
            let mut ranked: Vec<(u32, f32)> = (0u32..).zip(row.iter().copied()).collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            ranked
                .into_iter()
                .take(k)
                .map(|(id, p)| (tokenizer.piece(id).unwrap_or_default(), p))
                .collect()
        })
        .collect())
}

/// `xfmr fill-mask --run DIR "text with <mask>"`.
pub fn fill_mask_cmd<B: Backend>(run: &Path, texts: &[String], k: usize) -> Result<()> {
    let (model, tokenizer) = load_run::<B, EncoderOnlyConfig>(run, Task::Mlm, "fill-mask")?;
    for text in texts {
        println!("{text}");
        for (n, fills) in fill_mask(&model, &tokenizer, text, k)?.iter().enumerate() {
            let shown: Vec<String> = fills.iter().map(|(p, q)| format!("{p} {q:.3}")).collect();
            println!("  mask {}: {}", n + 1, shown.join("  "));
        }
    }
    Ok(())
}

/// Masks one word of a few test sentences and shows what the `mlm` run puts there.
pub(crate) fn show_mlm_run<B: Backend>(
    run: &Path,
    tokenizer: &SubwordTokenizer,
    test: &[Pair],
) -> Result<()> {
    let (model, _) = load_run::<B, EncoderOnlyConfig>(run, Task::Mlm, "train")?;
    println!();
    for pair in test.iter().take(5) {
        let words: Vec<&str> = pair.tgt.split_whitespace().collect();
        // The longest word: more often a content word than a short one.
        let Some((at, _)) = words.iter().enumerate().max_by_key(|(_, w)| w.len()) else {
            continue;
        };
        let masked: Vec<&str> = words
            .iter()
            .enumerate()
            .map(|(i, w)| {
                if i == at {
                    xfmr_train::tokenizer::MASK
                } else {
                    w
                }
            })
            .collect();
        let text = masked.join(" ");
        let fills = fill_mask(&model, tokenizer, &text, 5)?;
        let shown: Vec<String> = fills[0]
            .iter()
            .map(|(p, q)| format!("{p} {q:.2}"))
            .collect();
        println!(
            "{text}\n  original {:?}; model: {}",
            words[at],
            shown.join("  ")
        );
    }
    Ok(())
}

/// Sentence embeddings from an `mlm` run: the mean of the encoder's token states over the real
/// tokens, L2-normalised (as sentence-transformers pools MiniLM).
pub fn embed_run<B: Backend>(run: &Path, sentences: &[&str]) -> Result<Vec<Vec<f32>>> {
    let (model, tokenizer) = load_run::<B, EncoderOnlyConfig>(run, Task::Mlm, "embed --run")?;
    let device = Default::default();
    let rows = sentences
        .iter()
        .map(|s| encoder_ids(&tokenizer, s))
        .collect::<Result<Vec<_>>>()?;
    let len = rows.iter().map(Vec::len).max().unwrap_or(1);
    let pad = tokenizer.pad_id() as i64;
    let flat: Vec<i64> = rows
        .iter()
        .flat_map(|r| {
            r.iter()
                .copied()
                .chain(std::iter::repeat_n(pad, len - r.len()))
        })
        .collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(flat, [rows.len(), len]), &device);
    let keep = ids.clone().not_equal_elem(pad).int();
    let mask = model.padding_mask(ids.clone());
    let hidden = model.forward(ids, None, Some(&mask))?;
    let pooled = l2_normalize(EncoderOnly::pool(hidden, keep, Pooling::Mean));
    let d = pooled.dims()[1];
    let values: Vec<f32> = pooled
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(values.chunks(d).map(<[f32]>::to_vec).collect())
}
