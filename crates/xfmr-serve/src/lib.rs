//! # xfmr-serve
//!
//! xfmr's models over HTTP, as the runtimes people already use expose theirs (llama.cpp's
//! `llama-server`, vLLM): the OpenAI API, so that any OpenAI client works unchanged, plus two
//! endpoints of xfmr's own and a page to explore attention.
//!
//! | Endpoint | What |
//! |---|---|
//! | `POST /v1/chat/completions` | chat with the language model (its GGUF chat template); `stream: true` as server-sent events in OpenAI's chunk format; `max_tokens`, `temperature`, `top_p`, `seed`, `stop`; `usage` |
//! | `POST /v1/completions` | plain continuation of a prompt (or several) |
//! | `POST /v1/embeddings` | sentence embeddings (`encoding_format` `float` or `base64`) |
//! | `GET /v1/models`, `GET /health` | what is loaded; liveness |
//! | `POST /v1/translations` | xfmr's: the trained translation model, greedy or beam, n-best |
//! | `POST /v1/attention` | xfmr's: every layer's and head's attention weights over a sentence, for any loaded model |
//! | `GET /` | the page: a playground and the attention explorer (compiled in, no CDN) |
//!
//! **Concurrency.** The language model's requests are decoded together, one token each per
//! step, each through its own key/value cache: a request joins the batch between two steps
//! and leaves it when it ends or its client disconnects (continuous batching). The weights
//! are read once per step for the whole batch, which is where serving eight clients costs much
//! less than eight times one. Prompts' keys and values are kept across requests (prefix
//! caching, [`ServeConfig::prefix_cache_bytes`]): a request beginning as an earlier one did is
//! fed only the rest of its prompt. The encoder models run one request at a time on their own
//! thread. Both have bounded queues: beyond them a request gets a 429.
//!
//! **Admission by cost, before the work.** A POST reserves its `Content-Length` (the body
//! limit when it is chunked) from [`ServeConfig::max_body_bytes_in_flight`] before its body is
//! read, and keeps it until its handler answers: beyond that sum requests wait with their bytes
//! in the kernel's socket buffers (a 429 with `Retry-After` if none frees within
//! `idle_timeout`). A declared length over [`ServeConfig::body_limit`] is a 413 at once, also
//! under `Expect: 100-continue` (no `100 Continue` is sent). Bodies are parsed straight into
//! their typed request. Prompts are tokenised only as far as the model's context
//! (`encode_limited`, `encode_chat`): a megabyte prompt costs what its first few thousand
//! tokens cost, then a 400 `context_length_exceeded`. Attention and translation inputs are
//! refused by their byte length before they are tokenised where it is far over their token
//! limit; the encoder models' work runs one request at a time.
//!
//! **Cancellation.** A request's work on the encoder models' thread (embeddings, translations,
//! attention) carries a cancel token with the request's deadline, cancelled as well when the
//! handler goes away (the client disconnected) or answers 504: a waiting task is skipped, a
//! translation stops between batches and decoding steps, embeddings between batches, so the
//! thread is free for the next request at once. The language model's requests leave the batch
//! at the next step when their client goes.
//!
//! **Origins.** A request's `Host` must be a loopback name or address, the address the server
//! is bound to, or one of [`ServeConfig::allowed_hosts`]; bound to a non-loopback address any
//! `Host` is accepted unless that list is set (as Ollama does). This stops DNS rebinding, where
//! a web page whose name was pointed at 127.0.0.1 reads the replies. A browser's `Origin`
//! must be the server's own, a loopback one, or one of [`ServeConfig::allowed_origins`] (403
//! otherwise), and a POST's body must be `Content-Type: application/json` (415 otherwise): a
//! cross-site page can send neither without the browser asking first, which the server does
//! not allow (no CORS headers). Every response carries `X-Content-Type-Options: nosniff`; the
//! page has a `Content-Security-Policy` (its one script by hash, requests to this server only).
//!
//! **Bad input.** Every malformed, mistyped, oversized or out-of-range request gets a 4xx with
//! OpenAI's error JSON naming the field ([`ApiError`]), including the answers of the HTTP
//! parser itself (400, 414, 431, rewritten on their way out); nothing a client sends panics
//! the server, and no endpoint reads a path from the client. With
//! [`ServeConfig::log_requests`] each request is one line on stderr: method, path, status,
//! prompt and completion tokens where known, milliseconds.
//!
//! ```no_run
//! use burn::backend::Flex;
//! use xfmr_llm::{fetch, LanguageModel, WeightFormat};
//! use xfmr_serve::{ServeConfig, Server};
//!
//! let path = fetch::fetch_smollm2(&fetch::default_cache_dir()).unwrap();
//! let lm = LanguageModel::<Flex>::from_file_with(&path, &Default::default(), WeightFormat::Quantized)
//!     .unwrap();
//! let server = Server::<Flex>::new(ServeConfig::default())
//!     .llm("smollm2", lm)
//!     .unwrap()
//!     .start("127.0.0.1:8080")
//!     .unwrap();
//! println!("serving on http://{}", server.addr());
//! server.wait();
//! ```

#![warn(missing_docs)]

// The request and response bodies, one type each.
mod api;
// The language model's continuous batching.
mod engine;
// `ServeError`, `ApiError` and the request-body extractor.
mod error;
// One module per endpoint (or pair of endpoints).
mod handlers;
// The router, the page and the accept loop.
mod http;
// Streamed generations as server-sent events.
mod sse;
// The encoder models' thread.
mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use xfmr_llm::{GgufTokenizer, LanguageModel, QuantizedLlama};
use xfmr_models::Transformer;
use xfmr_sentence::SentenceEncoder;
use xfmr_translate::SubwordTokenizer;

pub use error::{ApiError, ServeError};

use engine::Engine;
use worker::{Models, Worker};

/// The server's limits and decoding settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServeConfig {
    /// Language-model requests decoded together (the batch).
    pub max_batch: usize,
    /// Requests that may wait for a place in the batch, or in the encoder models' queue;
    /// beyond them a 429.
    pub max_waiting: usize,
    /// The largest `max_tokens` a request may ask for (and the default, capped by the context).
    pub max_tokens: usize,
    /// Inputs per embeddings or translation request.
    pub max_inputs: usize,
    /// Tokens of a sentence whose attention maps are asked for.
    pub max_attention_tokens: usize,
    /// Largest request body, bytes.
    pub body_limit: usize,
    /// How long one request may take, generation included (504 after it; a stream ends with
    /// an error event).
    pub request_timeout: Duration,
    /// How long a connection may wait before sending a request's headers (then it is closed),
    /// and how long a request's whole body may take to arrive (then a 408).
    pub idle_timeout: Duration,
    /// Bytes of earlier prompts' keys and values kept for later requests that begin the same
    /// way ([`xfmr_llm::quantized::PrefixCache`]; 0 keeps none). SmolLM2-135M's take 45 KiB
    /// per token, and up to 15 tokens' keys more per sequence (its keys are kept in whole
    /// blocks of 16 positions).
    pub prefix_cache_bytes: usize,
    /// The length penalty α of translations' beam search (GNMT's; the paper's 0.6 by default).
    /// `xfmr serve` sets the one chosen for the run on its validation split
    /// ([`xfmr_translate::DecodingChoice`]).
    pub translation_length_penalty: f64,
    /// Request-body bytes admitted at once, across all requests (Default: 4 MiB, four
    /// bodies at the default `body_limit`; never below `body_limit`). A request reserves its
    /// `Content-Length` (the body limit when it sends none) before its body is read and keeps
    /// it until its handler answers, so that what parsing and tokenising cost is bounded by
    /// this sum: requests beyond it wait, their bytes in the kernel's socket buffers, and get
    /// a 429 if no room frees within `idle_timeout`.
    pub max_body_bytes_in_flight: usize,
    /// Further `Host` names (or `name:port`) the server answers, besides the loopback names
    /// and addresses and the address it is bound to (Default: none). While the server is bound
    /// to a loopback address any other `Host` gets a 403 (a DNS-rebinding page's requests
    /// name the attacker's domain); bound to another address, every `Host` is accepted unless
    /// this list is not empty.
    pub allowed_hosts: Vec<String>,
    /// Further browser origins (`http://localhost:3000`, or `*` for any) whose pages may call
    /// the server (Default: none). A request whose `Origin` is not the server's own (the
    /// `Host` it was sent to), a loopback one or listed here gets a 403.
    pub allowed_origins: Vec<String>,
    /// One line per request on stderr: method, path, status, prompt and completion tokens
    /// where known, milliseconds (Default: off; `xfmr serve` turns it on).
    pub log_requests: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            max_batch: 8,
            max_waiting: 32,
            max_tokens: 1024,
            max_inputs: 256,
            max_attention_tokens: 64,
            body_limit: 1 << 20,
            request_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(30),
            prefix_cache_bytes: 128 << 20,
            translation_length_penalty: xfmr_models::BeamOptions::default().length_penalty,
            max_body_bytes_in_flight: 4 << 20,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            log_requests: false,
        }
    }
}

/// A loaded language model.
pub(crate) struct Llm {
    pub name: String,
    pub model: Arc<QuantizedLlama>,
    pub tokenizer: Arc<GgufTokenizer>,
    pub engine: Engine,
}

/// What the handlers share.
pub(crate) struct AppState<B: Backend> {
    pub config: ServeConfig,
    /// Unix time the server started (the models' `created`).
    pub started: u64,
    pub llm: Option<Llm>,
    pub embeddings: Option<String>,
    pub translation: Option<String>,
    pub worker: Worker<B>,
    /// Request-body bytes that may be parsed and tokenised at once
    /// ([`ServeConfig::max_body_bytes_in_flight`]).
    pub admission: Arc<tokio::sync::Semaphore>,
    /// The address the server is bound to (its `Host` is always accepted).
    pub bound: SocketAddr,
}

impl<B: Backend> AppState<B> {
    /// Every loaded model's name.
    pub fn names(&self) -> Vec<String> {
        self.llm
            .iter()
            .map(|l| l.name.clone())
            .chain(self.embeddings.clone())
            .chain(self.translation.clone())
            .collect()
    }
}

/// A server being put together: its limits and models. [`start`](Self::start) serves them.
pub struct Server<B: Backend> {
    config: ServeConfig,
    llm: Option<(String, QuantizedLlama, GgufTokenizer)>,
    embeddings: Option<(String, SentenceEncoder<B>)>,
    translation: Option<(String, Transformer<B>, SubwordTokenizer)>,
    on_idle: IdleHook,
}

/// A function each of the server's threads calls when it runs out of work
/// ([`Server::on_idle`]).
pub type IdleHook = Arc<dyn Fn() + Send + Sync>;

/// The next message on a model thread's queue: at once if one waits, else after `on_idle`,
/// blocking. `Err` once every sender is gone.
pub(crate) fn recv_or_idle<T>(
    rx: &std::sync::mpsc::Receiver<T>,
    on_idle: &dyn Fn(),
) -> Result<T, std::sync::mpsc::RecvError> {
    use std::sync::mpsc::{RecvError, TryRecvError};
    match rx.try_recv() {
        Ok(message) => Ok(message),
        Err(TryRecvError::Empty) => {
            on_idle();
            rx.recv()
        }
        Err(TryRecvError::Disconnected) => Err(RecvError),
    }
}

impl<B: Backend> Server<B> {
    /// No models yet.
    pub fn new(config: ServeConfig) -> Self {
        Self {
            config,
            llm: None,
            embeddings: None,
            translation: None,
            on_idle: Arc::new(|| {}),
        }
    }

    /// Calls `hook` on each of the server's threads whenever it runs out of work: on the HTTP
    /// threads before they park or end (an idle blocking thread ends after 1 s), on the encoder
    /// models' and the language model's threads when their queue is empty (Default: nothing).
    ///
    /// This is where an allocator with per-thread caches gives memory back: mimalloc keeps
    /// the pages an idle thread freed until that thread allocates again, so after a burst of
    /// requests the server would hold its peak. `xfmr serve` passes mimalloc's
    /// `mi_collect(true)` (docs/reliability.md, "Hostile clients"). `hook` runs often under
    /// light load: it should cost microseconds.
    pub fn on_idle(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_idle = Arc::new(hook);
        self
    }

    /// Serves a language model under `name` (chat, completions, attention). It must hold its
    /// weights quantised ([`xfmr_llm::WeightFormat::Quantized`]): the batched decoding runs
    /// on the host.
    ///
    /// # Errors
    /// [`ServeError::Model`] for `f32` weights; [`ServeError::DuplicateName`].
    pub fn llm(mut self, name: &str, lm: LanguageModel<B>) -> Result<Self, ServeError> {
        self.check_name(name)?;
        let model = match lm.model {
            xfmr_llm::LmWeights::Quantized(model) => model,
            xfmr_llm::LmWeights::F32(_) => {
                return Err(ServeError::Model {
                    model: name.into(),
                    problem: "loaded with f32 weights; the server decodes quantised weights \
                              (load it with WeightFormat::Quantized)"
                        .into(),
                })
            }
        };
        self.llm = Some((name.into(), model, lm.tokenizer));
        Ok(self)
    }

    /// Serves a sentence encoder under `name` (embeddings, attention).
    ///
    /// # Errors
    /// [`ServeError::DuplicateName`].
    pub fn embeddings(
        mut self,
        name: &str,
        encoder: SentenceEncoder<B>,
    ) -> Result<Self, ServeError> {
        self.check_name(name)?;
        self.embeddings = Some((name.into(), encoder));
        Ok(self)
    }

    /// Serves a trained translation model and its vocabulary under `name` (translations,
    /// attention); `xfmr_train::RunDir::load_model` loads one from a run directory.
    ///
    /// # Errors
    /// [`ServeError::DuplicateName`].
    pub fn translation(
        mut self,
        name: &str,
        model: Transformer<B>,
        tokenizer: SubwordTokenizer,
    ) -> Result<Self, ServeError> {
        self.check_name(name)?;
        self.translation = Some((name.into(), model, tokenizer));
        Ok(self)
    }

    fn check_name(&self, name: &str) -> Result<(), ServeError> {
        let taken = [
            self.llm.as_ref().map(|m| &m.0),
            self.embeddings.as_ref().map(|m| &m.0),
            self.translation.as_ref().map(|m| &m.0),
        ];
        match taken.into_iter().flatten().any(|n| n == name) {
            true => Err(ServeError::DuplicateName(name.into())),
            false => Ok(()),
        }
    }

    /// Binds `addr` (`host:port`; port 0 picks a free one) and serves on background threads
    /// until the returned handle is shut down or dropped.
    ///
    /// # Errors
    /// [`ServeError::Bind`]; [`ServeError::Runtime`] if threads cannot be started.
    pub fn start(self, addr: &str) -> Result<RunningServer, ServeError> {
        let bind = |error| ServeError::Bind {
            addr: addr.into(),
            error,
        };
        let listener = std::net::TcpListener::bind(addr).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let local = listener.local_addr().map_err(bind)?;
        let config = self.config;
        let llm = match self.llm {
            Some((name, model, tokenizer)) => {
                let (model, tokenizer) = (Arc::new(model), Arc::new(tokenizer));
                let engine = Engine::spawn(
                    Arc::clone(&model),
                    Arc::clone(&tokenizer),
                    config.max_batch,
                    config.max_waiting,
                    config.prefix_cache_bytes,
                    Arc::clone(&self.on_idle),
                )
                .map_err(ServeError::Runtime)?;
                Some(Llm {
                    name,
                    model,
                    tokenizer,
                    engine,
                })
            }
            None => None,
        };
        let embeddings = self.embeddings.as_ref().map(|(name, _)| name.clone());
        let translation = self.translation.as_ref().map(|(name, ..)| name.clone());
        let models = Models {
            embeddings: self.embeddings.map(|(_, encoder)| encoder),
            translation: self
                .translation
                .map(|(_, model, tokenizer)| (model, tokenizer)),
            llm: llm
                .as_ref()
                .map(|l| (Arc::clone(&l.model), Arc::clone(&l.tokenizer))),
        };
        let worker = Worker::spawn(models, config.max_waiting, Arc::clone(&self.on_idle))
            .map_err(ServeError::Runtime)?;
        let idle = config.idle_timeout;
        // Never below one body at the limit, so that every admissible request can be admitted.
        let in_flight = config
            .max_body_bytes_in_flight
            .max(config.body_limit)
            .min(u32::MAX as usize);
        let app = http::router(Arc::new(AppState {
            config,
            started: unix_now(),
            llm,
            embeddings,
            translation,
            worker,
            admission: Arc::new(tokio::sync::Semaphore::new(in_flight)),
            bound: local,
        }));
        // Two threads for HTTP: the models compute on their own threads. Tokenising a
        // prompt hands a thread over to the blocking pool (`block_in_place`); the pool's idle
        // threads end after a second rather than tokio's ten, running the hook first, so
        // that what they freed goes back too.
        let (on_park, on_stop) = (Arc::clone(&self.on_idle), self.on_idle);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("xfmr-serve-http")
            .thread_keep_alive(Duration::from_secs(1))
            .on_thread_park(move || on_park())
            .on_thread_stop(move || on_stop())
            .build()
            .map_err(ServeError::Runtime)?;
        let (shutdown, stop) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("xfmr-serve".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => http::accept_loop(listener, app, idle, stop).await,
                        Err(e) => eprintln!("xfmr serve: {local}: {e}"),
                    }
                })
            })
            .map_err(ServeError::Runtime)?;
        Ok(RunningServer {
            addr: local,
            shutdown,
            thread: Some(thread),
        })
    }
}

/// A server running on background threads.
pub struct RunningServer {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (it runs until [`shutdown`](Self::shutdown)).
    pub fn wait(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Stops accepting connections and returns; requests in flight are dropped.
    pub fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
