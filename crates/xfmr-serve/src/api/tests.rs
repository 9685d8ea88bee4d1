//! The bodies' exact bytes: keys in the order the server has always sent them (alphabetical),
//! `null` where a key has no value, absent only where the server leaves the key out, `f32`s
//! widened to `f64`.

use super::*;

fn wire(body: &impl serde::Serialize) -> String {
    serde_json::to_string(body).unwrap()
}

#[test]
fn errors_send_all_four_keys() {
    let body = ErrorBody {
        error: ErrorDetail {
            code: None,
            message: "m".into(),
            param: Some("n".into()),
            kind: "invalid_request_error".into(),
        },
    };
    assert_eq!(
        wire(&body),
        r#"{"error":{"code":null,"message":"m","param":"n","type":"invalid_request_error"}}"#
    );
}

#[test]
fn health_leaves_out_llm_without_one() {
    let body = Health {
        llm: None,
        status: "ok".into(),
    };
    assert_eq!(wire(&body), r#"{"status":"ok"}"#);
}

#[test]
fn chat_completion_and_its_chunks() {
    let whole = ChatCompletion {
        choices: vec![ChatChoice {
            finish_reason: "stop".into(),
            index: 0,
            logprobs: None,
            message: AssistantMessage {
                content: "hi".into(),
                role: "assistant".into(),
            },
        }],
        created: 7,
        id: "chatcmpl-1".into(),
        model: "m".into(),
        object: "chat.completion".into(),
        system_fingerprint: None,
        usage: Usage::new(3, 1, 2),
    };
    assert_eq!(
        wire(&whole),
        r#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"content":"hi","role":"assistant"}}],"created":7,"id":"chatcmpl-1","model":"m","object":"chat.completion","system_fingerprint":null,"usage":{"completion_tokens":1,"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2},"total_tokens":4}}"#
    );
    let chunk = |content: Option<&str>, finish: Option<&str>, usage| StreamChunk {
        choices: vec![StreamChoice::Chat(ChatChunkChoice {
            delta: Delta {
                content: content.map(Into::into),
                role: None,
            },
            finish_reason: finish.map(Into::into),
            index: 0,
            logprobs: None,
        })],
        created: 7,
        id: "chatcmpl-2".into(),
        model: "m".into(),
        object: "chat.completion.chunk".into(),
        usage,
    };
    assert_eq!(
        wire(&chunk(Some("a"), None, None)),
        r#"{"choices":[{"delta":{"content":"a"},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"chatcmpl-2","model":"m","object":"chat.completion.chunk"}"#
    );
    let last = wire(&chunk(None, Some("length"), Some(Usage::new(1, 2, 0))));
    assert!(
        last.starts_with(r#"{"choices":[{"delta":{},"finish_reason":"length","#),
        "{last}"
    );
    assert!(
        last.ends_with(r#""usage":{"completion_tokens":2,"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":0},"total_tokens":3}}"#),
        "{last}"
    );
}

#[test]
fn floats_are_sent_widened() {
    let map = AttentionMap {
        heads: 1,
        keys: vec!["a".into()],
        layers: 1,
        name: "self-attention".into(),
        queries: vec!["a".into()],
        weights: vec![vec![0.1, f32::NAN]],
    };
    let body = Attention {
        maps: vec![map],
        model: "m".into(),
        object: "attention".into(),
        translation: None,
    };
    assert_eq!(
        wire(&body),
        r#"{"maps":[{"heads":1,"keys":["a"],"layers":1,"name":"self-attention","queries":["a"],"weights":[[0.10000000149011612,null]]}],"model":"m","object":"attention"}"#
    );
    let vector = EmbeddingVector::Float(vec![0.1, 2.0]);
    assert_eq!(wire(&vector), "[0.10000000149011612,2.0]");
    let back: EmbeddingVector = serde_json::from_str(&wire(&vector)).unwrap();
    assert_eq!(back, vector);
}
