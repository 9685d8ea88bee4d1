//! The encoder models' thread: embeddings, translation and attention maps run one request at a
//! time on a thread that owns the models (burn modules are not shared between threads), fed by
//! a bounded queue (a full queue is a 429).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;

use burn::tensor::backend::Backend;
use tokio::sync::oneshot;
use xfmr_llm::{GgufTokenizer, QuantizedLlama};
use xfmr_models::Transformer;
use xfmr_sentence::SentenceEncoder;
use xfmr_train::SubwordTokenizer;

use crate::error::ApiError;

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

/// The handle handlers submit work to.
pub(crate) struct Worker<B: Backend> {
    tasks: SyncSender<Task<B>>,
    capacity: usize,
}

impl<B: Backend> Worker<B> {
    /// Starts the thread; at most `capacity` tasks wait.
    pub fn spawn(models: Models<B>, capacity: usize) -> std::io::Result<Self> {
        let (tasks, rx) = mpsc::sync_channel::<Task<B>>(capacity);
        thread::Builder::new()
            .name("xfmr-serve-encoders".into())
            .spawn(move || {
                for task in rx {
                    // A panicking task drops its reply sender: its handler answers 500, and
                    // the next task runs.
                    let _ = catch_unwind(AssertUnwindSafe(|| task(&models)));
                }
            })?;
        Ok(Self { tasks, capacity })
    }

    /// Runs `f` on the models' thread and waits for its result (429 when the queue is full,
    /// 500 when `f` panics).
    pub async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Models<B>) -> R + Send + 'static,
    ) -> Result<R, ApiError> {
        let (reply, answer) = oneshot::channel();
        let task: Task<B> = Box::new(move |models| {
            // The client gave up (timeout, disconnect) while this waited: skip the work.
            if !reply.is_closed() {
                let _ = reply.send(f(models));
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
        answer
            .await
            .map_err(|_| ApiError::internal("the model failed on this request (it panicked)"))
    }
}
