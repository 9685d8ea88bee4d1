//! `metrics`: BLEU and chrF (sacreBLEU's) on arbitrary Unicode: hypotheses and references
//! alternate between `0xFF` bytes. Every score is a number in [0, 100], the brevity penalty is
//! in [0, 1], a segment scored against itself (non-empty, with a word in it) is 100, and the
//! 13a tokenizer never panics. Seed: the sacreBLEU cases of `fixtures/bleu`.

use xfmr_translate::{corpus_bleu, corpus_chrf, sentence_bleu, tokenize_13a};

use crate::{split_field, text};

/// The target's body.
pub fn run(data: &[u8]) {
    let mut hyps = Vec::new();
    let mut refs = Vec::new();
    let mut rest = data;
    while !rest.is_empty() && hyps.len() < 32 {
        let (h, after) = split_field(rest);
        let (r, after) = split_field(after);
        hyps.push(text(h));
        refs.push(text(r));
        rest = after;
    }
    // sacreBLEU itself scores identical text 100.00000000000004: a rounding margin of 1e-9.
    let in_range = |what: &str, v: f64| {
        assert!(
            (0.0..=100.0 + 1e-9).contains(&v),
            "{what} is {v}: hyps {hyps:?}, refs {refs:?}"
        );
    };
    for h in &hyps {
        let _ = tokenize_13a(h);
    }
    let streams = vec![refs.clone()];
    let bleu = corpus_bleu(&hyps, &streams).expect("one reference stream of the same length");
    in_range("corpus BLEU", bleu.score);
    assert!(
        (0.0..=1.0).contains(&bleu.bp),
        "brevity penalty {}",
        bleu.bp
    );
    in_range(
        "corpus chrF",
        corpus_chrf(&hyps, &streams).expect("same length"),
    );
    for (h, r) in hyps.iter().zip(&refs) {
        in_range("sentence BLEU", sentence_bleu(h, &[r.as_str()]).score);
        in_range("sentence BLEU, no reference", sentence_bleu(h, &[]).score);
    }
    if let Some(h) = hyps
        .first()
        .filter(|h| h.chars().any(char::is_alphanumeric))
    {
        let score = sentence_bleu(h, &[h.as_str()]).score;
        assert!(
            (score - 100.0).abs() < 1e-9,
            "{h:?} against itself: BLEU {score}"
        );
    }
}

/// The hypotheses and references of the sacreBLEU cases (`fixtures/bleu/cases.json`).
pub fn seeds() -> Vec<Vec<u8>> {
    let cases: serde_json::Value =
        serde_json::from_str(include_str!("../../../fixtures/bleu/cases.json")).expect("JSON");
    let mut seeds = Vec::new();
    for case in cases["cases"].as_array().into_iter().flatten() {
        let hyps = case["hyps"].as_array().cloned().unwrap_or_default();
        let refs = case["refs"][0].as_array().cloned().unwrap_or_default();
        let mut seed = Vec::new();
        for (h, r) in hyps.iter().zip(&refs) {
            seed.extend(h.as_str().unwrap_or_default().bytes());
            seed.push(0xFF);
            seed.extend(r.as_str().unwrap_or_default().bytes());
            seed.push(0xFF);
        }
        seeds.push(seed);
    }
    seeds
}
