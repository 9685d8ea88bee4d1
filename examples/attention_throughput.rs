//! Self-attention throughput of xfmr's `MultiHeadAttention` against burn-nn 0.21's, on the CPU
//! backends, printed as one JSON object per line (read by `benches/compare_attention.py`, which
//! adds PyTorch to the same run).
//!
//! ```text
//! cargo run --release -p xfmr --features flex --example attention_throughput -- [batch seq d_model heads iters]
//! ```
//! Defaults: batch 8, seq 256, d_model 512, 8 heads, 20 timed iterations after 3 warm-ups.

use std::time::Instant;

use burn::backend::{Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use xfmr::attention::{AttentionKernel, MhaInput, MultiHeadAttentionConfig};

/// Median seconds of `iters` runs of `f` after 3 warm-ups (each run synchronises the device).
fn median_secs<B: Backend>(device: &B::Device, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let start = Instant::now();
            f();
            B::sync(device).expect("device sync");
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[iters / 2]
}

fn run<B: Backend>(backend: &str, dims: [usize; 4], iters: usize) {
    let [batch, seq, d_model, heads] = dims;
    let device = B::Device::default();
    let x = Tensor::<B, 3>::random([batch, seq, d_model], Distribution::Default, &device);
    let mut ours = MultiHeadAttentionConfig::new(d_model, heads)
        .init::<B>(&device)
        .unwrap();
    let theirs = burn::nn::attention::MultiHeadAttentionConfig::new(d_model, heads)
        .with_dropout(0.0)
        .init::<B>(&device);
    let mut time_ours = |kernel| {
        ours.kernel = kernel;
        median_secs::<B>(&device, iters, || {
            let out = ours.forward(MhaInput::self_attn(x.clone())).context;
            let _ = out.into_data();
        })
    };
    let xfmr = time_ours(AttentionKernel::Auto);
    let xfmr_fused = time_ours(AttentionKernel::Fused);
    let burn_nn = median_secs::<B>(&device, iters, || {
        let out = theirs
            .forward(burn::nn::attention::MhaInput::self_attn(x.clone()))
            .context;
        let _ = out.into_data();
    });
    for (name, secs) in [
        ("xfmr", xfmr),
        ("xfmr (fused kernel)", xfmr_fused),
        ("burn-nn", burn_nn),
    ] {
        println!(
            "{{\"impl\": \"{name}\", \"backend\": \"{backend}\", \"batch\": {batch}, \"seq\": {seq}, \
             \"d_model\": {d_model}, \"heads\": {heads}, \"median_ms\": {:.3}, \"seq_per_s\": {:.2}}}",
            secs * 1e3,
            batch as f64 / secs
        );
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("arguments are integers: batch seq d_model heads iters")
        })
        .collect();
    let get = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let dims = [get(0, 8), get(1, 256), get(2, 512), get(3, 8)];
    let iters = get(4, 20);
    run::<NdArray<f32>>("ndarray", dims, iters);
    run::<Flex>("flex", dims, iters);
}
