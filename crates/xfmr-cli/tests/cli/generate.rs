//! `xfmr generate` on SmolLM2 (needs the model, like the other model tests).

use crate::xfmr_ok;

/// About 80 tokens of Genesis 1 (KJV), repeated past 800 tokens.
fn long_prompt() -> String {
    let verse = "In the beginning God created the heaven and the earth. And the earth was \
                 without form, and void; and darkness was upon the face of the deep. And the \
                 Spirit of God moved upon the face of the waters. And God said, Let there be \
                 light: and there was light. ";
    verse.repeat(16)
}

/// The prompt length `xfmr generate` reports on stderr.
fn prompt_tokens(stderr: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("prompt: "))
        .unwrap_or_else(|| panic!("no `prompt:` line in\n{stderr}"));
    line["prompt: ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {line:?}"))
}

/// A prompt of more than 800 tokens through `xfmr generate` with quantised weights (the CPU
/// default) and f32 weights on flex and ndarray: every run finishes, reports the prompt's
/// length and the tokens asked for; the f32 backends generate the same text.
#[test]
#[ignore = "needs SmolLM2: `cargo run -p xfmr-cli -- fetch-model smollm2`, then `cargo test --workspace -- --ignored`"]
fn generate_takes_a_long_prompt_with_either_weights() {
    let prompt = long_prompt();
    let mut f32_texts = Vec::new();
    for (backend, weights) in [("flex", "quantized"), ("flex", "f32"), ("ndarray", "f32")] {
        let args = [
            "generate",
            "--backend",
            backend,
            "--weights",
            weights,
            "--max-tokens",
            "6",
            "--min-tokens",
            "6",
            &prompt,
        ];
        let out = xfmr_ok(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tokens = prompt_tokens(&stderr);
        assert!(
            tokens > 800,
            "{backend} {weights}: a prompt of {tokens} tokens"
        );
        assert!(
            stderr.contains(&format!("{weights} weights")),
            "{backend}: {stderr}"
        );
        assert!(
            stderr.contains("generated: 6 tokens"),
            "{backend} {weights}: {stderr}"
        );
        if weights == "f32" {
            f32_texts.push(String::from_utf8_lossy(&out.stdout).into_owned());
        }
    }
    assert_eq!(
        f32_texts[0], f32_texts[1],
        "flex and ndarray generated different text"
    );
}
