//! Generation invariants on random tiny models.

use std::cell::Cell;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};
use xfmr_models::generate::{generate, length_penalty, Cancel, Step};
use xfmr_models::{
    BeamOptions, Generation, GenerationOptions, IncrementalDecoder, ModelError, SampleOptions,
    Strategy,
};
use xfmr_testing::to_vec;

use crate::{
    greedy_by_steps_lm, greedy_by_steps_transformer, ids, sources, tiny_lm, tiny_transformer, Cpu,
    Device, BOS, EOS, PAD,
};

const MAX_LEN: usize = 12;

fn greedy() -> GenerationOptions {
    GenerationOptions::greedy(MAX_LEN, EOS, PAD)
}

fn beam(beam_size: usize, n_best: usize) -> GenerationOptions {
    greedy().with_strategy(Strategy::Beam(BeamOptions {
        beam_size,
        length_penalty: 0.6,
        n_best,
    }))
}

fn sample(seed: u64, top_k: Option<usize>, top_p: Option<f64>) -> GenerationOptions {
    greedy().with_strategy(Strategy::Sample(SampleOptions {
        temperature: 1.5,
        top_k,
        top_p,
        seed,
    }))
}

/// Tokens and log-probabilities agree (log-probabilities within `tol`).
fn assert_same(a: &Generation, b: &Generation, tol: f64, what: &str) {
    assert_eq!(a.hypotheses.len(), b.hypotheses.len(), "{what}: batch");
    for (i, (x, y)) in a.hypotheses.iter().zip(&b.hypotheses).enumerate() {
        assert_eq!(x.len(), y.len(), "{what}: input {i}: hypothesis count");
        for (h, g) in x.iter().zip(y) {
            assert_eq!(h.tokens, g.tokens, "{what}: input {i}: tokens");
            assert_eq!(h.finished, g.finished, "{what}: input {i}: finished");
            assert!(
                (h.log_prob - g.log_prob).abs() <= tol,
                "{what}: input {i}: log_prob {} vs {}",
                h.log_prob,
                g.log_prob
            );
        }
    }
}

/// Guards the invariants against passing on empty outputs: some sequence is several tokens
/// long and the sequences are not all the same.
fn assert_nontrivial(g: &Generation) {
    let best = g.best_tokens();
    assert!(
        best.iter().any(|t| t.len() >= 2),
        "all outputs short: {best:?}"
    );
    assert!(
        best.windows(2).any(|w| w[0] != w[1]),
        "all outputs equal: {best:?}"
    );
}

#[test]
fn beam_one_equals_greedy() {
    for seed in [1, 2, 3] {
        let model = tiny_transformer(seed);
        let g = model.generate(&sources(), BOS, &greedy()).unwrap();
        let b = model.generate(&sources(), BOS, &beam(1, 1)).unwrap();
        assert_same(&g, &b, 1e-9, "transformer beam 1 vs greedy");
        assert_nontrivial(&g);
        let lm = tiny_lm(seed);
        let g = lm.generate(&sources(), &greedy()).unwrap();
        let b = lm.generate(&sources(), &beam(1, 1)).unwrap();
        assert_same(&g, &b, 1e-9, "decoder-only beam 1 vs greedy");
        assert_nontrivial(&g);
    }
}

/// Greedy decoding by hand through `step`: each step's logits equal the last row of a full
/// recomputation over the whole prefix.
#[test]
fn cached_steps_equal_full_recomputation() {
    let model = tiny_transformer(7);
    let prefix =
        greedy_by_steps_transformer(&model, sources()[0].clone(), MAX_LEN, "encoder-decoder");
    // The same tokens come out of the generation API.
    let g = model
        .generate(&[sources()[0].clone()], BOS, &greedy())
        .unwrap();
    let n = g.hypotheses[0][0].tokens.len();
    assert_eq!(g.hypotheses[0][0].tokens, prefix[1..=n].to_vec());

    // Decoder-only: the prompt in one step, then one token at a time.
    greedy_by_steps_lm(&tiny_lm(7), sources()[2].clone(), MAX_LEN, "decoder-only");
}

#[test]
fn batched_equals_one_by_one() {
    let model = tiny_transformer(11);
    let lm = tiny_lm(11);
    for (name, options) in [
        ("greedy", greedy()),
        ("beam 3", beam(3, 2)),
        ("sample top-k 1", sample(5, Some(1), None)),
    ] {
        let batched = model.generate(&sources(), BOS, &options).unwrap();
        let lm_batched = lm.generate(&sources(), &options).unwrap();
        assert_nontrivial(&batched);
        assert_nontrivial(&lm_batched);
        for (i, src) in sources().into_iter().enumerate() {
            let alone = model
                .generate(std::slice::from_ref(&src), BOS, &options)
                .unwrap();
            let one = Generation {
                hypotheses: vec![batched.hypotheses[i].clone()],
            };
            assert_same(
                &one,
                &alone,
                1e-4,
                &format!("transformer {name}, input {i}"),
            );
            let alone = lm.generate(&[src], &options).unwrap();
            let one = Generation {
                hypotheses: vec![lm_batched.hypotheses[i].clone()],
            };
            assert_same(
                &one,
                &alone,
                1e-4,
                &format!("decoder-only {name}, prompt {i}"),
            );
        }
    }
}

#[test]
fn sampling_is_reproducible_and_top_k_one_is_greedy() {
    let model = tiny_transformer(5);
    let a = model
        .generate(&sources(), BOS, &sample(42, None, None))
        .unwrap();
    let b = model
        .generate(&sources(), BOS, &sample(42, None, None))
        .unwrap();
    assert_same(&a, &b, 0.0, "same seed");
    // Another seed draws another sequence somewhere (temperature 1.5 over 24 tokens).
    let differs = (0..5).any(|seed| {
        model
            .generate(&sources(), BOS, &sample(100 + seed, None, None))
            .unwrap()
            .best_tokens()
            != a.best_tokens()
    });
    assert!(differs, "five other seeds all reproduced seed 42's samples");

    let g = model.generate(&sources(), BOS, &greedy()).unwrap();
    let k1 = model
        .generate(&sources(), BOS, &sample(9, Some(1), None))
        .unwrap();
    assert_same(&g, &k1, 1e-12, "top-k 1 vs greedy");
    // A nucleus smaller than any single probability keeps only the most probable token.
    let p0 = model
        .generate(&sources(), BOS, &sample(9, None, Some(1e-9)))
        .unwrap();
    assert_same(&g, &p0, 1e-12, "top-p → 0 vs greedy");
}

#[test]
fn beam_returns_n_best_sorted_with_gnmt_scores() {
    let model = tiny_transformer(3);
    let out = model.generate(&sources(), BOS, &beam(4, 3)).unwrap();
    for hyps in &out.hypotheses {
        assert_eq!(hyps.len(), 3);
        for w in hyps.windows(2) {
            assert!(w[0].score >= w[1].score, "n-best not sorted: {w:?}");
        }
        for h in hyps {
            let len = h.tokens.len() + usize::from(h.finished);
            let expected = h.log_prob / length_penalty(len, 0.6);
            assert!(
                (h.score - expected).abs() < 1e-12,
                "score {} vs {expected}",
                h.score
            );
            assert!(h.log_prob <= 0.0);
        }
    }
    // Beam search finds a sequence at least as probable (by its own score) as greedy's.
    let g = model.generate(&sources(), BOS, &greedy()).unwrap();
    for (b, g) in out.hypotheses.iter().zip(&g.hypotheses) {
        let g = &g[0];
        if g.finished {
            let g_score = g.log_prob / length_penalty(g.tokens.len() + 1, 0.6);
            assert!(
                b[0].score >= g_score - 1e-9,
                "beam {} < greedy {g_score}",
                b[0].score
            );
        }
    }
}

#[test]
fn min_len_and_end_token() {
    let model = tiny_transformer(4);
    let out = model
        .generate(&sources(), BOS, &greedy().with_min_len(MAX_LEN))
        .unwrap();
    for h in out.hypotheses.iter().map(|h| &h[0]) {
        assert_eq!(h.tokens.len(), MAX_LEN, "the end token was forbidden");
        assert!(!h.finished);
        assert!(!h.tokens.contains(&EOS));
    }
    // An end token ends a sequence: nothing after it, and it is not in the output.
    let out = model.generate(&sources(), BOS, &beam(2, 2)).unwrap();
    for h in out.hypotheses.iter().flatten() {
        assert!(!h.tokens.contains(&EOS));
        assert!(h.tokens.len() <= MAX_LEN);
    }
}

#[test]
fn cross_attention_per_token() {
    let model = tiny_transformer(8);
    let srcs = sources();
    let max_src = srcs.iter().map(Vec::len).max().unwrap();
    for options in [greedy().with_attention(), beam(2, 1).with_attention()] {
        let out = model.generate(&srcs, BOS, &options).unwrap();
        for (src, hyps) in srcs.iter().zip(&out.hypotheses) {
            let h = &hyps[0];
            let rows = h.attention.as_ref().expect("attention requested");
            assert_eq!(rows.len(), h.tokens.len(), "one row per generated token");
            for row in rows {
                assert_eq!(row.len(), max_src);
                let total: f32 = row.iter().sum();
                assert!((total - 1.0).abs() < 1e-4, "weights sum to {total}");
                assert!(
                    row[src.len()..].iter().all(|&w| w == 0.0),
                    "padding attended: {row:?}"
                );
            }
        }
    }
    let plain = model.generate(&srcs, BOS, &greedy()).unwrap();
    assert!(plain.hypotheses[0][0].attention.is_none());
}

#[test]
fn invalid_options_and_inputs_are_named() {
    let model = tiny_transformer(1);
    let err = |options: GenerationOptions| model.generate(&sources(), BOS, &options).unwrap_err();
    let field = |e: ModelError| match e {
        ModelError::InvalidOption { field, .. } => field,
        other => panic!("expected InvalidOption, got {other}"),
    };
    assert_eq!(field(err(beam(0, 1))), "beam_size");
    assert_eq!(field(err(beam(2, 3))), "n_best");
    assert_eq!(field(err(sample(0, Some(0), None))), "top_k");
    assert_eq!(field(err(sample(0, None, Some(1.5)))), "top_p");
    let mut o = greedy();
    o.eos_id = 999;
    assert_eq!(field(err(o)), "eos_id");
    assert_eq!(field(err(greedy().with_min_len(MAX_LEN + 1))), "min_len");
    let e = model.generate(&[vec![3, 99]], BOS, &greedy()).unwrap_err();
    assert!(e.to_string().contains("99"), "{e}");
    let lm = tiny_lm(1);
    let e = lm.generate(&[vec![3], vec![]], &greedy()).unwrap_err();
    assert!(e.to_string().contains("prompt 1 is empty"), "{e}");
}

/// A hypothesis' `log_prob` is the sum of the model's log-probabilities of its tokens (the end
/// token included), here recomputed from one teacher-forced pass over the whole output, not
/// from the cache; greedy ranks by it unchanged.
#[test]
fn hypothesis_log_prob_is_the_sum_of_token_log_probs() {
    let device: Device = Default::default();
    let model = tiny_transformer(2);
    for src in sources() {
        let g = model
            .generate(std::slice::from_ref(&src), BOS, &greedy())
            .unwrap();
        let hyp = &g.hypotheses[0][0];
        let mut scored = hyp.tokens.clone();
        if hyp.finished {
            scored.push(EOS);
        }
        let tgt_in: Vec<u32> = std::iter::once(BOS)
            .chain(scored[..scored.len() - 1].iter().copied())
            .collect();
        let memory = model.encode(ids::<Cpu>(&[src], &device)).unwrap();
        let logits = model
            .decode(ids::<Cpu>(&[tgt_in], &device), &memory)
            .unwrap();
        let vocab = logits.dims()[2];
        let lp = to_vec(&log_softmax(logits, 2));
        let expected: f64 = scored
            .iter()
            .enumerate()
            .map(|(i, &t)| lp[i * vocab + t as usize])
            .sum();
        assert!(expected.is_finite());
        assert!(
            (hyp.log_prob - expected).abs() <= 1e-4,
            "log_prob {} vs recomputed {expected}",
            hyp.log_prob
        );
        assert_eq!(hyp.score, hyp.log_prob);
    }
}

/// The same weights generate the same tokens on ndarray and flex (log-probabilities within
/// 1e-4), greedy and beam: generation is backend-generic, inputs are created on the model's
/// device.
#[test]
fn generation_agrees_across_cpu_backends() {
    let model = tiny_transformer(6);
    let on_flex = crate::transformer_on_flex(&model);
    for options in [greedy(), beam(3, 2)] {
        let a = model.generate(&sources(), BOS, &options).unwrap();
        let b = on_flex.generate(&sources(), BOS, &options).unwrap();
        assert_same(&a, &b, 1e-4, "ndarray vs flex");
    }
}

/// A token cancelled before the call, or whose deadline has passed, stops every strategy of
/// both model kinds before its first step with `ModelError::Cancelled`; the same options
/// without the token generate.
#[test]
fn generation_stops_when_cancelled() {
    let model = tiny_transformer(3);
    let lm = tiny_lm(3);
    let cancelled = Cancel::new();
    cancelled.cancel();
    // A deadline of now has passed by the time the search looks at it (`Instant` never goes
    // backwards).
    let expired = Cancel::with_deadline(Instant::now());
    for (name, options) in [
        ("greedy", greedy()),
        ("sample", sample(5, None, None)),
        ("beam", beam(3, 2)),
    ] {
        assert!(model.generate(&sources(), BOS, &options).is_ok(), "{name}");
        for (how, token) in [("cancelled", &cancelled), ("past deadline", &expired)] {
            let options = options.clone().with_cancel(token.clone());
            let what = format!("{name}, {how}");
            assert!(
                matches!(
                    model.generate(&sources(), BOS, &options),
                    Err(ModelError::Cancelled)
                ),
                "transformer {what}"
            );
            assert!(
                matches!(
                    lm.generate(&sources(), &options),
                    Err(ModelError::Cancelled)
                ),
                "decoder-only {what}"
            );
        }
    }
    // A token that is neither cancelled nor past its deadline changes nothing.
    let live = Cancel::with_deadline(Instant::now() + Duration::from_secs(3600));
    let with = model
        .generate(&sources(), BOS, &beam(3, 2).with_cancel(live))
        .unwrap();
    let without = model.generate(&sources(), BOS, &beam(3, 2)).unwrap();
    assert_eq!(with, without);
}

/// Wraps a decoder: counts its steps, and at step `cancel_at` has another thread cancel the
/// token (waiting until it has), as a server's request task does when its client leaves.
struct CancelledMidway<'a, M> {
    inner: &'a M,
    steps: Cell<usize>,
    cancel_at: usize,
    /// Asks the other thread to cancel; it answers on `done` once it has.
    ask: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
}

impl<M: IncrementalDecoder<Cpu>> IncrementalDecoder<Cpu> for CancelledMidway<'_, M> {
    type State = M::State;

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: Tensor<Cpu, 2, Int>,
        need_attention: bool,
    ) -> Result<Step<Cpu>, ModelError> {
        self.steps.set(self.steps.get() + 1);
        if self.steps.get() == self.cancel_at {
            self.ask.send(()).unwrap();
            self.done.recv().unwrap();
        }
        self.inner.step(state, tokens, need_attention)
    }

    fn reorder(&self, state: &mut Self::State, indices: &[usize]) {
        self.inner.reorder(state, indices);
    }
}

/// Runs `options` through `inner` wrapped in [`CancelledMidway`] (cancelled by another thread
/// during step 3) and returns the generation's result and the steps taken.
fn cancelled_at_step_three<M: IncrementalDecoder<Cpu>>(
    inner: &M,
    state: M::State,
    first: Vec<Vec<u32>>,
    options: &GenerationOptions,
) -> (Result<Generation, ModelError>, usize) {
    let token = Cancel::new();
    let options = options.clone().with_cancel(token.clone());
    let (ask, asked) = mpsc::channel();
    let (answer, done) = mpsc::channel();
    let canceller = std::thread::spawn(move || {
        if asked.recv().is_ok() {
            token.cancel();
            answer.send(()).unwrap();
        }
    });
    let wrapper = CancelledMidway {
        inner,
        steps: Cell::new(0),
        cancel_at: 3,
        ask,
        done,
    };
    let result = generate(&wrapper, state, first, &options);
    let steps = wrapper.steps.get();
    drop(wrapper); // closes the channel if step 3 never came
    canceller.join().unwrap();
    (result, steps)
}

/// Cancelled from another thread during the third decoding step, greedy, sampled and beam
/// search (encoder-decoder and decoder-only) return `Cancelled` and take no fourth step,
/// although uncancelled they run longer (so the stop is the token's doing).
#[test]
fn generation_cancelled_from_another_thread_stops_within_one_step() {
    let model = tiny_transformer(5);
    let lm = tiny_lm(5);
    let device = Device::default();
    let source = vec![sources()[0].clone()];
    let prompt = sources()[0].clone();
    let lm_state = || {
        let mut state = lm.start(1);
        state.ignored[0].extend(vec![false; prompt.len()]);
        state
    };
    for (name, options) in [
        ("greedy", greedy()),
        ("sample", sample(5, None, None)),
        ("beam", beam(3, 2)),
    ] {
        // min_len keeps every search running to max_len without the token.
        let options = options.with_min_len(MAX_LEN);
        let uncancelled = model.generate(&source, BOS, &options).unwrap();
        assert!(
            uncancelled.hypotheses[0][0].tokens.len() > 3,
            "{name}: the search must outlast step 3 for the test to mean anything"
        );
        let state = model.start(&model.encode(ids::<Cpu>(&source, &device)).unwrap());
        let (result, steps) = cancelled_at_step_three(&model, state, vec![vec![BOS]], &options);
        assert!(
            matches!(result, Err(ModelError::Cancelled)),
            "transformer {name}: {result:?}"
        );
        assert_eq!(steps, 3, "transformer {name}: steps taken");

        let (result, steps) =
            cancelled_at_step_three(&lm, lm_state(), vec![prompt.clone()], &options);
        assert!(
            matches!(result, Err(ModelError::Cancelled)),
            "decoder-only {name}: {result:?}"
        );
        assert_eq!(steps, 3, "decoder-only {name}: steps taken");
    }
}
