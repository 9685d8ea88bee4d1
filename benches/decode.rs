//! Decode benchmark: autoregressive generation of 256 tokens at batch 1 with the paper's base
//! widths (d_model 512, 8 heads, d_ff 2048, 6 layers, post-norm, f32, inference), on the
//! ndarray and flex CPU backends.
//!
//! - `xfmr stack`: `xfmr_blocks::Decoder::step`, one new position per step through
//!   the key/value cache (self-attention keys/values appended, memory projected once).
//! - `burn-nn stack`: burn-nn 0.21's `TransformerDecoder::forward_autoregressive_inference`
//!   with its autoregressive cache, fed the whole target so far each step (its API). Same
//!   widths, same 16-position memory, same random inputs.
//! - `xfmr DecoderOnly`: the whole `DecoderOnlyConfig::base(32000)` language model through
//!   `generate` (embedding, positions, stack, tied 32k-vocabulary logits, host-side greedy
//!   choice), forced to 256 tokens with `min_len`.
//!
//! Each step ends by reading its output back to the host, as a generation loop must. The runner
//! records every step's wall time: tokens/s = 256 / total (median of 3 runs after a warm-up),
//! and the per-token time around step 32 and step 256 (median of the 8 steps ending there,
//! over the 3 runs) shows how a step's cost grows with the prefix.
//!
//! ```text
//! cargo bench -p xfmr --features flex --bench decode
//! ```
//! Figures go to docs/benchmarks.md. A custom runner rather than criterion: criterion times
//! whole closures, while the point here is the per-step profile inside one generation.

use std::time::{Duration, Instant};

use burn::backend::{Flex, NdArray};
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::transformer::{TransformerDecoderConfig, TransformerDecoderInput};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use xfmr::blocks::{DecoderStepInput, LayerConfig, StackConfig};
use xfmr::models::{DecoderOnlyConfig, GenerationOptions};

const STEPS: usize = 256;
const D_MODEL: usize = 512;
const HEADS: usize = 8;
const D_FF: usize = 2048;
const LAYERS: usize = 6;
const MEMORY: usize = 16;
const RUNS: usize = 3;

/// Per-step durations of one generation, or only its total (`generate` times no steps).
enum Profile {
    Steps(Vec<Duration>),
    Total(Duration),
}

impl Profile {
    fn total(&self) -> f64 {
        match self {
            Profile::Steps(steps) => steps.iter().map(Duration::as_secs_f64).sum(),
            Profile::Total(total) => total.as_secs_f64(),
        }
    }

    /// Number of timed steps (0 for a total).
    fn len(&self) -> usize {
        match self {
            Profile::Steps(steps) => steps.len(),
            Profile::Total(_) => 0,
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn report(backend: &str, name: &str, runs: &[Profile]) -> f64 {
    let tokens_per_s = STEPS as f64 / median(runs.iter().map(Profile::total).collect());
    let steps: Vec<&Vec<Duration>> = runs
        .iter()
        .filter_map(|r| match r {
            Profile::Steps(steps) => Some(steps),
            Profile::Total(_) => None,
        })
        .collect();
    if steps.is_empty() {
        println!("{backend:8} {name:18} {tokens_per_s:9.1} tok/s   (whole `generate` call)");
        return tokens_per_s;
    }
    let around = |end: usize| {
        median(
            steps
                .iter()
                .flat_map(|r| r[end - 8..end].iter().map(|d| d.as_secs_f64() * 1e3))
                .collect(),
        )
    };
    let (t32, t256) = (around(32), around(STEPS));
    println!(
        "{backend:8} {name:18} {tokens_per_s:9.1} tok/s   step 32: {t32:7.2} ms   step 256: {t256:7.2} ms   ratio {:.2}",
        t256 / t32
    );
    tokens_per_s
}

fn xfmr_stack<B: Backend>(device: &B::Device, steps: usize) -> Profile {
    let layer = LayerConfig::new(D_MODEL, HEADS, D_FF).with_dropout(0.0);
    let decoder = StackConfig::new(layer, LAYERS)
        .init_decoder::<B>(device)
        .unwrap();
    let memory = Tensor::<B, 3>::random([1, MEMORY, D_MODEL], Distribution::Default, device);
    let inputs = Tensor::<B, 3>::random([1, steps, D_MODEL], Distribution::Default, device);
    // The memory is projected once here, as `Transformer::generate` does before its first step.
    let mut cache = decoder.start(&memory, None);
    Profile::Steps(
        (0..steps)
            .map(|t| {
                let start = Instant::now();
                let out = decoder.step(
                    DecoderStepInput::new(inputs.clone().narrow(1, t, 1)),
                    &mut cache,
                );
                let _ = out.hidden.into_data();
                start.elapsed()
            })
            .collect(),
    )
}

fn burn_nn_stack<B: Backend>(device: &B::Device, steps: usize) -> Profile {
    let decoder = TransformerDecoderConfig::new(D_MODEL, D_FF, HEADS, LAYERS)
        .with_dropout(0.0)
        .init::<B>(device);
    let memory = Tensor::<B, 3>::random([1, MEMORY, D_MODEL], Distribution::Default, device);
    let inputs = Tensor::<B, 3>::random([1, steps, D_MODEL], Distribution::Default, device);
    let mut cache = decoder.new_autoregressive_cache();
    Profile::Steps(
        (0..steps)
            .map(|t| {
                let start = Instant::now();
                let target = inputs.clone().narrow(1, 0, t + 1);
                let mask = generate_autoregressive_mask::<B>(1, t + 1, device);
                let input =
                    TransformerDecoderInput::new(target, memory.clone()).target_mask_attn(mask);
                let out = decoder.forward_autoregressive_inference(input, &mut cache);
                let _ = out.narrow(1, t, 1).into_data();
                start.elapsed()
            })
            .collect(),
    )
}

fn xfmr_lm<B: Backend>(device: &B::Device, steps: usize) -> Profile {
    let model = DecoderOnlyConfig::base(32_000)
        .map_layer(|l| l.with_dropout(0.0))
        .init::<B>(device)
        .unwrap();
    // `generate` reports no per-step times: time the whole call (tokens/s only).
    let options = GenerationOptions::greedy(steps, 2, 0).with_min_len(steps);
    let start = Instant::now();
    let out = model.generate(&[vec![5]], &options).unwrap();
    assert_eq!(out.hypotheses[0][0].tokens.len(), steps);
    Profile::Total(start.elapsed())
}

fn bench<B: Backend>(backend: &str) {
    let device = B::Device::default();
    let measure = |name: &str, f: fn(&B::Device, usize) -> Profile| {
        let _ = f(&device, 16); // warm-up
        let runs: Vec<Profile> = (0..RUNS).map(|_| f(&device, STEPS)).collect();
        report(backend, name, &runs)
    };
    let ours = measure("xfmr stack", xfmr_stack::<B>);
    let theirs = measure("burn-nn stack", burn_nn_stack::<B>);
    println!("{backend:8} xfmr / burn-nn tokens/s: {:.2}x", ours / theirs);
    measure("xfmr DecoderOnly", xfmr_lm::<B>);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too: keep it a smoke run.
    if std::env::args().any(|a| a == "--bench") {
        bench::<NdArray>("ndarray");
        bench::<Flex>("flex");
    } else {
        let device = Default::default();
        assert_eq!(xfmr_stack::<NdArray>(&device, 2).len(), 2);
        assert_eq!(burn_nn_stack::<NdArray>(&device, 2).len(), 2);
    }
}
