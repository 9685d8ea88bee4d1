//! The host operations of [`QuantizedLlama`](super::QuantizedLlama)'s forward pass besides
//! the products: RMSNorm, RoPE on interleaved pairs, causal attention over the cache
//! (xfmr-kernels' [`attend_cached`]).

use std::cell::RefCell;

use rayon::prelude::*;
use xfmr_kernels::{attend_cached, cached_probabilities, HeadCache};

use super::SequenceCache;
use crate::llama::LlamaConfig;

/// `out = x / √(mean(x²) + ε) · γ`, row by row (rows of `γ.len()`).
pub(super) fn rms_norm(x: &[f32], gamma: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (row, o) in x
        .chunks_exact(gamma.len())
        .zip(out.chunks_exact_mut(gamma.len()))
    {
        let mean = dot(row, row) / row.len() as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(row).zip(gamma) {
            *o = v * scale * g;
        }
    }
}

/// Appends `(sin, cos)` of `position·θ^(−2i/d_k)` for each pair `i < d_k/2`: the rotation of
/// one position, shared by its query and key heads in every layer.
pub(super) fn rope_angles(d_k: usize, position: usize, theta: f64, out: &mut Vec<(f32, f32)>) {
    out.extend((0..d_k / 2).map(|i| {
        let angle = position as f64 * theta.powf(-2.0 * i as f64 / d_k as f64);
        (angle.sin() as f32, angle.cos() as f32)
    }));
}

/// Rotates the interleaved pairs `(2i, 2i+1)` of each head of `x` (heads of `d_k`) by the
/// angles of [`rope_angles`].
pub(super) fn rope(x: &mut [f32], d_k: usize, angles: &[(f32, f32)]) {
    for head in x.chunks_exact_mut(d_k) {
        for (pair, &(sin, cos)) in head.chunks_exact_mut(2).zip(angles) {
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * cos - b * sin;
            pair[1] = b * cos + a * sin;
        }
    }
}

/// Causal attention of every new query of a step (rows of `qkv`, `width` each, queries first;
/// sequence after sequence, sequence `j`'s rows from `starts[j]`) over its own sequence's cache
/// of layer `layer` (the step's new positions already appended), written to `out` (`[rows, d]`),
/// in parallel over (query, key/value head) pairs of all sequences at once. The query heads
/// that share a key/value head are taken together ([`attend_cached`]: each cached key and
/// value row is read once for all of them, three heads per row for SmolLM2); each head's
/// arithmetic is the same as alone, and no sequence's result depends on the others.
///
/// Allocates nothing once each thread's score buffer holds the positions the caches were
/// reserved for (the first step of a sequence longer than any before).
pub(super) fn attention(
    c: &LlamaConfig,
    qkv: &[f32],
    width: usize,
    rows: &[(&mut SequenceCache, &[u32])],
    starts: &[usize],
    layer: usize,
    out: &mut [f32],
) {
    let d_k = c.d_k();
    let group = c.n_heads / c.n_kv_heads;
    debug_assert!(
        starts.windows(2).all(|w| w[0] < w[1]) && starts.len() == rows.len(),
        "attention: sequences' rows out of order"
    );
    out.par_chunks_mut(group * d_k)
        .enumerate()
        .for_each(|(chunk, o)| {
            let (r, g) = (chunk / c.n_kv_heads, chunk % c.n_kv_heads);
            // The sequence whose rows hold row `r` (starts ascend, as asserted above).
            let j = starts.partition_point(|&start| start <= r) - 1;
            let row = &rows[j].0;
            // `len` counts the positions fed before this step (it grows after the last
            // layer); the keys and values already hold the step's rows.
            let past = row.len;
            let seen = past + (r - starts[j]) + 1;
            let q = &qkv[r * width + g * group * d_k..r * width + (g + 1) * group * d_k];
            let cache = &row.heads[layer * c.n_kv_heads + g];
            SCORES.with_borrow_mut(|scores| {
                // Room for every position the cache was reserved for, so that the buffer
                // does not grow again as the sequence does.
                let reserved = group * cache.capacity();
                if scores.capacity() < reserved {
                    scores.reserve_exact(reserved - scores.len());
                }
                attend_cached(q, cache.view(seen), scale(c), scores, o)
            });
        });
}

thread_local! {
    /// Each thread's attention probabilities (`[group, seen]`), kept between steps.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `1/√d_k`.
fn scale(c: &LlamaConfig) -> f32 {
    1.0 / (c.d_k() as f32).sqrt()
}

/// The attention weights of the `n` new queries over a layer's cache (`heads`, one per
/// key/value head; `past + n` positions), as [`attention`] uses them (the same kernel's
/// probabilities): `[heads, n, past + n]`, zeros where a query may not look.
pub(super) fn attention_weights(
    c: &LlamaConfig,
    qkv: &[f32],
    width: usize,
    heads: &[HeadCache],
    past: usize,
) -> Vec<f32> {
    let d_k = c.d_k();
    let group = c.n_heads / c.n_kv_heads;
    let n = qkv.len() / width;
    let total = past + n;
    let mut out = vec![0f32; c.n_heads * n * total];
    let mut scores = Vec::new();
    for i in 0..n {
        let seen = past + i + 1;
        for g in 0..c.n_kv_heads {
            let q = &qkv[i * width + g * group * d_k..i * width + (g + 1) * group * d_k];
            cached_probabilities(q, heads[g].view(seen), scale(c), &mut scores);
            for (j, row) in scores.chunks_exact(seen).enumerate() {
                let at = ((g * group + j) * n + i) * total;
                out[at..at + seen].copy_from_slice(row);
            }
        }
    }
    out
}

/// `Σ a_i·b_i` over 8 partial sums, so that it vectorises (a plain `f32` sum is a sequential
/// chain the compiler may not reorder).
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    acc.iter().sum::<f32>() + tail
}
