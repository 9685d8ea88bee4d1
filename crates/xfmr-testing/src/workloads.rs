//! The models and inputs of the benchmark workloads W2 and W4 (`docs/benchmarks.md`), shared
//! by `examples/workloads.rs` (which `benches/compare_pytorch.py` runs beside PyTorch) and the
//! criterion bench `benches/workloads.rs`, so that both time the same thing. Feature
//! `workloads`.

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use xfmr_blocks::{Encoder, LayerConfig, StackConfig};
use xfmr_models::{GenerationOptions, Transformer, TransformerConfig};

/// W2: batch 8 × 128 tokens.
pub const W2_SHAPE: [usize; 2] = [8, 128];

/// W2: the encoder stack at the paper's `base` widths (d_model 512, 8 heads, d_ff 2048, 6
/// post-norm layers, no dropout) and a random `[8, 128, 512]` input.
pub fn w2_encoder<B: Backend>(device: &B::Device) -> (Encoder<B>, Tensor<B, 3>) {
    let [batch, seq] = W2_SHAPE;
    let layer = LayerConfig::new(512, 8, 2048).with_dropout(0.0);
    let encoder = StackConfig::new(layer, 6)
        .init_encoder::<B>(device)
        .expect("a valid configuration");
    let x = Tensor::<B, 3>::random([batch, seq, 512], Distribution::Default, device);
    (encoder, x)
}

/// W4: tokens decoded per run.
pub const W4_NEW_TOKENS: usize = 128;

/// W4: the `base` encoder-decoder (37,000-token shared vocabulary, random weights, no dropout), a
/// 24-token source, and greedy options that hold the end token (2) off until the last position,
/// so that every run decodes exactly [`W4_NEW_TOKENS`].
pub fn w4_model<B: Backend>(device: &B::Device) -> (Transformer<B>, Vec<u32>, GenerationOptions) {
    let model = TransformerConfig::base(37_000)
        .map_layer(|l| l.with_dropout(0.0))
        .init::<B>(device)
        .expect("a valid configuration");
    let source: Vec<u32> = (0..24).map(|i| 10 + 37 * i).collect();
    let options = GenerationOptions::greedy(W4_NEW_TOKENS, 2, 0).with_min_len(W4_NEW_TOKENS);
    (model, source, options)
}
