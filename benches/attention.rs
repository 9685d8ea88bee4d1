//! Criterion bench: self-attention forward, xfmr vs burn-nn 0.21's `MultiHeadAttention`, on the
//! ndarray and flex CPU backends. Batch 8, seq 256, d_model 512, 8 heads, f32, no mask,
//! inference (no autodiff).
//!
//! ```text
//! cargo bench -p xfmr --features flex --bench attention
//! ```
//! `benches/compare_attention.py` runs the same shapes beside PyTorch in one run and prints the
//! ratios; figures go to docs/benchmarks.md.

use burn::backend::{Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use xfmr::attention::{AttentionKernel, MhaInput, MultiHeadAttentionConfig};

const BATCH: usize = 8;
const SEQ: usize = 256;
const D_MODEL: usize = 512;
const HEADS: usize = 8;

fn bench_backend<B: Backend>(c: &mut Criterion, backend: &str) {
    let device = B::Device::default();
    let x = Tensor::<B, 3>::random([BATCH, SEQ, D_MODEL], Distribution::Default, &device);
    let ours = MultiHeadAttentionConfig::new(D_MODEL, HEADS)
        .init::<B>(&device)
        .unwrap();
    let mut ours_fused = ours.clone();
    ours_fused.kernel = AttentionKernel::Fused;
    let theirs = burn::nn::attention::MultiHeadAttentionConfig::new(D_MODEL, HEADS)
        .with_dropout(0.0)
        .init::<B>(&device);

    let mut group = c.benchmark_group(format!(
        "self_attention_b{BATCH}_s{SEQ}_d{D_MODEL}_h{HEADS}"
    ));
    group.sample_size(10);
    group.throughput(Throughput::Elements((BATCH * SEQ) as u64));
    group.bench_function(BenchmarkId::new("xfmr", backend), |b| {
        b.iter(|| {
            let out = ours.forward(MhaInput::self_attn(x.clone())).context;
            B::sync(&device).expect("sync");
            out
        })
    });
    group.bench_function(BenchmarkId::new("xfmr-fused-kernel", backend), |b| {
        b.iter(|| {
            let out = ours_fused.forward(MhaInput::self_attn(x.clone())).context;
            B::sync(&device).expect("sync");
            out
        })
    });
    group.bench_function(BenchmarkId::new("burn-nn", backend), |b| {
        b.iter(|| {
            let out = theirs
                .forward(burn::nn::attention::MhaInput::self_attn(x.clone()))
                .context;
            B::sync(&device).expect("sync");
            out
        })
    });
    group.finish();
}

fn attention(c: &mut Criterion) {
    bench_backend::<NdArray<f32>>(c, "ndarray");
    bench_backend::<Flex>(c, "flex");
}

criterion_group!(benches, attention);
criterion_main!(benches);
