//! `tokenizer_json`: an arbitrary `tokenizer.json` of a training run
//! ([`SubwordTokenizer::load`], the Hugging Face `tokenizers` reader with xfmr's check of the
//! special ids). A tokenizer that loads encodes a line of text to ids inside its vocabulary and
//! decodes them; an id past the vocabulary is an error. Seed: a BPE vocabulary learned here
//! from the embedded corpus.

use std::fs;

use xfmr_translate::SubwordTokenizer;

use super::scratch_dir;

/// The target's body.
pub fn run(data: &[u8]) {
    let path = scratch_dir().join("tokenizer.json");
    fs::write(&path, data).expect("write");
    let Ok(tokenizer) = SubwordTokenizer::load(&path) else {
        return;
    };
    let vocab = tokenizer.vocab_size();
    if let Ok(ids) = tokenizer.encode("Y dijo Dios: Sea la luz; y fué la luz. ¿Qué? 你好") {
        assert!(
            ids.iter().all(|&id| (id as usize) < vocab),
            "encode gave an id outside the vocabulary of {vocab}: {ids:?}"
        );
        let _ = tokenizer.decode(&ids);
    }
    assert!(
        tokenizer
            .decode(&[u32::try_from(vocab).unwrap_or(u32::MAX).saturating_add(3)])
            .is_err(),
        "an id outside the vocabulary decodes as an error"
    );
}

/// A vocabulary of 120 tokens learned from the first 200 pairs of the embedded corpus.
pub fn seeds() -> Vec<Vec<u8>> {
    vec![seed()]
}

fn seed() -> Vec<u8> {
    let sentences: Vec<&str> = crate::targets::tsv::EMBEDDED
        .lines()
        .take(200)
        .flat_map(|l| l.split('\t'))
        .collect();
    let tokenizer = SubwordTokenizer::train(sentences.into_iter(), 120).expect("BPE training");
    let path = scratch_dir().join("tokenizer-seed.json");
    tokenizer.save(&path).expect("save");
    fs::read(path).expect("read")
}
