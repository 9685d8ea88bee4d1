//! The server with the tiny models: every endpoint's happy path against the library's own
//! answers, streaming chunk by chunk, bad input, a client leaving mid-stream, and eight
//! concurrent streams decoding as each would alone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, NdArray};
use serde_json::{json, Value};
use xfmr_llm::decode::{self, DecodeRequest};
use xfmr_llm::{Gguf, LanguageModel, LmWeights, WeightFormat};
use xfmr_models::generate::{SampleOptions, Sampler};
use xfmr_models::{GenerationOptions, Transformer, TransformerConfig};
use xfmr_serve::{RunningServer, ServeConfig, Server};
use xfmr_train::{encode_pairs, TrainConfig, Trainer, Translation};
use xfmr_translate::data::parse_tsv;
use xfmr_translate::{translate, translation_attention, SubwordTokenizer};

use crate::client::{get, post, request, Events};
use crate::tiny::tiny_gguf_with_context;

pub type B = NdArray;

/// The tiny LLM's name on the server, and its context (long: streams of hundreds of tokens).
pub const LLM: &str = "tiny";
const CONTEXT: u64 = 4096;
/// The translation run's name.
pub const TRANSLATION: &str = "es-en-tiny";
/// The embedded sample the CLI trains on by default.
const SAMPLE: &str = include_str!("../../../xfmr-cli/data/sample_es_en.tsv");
/// The tiny model's end token (its GGUF says so).
const EOS: u32 = 2;

pub fn tiny_lm() -> LanguageModel<B> {
    let gguf = Gguf::parse(tiny_gguf_with_context(7, CONTEXT)).unwrap();
    LanguageModel::from_gguf_with(&gguf, &Default::default(), WeightFormat::Quantized).unwrap()
}

/// A translation run trained for a few steps here (once per test binary): its directory.
pub fn translation_run() -> &'static Path {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &RUN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join(TRANSLATION);
        let pairs = parse_tsv(SAMPLE.as_bytes(), Path::new("sample_es_en.tsv")).unwrap();
        let pairs = &pairs[..pairs.len().min(300)];
        let tokenizer = SubwordTokenizer::train(
            pairs.iter().flat_map(|p| [p.src.as_str(), p.tgt.as_str()]),
            400,
        )
        .unwrap();
        std::fs::create_dir_all(&run).unwrap();
        xfmr_train::RunDir::new(&run)
            .write_tokenizer(&tokenizer)
            .unwrap();
        let examples = encode_pairs(&tokenizer, pairs).unwrap();
        let objective =
            Translation::for_tokenizer(TransformerConfig::tiny(tokenizer.vocab_size()), &tokenizer);
        let config = TrainConfig::new()
            .with_steps(6)
            .with_max_tokens(512)
            .with_warmup(4)
            .with_eval_every(1000)
            .with_checkpoint_every(1000)
            .with_average(1);
        let mut trainer = Trainer::<Autodiff<B>, Translation>::open(
            &run,
            objective,
            config,
            examples.clone(),
            &Default::default(),
        )
        .unwrap();
        trainer
            .run(&run, &examples[..8], &mut xfmr_train::trainer::Silent)
            .unwrap();
        (dir, run)
    })
    .1
}

pub fn translation_model() -> (Transformer<B>, SubwordTokenizer) {
    xfmr_train::RunDir::new(translation_run())
        .load_model::<B, TransformerConfig>(&Default::default())
        .unwrap()
}

/// A server with both tiny models and `config`.
pub fn start(config: ServeConfig) -> RunningServer {
    let (model, tokenizer) = translation_model();
    Server::<B>::new(config)
        .llm(LLM, tiny_lm())
        .unwrap()
        .translation(TRANSLATION, model, tokenizer)
        .unwrap()
        .start("127.0.0.1:0")
        .unwrap()
}

/// One server with the default limits, shared by the tests that do not need their own.
fn shared() -> SocketAddr {
    static SERVER: OnceLock<RunningServer> = OnceLock::new();
    SERVER.get_or_init(|| start(ServeConfig::default())).addr()
}

/// `{"error": {...}}` with this status, type, param and code.
#[track_caller]
fn assert_error(
    response: &crate::client::Response,
    status: u16,
    param: Option<&str>,
    code: Option<&str>,
) -> Value {
    let body = response.json();
    assert_eq!(response.status, status, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    // OpenAI's error types: limits of rate, faults of the server, the request's own.
    let kind = match status {
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    };
    assert_eq!(e["type"], kind, "{body}");
    assert_eq!(e["param"].as_str(), param, "{body}");
    assert_eq!(e["code"].as_str(), code, "{body}");
    body
}

/// The tiny model's greedy completion of `prompt` through the library's search
/// (`xfmr_models::generate::search` over `QuantizedSteps`), decoded alone: a path apart from
/// the decoding loop that the server and `xfmr generate` share.
fn library_greedy(prompt: &str, max_tokens: usize) -> String {
    library_search(prompt, &GenerationOptions::greedy(max_tokens, EOS, 0))
}

/// [`library_greedy`] with the end token banned (as `logit_bias` −100 does: a bias so low it is
/// never the argmax).
fn library_greedy_banned(prompt: &str, tokens: usize) -> String {
    library_search(
        prompt,
        &GenerationOptions::greedy(tokens, EOS, 0).with_min_len(tokens),
    )
}

/// `prompt` continued by `xfmr_models::generate` on the tiny quantised model, as text.
fn library_search(prompt: &str, options: &GenerationOptions) -> String {
    let lm = tiny_lm();
    let LmWeights::Quantized(model) = &lm.model else {
        panic!("quantised weights asked for")
    };
    let ids = lm.tokenizer.encode(prompt).unwrap();
    let options = GenerationOptions {
        pad_id: lm.tokenizer.pad_id(),
        ..options.clone()
    };
    let tokens = model
        .generate_streaming(&[ids], &options, &mut |_, _| {})
        .unwrap()
        .best_tokens()
        .remove(0);
    lm.tokenizer.decode(&tokens).unwrap()
}

#[test]
fn serve_health_and_models() {
    let addr = shared();
    let health = get(addr, "/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
    assert_eq!(health.json()["llm"]["model"], LLM);
    assert_eq!(health.json()["llm"]["decoding"], true);
    let models = get(addr, "/v1/models").json();
    assert_eq!(models["object"], "list");
    let listed: Vec<(&str, &str)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, [(LLM, "llm"), (TRANSLATION, "translation")]);
    assert!(models["data"][0]["created"].as_u64().unwrap() > 1_700_000_000);
}

/// `xfmr serve` and `xfmr generate` (which runs `LanguageModel::complete`) decode through the
/// one loop (`xfmr_llm::decode`): the server's batched engine gives the greedy text of the
/// library's tensor search and of `complete`, and with a seed the sampled text of the loop
/// given the same request.
#[test]
fn decode_loop_serve_equals_xfmr_generate() {
    let addr = shared();
    for prompt in ["hello there", "the hello"] {
        let r = post(
            addr,
            "/v1/completions",
            &json!({"model": LLM, "prompt": prompt, "max_tokens": 12, "temperature": 0}),
        );
        assert_eq!(r.status, 200, "{}", r.json());
        let body = r.json();
        assert_eq!(body["object"], "text_completion");
        let choice = &body["choices"][0];
        assert_eq!(choice["text"], library_greedy(prompt, 12), "{body}");
        let lm = tiny_lm();
        let generate = lm.complete(prompt, &GenerationOptions::greedy(12, EOS, 0), |_| {});
        assert_eq!(choice["text"], generate.unwrap().text.as_str(), "{body}");
        let completion = body["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(completion <= 12);
        assert_eq!(
            choice["finish_reason"],
            if completion == 12 { "length" } else { "stop" }
        );
        let prompt_tokens = tiny_lm().tokenizer.encode(prompt).unwrap().len() as u64;
        assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens);
        assert_eq!(body["usage"]["total_tokens"], prompt_tokens + completion);
    }
    // `min_tokens` holds the end tokens off as the library's `min_len` does.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hello there", "max_tokens": 12, "min_tokens": 12, "temperature": 0}),
    )
    .json();
    assert_eq!(
        r["choices"][0]["text"],
        library_greedy_banned("hello there", 12),
        "{r}"
    );
    assert_eq!(r["usage"]["completion_tokens"], 12, "{r}");
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 4, "min_tokens": 5}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "min_tokens");
    // Several prompts in one request: one choice each, in order, as alone.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": ["hello there", "the hello"], "max_tokens": 12, "temperature": 0}),
    )
    .json();
    assert_eq!(r["choices"][0]["text"], library_greedy("hello there", 12));
    assert_eq!(r["choices"][1]["text"], library_greedy("the hello", 12));
    assert_eq!(r["choices"][1]["index"], 1);

    // Seeded sampling: the server's request and the library's loop given the same sampler
    // (temperature, top-p, seed, the end token's bias) draw the same tokens.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 20, "temperature": 0.9, "top_p": 0.95,
                "seed": 4, "logit_bias": {EOS.to_string(): -100}}),
    )
    .json();
    let lm = tiny_lm();
    let LmWeights::Quantized(model) = &lm.model else {
        panic!("quantised weights asked for")
    };
    let sampler = Sampler::new(Some(SampleOptions {
        temperature: 0.9,
        top_k: None,
        top_p: Some(0.95),
        seed: 4,
    }))
    .with_logit_bias(vec![(EOS, -100.0)]);
    let prompt = lm.tokenizer.encode("hello").unwrap();
    let request = DecodeRequest::greedy(&lm.tokenizer, 20).with_sampler(sampler);
    let library =
        decode::decode(model, &lm.tokenizer, &prompt, request, None, &mut |_| {}).unwrap();
    let text = lm.tokenizer.decode(&library.tokens).unwrap();
    assert_eq!(r["choices"][0]["text"], text.as_str());
    assert_eq!(
        r["usage"]["completion_tokens"].as_u64(),
        Some(library.tokens.len() as u64)
    );
}

/// Prefix caching across requests: a prompt that begins as an earlier one did is fed only the
/// rest (`usage.prompt_tokens_details.cached_tokens` says how many were not, `/health` counts
/// them), its whole conversation is kept when it ends, and the text is the library's greedy
/// decoding with or without the cache.
#[test]
fn serve_prefix_cache_skips_shared_prompt_tokens_and_changes_no_text() {
    let lm = tiny_lm();
    let ids = |text: &str| lm.tokenizer.encode(text).unwrap();
    let shared_len = |a: &[u32], b: &[u32]| {
        let n = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        n.min(b.len() - 1)
    };
    let (first, second) = ("hello there the hello", "hello there hello the");
    let complete = |addr: SocketAddr, prompt: &str| {
        let body = json!({"model": LLM, "prompt": prompt, "max_tokens": 8, "temperature": 0});
        let r = post(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.json());
        let r = r.json();
        assert_eq!(
            r["choices"][0]["text"],
            library_greedy(prompt, 8),
            "{prompt:?}: {r}"
        );
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap() as usize
    };
    let server = start(ServeConfig::default());
    let addr = server.addr();
    assert_eq!(complete(addr, first), 0, "a fresh server has nothing kept");
    let expected = shared_len(&ids(first), &ids(second));
    assert!(expected > 0, "the two prompts share a prefix");
    assert_eq!(
        complete(addr, second),
        expected,
        "the prefix shared with the first"
    );
    assert_eq!(
        complete(addr, first),
        ids(first).len() - 1,
        "the first prompt again: all but its last token"
    );
    let health = get(addr, "/health").json();
    assert_eq!(
        health["llm"]["cached_tokens"].as_u64().unwrap() as usize,
        expected + ids(first).len() - 1
    );
    let off = start(ServeConfig {
        prefix_cache_bytes: 0,
        ..ServeConfig::default()
    });
    assert_eq!(complete(off.addr(), first), 0);
    assert_eq!(complete(off.addr(), first), 0, "no cache, nothing reused");
}

#[test]
fn serve_chat_uses_the_template_and_streams_chunk_by_chunk() {
    let addr = shared();
    let messages = json!([{"role": "user", "content": "hello"}]);
    let lm = tiny_lm();
    let prompt = lm
        .chat_prompt(&[xfmr_llm::Message::new("user", "hello")])
        .unwrap();
    // Banning the end token makes the reply exactly `max_tokens` long.
    let request = json!({"model": LLM, "messages": messages, "max_tokens": 20, "temperature": 0,
                         "logit_bias": {EOS.to_string(): -100}});
    let whole = post(addr, "/v1/chat/completions", &request).json();
    assert_eq!(whole["object"], "chat.completion");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 20);
    assert_eq!(
        whole["usage"]["prompt_tokens"],
        lm.tokenizer.encode(&prompt).unwrap().len()
    );
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let mut events = Events::open(addr, "/v1/chat/completions", &streamed);
    assert_eq!(events.status, 200);
    assert!(events
        .headers
        .iter()
        .any(|(n, v)| n == "content-type" && v.starts_with("text/event-stream")));
    // The first chunk arrives on its own, before the rest is asked for.
    let first: Value = serde_json::from_str(&events.next_data().unwrap()).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let mut pieces = vec![first["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap()
        .to_string()];
    let rest = events.rest();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = rest[..rest.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let (usage, chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 20);
    let (last, content) = chunks.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    for c in content {
        assert_eq!(c["id"], first["id"]);
        assert!(c["choices"][0]["finish_reason"].is_null());
        pieces.push(c["choices"][0]["delta"]["content"].as_str().unwrap().into());
    }
    assert!(pieces.len() >= 10, "one chunk per token or so: {pieces:?}");
    assert_eq!(pieces.concat(), text);
}

#[test]
fn serve_stop_strings_end_the_text_before_them() {
    let addr = shared();
    let base = json!({"prompt": "hello there", "max_tokens": 40, "temperature": 0,
                      "logit_bias": {EOS.to_string(): -100}});
    let full = post(addr, "/v1/completions", &base).json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    // A stop string taken from the middle of the full text: the text ends right before it.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 12, "{full:?}");
    let stop: String = chars[8..11].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut req = base.clone();
        req["stop"] = json!([stop, "\u{1F600}never"]);
        req["stream"] = json!(stream);
        let text = if stream {
            Events::open(addr, "/v1/completions", &req)
                .rest()
                .iter()
                .filter(|d| *d != "[DONE]")
                .map(|d| {
                    serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect::<String>()
        } else {
            let r = post(addr, "/v1/completions", &req).json();
            assert_eq!(r["choices"][0]["finish_reason"], "stop");
            r["choices"][0]["text"].as_str().unwrap().to_string()
        };
        assert_eq!(text, expected, "stream: {stream}, stop {stop:?}");
    }
}

#[test]
fn serve_seeded_sampling_is_reproducible() {
    let addr = shared();
    let req = |seed: u64| {
        json!({"prompt": "hello", "max_tokens": 30, "temperature": 1.0, "top_p": 0.9,
               "seed": seed, "logit_bias": {EOS.to_string(): -100}})
    };
    let text =
        |seed| post(addr, "/v1/completions", &req(seed)).json()["choices"][0]["text"].clone();
    assert_eq!(text(1), text(1));
    assert_ne!(text(1), text(2), "two seeds, 30 sampled tokens");
}

#[test]
fn serve_translations_equal_the_library() {
    let addr = shared();
    let (model, tokenizer) = translation_model();
    let inputs = [
        "En el principio creó Dios los cielos y la tierra.",
        "Y dijo Dios",
    ];
    let r = post(
        addr,
        "/v1/translations",
        &json!({"model": TRANSLATION, "input": inputs, "beam": 3, "n_best": 2, "max_tokens": 20}),
    );
    assert_eq!(r.status, 200, "{}", r.json());
    let body = r.json();
    let options = GenerationOptions::greedy(20, tokenizer.eos_id(), tokenizer.pad_id())
        .with_strategy(xfmr_models::Strategy::Beam(xfmr_models::BeamOptions {
            beam_size: 3,
            n_best: 2,
            ..Default::default()
        }));
    let expected = translate(&model, &tokenizer, &inputs, &options, 32).unwrap();
    for (i, candidates) in expected.iter().enumerate() {
        let got = body["data"][i]["translations"].as_array().unwrap();
        assert_eq!(got.len(), 2);
        for (g, c) in got.iter().zip(candidates) {
            assert_eq!(g["text"], c.text.as_str());
            assert!((g["score"].as_f64().unwrap() - c.score).abs() < 1e-9);
        }
    }
    // Greedy (`beam: 1`): one candidate each, the library's greedy translation.
    let r = post(
        addr,
        "/v1/translations",
        &json!({"model": TRANSLATION, "input": inputs, "beam": 1, "max_tokens": 20}),
    );
    assert_eq!(r.status, 200, "{}", r.json());
    let body = r.json();
    let options = GenerationOptions::greedy(20, tokenizer.eos_id(), tokenizer.pad_id());
    let expected = translate(&model, &tokenizer, &inputs, &options, 32).unwrap();
    for (i, candidates) in expected.iter().enumerate() {
        let got = body["data"][i]["translations"].as_array().unwrap();
        assert_eq!(got.len(), 1, "{body}");
        assert_eq!(got[0]["text"], candidates[0].text.as_str());
    }
}

#[test]
fn serve_attention_maps_are_the_models_weights() {
    let addr = shared();
    // The language model: causal rows summing to one, equal to the model's own weights.
    let r = post(
        addr,
        "/v1/attention",
        &json!({"model": LLM, "input": "hello there the"}),
    );
    assert_eq!(r.status, 200, "{}", r.json());
    let body = r.json();
    let lm = tiny_lm();
    let ids = lm.tokenizer.encode("hello there the").unwrap();
    let expected = lm
        .quantized_model()
        .unwrap()
        .attention_weights(&ids)
        .unwrap();
    let map = &body["maps"][0];
    let n = ids.len();
    assert_eq!(map["queries"].as_array().unwrap().len(), n);
    assert_eq!(map["layers"], expected.len());
    assert_eq!(map["heads"], lm.config.n_heads);
    for (layer, want) in map["weights"].as_array().unwrap().iter().zip(&expected) {
        let got: Vec<f64> = layer
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - *w as f64).abs() <= 5e-5 + 1e-6, "{g} vs {w}"); // rounded to 4 places
        }
        for row in got.chunks(n).enumerate().map(|(i, r)| (i % n, r)) {
            let (q, values) = row;
            assert!((values.iter().sum::<f64>() - 1.0).abs() < 1e-3);
            assert!(values[q + 1..].iter().all(|&v| v == 0.0), "causal");
        }
    }
    // The translation model: encoder self-attention and cross-attention over its translation.
    let sentence = "Y dijo Dios";
    let r = post(
        addr,
        "/v1/attention",
        &json!({"model": TRANSLATION, "input": sentence}),
    )
    .json();
    let (model, tokenizer) = translation_model();
    let want = translation_attention(&model, &tokenizer, sentence, 64).unwrap();
    assert_eq!(r["translation"], want.translation.as_str());
    assert_eq!(r["maps"][0]["keys"], json!(want.source));
    assert_eq!(r["maps"][1]["queries"], json!(want.target));
    assert_eq!(r["maps"][1]["keys"], json!(want.source));
    assert_eq!(
        r["maps"][1]["weights"][1].as_array().unwrap().len(),
        want.cross[1].len()
    );
}

#[test]
fn serve_bad_input_gets_openai_errors_naming_the_field() {
    let server = start(ServeConfig {
        body_limit: 16 << 10,
        max_tokens: 100,
        ..ServeConfig::default()
    });
    let addr = server.addr();
    let chat = "/v1/chat/completions";
    let raw = |path: &str, body: &str| request(addr, "POST", path, body.as_bytes());
    assert_error(&raw(chat, "{\"messages\": [}"), 400, None, None);
    assert_error(&raw(chat, ""), 400, None, None);
    let user = json!([{"role": "user", "content": "hi"}]);
    assert_error(
        &post(addr, chat, &json!({"model": "gpt-4", "messages": user})),
        404,
        Some("model"),
        Some("model_not_found"),
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "temperature": "hot"})),
        400,
        Some("temperature"),
        None,
    );
    assert_error(
        &post(
            addr,
            chat,
            &json!({"messages": [{"role": "user", "content": 3}]}),
        ),
        400,
        Some("messages[0].content"),
        None,
    );
    assert_error(
        &post(
            addr,
            chat,
            &json!({"messages": [{"role": "robot", "content": "x"}]}),
        ),
        400,
        Some("messages[0].role"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"model": LLM})),
        400,
        Some("messages"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "max_tokens": 101})),
        400,
        Some("max_tokens"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "max_tokens": 0})),
        400,
        Some("max_tokens"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "temperature": 2.5})),
        400,
        Some("temperature"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "stream": "yes"})),
        400,
        Some("stream"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "top_p": 1.5})),
        400,
        Some("top_p"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "n": 2})),
        400,
        Some("n"),
        None,
    );
    assert_error(
        &post(
            addr,
            chat,
            &json!({"messages": user, "logit_bias": {"999999": 1}}),
        ),
        400,
        Some("logit_bias.999999"),
        None,
    );
    assert_error(
        &post(addr, chat, &json!({"messages": user, "stop": [1]})),
        400,
        Some("stop[0]"),
        None,
    );
    // Longer than the context: 4200 byte tokens (no merge joins `a` and `b`).
    let long = "ab".repeat(2100);
    assert_error(
        &post(
            addr,
            "/v1/completions",
            &json!({"prompt": long, "max_tokens": 100}),
        ),
        400,
        Some("prompt"),
        Some("context_length_exceeded"),
    );
    assert_error(
        &post(
            addr,
            "/v1/completions",
            &json!({"prompt": "x".repeat(20_000)}),
        ),
        413,
        None,
        Some("request_too_large"),
    );
    assert_error(
        &post(addr, "/v1/embeddings", &json!({"input": "x"})),
        404,
        Some("model"),
        Some("model_not_found"),
    );
    assert_error(
        &post(
            addr,
            "/v1/translations",
            &json!({"input": "hola", "beam": 0}),
        ),
        400,
        Some("beam"),
        None,
    );
    assert_error(
        &post(
            addr,
            "/v1/translations",
            &json!({"input": {"text": "hola"}}),
        ),
        400,
        Some("input"),
        None,
    );
    assert_error(
        &post(
            addr,
            "/v1/attention",
            &json!({"model": LLM, "input": "hello ".repeat(100)}),
        ),
        400,
        Some("input"),
        None,
    );
    assert_error(&get(addr, "/v1/nothing"), 404, None, Some("unknown_url"));
    assert_error(&get(addr, chat), 405, None, Some("method_not_allowed"));
    assert_error(
        &post(
            addr,
            chat,
            &json!({"messages": user, "stop": ["x".repeat(300)]}),
        ),
        400,
        Some("stop[0]"),
        None,
    );
    assert_error(
        &post(
            addr,
            "/v1/translations",
            &json!({"input": ["hola", "y ".repeat(600)]}),
        ),
        400,
        Some("input[1]"),
        None,
    );
    assert_error(
        &get(addr, "/v1/models/gpt-4"),
        404,
        Some("model"),
        Some("model_not_found"),
    );
    assert_eq!(
        get(addr, &format!("/v1/models/{LLM}")).json()["kind"],
        "llm"
    );
    // Still serving.
    assert_eq!(get(addr, "/health").status, 200);
    let ok = post(
        addr,
        chat,
        &json!({"messages": user, "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(ok.status, 200, "{}", ok.json());
}

/// Polls `/health` until `done` holds of its `llm` object (10 s at most).
fn wait_for_health(addr: SocketAddr, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = get(addr, "/health").json();
        if done(&h["llm"]) || Instant::now() > deadline {
            return h;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_a_client_leaving_mid_stream_frees_its_slot_and_full_queues_say_429() {
    // One slot, no queue: a second request is refused while the first decodes.
    let server = start(ServeConfig {
        max_batch: 1,
        max_waiting: 0,
        max_tokens: 4000,
        ..ServeConfig::default()
    });
    let addr = server.addr();
    // 4000 tokens (the end token banned): it decodes for a long while unless cancelled.
    let long = json!({"prompt": "hello", "max_tokens": 4000, "temperature": 0, "stream": true,
                      "logit_bias": {EOS.to_string(): -100}});
    let mut events = Events::open(addr, "/v1/completions", &long);
    assert_eq!(events.status, 200);
    events.next_data().unwrap();
    events.next_data().unwrap();
    let busy = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_error(&busy, 429, None, Some("rate_limit_exceeded"));
    events.disconnect();
    let health = wait_for_health(addr, |l| l["cancelled"] == 1 && l["active"] == 0);
    assert_eq!(health["llm"]["cancelled"], 1, "{health}");
    assert_eq!(
        health["llm"]["completed"], 0,
        "cancelled, not finished: {health}"
    );
    assert!(health["llm"]["steps"].as_u64().unwrap() < 4000, "{health}");
    let after = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(after.status, 200, "{}", after.json());
}

#[test]
fn serve_eight_concurrent_streams_each_get_what_they_would_alone() {
    let server = start(ServeConfig::default());
    let addr = server.addr();
    let prompts: Vec<String> = (0..8).map(|i| format!("hello {i} the")).collect();
    let body = |p: &str| {
        json!({"prompt": p, "max_tokens": 300, "temperature": 0, "stream": true,
               "logit_bias": {EOS.to_string(): -100}})
    };
    let text = |events: Events| -> String {
        events
            .rest()
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| {
                serde_json::from_str::<Value>(d).unwrap()["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| text(Events::open(addr, "/v1/completions", &body(p))))
        .collect();
    assert_eq!(wait_for_health(addr, |_| true)["llm"]["largest_batch"], 1);
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || text(Events::open(addr, "/v1/completions", &body(p)))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let health = wait_for_health(addr, |l| l["active"] == 0);
    let largest = health["llm"]["largest_batch"].as_u64().unwrap();
    assert!(largest >= 4, "the streams were decoded together: {health}");
    for (i, ((a, t), p)) in alone.iter().zip(&together).zip(&prompts).enumerate() {
        assert_eq!(a, t, "stream {i}");
        assert_eq!(
            a,
            &library_greedy_banned(p, 300),
            "stream {i} vs the library"
        );
    }
}

#[test]
fn serve_timeouts_close_idle_connections_and_end_slow_requests() {
    use std::io::{Read, Write};
    let server = start(ServeConfig {
        idle_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_millis(5),
        max_tokens: 4000,
        ..ServeConfig::default()
    });
    let addr = server.addr();
    // A connection that never sends its request is closed after the idle timeout.
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 256];
    let n = silent.read(&mut buf).unwrap_or(0);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let reply = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || reply.starts_with("HTTP/1.1 408"), "{reply}");
    // A body that stops arriving: 408 with OpenAI's error JSON.
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\nConnection: close\r\n\r\n{\"prompt\": ",
    )
    .unwrap();
    let mut reply = String::new();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = slow.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("\"code\":\"timeout\""), "{reply}");
    // Generation past the request timeout: 504, and a stream ends with an error event.
    let long = json!({"prompt": "hello", "max_tokens": 4000, "temperature": 0,
                      "logit_bias": {EOS.to_string(): -100}});
    assert_error(
        &post(addr, "/v1/completions", &long),
        504,
        None,
        Some("timeout"),
    );
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let events = Events::open(addr, "/v1/completions", &streamed).rest();
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("longer than"),
        "{last}"
    );
    // The timed-out requests' slots are freed, and the server still answers.
    let health = wait_for_health(addr, |l| l["active"] == 0 && l["cancelled"] == 2);
    assert_eq!(health["llm"]["cancelled"], 2, "{health}");
}
