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
use xfmr_llm::quantized::{PrefixCache, Scratch, SequenceCache};
use xfmr_llm::{GgufTokenizer, QuantizedLlama, TextStream};
use xfmr_models::generate::TokenChooser;

use crate::error::ApiError;
use crate::{recv_or_idle, IdleHook};

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The end token, or a stop string.
    Stop,
    /// `max_tokens`.
    Length,
}

impl Finish {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// What the engine tells a request's handler, in order: text pieces, then one end.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The next piece of text (whole characters; never part of a stop string).
    Text(String),
    /// Generation ended.
    Done {
        /// Why.
        finish: Finish,
        /// Tokens generated (the end token not counted).
        completion_tokens: usize,
        /// Prompt tokens whose keys and values came from the prefix cache (OpenAI's
        /// `usage.prompt_tokens_details.cached_tokens`).
        cached_tokens: usize,
    },
    /// The model failed; the request ends here (the server goes on).
    Failed(String),
}

/// One generation request.
pub(crate) struct Job {
    /// Prompt ids (non-empty; `prompt + max_tokens` within the context, checked before).
    pub prompt: Vec<u32>,
    /// At most this many tokens.
    pub max_tokens: usize,
    /// Greedy or seeded sampling.
    pub chooser: TokenChooser,
    /// Strings that end the generation (not included in the text).
    pub stop: Vec<String>,
    /// Added to these tokens' logits before choosing (OpenAI's `logit_bias`).
    pub bias: Vec<(u32, f32)>,
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
    job: Job,
    cache: SequenceCache,
    /// What the next step feeds: the prompt (what the prefix cache did not give), then each
    /// chosen token.
    feed: Vec<u32>,
    /// Prompt positions restored from the prefix cache.
    cached: usize,
    text: TextStream<'t>,
    /// Text not yet sent: it might be the start of a stop string.
    held: String,
    /// Everything emitted so far, sent or held (what the tokens' full decoding must extend).
    emitted: String,
    /// The tokens generated.
    tokens: Vec<u32>,
    generated: usize,
    /// Set when the request is over.
    done: bool,
}

impl Active<'_> {
    fn send(&self, event: Event) {
        // A closed channel means the client left: the request is dropped at the next step.
        let _ = self.job.events.send(event);
    }

    /// Ends the request at the end token or `max_tokens`: the text the streamed pieces have
    /// not given yet (bytes of an incomplete character, decoded as the whole sequence decodes)
    /// goes out first, unless it completes a stop string.
    fn finish_with_tail(&mut self, finish: Finish, tokenizer: &GgufTokenizer) {
        let full = tokenizer.decode(&self.tokens).unwrap_or_default();
        if let Some(tail) = full.strip_prefix(self.emitted.as_str()) {
            if !tail.is_empty() && self.push_text(tail) {
                return self.finish(Finish::Stop);
            }
        }
        self.finish(finish)
    }

    fn finish(&mut self, finish: Finish) {
        if !self.held.is_empty() {
            let text = std::mem::take(&mut self.held);
            self.send(Event::Text(text));
        }
        self.send(Event::Done {
            finish,
            completion_tokens: self.generated,
            cached_tokens: self.cached,
        });
        self.done = true;
    }

    /// Chooses the next token from the step's `row` of logits and handles it: the end, text
    /// (stop strings), `max_tokens`, or the token to feed next.
    fn advance(&mut self, row: &mut [f32], tokenizer: &GgufTokenizer) {
        for &(id, bias) in &self.job.bias {
            row[id as usize] += bias;
        }
        let token = self.job.chooser.choose_from_logits(row);
        // Any end-of-generation token (`<|endoftext|>` as well as the chat turn's end), even one
        // forced by `logit_bias`: the end, never text.
        if tokenizer.is_end_of_generation(token) {
            return self.finish_with_tail(Finish::Stop, tokenizer);
        }
        self.generated += 1;
        self.tokens.push(token);
        let stopped = match self.text.push(token) {
            Ok(piece) => self.push_text(&piece),
            Err(e) => {
                self.send(Event::Failed(e.to_string()));
                self.done = true;
                return;
            }
        };
        if stopped {
            self.finish(Finish::Stop);
        } else if self.generated >= self.job.max_tokens {
            self.finish_with_tail(Finish::Length, tokenizer);
        } else {
            self.feed.clear();
            self.feed.push(token);
        }
    }

    /// Takes the next piece of text: sends what can no longer be part of a stop string, and
    /// says whether a stop string was completed (the text before it is sent, it is not).
    fn push_text(&mut self, piece: &str) -> bool {
        self.emitted.push_str(piece);
        self.held.push_str(piece);
        let stops = &self.job.stop;
        if let Some(at) = stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.held.truncate(at);
            return true;
        }
        // Hold back the longest tail that begins a stop string.
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let keep = (1..=self.held.len().min(longest))
            .rev()
            .filter(|&k| self.held.is_char_boundary(self.held.len() - k))
            .find(|&k| {
                let tail = &self.held[self.held.len() - k..];
                stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0);
        let ready = self.held.len() - keep;
        if ready > 0 {
            let rest = self.held.split_off(ready);
            let text = std::mem::replace(&mut self.held, rest);
            self.send(Event::Text(text));
        }
        false
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
    let mut cache = model.sequence(job.prompt.len() + job.max_tokens);
    let cached = prefixes.restore(&job.prompt, &mut cache);
    Active {
        cache,
        feed: job.prompt[cached..].to_vec(),
        cached,
        text: tokenizer.stream(),
        held: String::new(),
        emitted: String::new(),
        tokens: Vec::new(),
        generated: 0,
        done: false,
        job,
    }
}

/// Keeps what `a` has been fed (its prompt, then the tokens it chose) for later requests.
fn keep(a: &Active<'_>, prefixes: &mut PrefixCache) {
    let fed = a.cache.len().saturating_sub(a.job.prompt.len());
    if fed == 0 {
        return prefixes.store(&a.job.prompt, &a.cache);
    }
    let mut tokens = Vec::with_capacity(a.cache.len());
    tokens.extend_from_slice(&a.job.prompt);
    tokens.extend_from_slice(&a.tokens[..fed.min(a.tokens.len())]);
    prefixes.store(&tokens, &a.cache);
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
            let gone = a.job.events.is_closed();
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
            if a.generated == 0 {
                stats.cached_tokens.fetch_add(a.cached, Ordering::SeqCst);
                keep(a, &mut prefixes);
            }
            // One request's failure (a panic in its sampling or detokenising) ends that
            // request only.
            let outcome = catch_unwind(AssertUnwindSafe(|| a.advance(row, tokenizer)));
            if outcome.is_err() {
                a.send(Event::Failed(
                    "choosing the next token failed (it panicked)".into(),
                ));
                a.done = true;
            }
            if a.done {
                keep(a, &mut prefixes);
            }
        }
        let before = active.len();
        active.retain(|a| !a.done);
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
