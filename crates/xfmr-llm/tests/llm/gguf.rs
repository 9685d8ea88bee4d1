//! The GGUF reader, tokenizer and loader on files written here: dequantisation by the format's
//! definition, metadata round trips, typed errors for lying, truncated and corrupt files (never
//! a panic, a hang or a huge allocation), the Q/K permutation, and cached decoding.

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use xfmr_llm::gguf::{GgmlType, Gguf, GgufError, GgufWriter, Value};
use xfmr_llm::{llama, LanguageModel, LlmError, Message};
use xfmr_models::ModelError;
use xfmr_testing::{assert_close_slices, to_vec, TestRng};

use crate::tiny::{self, tiny_gguf};
use crate::{assert_cached_equals_full, row, WgpuUnfused};

type B = NdArray;

fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

fn one_tensor(ty: GgmlType, cols: usize, bytes: Vec<u8>) -> Gguf {
    let file = GgufWriter::new()
        .tensor_raw("t", &[cols], ty, bytes)
        .to_bytes();
    Gguf::parse(file).unwrap()
}

#[test]
fn dequantises_each_type_as_the_format_defines_it() {
    // Q4_1: d = 0.5, m = -1; byte j holds j (low nibble) and 15 - j (high nibble).
    let mut block = Vec::new();
    block.extend(f16(0.5));
    block.extend(f16(-1.0));
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let got = one_tensor(GgmlType::Q4_1, 32, block)
        .dequantize("t")
        .unwrap();
    let want: Vec<f32> = (0..16)
        .map(|j| 0.5 * j as f32 - 1.0)
        .chain((0..16).map(|j| 0.5 * (15 - j) as f32 - 1.0))
        .collect();
    assert_eq!(got, want, "Q4_1");

    // Q4_0: d = 2; values (nibble - 8)·d.
    let mut block = f16(2.0).to_vec();
    block.extend((0..16u8).map(|j| j | (j << 4)));
    let got = one_tensor(GgmlType::Q4_0, 32, block)
        .dequantize("t")
        .unwrap();
    let want: Vec<f32> = (0..32).map(|j| 2.0 * ((j % 16) as f32 - 8.0)).collect();
    assert_eq!(got, want, "Q4_0");

    // Q8_0: d = 0.25; signed bytes -16..16.
    let mut block = f16(0.25).to_vec();
    block.extend((-16i8..16).map(|q| q as u8));
    let got = one_tensor(GgmlType::Q8_0, 32, block)
        .dequantize("t")
        .unwrap();
    let want: Vec<f32> = (-16..16).map(|q| 0.25 * q as f32).collect();
    assert_eq!(got, want, "Q8_0");

    // F16, BF16, F32: values exactly representable in each.
    let values = [1.5f32, -2.25, 0.0, 65504.0];
    let bytes = values.iter().flat_map(|&v| f16(v)).collect();
    assert_eq!(
        one_tensor(GgmlType::F16, 4, bytes).dequantize("t").unwrap(),
        values
    );
    let values = [3.0f32, -0.5, 1e30, -7.0];
    let bytes = values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let got = one_tensor(GgmlType::Bf16, 4, bytes)
        .dequantize("t")
        .unwrap();
    assert_eq!(got[..2], values[..2]);
    assert_eq!(got[3], values[3]);
    assert!(
        (got[2] / 1e30 - 1.0).abs() < 1e-2,
        "bf16 keeps 8 bits: {}",
        got[2]
    );
    let values = [0.1f32, -3.5, f32::MIN_POSITIVE, 7.0];
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        one_tensor(GgmlType::F32, 4, bytes).dequantize("t").unwrap(),
        values
    );
}

#[test]
fn metadata_and_directory_round_trip() {
    let file = GgufWriter::new()
        .metadata("a.u", Value::U64(7))
        .metadata("a.i", Value::I64(-3))
        .metadata("a.f", Value::F64(0.25))
        .metadata("a.b", Value::Bool(true))
        .metadata("a.s", Value::String("héllo".into()))
        .metadata(
            "a.arr",
            Value::Array(vec![Value::String("x".into()), Value::String("".into())]),
        )
        .tensor_f32("w", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .tensor_f32("b", &[5], &[0.5; 5])
        .to_bytes();
    let g = Gguf::parse(file).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.get_usize("a.u").unwrap(), 7);
    assert_eq!(g.metadata["a.i"], Value::I64(-3));
    assert_eq!(g.get_f64("a.f").unwrap(), 0.25);
    assert_eq!(g.metadata["a.b"], Value::Bool(true));
    assert_eq!(g.get_str("a.s").unwrap(), "héllo");
    assert_eq!(g.get_strings("a.arr").unwrap(), vec!["x", ""]);
    let w = g.tensor("w").unwrap();
    assert_eq!((w.dims.clone(), w.shape()), (vec![3, 2], vec![2, 3]));
    assert_eq!(w.offset % 32, 0, "data aligned");
    assert_eq!(g.dequantize("w").unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(g.dequantize("b").unwrap(), [0.5; 5]);
    assert!(matches!(g.dequantize("nope"), Err(GgufError::NoTensor(n)) if n == "nope"));
    assert!(matches!(
        g.get_usize("a.s"),
        Err(GgufError::Metadata { key, .. }) if key == "a.s"
    ));
}

/// A header claiming `counts` entries with nothing behind them.
fn header(n_tensors: u64, n_metadata: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(n_tensors.to_le_bytes());
    out.extend(n_metadata.to_le_bytes());
    out
}

#[test]
fn lying_counts_are_refused_before_allocating() {
    for (tensors, metadata) in [(u64::MAX, 0), (0, u64::MAX), (1 << 40, 1 << 40)] {
        let err = Gguf::parse(header(tensors, metadata)).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }
    // A key claiming 2^62 bytes (its length at offset 24, its bytes from 32).
    let mut file = header(0, 1);
    file.extend((1u64 << 62).to_le_bytes());
    file.extend([b'k'; 16]);
    let err = Gguf::parse(file).unwrap_err();
    assert!(
        matches!(err, GgufError::Truncated { offset: 32, needed, available: 16, .. } if needed == 1 << 62),
        "{err}"
    );
    // An array claiming 2^60 strings.
    let mut file = header(0, 1);
    file.extend(1u64.to_le_bytes());
    file.push(b'k');
    file.extend(9u32.to_le_bytes());
    file.extend(8u32.to_le_bytes());
    file.extend((1u64 << 60).to_le_bytes());
    let err = Gguf::parse(file).unwrap_err();
    assert!(err.to_string().contains("array \"k\""), "{err}");
    // A tensor whose dimensions overflow, and one larger than the file.
    for dims in [[u64::MAX, 4], [1 << 20, 1 << 20]] {
        let mut file = header(1, 0);
        file.extend(1u64.to_le_bytes());
        file.push(b't');
        file.extend(2u32.to_le_bytes());
        dims.iter().for_each(|d| file.extend(d.to_le_bytes()));
        file.extend(0u32.to_le_bytes());
        file.extend(0u64.to_le_bytes());
        let err = Gguf::parse(file).unwrap_err();
        assert!(err.to_string().contains("\"t\""), "names the tensor: {err}");
    }
    assert!(matches!(
        Gguf::parse(b"GGML\x03\0\0\0".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(
        Gguf::parse(b"GGUF\x09\0\0\0".to_vec()),
        Err(GgufError::UnsupportedVersion(9))
    ));
}

#[test]
fn unknown_and_unsupported_types_are_named() {
    let file = GgufWriter::new()
        .tensor_raw("iq2", &[256], GgmlType::Other(16), vec![0; 66])
        .to_bytes();
    let g = Gguf::parse(file).unwrap();
    let err = g.dequantize("iq2").unwrap_err();
    assert!(
        matches!(&err, GgufError::UnsupportedType { tensor, ty: GgmlType::Other(16) } if tensor == "iq2"),
        "{err}"
    );
    let file = GgufWriter::new()
        .tensor_raw("weird", &[32], GgmlType::Other(99), vec![0; 32])
        .to_bytes();
    let err = Gguf::parse(file).unwrap_err();
    assert!(
        matches!(&err, GgufError::UnknownType { tensor, type_id: 99, offset: 24 } if tensor == "weird"),
        "{err}"
    );
    // A quantised row that is not whole blocks.
    let file = GgufWriter::new()
        .tensor_raw("short", &[16], GgmlType::Q8_0, vec![0; 34])
        .to_bytes();
    let err = Gguf::parse(file).unwrap_err();
    assert!(err.to_string().contains("not whole blocks"), "{err}");
}

#[test]
fn every_truncation_is_an_error() {
    let file = tiny_gguf(1);
    assert!(Gguf::parse(file.clone()).is_ok());
    for len in 0..file.len() {
        let result = Gguf::parse(file[..len].to_vec());
        assert!(
            result.is_err(),
            "a file cut at {len} of {} parsed",
            file.len()
        );
    }
}

#[test]
fn corrupt_bytes_give_errors_or_models_never_panics() {
    let file = tiny_gguf(2);
    let device = Default::default();
    let mut rng = TestRng::new(3);
    let (mut loaded, mut refused) = (0, 0);
    // Every byte of the header (metadata and directory), inverted; then random flips anywhere.
    let data_start = Gguf::parse(file.clone()).unwrap().tensors[0].offset;
    let mut cases: Vec<Vec<(usize, u8)>> = (0..data_start).map(|i| vec![(i, 0xff)]).collect();
    for _ in 0..300 {
        let n = 1 + rng.below(4);
        cases.push(
            (0..n)
                .map(|_| (rng.below(file.len()), 1u8 << rng.below(8)))
                .collect(),
        );
    }
    for flips in cases {
        let mut bytes = file.clone();
        for &(i, mask) in &flips {
            bytes[i] ^= mask;
        }
        match Gguf::parse(bytes) {
            Err(_) => refused += 1,
            Ok(g) => match LanguageModel::<B>::from_gguf(&g, &device) {
                Ok(_) => loaded += 1,
                Err(_) => refused += 1,
            },
        }
    }
    // Both outcomes occur: flips in weights load; flips in structure are refused.
    assert!(
        loaded > 0 && refused > 0,
        "loaded {loaded}, refused {refused}"
    );
}

#[test]
fn a_missing_tensor_is_reported_by_name() {
    let g = Gguf::parse(tiny_gguf(4)).unwrap();
    let config = llama::LlamaConfig::from_gguf(&g).unwrap();
    let mut dict = llama::state_dict(&g, &config).unwrap();
    assert!(dict.remove("blk.1.ffn_down.weight"));
    dict.insert("extra.weight", vec![1], vec![0.0]);
    let model = config.to_config(2).init::<B>(&Default::default()).unwrap();
    let err = llama::load_weights(model, &dict).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("blk.1.ffn_down.weight"), "{text}");
    assert!(text.contains("extra.weight"), "{text}");
    assert!(matches!(err, LlmError::Model(ModelError::Block(_))));
}

#[test]
fn config_comes_from_the_metadata() {
    let g = Gguf::parse(tiny_gguf(5)).unwrap();
    let c = llama::LlamaConfig::from_gguf(&g).unwrap();
    assert_eq!(
        (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads),
        (
            tiny::N_LAYERS,
            tiny::D_MODEL,
            tiny::D_FF,
            tiny::N_HEADS,
            tiny::N_KV_HEADS
        )
    );
    assert_eq!(c.vocab_size, tiny::tokens().0.len());
    assert!(c.tie_embeddings);
    assert_eq!(
        c.cache_bytes_per_token(4),
        2 * tiny::N_LAYERS * tiny::N_KV_HEADS * (tiny::D_MODEL / tiny::N_HEADS) * 4
    );
}

/// llama.cpp's permutation (its converter's `permute`): within each head, Hugging Face's row
/// `s·d/2 + i` is stored at `2i + s`. Written here from the converter's definition, apart from
/// the crate's inverse.
fn llama_cpp_permute(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let d = values.len() / cols / heads;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for s in 0..2 {
            for i in 0..d / 2 {
                let hf = (h * d + s * d / 2 + i) * cols;
                let stored = (h * d + 2 * i + s) * cols;
                out[stored..stored + cols].copy_from_slice(&values[hf..hf + cols]);
            }
        }
    }
    out
}

#[test]
fn unpermuted_rows_with_half_split_rope_equal_stored_rows_with_interleaved_pairs() {
    let g = Gguf::parse(tiny_gguf(6)).unwrap();
    let device = Default::default();
    let config = llama::LlamaConfig::from_gguf(&g).unwrap();
    let dict = llama::state_dict(&g, &config).unwrap();
    let half_split =
        llama::load_weights(config.to_config(2).init::<B>(&device).unwrap(), &dict).unwrap();
    // The stored (permuted) rows, straight from the file, under interleaved-pair RoPE.
    let mut stored = dict.clone();
    for i in 0..config.n_layers {
        for (name, heads) in [("attn_q", config.n_heads), ("attn_k", config.n_kv_heads)] {
            let name = format!("blk.{i}.{name}.weight");
            let (shape, values) = dict.get(&name).unwrap();
            let permuted = llama_cpp_permute(values, heads, shape[1]);
            assert_eq!(permuted, g.dequantize(&name).unwrap(), "{name}: as stored");
            stored.insert(name, shape.to_vec(), permuted);
        }
    }
    let interleaved_config =
        config
            .to_config(2)
            .with_positions(xfmr_blocks::PositionEncoding::Rotary {
                theta: config.rope_theta,
                layout: xfmr_blocks::RotaryLayout::Interleaved,
            });
    let interleaved =
        llama::load_weights(interleaved_config.init::<B>(&device).unwrap(), &stored).unwrap();
    let ids = row::<B>(&[5, 100, 7, 259, 3, 42, 200, 9], &device);
    let a = half_split.forward(ids.clone()).unwrap();
    let b = interleaved.forward(ids).unwrap();
    let shape = a.dims();
    assert_close_slices(
        &to_vec(&a),
        &shape,
        &to_vec(&b),
        &b.dims(),
        1e-5,
        1e-5,
        "half-split vs interleaved",
    );
}

/// Cached decoding equals full recomputation (≤ 1e-4) on backend `B2`.
fn cached_equals_full_on<B2: Backend>() {
    let g = Gguf::parse(tiny_gguf(7)).unwrap();
    let lm = LanguageModel::<B2>::from_gguf(&g, &Default::default()).unwrap();
    let prompt = [10, 20, 30, 259, 40];
    let steps = 6;
    let state = assert_cached_equals_full(lm.f32_model().unwrap(), &prompt, steps, 1e-4, 1e-4);
    // Grouped heads are cached once: bytes per token from the configuration.
    assert_eq!(state.cache.len(), prompt.len() + steps - 1);
    assert_eq!(
        state.cache.bytes(),
        state.cache.len() * lm.config.cache_bytes_per_token(4),
    );
}

#[test]
fn cached_decoding_equals_full_recomputation() {
    cached_equals_full_on::<B>();
}

/// The same on wgpu without burn's kernel fusion. With fusion (`burn::backend::Wgpu`) the first
/// cached step after the prompt is wrong (logits off by ~2): upstream bug tracel-ai/burn#5257
/// (fusion + autotune, cached/incremental forward); the unfused backend is exact here, and it
/// is what `xfmr generate --backend wgpu` runs.
#[test]
fn cached_decoding_equals_full_recomputation_on_unfused_wgpu() {
    cached_equals_full_on::<WgpuUnfused>();
}

#[test]
fn tokenizer_applies_merges_and_keeps_control_tokens_whole() {
    let g = Gguf::parse(tiny_gguf(8)).unwrap();
    let tok = xfmr_llm::GgufTokenizer::from_gguf(&g).unwrap();
    // Token ids: 3 control tokens, then byte b at 3 + b, then the merges' results in order.
    let byte = |c: char| 3 + c as u32;
    let (he, hell) = (259, 263);
    let ids = tok.encode("the hello").unwrap();
    assert_eq!(ids, vec![byte('t'), he, byte(' '), hell, byte('o')]);
    assert_eq!(tok.decode(&ids).unwrap(), "the hello");
    let ids = tok.encode("<|im_start|>user\nhe<|im_end|>").unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(*ids.last().unwrap(), 2);
    assert_eq!(&ids[1..ids.len() - 1], tok.encode("user\nhe").unwrap());
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "user\nhe",
        "special tokens skipped"
    );
    assert_eq!(
        (tok.eos_id(), tok.pad_id(), tok.bos_id(), tok.add_bos()),
        (2, 2, Some(1), false)
    );
}

#[test]
fn streamed_text_never_splits_a_character() {
    let g = Gguf::parse(tiny_gguf(9)).unwrap();
    let tok = xfmr_llm::GgufTokenizer::from_gguf(&g).unwrap();
    let text = "é 日本 🦀 the hello";
    let ids = tok.encode(text).unwrap();
    assert!(
        ids.len() > text.chars().count(),
        "multi-byte characters span tokens"
    );
    let mut stream = tok.stream();
    let pieces: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    assert!(
        pieces.iter().any(String::is_empty),
        "incomplete characters wait"
    );
    assert_eq!(pieces.concat(), text);
}

#[test]
fn chat_template_renders_chatml_with_the_default_system_message() {
    let g = Gguf::parse(tiny_gguf(10)).unwrap();
    let device = Default::default();
    let lm = LanguageModel::<B>::from_gguf(&g, &device).unwrap();
    let prompt = lm.chat_prompt(&[Message::new("user", "Hi?")]).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are tiny.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    );
    let own = lm
        .chat_prompt(&[
            Message::new("system", "Be brief."),
            Message::new("user", "Hi?"),
        ])
        .unwrap();
    assert!(
        own.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"),
        "{own}"
    );
    // Streaming completion of the rendered prompt, stopped by the token limit or the end id.
    let options = lm.greedy(5);
    let mut streamed = String::new();
    let done = lm
        .complete(&prompt, &options, |t| streamed.push_str(t))
        .unwrap();
    assert_eq!(streamed, done.text);
    assert!(done.tokens.len() <= 5);
    assert_eq!(
        done.prompt_tokens,
        lm.tokenizer.encode(&prompt).unwrap().len()
    );
}

/// The key a metadata refusal names, through either error type.
fn refused_key(err: &LlmError) -> Option<&str> {
    match err {
        LlmError::Gguf(GgufError::Metadata { key, .. }) => Some(key),
        _ => None,
    }
}

/// Each metadata refusal of the Llama configuration (`LlamaConfig::from_gguf`, and through it
/// `QuantizedLlama::from_gguf` and `LanguageModel::from_gguf`) and of the file's tokenizer
/// (`GgufTokenizer::from_gguf`): one key of the tiny file changed, mistyped or removed at a
/// time, and the error is `GgufError::Metadata` naming that key, or the tensor whose shape
/// the metadata contradicts. (The flip sweep above shows that damaged files are refused, not
/// what the refusal says.)
#[test]
fn gguf_metadata_refusals_name_the_key() {
    let file = tiny_gguf(6);
    let base = Gguf::parse(file.clone()).unwrap();
    let vocab = tiny::tokens().0.len() as u64;
    let text = |s: &str| Some(Value::String(s.into()));
    let model_cases: [(&str, Option<Value>, &str); 14] = [
        ("general.architecture", text("gpt2"), "general.architecture"),
        (
            "llama.attention.head_count",
            None,
            "llama.attention.head_count",
        ),
        ("llama.context_length", None, "llama.context_length"),
        (
            "llama.embedding_length",
            Some(Value::U64(48)),
            "llama.embedding_length",
        ),
        (
            "llama.embedding_length",
            text("32"),
            "llama.embedding_length",
        ),
        (
            "llama.vocab_size",
            Some(Value::U64(vocab + 1)),
            "llama.vocab_size",
        ),
        (
            "llama.rope.dimension_count",
            Some(Value::U64(4)),
            "llama.rope.dimension_count",
        ),
        (
            "llama.block_count",
            Some(Value::U64(0)),
            "llama.block_count",
        ),
        (
            "llama.block_count",
            Some(Value::U64(1 << 40)),
            "llama.block_count",
        ),
        (
            "llama.attention.head_count",
            Some(Value::U64(3)),
            "llama.attention.head_count",
        ),
        (
            "llama.attention.head_count_kv",
            Some(Value::U64(3)),
            "llama.attention.head_count_kv",
        ),
        (
            "llama.feed_forward_length",
            Some(Value::U64(63)),
            "blk.0.ffn_up.weight",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Some(Value::F64(0.0)),
            "llama.attention.layer_norm_rms_epsilon",
        ),
        (
            "llama.rope.freq_base",
            Some(Value::F64(1.0)),
            "llama.rope.freq_base",
        ),
    ];
    let edited = |key: &str, value: &Option<Value>| {
        let mut g = Gguf::parse(file.clone()).unwrap();
        match value {
            Some(v) => g.metadata.insert(key.to_string(), v.clone()),
            None => g.metadata.remove(key),
        };
        g
    };
    for (key, value, named) in &model_cases {
        let g = edited(key, value);
        let case = format!("{key} = {value:?}");
        match llama::LlamaConfig::from_gguf(&g) {
            Err(GgufError::Metadata { key, .. }) => assert_eq!(key, *named, "{case}"),
            other => panic!("{case}: expected metadata {named:?} refused, got {other:?}"),
        }
        let err = xfmr_llm::quantized::QuantizedLlama::from_gguf(&g, 0).unwrap_err();
        assert_eq!(refused_key(&err), Some(*named), "{case}: {err}");
        let err = LanguageModel::<B>::from_gguf(&g, &Default::default()).unwrap_err();
        assert_eq!(refused_key(&err), Some(*named), "{case}: {err}");
    }
    let tokenizer_cases: [(&str, Option<Value>, &str); 7] = [
        (
            "tokenizer.ggml.model",
            text("llama"),
            "tokenizer.ggml.model",
        ),
        (
            "tokenizer.ggml.pre",
            text("no-such-split"),
            "tokenizer.ggml.pre",
        ),
        ("tokenizer.ggml.merges", None, "tokenizer.ggml.merges"),
        (
            "tokenizer.ggml.tokens",
            Some(Value::Array(vec![Value::U64(1)])),
            "tokenizer.ggml.tokens",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            None,
            "tokenizer.ggml.eos_token_id",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            Some(Value::U64(vocab)),
            "tokenizer.ggml.eos_token_id",
        ),
        (
            "tokenizer.ggml.bos_token_id",
            Some(Value::U64(vocab + 5)),
            "tokenizer.ggml.bos_token_id",
        ),
    ];
    for (key, value, named) in &tokenizer_cases {
        let g = edited(key, value);
        let err = xfmr_llm::GgufTokenizer::from_gguf(&g).unwrap_err();
        assert_eq!(refused_key(&err), Some(*named), "{key} = {value:?}: {err}");
    }
    // The unedited file loads through all of them.
    llama::LlamaConfig::from_gguf(&base).unwrap();
    xfmr_llm::GgufTokenizer::from_gguf(&base).unwrap();
}
