//! `xfmr demo`: causal multi-head self-attention over a few real sentences (byte tokens),
//! checking on the spot the invariants the library promises.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use xfmr::attention::{AttnMask, KvCache, MhaInput, MultiHeadAttentionConfig};
use xfmr::burn::tensor::backend::Backend;
use xfmr::burn::tensor::{Distribution, Tensor};
use xfmr::models::{padded_ids, PadSide};

use crate::backend::{with_backend, BackendArg};

/// Sentence pairs (Spanish TAB English) from the public-domain corpus; see data/README.md.
const SAMPLE: &str = include_str!("../../data/sample_es_en.tsv");

/// Options of `xfmr demo`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArg,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Number of heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Use the Spanish side instead of the English one.
    #[arg(long)]
    spanish: bool,
}

/// Runs `xfmr demo` on the embedded sentences (English, or Spanish with `--spanish`).
pub fn run(args: Args) -> Result<()> {
    let sentences: Vec<&str> = SAMPLE
        .lines()
        .filter_map(|l| l.split('\t').nth(usize::from(!args.spanish)))
        .collect();
    with_backend!(args.backend.resolve(), "demo", |B| demo::<B>(
        &sentences,
        args.d_model,
        args.heads
    ))
}

/// Runs the demo on `sentences` with a fresh layer of `d_model` and `heads`.
fn demo<B: Backend>(sentences: &[&str], d_model: usize, heads: usize) -> Result<()> {
    let device = B::Device::default();
    B::seed(&device, 42);
    // Byte tokens: id = byte + 1, 0 is padding.
    let lengths: Vec<usize> = sentences.iter().map(|s| s.len()).collect();
    let seq = *lengths
        .iter()
        .max()
        .ok_or_else(|| anyhow!("no sentences"))?;
    let batch = sentences.len();
    // Byte `b` is token `b + 1`; 0 pads.
    let rows: Vec<Vec<u32>> = sentences
        .iter()
        .map(|s| s.bytes().map(|b| u32::from(b) + 1).collect())
        .collect();
    let ids = padded_ids::<B, u32>(&rows, 0, PadSide::Right, &device);

    // Untrained layer: random byte embeddings, random projections.
    let mha = MultiHeadAttentionConfig::new(d_model, heads).init::<B>(&device)?;
    let table = Tensor::<B, 2>::random([257, d_model], Distribution::Normal(0.0, 1.0), &device);
    let x = table
        .select(0, ids.clone().reshape([batch * seq]))
        .reshape([batch, seq, d_model]);
    let pad = AttnMask::padding_from_ids(ids, 0);

    let start = Instant::now();
    let out = mha.forward(
        MhaInput::self_attn(x.clone())
            .causal()
            .mask(pad.clone())
            .need_weights(),
    );
    B::sync(&device).map_err(|e| anyhow!("{e:?}"))?;
    let elapsed = start.elapsed();
    let weights = out.weights.expect("weights requested");
    println!(
        "causal self-attention: batch {batch}, padded length {seq}, d_model {d_model}, {heads} heads \
         ({:.1} ms)",
        elapsed.as_secs_f64() * 1e3
    );
    let w = weights
        .to_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| anyhow!("{e:?}"))?;
    for (b, sentence) in sentences.iter().enumerate() {
        // Head 0, the query at the sentence's last real token.
        let q = lengths[b] - 1;
        let row = &w[((b * heads) * seq + q) * seq..][..seq];
        let mut top: Vec<(usize, f32)> = row.iter().copied().enumerate().collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1));
        // `+ 0.0` turns a sum of negative zeros into a plain 0.
        let ignored: f32 = row[lengths[b]..].iter().sum::<f32>() + 0.0;
        let shown: Vec<String> = top[..3]
            .iter()
            .map(|&(k, p)| format!("{:?}@{k} {p:.3}", sentence.as_bytes()[k] as char))
            .collect();
        println!(
            "  {sentence:<60} last token attends: {}  (weight on padding: {ignored})",
            shown.join(", ")
        );
    }

    // Invariant 1: decoding through the key/value cache equals the full causal pass.
    let mut cache = KvCache::new();
    let mut max_cache_diff = 0f32;
    let full = out.context;
    for t in 0..seq {
        let step_mask = pad.clone().narrow_keys(0, t + 1);
        let step = mha
            .forward_cached(
                MhaInput::self_attn(x.clone().narrow(1, t, 1)).mask(step_mask),
                &mut cache,
            )
            .context;
        let diff: f32 = (step - full.clone().narrow(1, t, 1))
            .abs()
            .max()
            .into_scalar()
            .elem_f32();
        max_cache_diff = max_cache_diff.max(diff);
    }
    // Invariant 2: each sentence alone gives the same outputs as inside the padded batch.
    let mut max_pad_diff = 0f32;
    for (b, &len) in lengths.iter().enumerate() {
        let alone = mha
            .forward(MhaInput::self_attn(x.clone().narrow(0, b, 1).narrow(1, 0, len)).causal())
            .context;
        let batched = full.clone().narrow(0, b, 1).narrow(1, 0, len);
        let diff: f32 = (alone - batched).abs().max().into_scalar().elem_f32();
        max_pad_diff = max_pad_diff.max(diff);
    }
    println!("cached step-by-step decoding vs full pass: max |diff| = {max_cache_diff:.2e}");
    println!("each sentence alone vs in the padded batch:  max |diff| = {max_pad_diff:.2e}");
    if max_cache_diff > 1e-4 || max_pad_diff > 1e-4 {
        bail!("an invariant does not hold");
    }
    Ok(())
}

/// `f32` from a backend float element.
trait ElemF32 {
    fn elem_f32(self) -> f32;
}

impl<E: xfmr::burn::tensor::ElementConversion> ElemF32 for E {
    fn elem_f32(self) -> f32 {
        self.elem()
    }
}
