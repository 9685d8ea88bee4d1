//! `gguf`: arbitrary bytes as a GGUF file, and every reader of a parsed file.
//!
//! [`Gguf::parse`]; when it accepts the bytes: every tensor dequantised (and its blocks checked
//! through `tensor_data`), [`LlamaConfig::from_gguf`], [`GgufTokenizer::from_gguf`] (encoding and
//! decoding a line of text), [`QuantizedLlama::from_gguf`] (and `from_gguf_owned`) and
//! [`LanguageModel::from_gguf_with`] in both weight formats on ndarray. Seeds: the tiny
//! Llama-family file of xfmr-llm's tests.

use burn::backend::NdArray;
use xfmr_llm::{Gguf, GgufTokenizer, LanguageModel, LlamaConfig, QuantizedLlama, WeightFormat};

/// The target's body.
pub fn run(data: &[u8]) {
    let Ok(gguf) = Gguf::parse(data.to_vec()) else {
        return;
    };
    for info in &gguf.tensors {
        if let Ok(values) = gguf.dequantize_info(info) {
            assert_eq!(
                values.len(),
                info.len(),
                "{}: dequantised length",
                info.name
            );
        }
        let _ = gguf.tensor_data(info);
    }
    let _ = LlamaConfig::from_gguf(&gguf);
    if let Ok(tokenizer) = GgufTokenizer::from_gguf(&gguf) {
        if let Ok(ids) = tokenizer.encode("Hello, world! ¿Qué tal? 你好") {
            let _ = tokenizer.decode(&ids);
        }
    }
    if let Ok(model) = QuantizedLlama::from_gguf(&gguf, 0) {
        // One step of the model: a file that loads must also run, and so must the model that
        // takes the file (its blocks interleaved on AVX-512 VNNI).
        let _ = model.attention_weights(&[0]);
        let owned = QuantizedLlama::from_gguf_owned(Gguf::parse(data.to_vec()).unwrap(), 0);
        let _ = owned
            .expect("loads as the borrowing model did")
            .attention_weights(&[0]);
    }
    for format in [WeightFormat::F32, WeightFormat::Quantized] {
        let _ = LanguageModel::<NdArray>::from_gguf_with(&gguf, &Default::default(), format);
    }
}

/// The tiny Llama-family file of xfmr-llm's tests (F32, F16, BF16, Q4_0, Q4_1 and Q8_0
/// tensors, a byte-level BPE vocabulary, a ChatML template).
pub fn seeds() -> Vec<Vec<u8>> {
    vec![crate::tiny::tiny_gguf(1)]
}
