//! The server with the real models (`--ignored`: they need `xfmr fetch-model smollm2` and
//! `xfmr fetch-model minilm`): SmolLM2's chat through its template, MiniLM's embeddings equal to
//! the library's, as floats and as base64.

use base64::Engine as _;
use serde_json::json;
use xfmr_llm::{fetch, LanguageModel, Message, WeightFormat};
use xfmr_sentence::SentenceEncoder;
use xfmr_serve::{ServeConfig, Server};

use crate::client::post;
use crate::server::B;

fn smollm2() -> LanguageModel<B> {
    let path = fetch::find_smollm2().unwrap_or_else(|| {
        panic!("SmolLM2 is not in the cache: run `cargo run -p xfmr-cli -- fetch-model smollm2`")
    });
    LanguageModel::from_file_with(&path, &Default::default(), WeightFormat::Quantized).unwrap()
}

fn minilm() -> SentenceEncoder<B> {
    let dir = xfmr_sentence::fetch::find_minilm().unwrap_or_else(|| {
        panic!("MiniLM is not in the cache: run `cargo run -p xfmr-cli -- fetch-model minilm`")
    });
    SentenceEncoder::from_dir(&dir, &Default::default()).unwrap()
}

#[test]
#[ignore = "needs SmolLM2 and MiniLM: `cargo run -p xfmr-cli -- fetch-model smollm2` and `... fetch-model minilm`, then `cargo test --workspace -- --ignored`"]
fn serve_smollm2_chat_and_minilm_embeddings() {
    let server = Server::<B>::new(ServeConfig::default())
        .llm("smollm2", smollm2())
        .unwrap()
        .embeddings("minilm", minilm())
        .unwrap()
        .start("127.0.0.1:0")
        .unwrap();
    let addr = server.addr();
    // Chat: the same reply as the library's greedy completion of the templated prompt.
    let lm = smollm2();
    let question = "What is the capital of France? Answer in one word.";
    let prompt = lm.chat_prompt(&[Message::new("user", question)]).unwrap();
    let expected = lm.complete(&prompt, &lm.greedy(24), |_| {}).unwrap();
    let r = post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "smollm2", "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": question}]}),
    );
    assert_eq!(r.status, 200, "{}", r.json());
    let body = r.json();
    assert_eq!(
        body["choices"][0]["message"]["content"],
        expected.text.as_str()
    );
    assert!(expected.text.contains("Paris"), "{}", expected.text);
    assert_eq!(body["usage"]["prompt_tokens"], expected.prompt_tokens);

    // Embeddings: the library's vectors, as floats and as base64 little-endian f32.
    let sentences = ["A man is eating food.", "A man is riding a horse."];
    let want = minilm().embed(&sentences).unwrap();
    for format in ["float", "base64"] {
        let r = post(
            addr,
            "/v1/embeddings",
            &json!({"model": "minilm", "input": sentences, "encoding_format": format}),
        )
        .json();
        for (i, w) in want.iter().enumerate() {
            let e = &r["data"][i]["embedding"];
            let got: Vec<f32> = match format {
                "float" => e
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect(),
                _ => base64::engine::general_purpose::STANDARD
                    .decode(e.as_str().unwrap())
                    .unwrap()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            };
            assert_eq!(&got, w, "{format} embedding {i}");
        }
        assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() >= 12);
    }
    // Attention for each: MiniLM's rows sum to one over its [CLS] ... [SEP] tokens.
    let r = post(
        addr,
        "/v1/attention",
        &json!({"model": "minilm", "input": sentences[0]}),
    )
    .json();
    assert_eq!(r["maps"][0]["queries"][0], "[CLS]");
    assert_eq!(r["maps"][0]["layers"], 6);
    let r = post(
        addr,
        "/v1/attention",
        &json!({"model": "smollm2", "input": "The capital"}),
    )
    .json();
    assert_eq!(r["maps"][0]["heads"], 9);
}
