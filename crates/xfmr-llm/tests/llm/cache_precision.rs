//! The quantised model's key/value cache in `f16` (the default) against the same model with an
//! `f32` cache, and the prefix cache keeping the two apart, on the tiny file the tests write.

use burn::backend::NdArray;
use xfmr_llm::gguf::Gguf;
use xfmr_llm::quantized::{Activations, CachePrecision, PrefixCache, Scratch};
use xfmr_llm::{LanguageModel, QuantizedLlama};

/// The tiny model with `f32` products (so that the cache's precision is the one difference),
/// its cache in `precision`.
fn tiny(precision: CachePrecision) -> QuantizedLlama {
    let g = Gguf::parse(crate::tiny::tiny_gguf(8)).unwrap();
    let lm = LanguageModel::<NdArray>::from_gguf(&g, &Default::default()).unwrap();
    QuantizedLlama::from_gguf(&g, lm.tokenizer.pad_id())
        .unwrap()
        .with_activations(Activations::F32)
        .with_cache_precision(precision)
}

/// Logits after each token of `prompt` fed one at a time (every step attends over the cache).
fn logits_one_at_a_time(q: &QuantizedLlama, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = q.sequence(prompt.len());
    let mut scratch = Scratch::new();
    prompt
        .iter()
        .map(|&t| {
            q.forward_batch(&mut [(&mut cache, &[t][..])], &mut scratch)
                .unwrap()
        })
        .collect()
}

/// The `f16` cache moves each cached key and value by at most 2⁻¹¹ of itself (f16's rounding
/// in its normal range), so the logits stay close to the `f32` cache's: within 1% of their
/// largest magnitude at every step (the bound allows each layer's rounding to be amplified
/// twentyfold through the residual stream; chosen before measuring), and the greedy token is
/// the same wherever the `f32` cache's top-two margin exceeds that bound. The `f16` cache
/// holds half the bytes.
#[test]
fn f16_cache_stays_within_f16_rounding_of_the_f32_cache() {
    let (q32, q16) = (tiny(CachePrecision::F32), tiny(CachePrecision::F16));
    assert_eq!(q16.cache_precision(), CachePrecision::F16);
    let vocab = q32.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..24).map(|i| (7 * i + 3) % vocab).collect();
    let (want, got) = (
        logits_one_at_a_time(&q32, &prompt),
        logits_one_at_a_time(&q16, &prompt),
    );
    let (mut worst, mut changed) = (0f32, false);
    for (t, (want, got)) in want.iter().zip(&got).enumerate() {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let bound = 1e-2 * scale;
        let diff = want
            .iter()
            .zip(got)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff / scale);
        assert!(diff <= bound, "step {t}: logits differ by {diff} > {bound}");
        changed |= want != got;
        let order = |v: &[f32]| {
            let mut ids: Vec<usize> = (0..v.len()).collect();
            ids.sort_by(|&i, &j| v[j].total_cmp(&v[i]));
            ids
        };
        let (w, g) = (order(want), order(got));
        if want[w[0]] - want[w[1]] > bound {
            assert_eq!(w[0], g[0], "step {t}: greedy token");
        }
    }
    assert!(changed, "the f16 cache changed no logit: is it f16?");
    eprintln!("f16 cache against f32: largest difference {worst:.2e} of the logits' magnitude");
    let (mut c32, mut c16) = (q32.sequence(8), q16.sequence(8));
    let mut scratch = Scratch::new();
    q32.forward_batch(&mut [(&mut c32, &prompt[..8])], &mut scratch)
        .unwrap();
    q16.forward_batch(&mut [(&mut c16, &prompt[..8])], &mut scratch)
        .unwrap();
    let mut p32 = PrefixCache::new(usize::MAX);
    let mut p16 = PrefixCache::new(usize::MAX);
    p32.store(&prompt[..8], &c32);
    p16.store(&prompt[..8], &c16);
    let tokens = 8 * std::mem::size_of::<u32>();
    assert_eq!(
        (p16.bytes() - tokens) * 2,
        p32.bytes() - tokens,
        "half the bytes, tokens aside"
    );
}

/// One `PrefixCache` serving models of both precisions keeps their sequences apart: a prompt
/// is never restored from a sequence of the other precision (which could not be copied), a
/// sequence of one precision neither counts as holding nor replaces the other's, and each
/// restores its own.
#[test]
fn prefix_cache_keeps_each_cache_precision_apart() {
    let (q32, q16) = (tiny(CachePrecision::F32), tiny(CachePrecision::F16));
    let vocab = q32.config.vocab_size as u32;
    let a: Vec<u32> = (0..12).map(|i| (5 * i + 1) % vocab).collect();
    let mut prefixes = PrefixCache::new(usize::MAX);
    // How many positions `prompt` restored; then the sequence is kept.
    let feed = |q: &QuantizedLlama, prefixes: &mut PrefixCache, prompt: &[u32]| {
        crate::quantized::logits_after(q, prefixes, prompt).1
    };
    assert_eq!(feed(&q32, &mut prefixes, &a), 0, "nothing kept yet");
    assert_eq!(feed(&q16, &mut prefixes, &a), 0, "a is kept in f32 only");
    assert_eq!(
        prefixes.len(),
        2,
        "the f16 sequence is kept beside the f32 one"
    );
    assert_eq!(feed(&q16, &mut prefixes, &a), a.len() - 1, "f16 from f16");
    assert_eq!(feed(&q32, &mut prefixes, &a), a.len() - 1, "f32 from f32");
    let longer = [a.as_slice(), &[2, 3]].concat();
    assert_eq!(
        feed(&q16, &mut prefixes, &longer),
        a.len(),
        "f16 extends f16"
    );
    assert_eq!(
        prefixes.len(),
        2,
        "the extension replaced the f16 sequence only"
    );
    assert_eq!(
        feed(&q32, &mut prefixes, &a),
        a.len() - 1,
        "the f32 one is still there"
    );
}
