//! A character-level GPT-like language model trained on 1,000 King James verses
//! (`benches/data/kjv_1000.txt`, public domain), then asked to continue a prompt with greedy
//! decoding, beam search and seeded sampling, all through the key/value cache; the model also
//! goes through a checkpoint and back.
//!
//! ```text
//! cargo run --release -p xfmr --features flex,autodiff --example char_lm [-- STEPS]
//! ```
//! About a minute for the default 300 steps on two cores with flex.

use std::collections::BTreeSet;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use xfmr::models::{
    checkpoint, cross_entropy, BeamOptions, DecoderOnly, DecoderOnlyConfig, GenerationOptions,
    SampleOptions, Strategy,
};

type Infer = Flex;
type Train = Autodiff<Infer>;

const TEXT: &str = include_str!("../benches/data/kjv_1000.txt");
const CONTEXT: usize = 64;
const BATCH: usize = 16;
/// Id 0 pads, id 1 ends a verse; characters start at 2.
const PAD: u32 = 0;
const EOS: u32 = 1;

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
            .filter_map(|c| chars.iter().position(|&x| x == c).map(|i| i as u32 + 2))
            .collect()
    };
    let decode = |ids: &[u32]| -> String {
        ids.iter()
            .filter(|&&i| i >= 2)
            .map(|&i| chars[i as usize - 2])
            .collect()
    };
    // One stream of verses, each ended by EOS.
    let stream: Vec<u32> = TEXT
        .lines()
        .flat_map(|l| encode(l).into_iter().chain([EOS]))
        .collect();

    let layer = DecoderOnlyConfig::gpt_layer(128, 4, 512).with_dropout(0.1);
    let config = DecoderOnlyConfig::new(chars.len() + 2, layer, 3).with_max_len(256);
    let device = Default::default();
    <Train as Backend>::seed(&device, 0);
    let mut model: DecoderOnly<Train> = config.init(&device)?;
    println!(
        "{} parameters, vocabulary {} characters, {} training tokens",
        burn::module::Module::num_params(&model),
        chars.len(),
        stream.len()
    );
    let mut optim = AdamConfig::new().init();
    let mut state = 12345u64;
    for step in 1..=steps {
        // Teacher forcing on random windows: predict token t+1 from tokens ≤ t.
        let mut rows = Vec::with_capacity(BATCH * (CONTEXT + 1));
        for _ in 0..BATCH {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let start = (state >> 33) as usize % (stream.len() - CONTEXT - 1);
            rows.extend(stream[start..=start + CONTEXT].iter().map(|&t| t as i64));
        }
        let batch: Tensor<Train, 2, Int> =
            Tensor::from_data(TensorData::new(rows, [BATCH, CONTEXT + 1]), &device);
        let logits = model.forward(batch.clone().narrow(1, 0, CONTEXT))?;
        let loss = cross_entropy(logits, batch.narrow(1, 1, CONTEXT), PAD as usize, 0.0);
        if step % 50 == 0 || step == 1 {
            println!("step {step:4}: loss {:.3}", loss.clone().into_scalar());
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }

    // Through a checkpoint and back, then generate without autodiff.
    let dir = std::env::temp_dir().join(format!("xfmr-char-lm-{}", std::process::id()));
    let trained: DecoderOnly<Infer> = model.valid();
    checkpoint::save(&trained, &config, &dir)?;
    let model: DecoderOnly<Infer> = checkpoint::load_expecting(&dir, &config, &device)?;
    std::fs::remove_dir_all(&dir)?;

    let prompts = ["And God said", "In the beginning", "And the LORD"];
    let prompt_ids: Vec<Vec<u32>> = prompts.iter().map(|p| encode(p)).collect();
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
