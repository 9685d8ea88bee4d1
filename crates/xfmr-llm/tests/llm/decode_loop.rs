//! The one decoding loop on host logits (`xfmr_llm::decode`): what `xfmr generate`,
//! `LanguageModel::complete` on quantised weights and `xfmr serve` share.
//!
//! [`Decoding`] is driven here with scripted logits (one token made the argmax per step), so
//! that every split of a stop string over tokens can be chosen; [`decode`] and `complete` run
//! the tiny quantised model, checked against the library's search (`xfmr_models::generate::search`
//! over `QuantizedSteps`), whose beam search is checked against one forward pass per beam.

use burn::backend::NdArray;
use xfmr_llm::budget;
use xfmr_llm::decode::{self, DecodeRequest, Decoding, Event, Finish, Next};
use xfmr_llm::gguf::Gguf;
use xfmr_llm::quantized::{PrefixCache, Scratch, SequenceCache};
use xfmr_llm::{GgufTokenizer, LanguageModel, LmWeights, QuantizedLlama, WeightFormat};
use xfmr_models::generate::{search, HostSteps, SampleOptions, Sampler, Strategy};
use xfmr_models::{BeamOptions, GenerationOptions, ModelError};

use crate::tiny::tiny_gguf;

fn tiny_lm() -> LanguageModel<NdArray> {
    let gguf = Gguf::parse(tiny_gguf(7)).unwrap();
    LanguageModel::from_gguf_with(&gguf, &Default::default(), WeightFormat::Quantized).unwrap()
}

/// Logits of `vocab` zeros with `token` at 10: the argmax.
fn one_hot(vocab: usize, token: u32) -> Vec<f32> {
    let mut logits = vec![0.0; vocab];
    logits[token as usize] = 10.0;
    logits
}

/// Runs `decoding` over `script` (one chosen token per step, until it says it is done) and
/// returns its events and how many steps it took.
fn run(decoding: &mut Decoding<'_>, vocab: usize, script: &[u32]) -> (Vec<Event>, usize) {
    let mut events = Vec::new();
    for (step, &token) in script.iter().enumerate() {
        let next = decoding.advance(&mut one_hot(vocab, token), &mut |e| events.push(e));
        match next {
            Next::Feed(fed) => assert_eq!(fed, token, "step {step} feeds the chosen token"),
            Next::Done => return (events, step + 1),
        }
    }
    (events, script.len())
}

fn text_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn done_of(events: &[Event]) -> (Finish, usize) {
    match events.last() {
        Some(Event::Done {
            finish,
            completion_tokens,
            ..
        }) => (*finish, *completion_tokens),
        other => panic!("the last event is not the end: {other:?}"),
    }
}

/// One token per byte of `text`, so that every split of a multi-byte character and of a
/// stop string over tokens is taken: the tiny vocabulary lists its 256 byte tokens after its
/// three control tokens, byte `b` at id `3 + b` (`xfmr_testing::tiny_gguf::tokens`).
fn byte_tokens(tokenizer: &GgufTokenizer, text: &str) -> Vec<u32> {
    let ids: Vec<u32> = text.bytes().map(|b| 3 + u32::from(b)).collect();
    assert_eq!(
        tokenizer.decode(&ids).unwrap(),
        text,
        "byte tokens of {text:?}"
    );
    ids
}

#[test]
fn decode_loop_stop_strings_never_in_the_output_even_split_across_tokens() {
    let lm = tiny_lm();
    let tokenizer = &lm.tokenizer;
    let vocab = tokenizer.n_tokens();
    let text = "a café. STOP! then more";
    let script = byte_tokens(tokenizer, text);
    for stop in ["STOP", "é. S", "é", " ", "P! t", "a café. STOP! then more"] {
        let before = &text[..text.find(stop).unwrap()];
        let request = DecodeRequest::greedy(tokenizer, 100).with_stop(vec![stop.into()]);
        let mut decoding = Decoding::new(tokenizer, request);
        let (events, steps) = run(&mut decoding, vocab, &script);
        assert_eq!(
            text_of(&events),
            before,
            "stop {stop:?}: the text before it"
        );
        assert_eq!(
            steps,
            text[..text.find(stop).unwrap() + stop.len()].len(),
            "stop {stop:?}: it ends at the token completing it"
        );
        assert_eq!(done_of(&events).0, Finish::Stop, "stop {stop:?}");
        // No piece ever held a part of the stop string that was then taken back: the pieces
        // are the text before it, in order.
        let mut emitted = String::new();
        for e in &events {
            if let Event::Text(t) = e {
                emitted.push_str(t);
                assert!(
                    before.starts_with(&emitted),
                    "stop {stop:?}: {emitted:?} emitted"
                );
            }
        }
    }
    // A string that only begins like a stop string is held, then emitted whole.
    let request = DecodeRequest::greedy(tokenizer, 100).with_stop(vec!["STOPPED".into()]);
    let mut decoding = Decoding::new(tokenizer, request);
    let (events, steps) = run(&mut decoding, vocab, &script);
    assert_eq!(steps, script.len());
    assert_eq!(text_of(&events), text, "no stop string: all the text");
    assert!(!decoding.is_done(), "the script ended before the limit");
}

#[test]
fn decode_loop_logit_bias_and_min_len_honoured() {
    let lm = tiny_lm();
    let tokenizer = &lm.tokenizer;
    let vocab = tokenizer.n_tokens();
    let eos = tokenizer.eos_id();
    let [a, b] = byte_tokens(tokenizer, "ab")[..] else {
        unreachable!()
    };
    // The end token is the argmax at every step: min_len 3 keeps it off for three tokens
    // (each the runner-up), then it ends the sequence.
    let mut logits_with_end = one_hot(vocab, eos);
    logits_with_end[a as usize] = 5.0;
    let request = DecodeRequest::greedy(tokenizer, 10)
        .with_sampler(Sampler::greedy().with_min_len(3, vec![eos]));
    let mut decoding = Decoding::new(tokenizer, request);
    let mut events = Vec::new();
    for _ in 0..10 {
        if decoding.advance(&mut logits_with_end.clone(), &mut |e| events.push(e)) == Next::Done {
            break;
        }
    }
    assert_eq!(
        decoding.tokens(),
        [a, a, a],
        "the end token held off for three"
    );
    assert_eq!(done_of(&events), (Finish::Stop, 3));
    assert_eq!(text_of(&events), "aaa");

    // logit_bias: +20 makes `b` win over the argmax `a`; -inf bans `a` (then `b` wins,
    // the runner-up); a bias on an id outside the vocabulary is ignored.
    for (bias, expected) in [
        (vec![(b, 20.0)], b),
        (vec![(a, f32::NEG_INFINITY)], b),
        (vec![(vocab as u32 + 5, 100.0)], a),
    ] {
        let mut logits = one_hot(vocab, a);
        logits[b as usize] = 5.0;
        let request = DecodeRequest::greedy(tokenizer, 1)
            .with_sampler(Sampler::greedy().with_logit_bias(bias.clone()));
        let mut decoding = Decoding::new(tokenizer, request);
        let mut events = Vec::new();
        assert_eq!(
            decoding.advance(&mut logits, &mut |e| events.push(e)),
            Next::Done
        );
        assert_eq!(decoding.tokens(), [expected], "bias {bias:?}");
        assert_eq!(done_of(&events), (Finish::Length, 1), "bias {bias:?}");
    }
    // Sampling draws only among what the bias leaves: `a` banned, `b` and `c` possible.
    let [c] = byte_tokens(tokenizer, "c")[..] else {
        unreachable!()
    };
    let mut logits = vec![f32::NEG_INFINITY; vocab];
    logits[a as usize] = 10.0;
    logits[b as usize] = 0.0;
    logits[c as usize] = 0.0;
    let sampler = Sampler::new(Some(SampleOptions {
        seed: 3,
        ..Default::default()
    }))
    .with_logit_bias(vec![(a, f32::NEG_INFINITY)]);
    let request = DecodeRequest::greedy(tokenizer, 200).with_sampler(sampler);
    let mut decoding = Decoding::new(tokenizer, request);
    for _ in 0..200 {
        decoding.advance(&mut logits.clone(), &mut |_| {});
    }
    let drawn = decoding.tokens();
    assert_eq!(drawn.len(), 200);
    assert!(!drawn.contains(&a), "a banned token was drawn");
    let bs = drawn.iter().filter(|&&t| t == b).count();
    // b and c are equally likely: 200 fair draws give 100 ± 5σ (σ ≈ 7.1).
    assert!((65..=135).contains(&bs), "{bs} of 200 draws were b");
}

#[test]
fn decode_loop_max_tokens_ends_with_length_and_the_whole_text() {
    let lm = tiny_lm();
    let tokenizer = &lm.tokenizer;
    let vocab = tokenizer.n_tokens();
    let text = "hello é";
    let script = byte_tokens(tokenizer, text);
    for max in 1..=script.len() {
        let request = DecodeRequest::greedy(tokenizer, max);
        let mut decoding = Decoding::new(tokenizer, request);
        let (events, steps) = run(&mut decoding, vocab, &script);
        assert_eq!(steps, max, "max_tokens {max}");
        assert_eq!(done_of(&events), (Finish::Length, max));
        assert_eq!(
            text_of(&events),
            tokenizer.decode(&script[..max]).unwrap(),
            "max_tokens {max}: the text of the tokens, an incomplete character included"
        );
        // After the end, nothing more.
        let mut more = Vec::new();
        assert_eq!(
            decoding.advance(&mut one_hot(vocab, script[0]), &mut |e| more.push(e)),
            Next::Done
        );
        assert!(more.is_empty());
    }
    // No token asked for: the end at once, nothing chosen.
    let mut decoding = Decoding::new(tokenizer, DecodeRequest::greedy(tokenizer, 0));
    let mut events = Vec::new();
    let next = decoding.advance(&mut one_hot(vocab, script[0]), &mut |e| events.push(e));
    assert_eq!(next, Next::Done);
    assert!(decoding.tokens().is_empty());
    assert_eq!(done_of(&events), (Finish::Length, 0));
}

#[test]
fn decode_loop_prefix_cache_restore_gives_the_tokens_of_an_uncached_run() {
    let lm = tiny_lm();
    let LmWeights::Quantized(model) = &lm.model else {
        panic!("quantised weights asked for")
    };
    let tokenizer = &lm.tokenizer;
    let request = |seed: Option<u64>| {
        let sampler = Sampler::new(seed.map(|seed| SampleOptions {
            seed,
            ..Default::default()
        }))
        .with_min_len(12, tokenizer.end_of_generation_ids().to_vec());
        DecodeRequest::greedy(tokenizer, 12).with_sampler(sampler)
    };
    let first = tokenizer.encode("the hello there, the hello").unwrap();
    let mut second = first.clone();
    second.extend(tokenizer.encode(" and hello again").unwrap());
    for seed in [None, Some(11)] {
        let mut prefixes = PrefixCache::new(1 << 20);
        let alone = |prompt: &[u32]| {
            decode::decode(model, tokenizer, prompt, request(seed), None, &mut |_| {}).unwrap()
        };
        let a = decode::decode(
            model,
            tokenizer,
            &first,
            request(seed),
            Some(&mut prefixes),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(a.cached_tokens, 0, "an empty prefix cache");
        assert_eq!(a.tokens, alone(&first).tokens, "seed {seed:?}");
        let mut events = Vec::new();
        let b = decode::decode(
            model,
            tokenizer,
            &second,
            request(seed),
            Some(&mut prefixes),
            &mut |e| events.push(e),
        )
        .unwrap();
        // At least the first prompt restored (more if its first generated tokens begin the
        // second prompt's continuation).
        assert!(
            b.cached_tokens >= first.len(),
            "seed {seed:?}: {} restored",
            b.cached_tokens
        );
        assert_eq!(
            b.tokens,
            alone(&second).tokens,
            "seed {seed:?}: the tokens of an uncached run"
        );
        assert_eq!(b.tokens.len(), 12);
        assert!(matches!(
            events.last(),
            Some(Event::Done { cached_tokens, .. }) if *cached_tokens == b.cached_tokens
        ));
        // The same prompt again: all but its last token restored.
        let c = decode::decode(
            model,
            tokenizer,
            &second,
            request(seed),
            Some(&mut prefixes),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(c.cached_tokens, second.len() - 1);
        assert_eq!(c.tokens, b.tokens);
    }
}

#[test]
fn decode_loop_complete_equals_the_library_search() {
    let lm = tiny_lm();
    let LmWeights::Quantized(model) = &lm.model else {
        panic!("quantised weights asked for")
    };
    let tokenizer = &lm.tokenizer;
    let prompt = "the hello there";
    let ids = tokenizer.encode(prompt).unwrap();
    let greedy = GenerationOptions::greedy(16, tokenizer.eos_id(), tokenizer.pad_id());
    for options in [
        greedy.clone().with_min_len(16),
        greedy.clone().with_min_len(5),
        greedy
            .clone()
            .with_strategy(Strategy::Sample(SampleOptions {
                temperature: 0.8,
                top_k: Some(40),
                top_p: Some(0.95),
                seed: 5,
            })),
        greedy
            .clone()
            .with_min_len(16)
            .with_strategy(Strategy::Sample(SampleOptions {
                seed: 9,
                ..Default::default()
            })),
    ] {
        let mut streamed = String::new();
        let host = lm
            .complete(prompt, &options, |t| streamed.push_str(t))
            .unwrap();
        let mut library = model
            .generate_streaming(std::slice::from_ref(&ids), &options, &mut |_, _| {})
            .unwrap();
        let expected = library.hypotheses.remove(0).remove(0);
        assert_eq!(host.tokens, expected.tokens, "{:?}", options.strategy);
        assert_eq!(
            host.stopped_at_eos, expected.finished,
            "{:?}",
            options.strategy
        );
        assert_eq!(streamed, host.text, "the streamed pieces are the text");
        assert_eq!(host.text, tokenizer.decode(&host.tokens).unwrap());
    }
    // With a stop string taken from the middle of the greedy text, the completion's text (and
    // what was streamed) ends right before it.
    let full = lm
        .complete(prompt, &greedy.clone().with_min_len(16), |_| {})
        .unwrap()
        .text;
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    let stop: String = chars[4..6].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let request = lm
        .decode_request(&greedy.clone().with_min_len(16))
        .unwrap()
        .expect("greedy runs the loop")
        .with_stop(vec![stop.clone()]);
    let mut streamed = String::new();
    let stopped = lm
        .complete_request(prompt, request, |t| streamed.push_str(t))
        .unwrap();
    assert_eq!(stopped.text, expected, "stop {stop:?}");
    assert_eq!(streamed, expected);
    assert!(stopped.stopped_at_eos);
    // Beam search is not the loop's.
    let beam = greedy
        .clone()
        .with_strategy(Strategy::Beam(Default::default()));
    assert!(lm.decode_request(&beam).unwrap().is_none());
    // Invalid options are refused as the library's search refuses them.
    let bad = greedy.with_strategy(Strategy::Sample(SampleOptions {
        temperature: 0.0,
        ..Default::default()
    }));
    let err = lm.complete(prompt, &bad, |_| {}).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
}

/// The quantised model one row at a time: each row its own forward pass (the weights read once
/// per beam), rows reordered by cloning; the reference of the batched rows.
struct PerRow<'m> {
    model: &'m QuantizedLlama,
    rows: Vec<SequenceCache>,
    logits: Vec<f32>,
}

impl HostSteps for PerRow<'_> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn step(&mut self, tokens: &[u32], width: usize, _: bool) -> Result<&mut [f32], ModelError> {
        self.logits.clear();
        for (row, ids) in self.rows.iter_mut().zip(tokens.chunks_exact(width)) {
            let logits = self
                .model
                .forward_batch(&mut [(row, ids)], &mut Scratch::new())?;
            self.logits.extend_from_slice(&logits);
        }
        Ok(&mut self.logits)
    }

    fn reorder(&mut self, indices: &[usize]) {
        self.rows = indices.iter().map(|&i| self.rows[i].clone()).collect();
    }
}

/// Counts the rows of each step of the batched steps it wraps.
struct Counted<S> {
    inner: S,
    rows: Vec<usize>,
}

impl<S: HostSteps> HostSteps for Counted<S> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn step(&mut self, tokens: &[u32], width: usize, a: bool) -> Result<&mut [f32], ModelError> {
        self.rows.push(tokens.len() / width);
        self.inner.step(tokens, width, a)
    }

    fn reorder(&mut self, indices: &[usize]) {
        self.inner.reorder(indices)
    }
}

#[test]
fn decode_loop_beam_search_over_batched_rows_equals_per_beam() {
    let lm = tiny_lm();
    let LmWeights::Quantized(model) = &lm.model else {
        panic!("quantised weights asked for")
    };
    let tokenizer = &lm.tokenizer;
    // Two prompts of one length (the per-row reference feeds no padding).
    let first = tokenizer.encode("the hello there").unwrap();
    let prompts = vec![first.clone(), first.iter().rev().copied().collect()];
    let len = prompts[0].len();
    let max_len = 10;
    for (beam_size, min_len) in [(4, 0), (3, 6), (1, 0)] {
        let beam = BeamOptions {
            beam_size,
            n_best: beam_size,
            ..Default::default()
        };
        let options = GenerationOptions::greedy(max_len, tokenizer.eos_id(), tokenizer.pad_id())
            .with_min_len(min_len)
            .with_strategy(Strategy::Beam(beam));
        let mut batched = Counted {
            inner: model.steps(prompts.len(), len + max_len),
            rows: Vec::new(),
        };
        let got = search(&mut batched, prompts.clone(), &options, &mut |_, _| {}).unwrap();
        let mut per_row = PerRow {
            model,
            rows: (0..prompts.len())
                .map(|_| model.sequence(len + max_len))
                .collect(),
            logits: Vec::new(),
        };
        let want = search(&mut per_row, prompts.clone(), &options, &mut |_, _| {}).unwrap();
        let case = format!("beam {beam_size}, min_len {min_len}");
        // Every step fed all beams of both prompts as rows of one pass.
        assert!(!batched.rows.is_empty(), "{case}");
        assert!(
            batched.rows.iter().all(|&r| r == prompts.len() * beam_size),
            "{case}: rows per step {:?}",
            batched.rows
        );
        for (b, (got, want)) in got.hypotheses.iter().zip(&want.hypotheses).enumerate() {
            assert_eq!(got.len(), want.len(), "{case}, prompt {b}");
            assert!(!got.is_empty(), "{case}, prompt {b}");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.tokens, w.tokens, "{case}, prompt {b}");
                assert_eq!(g.finished, w.finished, "{case}, prompt {b}");
                // No product mixes rows, but one row and several take different kernels
                // (four weight rows at a time against activation panels), whose f32 sums
                // round differently by a few ulps: 1e-5 relative is ~80 ulps of f32.
                assert!(
                    (g.score - w.score).abs() <= 1e-5 * w.score.abs().max(1.0),
                    "{case}, prompt {b}: score {} vs {}",
                    g.score,
                    w.score
                );
            }
        }
        if beam_size == 1 {
            // Beam 1 is greedy decoding.
            let greedy = GenerationOptions::greedy(max_len, tokenizer.eos_id(), tokenizer.pad_id())
                .with_min_len(min_len);
            let alone = model
                .generate_streaming(&prompts, &greedy, &mut |_, _| {})
                .unwrap();
            assert_eq!(got.best_tokens(), alone.best_tokens(), "{case}");
        }
    }
}

/// The quantised model's decoding steps allocate nothing per token: after the prompt and a few
/// tokens (buffers grown to their size), 32 more steps of greedy decoding on a pool of two
/// threads make no allocation per step on any of its threads (counted by the test binary's global
/// allocator, `xfmr_llm::budget`'s, as the `xfmr` binary installs it; other tests' threads do
/// not count).
#[test]
fn decode_loop_steps_allocate_nothing_per_token() {
    let lm = tiny_lm();
    let LmWeights::Quantized(model) = &lm.model else {
        panic!("quantised weights asked for")
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .start_handler(|_| budget::count_allocations())
        .build()
        .unwrap();
    let prompt = lm.tokenizer.encode("the hello there").unwrap();
    let (warm, counted) = (4, 32);
    let capacity = prompt.len() + warm + counted;
    let allocations = pool.install(|| {
        budget::count_allocations();
        let mut steps = xfmr_llm::QuantizedSteps::new(model, model.sequence(capacity));
        let mut sampler = Sampler::greedy();
        let mut next = |steps: &mut xfmr_llm::QuantizedSteps<'_>, feed: &[u32], n: usize| {
            let logits = steps.step(feed, feed.len(), false).unwrap();
            sampler.choose(logits, n)
        };
        let mut token = next(&mut steps, &prompt, 0);
        for n in 1..=warm {
            token = next(&mut steps, &[token], n);
        }
        let before = budget::allocations();
        for n in warm + 1..=warm + counted {
            token = next(&mut steps, &[token], n);
        }
        assert_eq!(steps.caches()[0].len(), capacity);
        budget::allocations() - before
    });
    // An allocation per token would count at least 32. What may come is one per thread at
    // most: a thread's attention scores (a per-thread buffer) reserved the first time the
    // scheduler hands it an attention chunk, which under load can fall after the warm-up.
    assert!(
        allocations <= pool.current_num_threads(),
        "{allocations} allocations in {counted} decoding steps"
    );
}
