//! xfmr-llm tests: the GGUF reader on files written by the tests (always run) and SmolLM2
//! parity with Hugging Face transformers (`#[ignore]`d: they need the fetched model).

mod gguf;
mod smollm2;
mod tiny;
