//! A character-level GPT-like language model trained on 1,000 King James verses
//! (`benches/data/kjv_1000.txt`, public domain) through the library's trainer (the causal
//! language-model objective, one verse per example), then asked to continue a prompt with greedy
//! decoding, beam search and seeded sampling, all through the key/value cache, from the final
//! model the run saved.
//!
//! ```text
//! cargo run --release -p xfmr --features flex,autodiff --example char_lm [-- STEPS]
//! ```
//! About a minute for the default 300 steps on two cores with flex.

use std::collections::BTreeSet;

use burn::backend::{Autodiff, Flex};
use xfmr::blocks::PositionEncoding;
use xfmr::models::{
    BeamOptions, DecoderOnly, DecoderOnlyConfig, GenerationOptions, SampleOptions, Strategy,
};
use xfmr::train::trainer::load_model;
use xfmr::train::{CausalLm, Event, Observer, TrainConfig, TrainError, Trainer};

type Infer = Flex;
type Train = Autodiff<Infer>;

const TEXT: &str = include_str!("../benches/data/kjv_1000.txt");
/// Id 0 pads, 1 starts a verse, 2 ends one; characters start at 3.
const PAD: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;
const FIRST_CHAR: u32 = 3;

/// Prints the training loss every 50 steps and each validation.
struct Report;

impl Observer for Report {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        match event {
            Event::Step { report, .. } if report.step % 50 == 0 || report.step == 1 => {
                println!("step {:4}: loss {:.3}", report.step, report.loss);
            }
            Event::Validation { step, loss, .. } => {
                println!(
                    "step {step:4}: validation perplexity {:.2}",
                    loss.perplexity()
                );
            }
            _ => {}
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args().nth(1).map_or(Ok(300), |s| s.parse())?;
    let chars: Vec<char> = TEXT
        .chars()
        .filter(|c| *c != '\n')
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let encode = |s: &str| -> Vec<u32> {
        s.chars()
            .filter_map(|c| chars.iter().position(|&x| x == c))
            .map(|i| i as u32 + FIRST_CHAR)
            .collect()
    };
    let decode = |ids: &[u32]| -> String {
        ids.iter()
            .filter(|&&i| i >= FIRST_CHAR)
            .map(|&i| chars[(i - FIRST_CHAR) as usize])
            .collect()
    };
    let verses: Vec<Vec<u32>> = TEXT.lines().map(encode).collect();
    let (valid, train) = verses.split_at(50);

    // Rotary positions: verses run to 330 characters, and a learned table's far rows would see
    // few updates in 300 steps.
    let layer = DecoderOnlyConfig::gpt_layer(128, 4, 512).with_dropout(0.1);
    let model = DecoderOnlyConfig::new(chars.len() + FIRST_CHAR as usize, layer, 3)
        .with_positions(PositionEncoding::rotary())
        .with_max_len(400) // the longest verse has 330 characters
        .with_pad_id(PAD);
    let objective = CausalLm::new(model, BOS, EOS);
    let config = TrainConfig::new()
        .with_steps(steps)
        .with_max_tokens(2048)
        .with_warmup(30)
        .with_lr_factor(0.3)
        .with_eval_every(100)
        .with_checkpoint_every(100)
        .with_keep_checkpoints(2)
        .with_average(2)
        .with_seed(0);
    println!(
        "vocabulary {} characters, {} training verses",
        chars.len(),
        train.len()
    );
    let dir = std::env::temp_dir().join(format!("xfmr-char-lm-{}", std::process::id()));
    let device = Default::default();
    let mut trainer = Trainer::<Train, _>::new(objective, config, train.to_vec(), &device)?;
    let summary = trainer.run(&dir, valid, &mut Report)?;
    // The final model (the average of the last two checkpoints), read back without autodiff.
    let final_model = summary.final_model.ok_or("no final model")?;
    let (_, model): (_, DecoderOnly<Infer>) =
        load_model::<Infer, DecoderOnlyConfig>(&final_model, &device)?;
    std::fs::remove_dir_all(&dir)?;

    let prompts = ["And God said", "In the beginning", "And the LORD"];
    let prompt_ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| [vec![BOS], encode(p)].concat())
        .collect();
    let base = GenerationOptions::greedy(80, EOS, PAD);
    let strategies = [
        ("greedy", Strategy::Greedy),
        ("beam 4", Strategy::Beam(BeamOptions::default())),
        (
            "sample (T 0.8, top-p 0.9, seed 7)",
            Strategy::Sample(SampleOptions {
                temperature: 0.8,
                top_k: None,
                top_p: Some(0.9),
                seed: 7,
            }),
        ),
    ];
    for (name, strategy) in strategies {
        let out = model.generate(&prompt_ids, &base.clone().with_strategy(strategy))?;
        println!("\n{name}:");
        for (prompt, tokens) in prompts.iter().zip(out.best_tokens()) {
            println!("  {prompt}|{}", decode(&tokens));
        }
    }
    Ok(())
}
