//! `gguf_tokenizer`: a GGUF file's tokenizer from arbitrary tokens, merges and special ids, and
//! arbitrary text through it.
//!
//! Fields, split at `0xFF` bytes: the tokens (one per line; a line of the form `\x01token`
//! marks a control token), the merges (one per line), four option bytes (end, begin and
//! padding ids, which may lie outside the vocabulary, and which pre-tokenizer name to write),
//! and the text. The file is written with [`GgufWriter`]; [`GgufTokenizer::from_gguf`] must
//! build a tokenizer or name what it refuses; the text is encoded, every id is within the
//! vocabulary, decoded whole and streamed one id at a time, and an id past the vocabulary is an
//! error, not a panic.

use xfmr_llm::gguf::{GgufWriter, Value};
use xfmr_llm::{Gguf, GgufTokenizer};

use crate::{split_field, text};

/// The target's body.
pub fn run(data: &[u8]) {
    let (tokens, rest) = split_field(data);
    let (merges, rest) = split_field(rest);
    let (options, input) = split_field(rest);
    let tokens: Vec<String> = text(tokens).split('\n').map(str::to_string).collect();
    let kinds: Vec<Value> = tokens
        .iter()
        .map(|t| Value::I64(if t.starts_with('\u{1}') { 3 } else { 1 }))
        .collect();
    let tokens: Vec<Value> = tokens
        .into_iter()
        .map(|t| Value::String(t.trim_start_matches('\u{1}').to_string()))
        .collect();
    let merges: Vec<Value> = text(merges)
        .split('\n')
        .filter(|m| !m.is_empty())
        .map(|m| Value::String(m.to_string()))
        .collect();
    let option = |i: usize| options.get(i).copied().unwrap_or(0) as u64;
    let pre = ["smollm", "gpt2", "llama-bpe", "qwen2"][option(3) as usize % 4];
    let n = tokens.len() as u32;
    let file = GgufWriter::new()
        .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::String(pre.into()))
        .metadata("tokenizer.ggml.tokens", Value::Array(tokens))
        .metadata("tokenizer.ggml.token_type", Value::Array(kinds))
        .metadata("tokenizer.ggml.merges", Value::Array(merges))
        .metadata("tokenizer.ggml.eos_token_id", Value::U64(option(0)))
        .metadata("tokenizer.ggml.bos_token_id", Value::U64(option(1)))
        .metadata("tokenizer.ggml.padding_token_id", Value::U64(option(2)))
        .metadata(
            "tokenizer.ggml.add_bos_token",
            Value::Bool(option(3) & 4 != 0),
        )
        .to_bytes();
    let gguf = Gguf::parse(file).expect("a file GgufWriter wrote parses");
    let Ok(tokenizer) = GgufTokenizer::from_gguf(&gguf) else {
        return;
    };
    assert!(
        tokenizer.eos_id() < n && tokenizer.pad_id() < n,
        "special ids in range"
    );
    let input = text(input);
    let Ok(ids) = tokenizer.encode(&input) else {
        return;
    };
    // The file's ids, duplicates included (a file may spell two ids alike: the tokenizer's
    // own vocabulary is then smaller than the file's).
    assert_eq!(tokenizer.n_tokens(), n as usize);
    let vocab = n;
    assert!(
        ids.iter().all(|&id| id < vocab),
        "encode gave an id outside the file's {vocab} tokens: {ids:?}"
    );
    let _ = tokenizer.decode(&ids);
    let mut stream = tokenizer.stream();
    for &id in &ids {
        let _ = stream.push(id);
    }
    assert!(
        tokenizer.stream().push(vocab.saturating_add(7)).is_err(),
        "an id outside the vocabulary streams as an error"
    );
}

/// The tiny model's vocabulary and merges (control tokens marked), its special ids, a line.
pub fn seeds() -> Vec<Vec<u8>> {
    let (tokens, merges) = crate::tiny::tokens();
    let mut seed = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            seed.push(b'\n');
        }
        if i < 3 {
            seed.push(1);
        }
        seed.extend(t.bytes());
    }
    seed.push(0xFF);
    seed.extend(merges.join("\n").bytes());
    seed.push(0xFF);
    seed.extend([2, 1, 2, 0]);
    seed.push(0xFF);
    seed.extend("<|im_start|>user\nhello there, the shell<|im_end|> ¿qué?".bytes());
    vec![seed]
}
