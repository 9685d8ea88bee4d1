//! `xfmr serve` end to end: the real server on a free loopback port, talked to over HTTP.
//!
//! The models are made here, so that no download is needed: the tiny Llama-family GGUF of
//! xfmr-llm's tests (random weights, every tensor type; a long context so that streams last)
//! and a translation run trained for a few steps on the embedded Spanish–English sample. The
//! SmolLM2 and MiniLM runs are the `--ignored` tests in `models.rs`.

/// The allocator `xfmr serve` has (around the system's here): chat templates get their memory
/// budget (`xfmr_llm::budget`) in these tests as in the program.
#[global_allocator]
static ALLOCATOR: xfmr_llm::budget::BudgetAllocator<std::alloc::System> =
    xfmr_llm::budget::BudgetAllocator::new(std::alloc::System);

mod hostile;
mod models;
mod page;
mod server;

/// The HTTP client and the tiny GGUF file (xfmr-testing's `http` and `gguf` features).
use xfmr_testing::{http as client, tiny_gguf as tiny};
