//! Long inputs through the decoder-only model's vocabulary projection.
//!
//! 803 positions of a 49,152-token vocabulary make 158 MB of f32 logits: past the 128 MiB
//! that lavapipe (Mesa's CPU Vulkan driver, what runs wgpu here) and WebGPU's default allow
//! for one storage buffer, beyond which cubecl cannot allocate a tensor at all: the kernels
//! touching it are skipped and their results hold stale memory, reported only by the next
//! device synchronisation (so `forward` checks, and returns `ModelError::TooLargeForDevice`).
//! On wgpu the full-sequence logits are read through `forward_chunks` (each chunk ≤
//! `LOGITS_CHUNK_BYTES`), the last position through `last_logits` and the text's score
//! through `token_log_probs`; every one equals ndarray's full `forward` (computed in f64 on
//! the host for the scores). `forward` itself is tested one position under and one over the
//! adapter's limit, read from the device wgpu opened.
//!
//! Tolerances (absolute, on logits of magnitude up to ~40 and log-probabilities down to ~−60;
//! measured: ≤ 6e-6 on flex and wgpu): 1e-5 on ndarray (the scores against f64 host
//! arithmetic), 1e-4 on flex and on wgpu (f32 sums in another order); the chunked product
//! equals the single product to 1e-5 on ndarray.

use std::sync::OnceLock;

use burn::backend::wgpu::{graphics::AutoGraphicsApi, init_setup, RuntimeOptions, WgpuDevice};
use burn::backend::Flex;
use burn::tensor::{activation::log_softmax, backend::Backend, Tensor};
use xfmr_models::{
    DecoderOnly, DecoderOnlyConfig, EncoderOnlyConfig, IncrementalDecoder, ModelError,
    TransformerConfig, DEVICE_BUFFER_BYTES, LOGITS_CHUNK_BYTES,
};
use xfmr_testing::{assert_close_slices, to_vec, TestRng};

use crate::{convert, ids, training_lock, Cpu, Device};

/// burn's wgpu backend without kernel fusion (`xfmr::backend::WgpuUnfused`), what xfmr runs
/// decoder-only models on.
pub(crate) type WgpuUnfused =
    burn::backend::wgpu::CubeBackend<burn::backend::wgpu::WgpuRuntime, f32, i32, u32>;

/// The wgpu device of these tests and the largest tensor it holds, in bytes: cubecl's
/// `max_page_size` on wgpu, the device's `max_storage_buffer_binding_size` (128 MiB on
/// lavapipe). The device is opened here, once, before any test uses it: every test of this
/// binary on wgpu takes its device from here.
pub(crate) fn wgpu_device() -> (WgpuDevice, usize) {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    let device = WgpuDevice::default();
    let limit = *LIMIT.get_or_init(|| {
        let setup = init_setup::<AutoGraphicsApi>(&device, RuntimeOptions::default());
        setup.device.limits().max_storage_buffer_binding_size
    });
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    assert!(
        limit >= DEVICE_BUFFER_BYTES,
        "the adapter holds {limit} bytes per buffer, less than DEVICE_BUFFER_BYTES"
    );
    (device, limit)
}

/// `err` is `TooLargeForDevice` for `what` of `shape` (f32), with the shared limit.
fn assert_too_large(err: ModelError, what: &str, shape: &[usize], context: &str) {
    match err {
        ModelError::TooLargeForDevice {
            what: got,
            shape: got_shape,
            bytes,
            limit,
            ..
        } => {
            assert_eq!(
                (got, got_shape.as_slice(), bytes, limit),
                (
                    what,
                    shape,
                    shape.iter().product::<usize>() * 4,
                    DEVICE_BUFFER_BYTES
                ),
                "{context}"
            );
        }
        other => panic!("{context}: expected TooLargeForDevice, got {other}"),
    }
}

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
        let single = model.vocab_logits(hidden.clone(), usize::MAX).unwrap();
        assert_eq!(single.dims(), [2, 37, vocab]);
        for chunk_rows in [7, 20] {
            let chunked = model
                .vocab_logits(hidden.clone(), chunk_rows * vocab * 4)
                .unwrap();
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
/// `forward` itself too; without, `forward` must be `TooLargeForDevice` (on wgpu: 158 MB in one
/// tensor is past lavapipe's 128 MiB).
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
        } else {
            let err = model.forward(x).unwrap_err();
            assert_too_large(err, "logits", &[1, SEQ, BIG_VOCAB], &what);
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

/// The reported failures: on wgpu the 803 × 49,152 logits in one product panicked inside
/// burn's matmul autotune, and once chunked, `forward`'s concatenated result silently held
/// stale memory; chunked, every position's logits, the last one and the scores come out, and
/// `forward` is `TooLargeForDevice`.
#[test]
fn long_prompt_on_wgpu() {
    check_long_prompt::<WgpuUnfused>(&wgpu_device().0, 1e-4, false, "wgpu");
}

/// `forward` on wgpu one position under and one over the adapter's largest buffer (682 and 683
/// positions of 49,152 logits on lavapipe's 128 MiB): under, the logits equal ndarray's (a
/// causal model's prefix has the logits of the long prompt's first positions); over, it is
/// `TooLargeForDevice` naming the logits, where it used to return stale memory; after the
/// error the device computes correctly again (`last_logits` of the same prefix).
#[test]
fn forward_at_the_device_buffer_limit_on_wgpu() {
    let (device, limit) = wgpu_device();
    let case = long_case(false);
    let model = on::<WgpuUnfused>(&case.model, &case.config, &device);
    let under = limit / (BIG_VOCAB * 4);
    assert!(
        under < SEQ,
        "the adapter holds {limit} bytes per buffer: {SEQ} positions do not reach past it"
    );
    let prefix = |n: usize| ids::<WgpuUnfused>(&[case.ids[..n].to_vec()], &device);

    let logits = to_vec(&model.forward(prefix(under)).unwrap());
    eprintln!(
        "wgpu: {under} positions ({} bytes, limit {limit}): within {:.2e} of ndarray's",
        under * BIG_VOCAB * 4,
        max_abs(&logits, &case.logits[..under * BIG_VOCAB])
    );
    assert_close_slices(
        &logits,
        &[under, BIG_VOCAB],
        &case.logits[..under * BIG_VOCAB],
        &[under, BIG_VOCAB],
        1e-4,
        0.0,
        "wgpu: forward just under the limit vs ndarray's",
    );

    let over = under + 1;
    let err = model.forward(prefix(over)).unwrap_err();
    eprintln!("wgpu: {over} positions: {err}");
    assert_too_large(
        err,
        "logits",
        &[1, over, BIG_VOCAB],
        "wgpu: just over the limit",
    );

    let last = to_vec(&model.last_logits(prefix(over)).unwrap());
    assert_close_slices(
        &last,
        &[BIG_VOCAB],
        &case.logits[under * BIG_VOCAB..over * BIG_VOCAB],
        &[BIG_VOCAB],
        1e-4,
        0.0,
        "wgpu: last_logits after the error vs ndarray's",
    );
}

/// Every other vocabulary product over the device's buffer is an error on wgpu too: the
/// encoder-decoder's output projection (683 target positions) and the encoder-only model's MLM
/// logits (683 positions). The models are random, initialised on wgpu (d_model 8, one layer,
/// no positions: only the sizes matter). (A vocabulary table over the limit is not tested:
/// burn allocates parameters in cubecl's persistent pool, which has no size limit, and wgpu's
/// validation then panics on the device's thread when a kernel binds the table, which leaves
/// the device unusable for the other tests of this binary.)
#[test]
fn vocabulary_products_over_the_device_buffer_are_errors_on_wgpu() {
    let (device, limit) = wgpu_device();
    let over = limit / (BIG_VOCAB * 4) + 1;
    let layer = |d_model| DecoderOnlyConfig::gpt_layer(d_model, 2, 16).with_dropout(0.0);
    let none = xfmr_blocks::PositionEncoding::None;
    let row =
        |n: usize| ids::<WgpuUnfused>(&[(0..n as u32).map(|i| 3 + i % 97).collect()], &device);

    let transformer = TransformerConfig::new(BIG_VOCAB, BIG_VOCAB, layer(8), 1, 1)
        .with_positions(none.clone())
        .init::<WgpuUnfused>(&device)
        .unwrap();
    let err = transformer.forward(row(5), row(over)).unwrap_err();
    assert_too_large(err, "logits", &[1, over, BIG_VOCAB], "Transformer::forward");

    let encoder = EncoderOnlyConfig::new(BIG_VOCAB, layer(8), 1)
        .with_positions(none)
        .with_mlm_head(true)
        .init::<WgpuUnfused>(&device)
        .unwrap();
    let hidden = encoder.forward(row(over), None, None).unwrap();
    let err = encoder.mlm_logits(hidden).unwrap_err();
    assert_too_large(
        err,
        "logits",
        &[1, over, BIG_VOCAB],
        "EncoderOnly::mlm_logits",
    );
}
