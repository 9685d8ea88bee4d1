//! Long inputs through the decoder-only model's vocabulary projection.
//!
//! 803 positions of a 49,152-token vocabulary make 158 MB of f32 logits: past the 128 MiB
//! that lavapipe (Mesa's CPU Vulkan driver, what runs wgpu here) and WebGPU's default allow
//! for one storage buffer, beyond which cubecl cannot allocate a tensor at all and burn
//! panics ("Can't execute the autotune plan ... Memory page 0 doesn't exist"). So on wgpu the
//! full-sequence logits are read through `forward_chunks` (each chunk ≤ `LOGITS_CHUNK_BYTES`),
//! the last position through `last_logits` and the text's score through `token_log_probs`;
//! every one equals ndarray's full `forward` (computed in f64 on the host for the scores).
//!
//! Tolerances (absolute, on logits of magnitude up to ~40 and log-probabilities down to ~−60;
//! measured: ≤ 6e-6 on flex and wgpu): 1e-5 on ndarray (the scores against f64 host
//! arithmetic), 1e-4 on flex and on wgpu (f32 sums in another order); the chunked product
//! equals the single product to 1e-5 on ndarray.

use burn::backend::Flex;
use burn::tensor::{activation::log_softmax, backend::Backend, Tensor};
use xfmr_models::{DecoderOnly, DecoderOnlyConfig, IncrementalDecoder, LOGITS_CHUNK_BYTES};
use xfmr_testing::{assert_close_slices, to_vec, TestRng};

use crate::{convert, ids, training_lock, Cpu, Device};

/// burn's wgpu backend without kernel fusion (`xfmr::backend::WgpuUnfused`), what xfmr runs
/// decoder-only models on.
type WgpuUnfused =
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;

/// Prompt length of the long-input tests (≥ 800 positions).
const SEQ: usize = 803;
/// SmolLM2's vocabulary.
const BIG_VOCAB: usize = 49_152;

/// One layer at d_model 64 over a 49,152-token vocabulary, dropout off; learned positions
/// (1,024 rows, enough for [`SEQ`]); output tied (`untied`: its own projection).
fn big_vocab_config(untied: bool) -> DecoderOnlyConfig {
    DecoderOnlyConfig::new(
        BIG_VOCAB,
        DecoderOnlyConfig::gpt_layer(64, 4, 128).with_dropout(0.0),
        1,
    )
    .with_tie_output(!untied)
}

/// The same weights on backend `B` (initialised under [`training_lock`]: flex's generator
/// belongs to the fixtures).
fn on<B: Backend>(
    model: &DecoderOnly<Cpu>,
    config: &DecoderOnlyConfig,
    device: &B::Device,
) -> DecoderOnly<B> {
    let _guard = training_lock();
    let target = config.init::<B>(device).unwrap();
    convert::<Cpu, B, _, _>(model.clone(), target)
}

/// `log p(ids[t + 1] | ids[..=t])` from host logits `[seq, vocab]`, in f64.
fn host_log_probs(logits: &[f64], vocab: usize, ids: &[u32]) -> Vec<f64> {
    (0..ids.len() - 1)
        .map(|t| {
            let row = &logits[t * vocab..(t + 1) * vocab];
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|&v| (v - max).exp()).sum::<f64>().ln();
            row[ids[t + 1] as usize] - lse
        })
        .collect()
}

/// Largest absolute difference (reported by the long tests).
fn max_abs(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The chunked vocabulary product equals the single product (tied and untied output, chunks
/// of 7 rows, through the few-rows branch of the tied product, and of 20); `forward_chunks`
/// concatenates to `forward` with every chunk within its byte limit; `last_logits` is
/// `forward`'s last row and the first generation step; `token_log_probs` is the log-softmax of
/// `forward` at the next token; fewer than two positions cannot be scored.
#[test]
fn chunked_vocab_product_equals_single_product() {
    let device: Device = Default::default();
    let vocab = 50;
    let mut rng = TestRng::new(11);
    let rows: Vec<Vec<u32>> = (0..2)
        .map(|_| (0..37).map(|_| rng.below(vocab) as u32).collect())
        .collect();
    for untied in [false, true] {
        let what = if untied { "untied" } else { "tied" };
        let model: DecoderOnly<Cpu> = DecoderOnlyConfig::tiny(vocab)
            .map_layer(|l| l.with_dropout(0.0))
            .with_tie_output(!untied)
            .init(&device)
            .unwrap();
        let x = ids::<Cpu>(&rows, &device);
        let hidden = model.hidden(x.clone()).unwrap();
        let single = model.vocab_logits(hidden.clone(), usize::MAX);
        assert_eq!(single.dims(), [2, 37, vocab]);
        for chunk_rows in [7, 20] {
            let chunked = model.vocab_logits(hidden.clone(), chunk_rows * vocab * 4);
            assert_close_slices(
                &to_vec(&chunked),
                &chunked.dims(),
                &to_vec(&single),
                &single.dims(),
                1e-5,
                0.0,
                &format!("{what}: products of {chunk_rows} rows vs one product"),
            );
        }

        let full = model.forward(x.clone()).unwrap();
        let limit = 2 * 3 * vocab * 4; // 3 positions of the 2 rows
        let chunks: Vec<_> = model.forward_chunks(x.clone(), limit).unwrap().collect();
        assert_eq!(chunks.len(), 13, "{what}: 37 positions by 3");
        for chunk in &chunks {
            let [b, n, v] = chunk.dims();
            assert!(b * n * v * 4 <= limit, "{what}: chunk {:?}", chunk.dims());
        }
        let joined = Tensor::cat(chunks, 1);
        assert_close_slices(
            &to_vec(&joined),
            &joined.dims(),
            &to_vec(&full),
            &full.dims(),
            1e-5,
            0.0,
            &format!("{what}: forward_chunks vs forward"),
        );

        let last = model.last_logits(x.clone()).unwrap();
        let expected = full.clone().narrow(1, 36, 1).reshape([2, vocab]);
        assert_close_slices(
            &to_vec(&last),
            &last.dims(),
            &to_vec(&expected),
            &expected.dims(),
            1e-5,
            0.0,
            &format!("{what}: last_logits vs forward"),
        );
        let step = model
            .step(&mut model.start(2), x.clone(), false)
            .unwrap()
            .logits;
        assert_close_slices(
            &to_vec(&step),
            &step.dims(),
            &to_vec(&last),
            &last.dims(),
            1e-5,
            0.0,
            &format!("{what}: first generation step vs last_logits"),
        );

        let scores = model.token_log_probs(x.clone()).unwrap();
        assert_eq!(scores.dims(), [2, 36]);
        let target = x.clone().narrow(1, 1, 36).unsqueeze_dim::<3>(2);
        let expected = log_softmax(full.narrow(1, 0, 36), 2)
            .gather(2, target)
            .reshape([2, 36]);
        assert_close_slices(
            &to_vec(&scores),
            &scores.dims(),
            &to_vec(&expected),
            &expected.dims(),
            1e-5,
            0.0,
            &format!("{what}: token_log_probs vs log-softmax of forward"),
        );
        assert!(model.token_log_probs(x.narrow(1, 0, 1)).is_err());
    }
}

/// The long-input case: a model on ndarray, 803 random ids, and ndarray's full-sequence
/// logits `[SEQ, BIG_VOCAB]` and scores `[SEQ - 1]` on the host.
struct LongCase {
    config: DecoderOnlyConfig,
    model: DecoderOnly<Cpu>,
    ids: Vec<u32>,
    logits: Vec<f64>,
    log_probs: Vec<f64>,
}

fn long_case(untied: bool) -> LongCase {
    let device: Device = Default::default();
    let config = big_vocab_config(untied);
    let model: DecoderOnly<Cpu> = config.init(&device).unwrap();
    let mut rng = TestRng::new(803);
    let prompt: Vec<u32> = (0..SEQ).map(|_| rng.below(BIG_VOCAB) as u32).collect();
    let full = model
        .forward(ids::<Cpu>(std::slice::from_ref(&prompt), &device))
        .unwrap();
    assert_eq!(full.dims(), [1, SEQ, BIG_VOCAB]);
    let logits = to_vec(&full);
    let log_probs = host_log_probs(&logits, BIG_VOCAB, &prompt);
    LongCase {
        config,
        model,
        ids: prompt,
        logits,
        log_probs,
    }
}

/// On backend `B`, for an 803-token prompt: every position's logits through `forward_chunks`
/// (chunks within [`LOGITS_CHUNK_BYTES`], adding up to the prompt), the last position through
/// `last_logits` and through the first generation step, and the scores through
/// `token_log_probs`, all equal to ndarray's full `forward` (≤ `atol`); with `full_forward`,
/// `forward` itself too (not on wgpu: 158 MB in one tensor is past lavapipe's 128 MiB).
fn check_long_prompt<B: Backend>(device: &B::Device, atol: f64, full_forward: bool, what: &str) {
    for untied in [false, true] {
        let case = long_case(untied);
        let what = format!("{what} ({})", if untied { "untied" } else { "tied" });
        let model = on::<B>(&case.model, &case.config, device);
        let x = ids::<B>(std::slice::from_ref(&case.ids), device);

        let mut start = 0;
        let mut worst: f64 = 0.0;
        for chunk in model.forward_chunks(x.clone(), LOGITS_CHUNK_BYTES).unwrap() {
            let [batch, rows, vocab] = chunk.dims();
            assert_eq!((batch, vocab), (1, BIG_VOCAB));
            assert!(
                rows * vocab * 4 <= LOGITS_CHUNK_BYTES,
                "{what}: {rows} rows"
            );
            let got = to_vec(&chunk);
            let expected = &case.logits[start * vocab..(start + rows) * vocab];
            worst = worst.max(max_abs(&got, expected));
            assert_close_slices(
                &got,
                &[rows, vocab],
                expected,
                &[rows, vocab],
                atol,
                0.0,
                &format!("{what}: logits of positions {start}..{}", start + rows),
            );
            start += rows;
        }
        assert_eq!(start, SEQ, "{what}: the chunks cover the prompt");
        eprintln!("{what}: every position's logits within {worst:.2e} of ndarray's");

        let last_expected = &case.logits[(SEQ - 1) * BIG_VOCAB..];
        let last = to_vec(&model.last_logits(x.clone()).unwrap());
        let step = model
            .step(&mut model.start(1), x.clone(), false)
            .unwrap()
            .logits;
        let step = to_vec(&step);
        for (name, got) in [("last_logits", &last), ("first generation step", &step)] {
            assert_close_slices(
                got,
                &[BIG_VOCAB],
                last_expected,
                &[BIG_VOCAB],
                atol,
                0.0,
                &format!("{what}: {name} vs ndarray's last row"),
            );
        }

        let scores = to_vec(&model.token_log_probs(x.clone()).unwrap());
        eprintln!(
            "{what}: scores within {:.2e} of ndarray's",
            max_abs(&scores, &case.log_probs)
        );
        assert_close_slices(
            &scores,
            &[SEQ - 1],
            &case.log_probs,
            &[SEQ - 1],
            atol,
            0.0,
            &format!("{what}: token_log_probs vs ndarray's log-softmax"),
        );

        if full_forward {
            let full = to_vec(&model.forward(x).unwrap());
            assert_close_slices(
                &full,
                &[SEQ, BIG_VOCAB],
                &case.logits,
                &[SEQ, BIG_VOCAB],
                atol,
                0.0,
                &format!("{what}: forward vs ndarray's"),
            );
        }
    }
}

#[test]
fn long_prompt_on_ndarray() {
    check_long_prompt::<Cpu>(&Default::default(), 1e-5, true, "ndarray");
}

#[test]
fn long_prompt_on_flex() {
    check_long_prompt::<Flex>(&Default::default(), 1e-4, true, "flex");
}

/// The reported failure: on wgpu the 803 × 49,152 logits in one product panicked inside
/// burn's matmul autotune; chunked, every position's logits, the last one and the scores
/// come out.
#[test]
fn long_prompt_on_wgpu() {
    check_long_prompt::<WgpuUnfused>(&Default::default(), 1e-4, false, "wgpu");
}
