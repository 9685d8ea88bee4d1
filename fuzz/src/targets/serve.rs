//! `serve`: `xfmr serve`'s endpoints with arbitrary request bodies, over HTTP.
//!
//! One server per process, started on a free loopback port with the tiny Llama-family model
//! (xfmr-llm's tests' GGUF, quantised weights) under small limits (8 tokens a request, a 16 KiB
//! body, 5 s timeouts). The first byte picks the endpoint, the rest is the body, sent as one
//! `POST` (a `GET` for the model route). Every answer must be an answer: 200, or a 4xx with
//! OpenAI's error JSON (`error.message`, `error.type`); a 5xx, a malformed response or a
//! closed connection is a failure, and so is a server that no longer says it is healthy.
//! Seeds: a valid request of each endpoint.

use std::sync::OnceLock;
use std::time::Duration;

use burn::backend::NdArray;
use serde_json::Value;
use xfmr_llm::{Gguf, LanguageModel, WeightFormat};
use xfmr_serve::{RunningServer, ServeConfig, Server};

use xfmr_testing::http as client;

/// The routes a body goes to (the first byte of the input picks one).
const ROUTES: [(&str, &str); 6] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/translations"),
    ("POST", "/v1/attention"),
    ("GET", "/v1/models/tiny"),
];

fn server() -> &'static RunningServer {
    static SERVER: OnceLock<RunningServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let gguf = Gguf::parse(crate::tiny::tiny_gguf(7)).expect("the tiny GGUF parses");
        let lm = LanguageModel::<NdArray>::from_gguf_with(
            &gguf,
            &Default::default(),
            WeightFormat::Quantized,
        )
        .expect("the tiny model loads");
        let config = ServeConfig {
            max_tokens: 8,
            body_limit: 16 << 10,
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            ..ServeConfig::default()
        };
        Server::<NdArray>::new(config)
            .llm("tiny", lm)
            .expect("a model name")
            .start("127.0.0.1:0")
            .expect("the server starts")
    })
}

/// The target's body.
pub fn run(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let addr = server().addr();
    let (method, path) = ROUTES[pick as usize % ROUTES.len()];
    let response = client::request(addr, method, path, body);
    let shown = || String::from_utf8_lossy(&response.body).into_owned();
    match response.status {
        200 => {}
        400..=499 => {
            let json: Value = serde_json::from_slice(&response.body).unwrap_or_else(|e| {
                panic!("{path} {}: not JSON ({e}): {}", response.status, shown())
            });
            let error = &json["error"];
            assert!(
                error["message"].is_string() && error["type"].is_string(),
                "{path} {}: not OpenAI's error JSON: {}",
                response.status,
                shown()
            );
        }
        status => panic!("{path} answered {status}: {}", shown()),
    }
    let health = client::get(addr, "/health");
    assert_eq!(health.status, 200, "the server is not healthy after {path}");
}

/// A valid request of each endpoint.
pub fn seeds() -> Vec<Vec<u8>> {
    let bodies = [
        r#"{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}"#,
        r#"{"model":"tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"stream":true,"max_tokens":3,"stop":["\n"],"seed":3,"top_p":0.5}"#,
        r#"{"model":"tiny","prompt":"The cat","max_tokens":4,"logit_bias":{"5":-100}}"#,
        r#"{"model":"tiny","input":["a sentence"]}"#,
        r#"{"model":"tiny","input":"Y dijo Dios","beam":2}"#,
        r#"{"model":"tiny","input":"the cat sat"}"#,
        "",
    ];
    bodies
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let route = [0u8, 0, 1, 2, 3, 4, 5][i];
            [&[route][..], b.as_bytes()].concat()
        })
        .collect()
}
