//! One pass of the model over new tokens: the products of every layer for all sequences at
//! once, attention over each sequence's own cache, and the logits of each sequence's last
//! position.

use xfmr_kernels::silu_mul;
use xfmr_models::ModelError;

use super::ops::{attention, attention_weights, rms_norm, rope, rope_angles};
use super::{QuantizedLinear, QuantizedLlama, Scratch, SequenceCache};

impl QuantizedLlama {
    /// Feeds each sequence its tokens (one pass of the products over all of them) and
    /// leaves the logits after each sequence's last token in `s.logits`, `[sequences,
    /// vocab]`. With `record`, pushes each layer's attention weights `[heads, n, past + n]`
    /// (one sequence only).
    ///
    /// The whole pass runs on one of rayon's workers (`rayon::scope` moves it there when the
    /// caller is not one): its ~150 parallel regions then fork from a worker, whose partners
    /// steal from its queue, instead of each being injected into the pool from outside and
    /// waited for on a lock (a sleep and a wake-up per region; one client's decoding
    /// 14% faster, docs/benchmarks.md).
    pub(super) fn forward_rows(
        &self,
        rows: &mut [(&mut SequenceCache, &[u32])],
        s: &mut Scratch,
        record: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        rayon::scope(|_| self.forward_rows_on_worker(rows, s, record))
    }

    /// [`forward_rows`](Self::forward_rows)' body.
    fn forward_rows_on_worker(
        &self,
        rows: &mut [(&mut SequenceCache, &[u32])],
        s: &mut Scratch,
        mut record: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (d, d_k) = (c.d_model, c.d_k());
        let kv = c.n_kv_heads * d_k;
        debug_assert!(record.is_none() || rows.len() == 1);
        for (row, tokens) in rows.iter() {
            if tokens.is_empty() {
                return Err(ModelError::InvalidInput("a step of no tokens".into()));
            }
            if row.len + tokens.len() > c.context_length {
                return Err(ModelError::InvalidInput(format!(
                    "{} positions exceed the model's context of {}",
                    row.len + tokens.len(),
                    c.context_length
                )));
            }
        }
        // Where each sequence's tokens start among all of them.
        s.starts.clear();
        s.starts.extend(rows.iter().scan(0, |at, (_, t)| {
            let start = *at;
            *at += t.len();
            Some(start)
        }));
        let n: usize = rows.iter().map(|(_, t)| t.len()).sum();
        let eps = c.rms_norm_eps as f32;
        s.x.resize(n * d, 0.0);
        for (&t, x) in rows
            .iter()
            .flat_map(|(_, t)| t.iter())
            .zip(s.x.chunks_exact_mut(d))
        {
            self.embedding.row_into(t as usize, x);
        }
        let width = d + 2 * kv;
        // Every new row's rotation, once for all layers: rows in `starts` order.
        let half = d_k / 2;
        s.angles.clear();
        for (row, tokens) in rows.iter() {
            for i in 0..tokens.len() {
                rope_angles(d_k, row.len + i, c.rope_theta, &mut s.angles);
            }
        }
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&s.x, &layer.attn_norm, eps, &mut s.h);
            s.qkv.resize(n * width, 0.0);
            let [q, k, v] = &layer.qkv;
            QuantizedLinear::forward_fused(
                &[q, k, v],
                &s.h,
                n,
                &mut s.qkv,
                &mut s.product,
                self.activations,
            );
            s.attn.resize(n * d, 0.0);
            for ((row, tokens), &start) in rows.iter_mut().zip(&s.starts) {
                let m = tokens.len();
                let qkv = &mut s.qkv[start * width..(start + m) * width];
                let angles = s.angles[start * half..(start + m) * half].chunks_exact(half);
                for (row_qkv, angles) in qkv.chunks_exact_mut(width).zip(angles) {
                    let (q, kv_part) = row_qkv.split_at_mut(d);
                    rope(q, d_k, angles);
                    rope(&mut kv_part[..kv], d_k, angles);
                    let (k, v) = kv_part.split_at(kv);
                    let heads = &mut row.heads[l * c.n_kv_heads..(l + 1) * c.n_kv_heads];
                    for ((cache, k), v) in heads
                        .iter_mut()
                        .zip(k.chunks_exact(d_k))
                        .zip(v.chunks_exact(d_k))
                    {
                        cache.push(k, v);
                    }
                }
            }
            // Every query of every sequence in one parallel pass over (query, key/value head)
            // pairs: one fork-join per layer.
            attention(c, &s.qkv, width, rows, &s.starts, l, &mut s.attn);
            if let Some(weights) = record.as_deref_mut() {
                for ((row, tokens), &start) in rows.iter().zip(&s.starts) {
                    let qkv = &s.qkv[start * width..(start + tokens.len()) * width];
                    let heads = &row.heads[l * c.n_kv_heads..(l + 1) * c.n_kv_heads];
                    weights.push(attention_weights(c, qkv, width, heads, row.len));
                }
            }
            s.proj.resize(n * d, 0.0);
            QuantizedLinear::forward_fused(
                &[&layer.output],
                &s.attn,
                n,
                &mut s.proj,
                &mut s.product,
                self.activations,
            );
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
            rms_norm(&s.x, &layer.ffn_norm, eps, &mut s.h);
            let ff = c.d_ff;
            s.gate_up.resize(n * 2 * ff, 0.0);
            let [gate, up] = &layer.gate_up;
            QuantizedLinear::forward_fused(
                &[gate, up],
                &s.h,
                n,
                &mut s.gate_up,
                &mut s.product,
                self.activations,
            );
            s.act.resize(n * ff, 0.0);
            for (act, gu) in s
                .act
                .chunks_exact_mut(ff)
                .zip(s.gate_up.chunks_exact(2 * ff))
            {
                let (g, u) = gu.split_at(ff);
                silu_mul(g, u, act);
            }
            QuantizedLinear::forward_fused(
                &[&layer.down],
                &s.act,
                n,
                &mut s.proj,
                &mut s.product,
                self.activations,
            );
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        }
        // The last position of each sequence only: final norm and logits.
        s.last.clear();
        for ((row, tokens), &start) in rows.iter_mut().zip(&s.starts) {
            row.len += tokens.len();
            let last = start + tokens.len() - 1;
            s.last.extend_from_slice(&s.x[last * d..(last + 1) * d]);
        }
        rms_norm(&s.last, &self.norm, eps, &mut s.h);
        let output = self.output.as_ref().unwrap_or(&self.embedding);
        s.logits.resize(rows.len() * c.vocab_size, 0.0);
        QuantizedLinear::forward_fused(
            &[output],
            &s.h,
            rows.len(),
            &mut s.logits,
            &mut s.product,
            self.activations,
        );
        Ok(())
    }
}
