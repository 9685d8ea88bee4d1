//! A tiny Llama-family GGUF file, with every tensor type the loader supports, so that tests of
//! the GGUF reader, the tokenizer, the quantised model and the server (and the fuzz targets'
//! seeds) run without the real model. Feature `gguf`.
//!
//! The weights are small random values from [`TestRng`] (`seed` picks them); the tokenizer is
//! a byte-level BPE of 3 control tokens, the 256 byte tokens and 5 merges; the chat template is
//! ChatML with a default system prompt.

use xfmr_llm::gguf::{GgmlType, GgufWriter, Value};

use crate::TestRng;

/// The tiny model's width. Rows of quantised tensors must be whole 32-element blocks.
pub const D_MODEL: usize = 32;
/// Its query heads.
pub const N_HEADS: usize = 4;
/// Its key/value heads (grouped: two query heads per key/value head).
pub const N_KV_HEADS: usize = 2;
/// Its feed-forward width.
pub const D_FF: usize = 64;
/// Its layers.
pub const N_LAYERS: usize = 2;
/// GPT-2's printable spelling of each byte (`bytes_to_unicode`), written out independently of
/// the crate's own table.
fn byte_level_alphabet() -> Vec<String> {
    let printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = vec![String::new(); 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap().to_string();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).unwrap().to_string();
            n += 1;
        }
    }
    chars
}

/// The vocabulary: three control tokens, the 256 byte tokens, then merged tokens.
pub fn tokens() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tokens.extend(byte_level_alphabet());
    let merges = ["h e", "Ġ t", "Ġt he", "l l", "he ll"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    (tokens, merges.iter().map(|s| s.to_string()).collect())
}

/// An f16 scale's little-endian bytes.
fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// `rows × cols` values of type `ty` as raw blocks with small random contents.
fn blocks(ty: GgmlType, rows: usize, cols: usize, rng: &mut TestRng) -> Vec<u8> {
    let n = rows * cols;
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => {
            for _ in 0..n {
                out.extend((rng.uniform(-0.3, 0.3) as f32).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for _ in 0..n {
                out.extend(f16_bytes(rng.uniform(-0.3, 0.3) as f32));
            }
        }
        GgmlType::Bf16 => {
            for _ in 0..n {
                out.extend(half::bf16::from_f32(rng.uniform(-0.3, 0.3) as f32).to_le_bytes());
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            for _ in 0..n / 32 {
                out.extend(f16_bytes(rng.uniform(0.005, 0.05) as f32));
                if ty == GgmlType::Q4_1 {
                    out.extend(f16_bytes(rng.uniform(-0.2, 0.0) as f32));
                }
                let len = if ty == GgmlType::Q8_0 { 32 } else { 16 };
                for _ in 0..len {
                    out.push(rng.below(256) as u8);
                }
            }
        }
        _ => unreachable!("the tiny model uses F32, F16, BF16, Q4_0, Q4_1 and Q8_0"),
    }
    out
}

/// The tiny model's GGUF bytes (`seed` picks the weights).
pub fn tiny_gguf(seed: u64) -> Vec<u8> {
    tiny_gguf_with_context(seed, 64)
}

/// [`tiny_gguf`] with a context of `context` positions (xfmr-serve's tests: long streams).
pub fn tiny_gguf_with_context(seed: u64, context: u64) -> Vec<u8> {
    tiny_gguf_with_metadata(seed, context, Vec::new())
}

/// [`tiny_gguf_with_context`] with `extra` metadata pairs written after the model's own: a key
/// written twice takes the later value (the reader keeps the last), so tests can change or add
/// any key (hostile files: a `head_count` that does not divide the width, a hostile chat
/// template...).
pub fn tiny_gguf_with_metadata(seed: u64, context: u64, extra: Vec<(String, Value)>) -> Vec<u8> {
    let mut rng = TestRng::new(seed);
    let (tokens, merges) = tokens();
    let vocab = tokens.len();
    let mut types = vec![Value::I64(1); vocab];
    for t in types.iter_mut().take(3) {
        *t = Value::I64(3);
    }
    let strings = |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
    let template = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let mut w = GgufWriter::new()
        .metadata("general.architecture", Value::String("llama".into()))
        .metadata("llama.block_count", Value::U64(N_LAYERS as u64))
        .metadata("llama.context_length", Value::U64(context))
        .metadata("llama.embedding_length", Value::U64(D_MODEL as u64))
        .metadata("llama.feed_forward_length", Value::U64(D_FF as u64))
        .metadata("llama.attention.head_count", Value::U64(N_HEADS as u64))
        .metadata(
            "llama.attention.head_count_kv",
            Value::U64(N_KV_HEADS as u64),
        )
        .metadata("llama.rope.freq_base", Value::F64(10000.0))
        .metadata("llama.attention.layer_norm_rms_epsilon", Value::F64(1e-5))
        .metadata("llama.vocab_size", Value::U64(vocab as u64))
        .metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::String("smollm".into()))
        .metadata("tokenizer.ggml.tokens", strings(&tokens))
        .metadata("tokenizer.ggml.token_type", Value::Array(types))
        .metadata("tokenizer.ggml.merges", strings(&merges))
        .metadata("tokenizer.ggml.bos_token_id", Value::U64(1))
        .metadata("tokenizer.ggml.eos_token_id", Value::U64(2))
        .metadata("tokenizer.ggml.padding_token_id", Value::U64(2))
        .metadata("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .metadata("tokenizer.chat_template", Value::String(template.into()));
    for (key, value) in extra {
        w = w.metadata(&key, value);
    }
    let kv = N_KV_HEADS * D_MODEL / N_HEADS;
    let mut add = |w: GgufWriter, name: &str, ty: GgmlType, rows: usize, cols: usize| {
        let bytes = blocks(ty, rows, cols, &mut rng);
        let shape: Vec<usize> = if rows == 1 {
            vec![cols]
        } else {
            vec![rows, cols]
        };
        w.tensor_raw(name, &shape, ty, bytes)
    };
    w = add(w, "token_embd.weight", GgmlType::Q8_0, vocab, D_MODEL);
    for i in 0..N_LAYERS {
        let b = format!("blk.{i}.");
        w = add(
            w,
            &format!("{b}attn_norm.weight"),
            GgmlType::F32,
            1,
            D_MODEL,
        );
        w = add(
            w,
            &format!("{b}attn_q.weight"),
            GgmlType::Q4_1,
            D_MODEL,
            D_MODEL,
        );
        w = add(w, &format!("{b}attn_k.weight"), GgmlType::Q4_0, kv, D_MODEL);
        w = add(w, &format!("{b}attn_v.weight"), GgmlType::F16, kv, D_MODEL);
        w = add(
            w,
            &format!("{b}attn_output.weight"),
            GgmlType::Bf16,
            D_MODEL,
            D_MODEL,
        );
        w = add(w, &format!("{b}ffn_norm.weight"), GgmlType::F32, 1, D_MODEL);
        w = add(
            w,
            &format!("{b}ffn_gate.weight"),
            GgmlType::Q8_0,
            D_FF,
            D_MODEL,
        );
        w = add(
            w,
            &format!("{b}ffn_up.weight"),
            GgmlType::Q4_1,
            D_FF,
            D_MODEL,
        );
        w = add(
            w,
            &format!("{b}ffn_down.weight"),
            GgmlType::Q4_1,
            D_MODEL,
            D_FF,
        );
    }
    w = add(w, "output_norm.weight", GgmlType::F32, 1, D_MODEL);
    w.to_bytes()
}
