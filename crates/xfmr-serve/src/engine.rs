//! Continuous batching of a language model's decoding: one thread owns the model and decodes
//! every active request together, one token per request per step, through each request's own
//! key/value cache ([`QuantizedLlama::forward_batch`]). Requests join between steps (their
//! prompt is fed in the step they join) and leave as soon as they finish or their client goes
//! away; a request that finds every slot taken waits in a bounded queue, and beyond it is
//! refused (429).
//!
//! Prompts' key/value caches are kept across requests ([`PrefixCache`], within
//! `ServeConfig::prefix_cache_bytes`): a request starts from the longest prefix it shares with
//! an earlier prompt or conversation (the chat template's system prompt, the turns before),
//! and only the rest of its prompt is fed. What a request has been fed is kept after its
//! prompt's step and again when it ends or its client leaves (not after a failed step).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::thread;

use tokio::sync::mpsc::UnboundedSender;
use xfmr_llm::decode::{self, DecodeRequest, Decoding, Next};
use xfmr_llm::quantized::{PrefixCache, Scratch, SequenceCache};
use xfmr_llm::{GgufTokenizer, QuantizedLlama};

use crate::error::ApiError;
use crate::{recv_or_idle, IdleHook};

pub use xfmr_llm::decode::{Event, Finish};

/// One generation request.
pub(crate) struct Job {
    /// Prompt ids (non-empty; `prompt + max_tokens` within the context, checked before).
    pub prompt: Vec<u32>,
    /// The token limit, the sampler (greedy or seeded, `logit_bias`), stop strings and end
    /// tokens: decoded by the library's one loop ([`Decoding`]).
    pub request: DecodeRequest,
    /// Where the events go; closed when the client is gone.
    pub events: UnboundedSender<Event>,
}

/// What the engine has done, for `GET /health`.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Requests decoding now.
    pub active: AtomicUsize,
    /// Requests that ended (end token, stop string, `max_tokens`, or an error).
    pub completed: AtomicUsize,
    /// Requests dropped because their client went away before the end.
    pub cancelled: AtomicUsize,
    /// The most requests ever decoded in one step.
    pub largest_batch: AtomicUsize,
    /// Decoding steps taken.
    pub steps: AtomicUsize,
    /// Prompt tokens that were not fed, their keys and values taken from the prefix cache.
    pub cached_tokens: AtomicUsize,
    /// Whether the decoding thread has ended (a panic outside a request's own guarded work):
    /// the server can no longer generate, and `GET /health` says so.
    pub stopped: AtomicBool,
}

/// Marks the engine stopped when the decoding thread ends, by return or by unwinding.
struct StopGuard<'a>(&'a Stats);

impl Drop for StopGuard<'_> {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
    }
}

/// The handle handlers submit to.
#[derive(Clone)]
pub(crate) struct Engine {
    jobs: mpsc::Sender<Job>,
    /// Requests submitted and not yet finished (active and waiting).
    load: Arc<AtomicUsize>,
    limit: usize,
    /// Counters.
    pub stats: Arc<Stats>,
}

impl Engine {
    /// Starts the decoding thread: at most `max_batch` requests decode together, at most
    /// `max_waiting` more wait, at most `prefix_cache_bytes` of earlier prompts' keys and
    /// values are kept.
    pub fn spawn(
        model: Arc<QuantizedLlama>,
        tokenizer: Arc<GgufTokenizer>,
        max_batch: usize,
        max_waiting: usize,
        prefix_cache_bytes: usize,
        on_idle: IdleHook,
    ) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel();
        let load = Arc::new(AtomicUsize::new(0));
        let stats = Arc::new(Stats::default());
        let (thread_load, thread_stats) = (Arc::clone(&load), Arc::clone(&stats));
        thread::Builder::new()
            .name("xfmr-serve-llm".into())
            .spawn(move || {
                let _guard = StopGuard(&thread_stats);
                decode_loop(
                    &model,
                    &tokenizer,
                    Jobs { rx, on_idle },
                    max_batch.max(1),
                    PrefixCache::new(prefix_cache_bytes),
                    &thread_load,
                    &thread_stats,
                )
            })?;
        Ok(Self {
            jobs,
            load,
            limit: max_batch.max(1) + max_waiting,
            stats,
        })
    }

    /// Requests submitted and not finished: decoding or waiting.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::SeqCst)
    }

    /// Queues `job`, or refuses it (429) when the batch and the queue are full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let taken = self
            .load
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limit).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(ApiError::busy("the language model", self.limit));
        }
        self.jobs.send(job).map_err(|_| {
            self.load.fetch_sub(1, Ordering::SeqCst);
            ApiError::internal("the language model's thread has stopped")
        })
    }
}

/// A request being decoded.
struct Active<'t> {
    prompt: Vec<u32>,
    events: UnboundedSender<Event>,
    cache: SequenceCache,
    /// What the next step feeds: the prompt (what the prefix cache did not give), then each
    /// chosen token.
    feed: Vec<u32>,
    /// Token choice, stop strings, text: the library's one loop.
    decoding: Decoding<'t>,
}

impl Active<'_> {
    fn send(&self, event: Event) {
        // A closed channel means the client left: the request is dropped at the next step.
        let _ = self.events.send(event);
    }

    /// Chooses the next token from the step's `row` of logits and handles it: the end, text
    /// (stop strings), `max_tokens`, or the token to feed next.
    fn advance(&mut self, row: &mut [f32]) {
        let events = &self.events;
        let next = self.decoding.advance(row, &mut |e| {
            let _ = events.send(e);
        });
        if let Next::Feed(token) = next {
            self.feed.clear();
            self.feed.push(token);
        }
    }
}

/// A request's first state: its cache started from the longest prefix of its prompt that the
/// prefix cache holds, the rest of the prompt to feed.
fn admit<'t>(
    job: Job,
    model: &QuantizedLlama,
    tokenizer: &'t GgufTokenizer,
    prefixes: &mut PrefixCache,
) -> Active<'t> {
    let mut cache = model.sequence(job.prompt.len() + job.request.max_tokens);
    let cached = prefixes.restore(&job.prompt, &mut cache);
    Active {
        cache,
        feed: job.prompt[cached..].to_vec(),
        decoding: Decoding::new(tokenizer, job.request).with_cached_tokens(cached),
        prompt: job.prompt,
        events: job.events,
    }
}

/// Keeps what `a` has been fed (its prompt, then the tokens it chose) for later requests.
fn keep(a: &Active<'_>, prefixes: &mut PrefixCache) {
    decode::store(prefixes, &a.prompt, a.decoding.tokens(), &a.cache);
}

/// The engine's queue, and what its thread does before it waits on it.
struct Jobs {
    rx: Receiver<Job>,
    on_idle: IdleHook,
}

impl Jobs {
    /// The next job ([`recv_or_idle`]).
    fn wait(&self) -> Result<Job, mpsc::RecvError> {
        recv_or_idle(&self.rx, &*self.on_idle)
    }
}

fn decode_loop(
    model: &QuantizedLlama,
    tokenizer: &GgufTokenizer,
    jobs: Jobs,
    max_batch: usize,
    mut prefixes: PrefixCache,
    load: &AtomicUsize,
    stats: &Stats,
) {
    let vocab = model.config.vocab_size;
    let mut scratch = Scratch::new();
    let mut active: Vec<Active<'_>> = Vec::new();
    loop {
        // Join: wait when idle, else take whoever is waiting, up to the batch size.
        if active.is_empty() {
            match jobs.wait() {
                Ok(job) => active.push(admit(job, model, tokenizer, &mut prefixes)),
                Err(_) => return,
            }
        }
        while active.len() < max_batch {
            match jobs.rx.try_recv() {
                Ok(job) => active.push(admit(job, model, tokenizer, &mut prefixes)),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if active.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        // Leave: clients that went away free their slot before the step (what they were fed
        // is kept).
        let before = active.len();
        active.retain(|a| {
            let gone = a.events.is_closed();
            if gone {
                keep(a, &mut prefixes);
            }
            !gone
        });
        load.fetch_sub(before - active.len(), Ordering::SeqCst);
        stats
            .cancelled
            .fetch_add(before - active.len(), Ordering::SeqCst);
        stats.active.store(active.len(), Ordering::SeqCst);
        if active.is_empty() {
            continue;
        }
        stats
            .largest_batch
            .fetch_max(active.len(), Ordering::SeqCst);
        stats.steps.fetch_add(1, Ordering::SeqCst);
        let step = catch_unwind(AssertUnwindSafe(|| {
            let mut batch: Vec<(&mut SequenceCache, &[u32])> = active
                .iter_mut()
                .map(|a| (&mut a.cache, a.feed.as_slice()))
                .collect();
            model.forward_batch_in(&mut batch, &mut scratch).map(|_| ())
        }));
        match step {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                fail_all(&mut active, load, stats, &e.to_string());
                continue;
            }
            Err(_) => {
                scratch = Scratch::new();
                fail_all(
                    &mut active,
                    load,
                    stats,
                    "the model panicked during a decoding step",
                );
                continue;
            }
        }
        let logits = scratch.logits_mut();
        for (a, row) in active.iter_mut().zip(logits.chunks_exact_mut(vocab)) {
            // The step that fed the prompt: no token has been chosen yet (every request
            // that outlives a step has chosen one).
            if a.decoding.tokens().is_empty() {
                stats
                    .cached_tokens
                    .fetch_add(a.decoding.cached_tokens(), Ordering::SeqCst);
                keep(a, &mut prefixes);
            }
            // One request's failure (a panic in its sampling or detokenising) ends that
            // request only.
            let outcome = catch_unwind(AssertUnwindSafe(|| a.advance(row)));
            if outcome.is_err() {
                let events = &a.events;
                a.decoding.fail(
                    "choosing the next token failed (it panicked)".into(),
                    &mut |e| {
                        let _ = events.send(e);
                    },
                );
            }
            if a.decoding.is_done() {
                keep(a, &mut prefixes);
            }
        }
        let before = active.len();
        active.retain(|a| !a.decoding.is_done());
        load.fetch_sub(before - active.len(), Ordering::SeqCst);
        stats
            .completed
            .fetch_add(before - active.len(), Ordering::SeqCst);
        stats.active.store(active.len(), Ordering::SeqCst);
    }
}

/// Ends every active request with `message` (a failed step leaves their caches unusable).
fn fail_all(active: &mut Vec<Active<'_>>, load: &AtomicUsize, stats: &Stats, message: &str) {
    for a in active.iter() {
        a.send(Event::Failed(message.to_string()));
    }
    load.fetch_sub(active.len(), Ordering::SeqCst);
    stats.completed.fetch_add(active.len(), Ordering::SeqCst);
    stats.active.store(0, Ordering::SeqCst);
    active.clear();
}
