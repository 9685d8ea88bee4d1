//! Criterion benches of issue 13's workloads W2–W6 (W1, the attention layer alone, is
//! `benches/attention.rs`), on the ndarray and flex CPU backends, f32:
//!
//! - `w2_encoder`: the encoder stack at the paper's `base` widths (d_model 512, 8 heads, d_ff
//!   2048, 6 post-norm layers, no dropout), batch 8 × 128 tokens, inference.
//! - `w3_train_step`: one optimiser step (forward, backward, Adam) of the `xfmr train` CPU preset
//!   (d_model 128, 4 heads, d_ff 512, 3 + 3 layers, label smoothing 0.1; dropout 0.1, as
//!   `compare_pytorch.py`'s W3 passes it, the preset's own default being 0 since 2026-11-27) on the
//!   embedded Spanish–English pairs: a 4,000-token BPE vocabulary learnt from them, batches of at
//!   most 2,000 padded tokens in the trainer's shuffled order. Each iteration is the next batch,
//!   so the time is the mean over batches of varying shape, as in training.
//! - `w4_greedy`: batch-1 greedy decoding of exactly 128 tokens with the `base` encoder-decoder
//!   (37,000-token vocabulary, random weights) from a 24-token source, key/value cache.
//! - `w5_minilm`: all-MiniLM-L6-v2 embeddings of the 1,000 King James verses of
//!   `benches/data/kjv_1000.txt`, batch 32 (needs the model: `xfmr fetch-model minilm`).
//! - `w6_smollm2`: SmolLM2-135M-Instruct, 32 greedy tokens after a 15-word prompt (Genesis
//!   1:1–2), batch 1, flex only (needs the model: `xfmr fetch-model smollm2`).
//!
//! Without a model, its bench is skipped with a message naming the fetch command. Select one
//! with criterion's filter, and match PyTorch's thread count as `benches/compare_pytorch.py`
//! does:
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo bench -p xfmr-cli --bench workloads -- w3_train_step
//! ```
//! `benches/compare_pytorch.py` runs the same workloads beside PyTorch in one run and prints the
//! ratios; figures go to docs/benchmarks.md.

use std::path::Path;
use std::time::Duration;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::tensor::backend::{AutodiffBackend, Backend};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use xfmr::blocks::{LayerConfig, SelfAttentionInput};
use xfmr::burn;
use xfmr::models::TransformerConfig;
use xfmr_train::{encode_pairs, TrainConfig, Trainer, Translation};
use xfmr_translate::{data, SubwordTokenizer};

/// The same allocator as the `xfmr` program, whose runs these benches stand for, with the same
/// options (`keep_memory`, called first in `workloads`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// W2's and W4's models and inputs, shared with `examples/workloads.rs`.
use xfmr_testing::workloads::{w2_encoder, w4_model, W2_SHAPE, W4_NEW_TOKENS};

// The program's own allocator options (`xfmr_cli::alloc`).
use xfmr_cli::alloc;

fn w2<B: Backend>(c: &mut Criterion, backend: &str) {
    let (encoder, x) = w2_encoder::<B>(&B::Device::default());
    let mut group = c.benchmark_group("w2_encoder_base_8x128");
    group.sample_size(10);
    group.throughput(Throughput::Elements((W2_SHAPE[0] * W2_SHAPE[1]) as u64));
    group.bench_function(BenchmarkId::from_parameter(backend), |b| {
        b.iter(|| {
            encoder
                .forward(SelfAttentionInput::new(x.clone()))
                .into_data()
        })
    });
    group.finish();
}

/// The embedded training pairs of `xfmr train`, tokenized with a BPE vocabulary learnt from them.
fn w3_examples() -> Vec<xfmr_train::Example> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/es-en/train.tsv");
    let pairs = data::read_tsv(&path).expect("the embedded training pairs");
    let sentences = pairs.iter().flat_map(|p| [p.src.as_str(), p.tgt.as_str()]);
    let tokenizer = SubwordTokenizer::train(sentences, 4000).expect("a BPE vocabulary");
    encode_pairs(&tokenizer, &pairs)
        .expect("the pairs encode")
        .into_iter()
        // `xfmr train --max-len` (100).
        .filter(|e| e.src.len() <= 100 && e.tgt.len() <= 100)
        .collect()
}

fn w3<B: AutodiffBackend>(c: &mut Criterion, backend: &str, examples: &[xfmr_train::Example]) {
    let device = B::Device::default();
    let vocab = 4000;
    // `xfmr train`'s CPU preset and defaults (`xfmr_train::spec::Preset`), with
    // `LayerConfig`'s dropout 0.1 as W3 keeps it.
    let model = TransformerConfig::new(vocab, vocab, LayerConfig::new(128, 4, 512), 3, 3);
    let config = TrainConfig::new()
        .with_steps(1_000_000)
        .with_max_tokens(2000)
        .with_warmup(150);
    let mut trainer = Trainer::<B>::new(
        Translation::new(model, 1, 2),
        config,
        examples.to_vec(),
        &device,
    )
    .expect("a valid configuration");
    let mut group = c.benchmark_group("w3_train_step_cpu_preset");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function(BenchmarkId::from_parameter(backend), |b| {
        b.iter(|| trainer.step().expect("a training step").loss)
    });
    group.finish();
}

fn w4<B: Backend>(c: &mut Criterion, backend: &str) {
    let (model, source, options) = w4_model::<B>(&B::Device::default());
    let mut group = c.benchmark_group("w4_greedy_base_128_tokens");
    group.sample_size(10);
    group.throughput(Throughput::Elements(W4_NEW_TOKENS as u64));
    group.bench_function(BenchmarkId::from_parameter(backend), |b| {
        b.iter(|| {
            let out = model
                .generate(std::slice::from_ref(&source), 1, &options)
                .expect("generation runs");
            assert_eq!(out.best_tokens()[0].len(), W4_NEW_TOKENS);
        })
    });
    group.finish();
}

fn w5<B: Backend>(c: &mut Criterion, backend: &str) {
    let Some(dir) = xfmr_sentence::fetch::find_minilm() else {
        eprintln!(
            "SKIPPED w5_minilm ({backend}): all-MiniLM-L6-v2 not found; run \
             `cargo run -p xfmr-cli -- fetch-model minilm` (or set XFMR_MINILM_DIR)"
        );
        return;
    };
    let encoder = xfmr_sentence::SentenceEncoder::<B>::from_dir(&dir, &B::Device::default())
        .expect("the model loads");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/data/kjv_1000.txt"),
    )
    .expect("benches/data/kjv_1000.txt");
    let sentences: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut group = c.benchmark_group("w5_minilm_1000_sentences");
    group.sample_size(10);
    group.throughput(Throughput::Elements(sentences.len() as u64));
    group.bench_function(BenchmarkId::from_parameter(backend), |b| {
        b.iter(|| encoder.embed(&sentences).expect("embeddings"))
    });
    group.finish();
}

fn w6(c: &mut Criterion) {
    const NEW_TOKENS: usize = 32;
    let Some(path) = xfmr_llm::fetch::find_smollm2() else {
        eprintln!(
            "SKIPPED w6_smollm2: SmolLM2-135M-Instruct not found; run \
             `cargo run --release -p xfmr-cli -- fetch-model smollm2` (or set XFMR_SMOLLM2_GGUF)"
        );
        return;
    };
    let lm = xfmr_llm::LanguageModel::<Flex>::from_file(&path, &Default::default())
        .expect("the model loads");
    let options = lm.greedy(NEW_TOKENS).with_min_len(NEW_TOKENS);
    let prompt = "In the beginning God created the heaven and the earth. And the earth was";
    let mut group = c.benchmark_group("w6_smollm2_32_tokens");
    group.sample_size(10);
    group.throughput(Throughput::Elements(NEW_TOKENS as u64));
    group.bench_function(BenchmarkId::from_parameter("flex"), |b| {
        b.iter(|| {
            let out = lm.complete(prompt, &options, |_| {}).expect("a completion");
            assert_eq!(out.tokens.len(), NEW_TOKENS);
        })
    });
    group.finish();
}

fn workloads(c: &mut Criterion) {
    alloc::keep_memory();
    w2::<NdArray>(c, "ndarray");
    w2::<Flex>(c, "flex");
    let examples = w3_examples();
    w3::<Autodiff<NdArray>>(c, "ndarray", &examples);
    w3::<Autodiff<Flex>>(c, "flex", &examples);
    w4::<NdArray>(c, "ndarray");
    w4::<Flex>(c, "flex");
    w5::<NdArray>(c, "ndarray");
    w5::<Flex>(c, "flex");
    w6(c);
}

criterion_group!(benches, workloads);
criterion_main!(benches);
