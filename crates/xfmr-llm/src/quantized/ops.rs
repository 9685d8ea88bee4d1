//! The host operations of [`QuantizedLlama`](super::QuantizedLlama)'s forward pass besides
//! the products: RMSNorm, RoPE on interleaved pairs, causal attention over the cache.

use rayon::prelude::*;

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

/// Rotates the interleaved pairs `(2i, 2i+1)` of each head of `x` (heads of `d_k`) by
/// `position·θ^(−2i/d_k)`.
pub(super) fn rope(x: &mut [f32], d_k: usize, position: usize, theta: f64) {
    let half = d_k / 2;
    for i in 0..half {
        let angle = position as f64 * theta.powf(-2.0 * i as f64 / d_k as f64);
        let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
        for head in x.chunks_exact_mut(d_k) {
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * cos - b * sin;
            head[2 * i + 1] = b * cos + a * sin;
        }
    }
}

/// Causal attention of the `n` new queries (in `qkv`, rows of `width`, queries first) over
/// the cache (`past + n` positions), written to `out` (`[n, d]`), in parallel over queries and
/// key/value heads. The query heads that share a key/value head are taken together, so that
/// each cached key and value row is read once for all of them (three heads per row for
/// SmolLM2); each head's arithmetic is the same as alone.
pub(super) fn attention(
    c: &LlamaConfig,
    qkv: &[f32],
    width: usize,
    keys: &[f32],
    values: &[f32],
    past: usize,
    out: &mut [f32],
) {
    let d_k = c.d_k();
    let kv = c.n_kv_heads * d_k;
    let group = c.n_heads / c.n_kv_heads;
    let scale = 1.0 / (d_k as f32).sqrt();
    out.par_chunks_mut(group * d_k).enumerate().for_each_init(
        Vec::new,
        |scores: &mut Vec<f32>, (chunk, o)| {
            let (i, g) = (chunk / c.n_kv_heads, chunk % c.n_kv_heads);
            let seen = past + i + 1;
            // scores[j·seen + t]: head g·group + j against position t.
            scores.clear();
            scores.resize(group * seen, 0.0);
            let q = &qkv[i * width + g * group * d_k..i * width + (g + 1) * group * d_k];
            for t in 0..seen {
                let k = &keys[t * kv + g * d_k..t * kv + (g + 1) * d_k];
                for (j, q) in q.chunks_exact(d_k).enumerate() {
                    scores[j * seen + t] = dot(q, k) * scale;
                }
            }
            for row in scores.chunks_exact_mut(seen) {
                softmax(row);
            }
            o.fill(0.0);
            for t in 0..seen {
                let v = &values[t * kv + g * d_k..t * kv + (g + 1) * d_k];
                for (j, o) in o.chunks_exact_mut(d_k).enumerate() {
                    let w = scores[j * seen + t];
                    o.iter_mut().zip(v).for_each(|(o, v)| *o += w * v);
                }
            }
        },
    );
}

/// `row ← softmax(row)` in place.
fn softmax(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut total = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        total += *v;
    }
    row.iter_mut().for_each(|v| *v /= total);
}

/// The attention weights of the `n` new queries over the cache (`past + n` positions), as
/// [`attention`] uses them: `[heads, n, past + n]`, zeros where a query may not look.
pub(super) fn attention_weights(
    c: &LlamaConfig,
    qkv: &[f32],
    width: usize,
    keys: &[f32],
    past: usize,
) -> Vec<f32> {
    let n = qkv.len() / width;
    let total = past + n;
    let mut out = vec![0f32; c.n_heads * n * total];
    let mut scores = Vec::new();
    for h in 0..c.n_heads {
        for i in 0..n {
            probabilities(c, qkv, width, keys, past, i, h, &mut scores);
            let at = (h * n + i) * total;
            out[at..at + scores.len()].copy_from_slice(&scores);
        }
    }
    out
}

/// Softmax of query `i`'s (head `h`) scaled scores over the `past + i + 1` positions it sees,
/// into `scores` (the arithmetic of [`attention`], one head at a time).
#[allow(clippy::too_many_arguments)]
fn probabilities(
    c: &LlamaConfig,
    qkv: &[f32],
    width: usize,
    keys: &[f32],
    past: usize,
    i: usize,
    h: usize,
    scores: &mut Vec<f32>,
) {
    let d_k = c.d_k();
    let kv = c.n_kv_heads * d_k;
    let g = h / (c.n_heads / c.n_kv_heads);
    let scale = 1.0 / (d_k as f32).sqrt();
    let q = &qkv[i * width + h * d_k..i * width + (h + 1) * d_k];
    scores.clear();
    scores.extend((0..past + i + 1).map(|t| {
        let k = &keys[t * kv + g * d_k..t * kv + (g + 1) * d_k];
        dot(q, k) * scale
    }));
    softmax(scores);
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
