//! `chat_template`: a GGUF file's chat template (Jinja, from the file's metadata: a stranger's
//! program) rendered over arbitrary messages.
//!
//! Fields, split at `0xFF` bytes: the template, then role and content of each message in turn.
//! The tokenizer is the tiny Llama file's (xfmr-llm's tests), with small template limits
//! ([`LIMITS`]); [`GgufTokenizer::render_chat`] and [`GgufTokenizer::encode_chat`] must render
//! or return a typed error ([`LlmError::Template`], [`LlmError::TemplateLimit`],
//! [`LlmError::TooManyTokens`]), in bounded time and memory whatever the template asks for
//! (loops, recursion, strings and lists that double, huge filter widths): the memory budget is
//! xfmr-llm's `BudgetAllocator`, installed by this crate. The kept corpus holds the hostile
//! templates of issue 43.

use std::sync::OnceLock;

use xfmr_llm::{Gguf, GgufTokenizer, LlmError, Message, TemplateLimits};

use crate::{split_field, text};

/// The tiny model's tokenizer, built once.
pub(crate) fn tiny_tokenizer() -> &'static GgufTokenizer {
    static TOKENIZER: OnceLock<GgufTokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let gguf = Gguf::parse(crate::tiny::tiny_gguf(1)).expect("the tiny GGUF parses");
        GgufTokenizer::from_gguf(&gguf).expect("the tiny GGUF's tokenizer")
    })
}

/// The limits renderings run under here: small, so that each blocked thread (a template over
/// its budget leaves one, see `xfmr_llm::budget`) keeps little.
pub const LIMITS: TemplateLimits = TemplateLimits {
    output_bytes: 256 << 10,
    memory_bytes: 2 << 20,
};

/// The target's body.
pub fn run(data: &[u8]) {
    let (template, mut rest) = split_field(data);
    let mut messages = Vec::new();
    while !rest.is_empty() && messages.len() < 16 {
        let (role, after) = split_field(rest);
        let (content, after) = split_field(after);
        messages.push(Message::new(&text(role), &text(content)));
        rest = after;
    }
    let tokenizer = tiny_tokenizer()
        .clone()
        .with_chat_template(Some(text(template)))
        .with_template_limits(LIMITS);
    let input: usize = messages
        .iter()
        .map(|m| m.role.len() + m.content.len())
        .sum();
    let output_limit =
        LIMITS.output_bytes + input * xfmr_llm::tokenizer::CHAT_TEMPLATE_BYTES_PER_INPUT_BYTE;
    for add_generation_prompt in [false, true] {
        match tokenizer.render_chat(&messages, add_generation_prompt) {
            Ok(text) => {
                assert!(text.len() <= output_limit, "{} bytes of output", text.len());
                // Tokenised with message contents as text: whatever the contents spell, the
                // ids are the file's, and within the limit.
                match tokenizer.encode_chat(&messages, add_generation_prompt, 4096) {
                    Ok(ids) => {
                        assert!(ids.len() <= 4096);
                        assert!(ids.iter().all(|&id| (id as usize) < tokenizer.n_tokens()));
                    }
                    Err(
                        LlmError::Template(_)
                        | LlmError::TemplateLimit(_)
                        | LlmError::TooManyTokens { .. },
                    ) => {}
                    Err(e) => panic!("encode_chat: {e}"),
                }
            }
            Err(LlmError::Template(_) | LlmError::TemplateLimit(_)) => {}
            Err(e) => panic!("render_chat: {e}"),
        }
    }
}

/// The tiny model's ChatML template, and a template of the shape SmolLM2's has (a system
/// message added when the conversation has none, `raise_exception` on a bad role), each with a
/// conversation.
pub fn seeds() -> Vec<Vec<u8>> {
    let chatml = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let strict = "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}{{ m['role'] | upper }}: {{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}";
    [chatml, strict]
        .iter()
        .map(|t| {
            let mut seed = t.as_bytes().to_vec();
            for (role, content) in [
                ("system", "Be brief."),
                ("user", "What is 2+2?"),
                ("assistant", "4"),
            ] {
                seed.push(0xFF);
                seed.extend(role.bytes());
                seed.push(0xFF);
                seed.extend(content.bytes());
            }
            seed
        })
        .collect()
}
