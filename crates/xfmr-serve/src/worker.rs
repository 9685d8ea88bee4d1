//! The encoder models' thread: embeddings, translation and attention maps run one request at a
//! time on a thread that owns the models (burn modules are not shared between threads), fed by
//! a bounded queue (a full queue is a 429).
//!
//! Each task carries a [`Cancel`] token with its request's deadline, cancelled as well when its
//! handler's future is dropped (the client went away) or gives up (504): a task not yet started
//! is skipped, and a running one stops at its next check (between translation batches and
//! decoding steps, between embedding batches), so that the thread is free for the next.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use tokio::sync::oneshot;
use xfmr_llm::{GgufTokenizer, QuantizedLlama};
use xfmr_models::generate::Cancel;
use xfmr_models::Transformer;
use xfmr_sentence::SentenceEncoder;
use xfmr_translate::SubwordTokenizer;

use crate::error::ApiError;
use crate::{recv_or_idle, IdleHook};

/// The models the worker owns.
pub(crate) struct Models<B: Backend> {
    /// The sentence encoder.
    pub embeddings: Option<SentenceEncoder<B>>,
    /// The translation model and its vocabulary.
    pub translation: Option<(Transformer<B>, SubwordTokenizer)>,
    /// The language model (shared with the decoding thread), for its attention maps.
    pub llm: Option<(Arc<QuantizedLlama>, Arc<GgufTokenizer>)>,
}

type Task<B> = Box<dyn FnOnce(&Models<B>) + Send>;

/// A worker task's error when its work stopped because it was cancelled (the deadline) or
/// failed otherwise: a 504, or `otherwise`.
pub(crate) fn failed(cancel: &Cancel, timeout: Duration, otherwise: ApiError) -> ApiError {
    match cancel.is_cancelled() {
        true => ApiError::timeout(timeout),
        false => otherwise,
    }
}

/// The handle handlers submit work to.
pub(crate) struct Worker<B: Backend> {
    tasks: SyncSender<Task<B>>,
    capacity: usize,
}

impl<B: Backend> Worker<B> {
    /// Starts the thread; at most `capacity` tasks wait; `on_idle` runs whenever the queue
    /// is empty.
    pub fn spawn(models: Models<B>, capacity: usize, on_idle: IdleHook) -> std::io::Result<Self> {
        let (tasks, rx) = mpsc::sync_channel::<Task<B>>(capacity);
        thread::Builder::new()
            .name("xfmr-serve-encoders".into())
            .spawn(move || {
                while let Ok(task) = recv_or_idle(&rx, &*on_idle) {
                    // A panicking task drops its reply sender: its handler answers 500, and
                    // the next task runs.
                    let _ = catch_unwind(AssertUnwindSafe(|| task(&models)));
                }
            })?;
        Ok(Self { tasks, capacity })
    }

    /// Runs `f` on the models' thread and waits for its result, at most `timeout` (429 when
    /// the queue is full, 500 when `f` panics, 504 after `timeout`). `f` gets the request's
    /// [`Cancel`] token to check between its batches: it is cancelled at the deadline, and
    /// when this future is dropped or returns.
    pub async fn run<R: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&Models<B>, &Cancel) -> R + Send + 'static,
    ) -> Result<R, ApiError> {
        let cancel = Cancel::with_deadline(Instant::now() + timeout);
        // Dropped with this future: when the client goes away (hyper drops the handler), the
        // timeout below fires, or the answer came.
        let _stop = cancel.cancel_on_drop();
        let (reply, answer) = oneshot::channel();
        let token = cancel.clone();
        let task: Task<B> = Box::new(move |models| {
            // The client gave up (timeout, disconnect) while this waited: skip the work.
            if !reply.is_closed() && !token.is_cancelled() {
                let _ = reply.send(f(models, &token));
            }
        });
        match self.tasks.try_send(task) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ApiError::busy("the encoder models' queue", self.capacity))
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(ApiError::internal("the encoder models' thread has stopped"))
            }
        }
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(ApiError::timeout(timeout)),
            Ok(Ok(r)) => Ok(r),
            // Skipped at its deadline, or panicked.
            Ok(Err(_)) => Err(failed(
                &cancel,
                timeout,
                ApiError::internal("the model failed on this request (it panicked)"),
            )),
        }
    }
}
