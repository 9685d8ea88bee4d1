//! xfmr-llm tests: the GGUF reader on files written by the tests (always run) and SmolLM2
//! parity with Hugging Face transformers (`#[ignore]`d: they need the fetched model).

mod cache_precision;
mod decode_loop;
mod gguf;
mod hostile;
mod interleaved;
mod quantized;
mod smollm2;
mod smollm2_quantized;

/// The memory budget of chat-template rendering, installed as the `xfmr` binary installs it
/// (`hostile.rs` tests it).
#[global_allocator]
static ALLOCATOR: xfmr_llm::budget::BudgetAllocator<std::alloc::System> =
    xfmr_llm::budget::BudgetAllocator::new(std::alloc::System);

/// The tiny Llama-family GGUF the tests write (xfmr-testing's `gguf` feature).
use xfmr_testing::tiny_gguf as tiny;

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use xfmr_models::{DecoderOnly, IncrementalDecoder, LmState};
use xfmr_testing::{assert_close_slices, to_vec};

/// burn's wgpu backend without kernel fusion (`xfmr::backend::WgpuUnfused`): the fused one
/// decodes wrongly through a key/value cache (tracel-ai/burn#5257).
pub type WgpuUnfused =
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;

/// One row of token ids as a `[1, len]` tensor.
pub fn row<B: Backend>(ids: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    let values = ids.iter().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(values, [1, ids.len()]), device)
}

/// Decodes `steps` greedy tokens after `prompt` through the key/value cache, checking each
/// step's logits against the last row of a full pass over every token so far (`atol`, `rtol`).
/// Returns the state: its cache then holds `prompt.len() + steps - 1` positions.
pub fn assert_cached_equals_full<B: Backend>(
    model: &DecoderOnly<B>,
    prompt: &[u32],
    steps: usize,
    atol: f64,
    rtol: f64,
) -> LmState<B> {
    let device = model.embedding.weight.device();
    let vocab = model.vocab_size();
    let mut state = model.start(1);
    let mut tokens = prompt.to_vec();
    let mut input = prompt.to_vec();
    for step in 0..steps {
        let step_out = model.step(&mut state, row(&input, &device), false).unwrap();
        let cached = to_vec(&step_out.logits);
        let full = model.forward(row(&tokens, &device)).unwrap();
        let last = to_vec(&full.narrow(1, tokens.len() - 1, 1).reshape([1, vocab]));
        let shape = [vocab];
        let what = format!("cached vs full, step {step}");
        assert_close_slices(&cached, &shape, &last, &shape, atol, rtol, &what);
        let next = cached
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        tokens.push(next);
        input = vec![next];
    }
    state
}
