//! The one decoding loop of a GGUF language model on host logits: what `xfmr generate`, the
//! library's [`LanguageModel::complete`](crate::LanguageModel::complete) and `xfmr serve`'s
//! engine share (as llama.cpp's `common/sampling` serves both its CLI and its server).
//!
//! A [`Decoding`] is one sequence after its prompt: it takes the logits of each step
//! (`[vocab]`, on the host), chooses the next token through its [`Sampler`] (greedy or
//! seeded sampling, `logit_bias`, a minimum length), and turns tokens into [`Event`]s:
//! text in whole characters, never any part of a stop string (text that might begin one is
//! held back until it cannot), then one [`Event::Done`] at an end token, a stop string or
//! the token limit. [`run`] drives one `Decoding` over any [`HostSteps`]: [`decode`] over the
//! quantised model (restoring and storing prompts in a
//! [`PrefixCache`](crate::quantized::PrefixCache)), [`decode_tensor`] over a tensor model
//! through the one adapter [`TensorSteps`]; the server's engine feeds many sequences at once,
//! each through its own `Decoding`.

use xfmr_models::generate::{Cancel, Sampler};

use crate::{GgufTokenizer, LlmError, TextStream};

mod run;

pub use crate::quantized::QuantizedSteps;
pub use run::{decode, decode_tensor, run, store, Decoded};
pub use xfmr_models::generate::{HostSteps, TensorSteps};

/// Why a generation ended (OpenAI's `finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end token, or a stop string.
    Stop,
    /// The token limit.
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

/// What a [`Decoding`] tells its caller, in order: text pieces, then one end.
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
        /// Prompt tokens whose keys and values came from a prefix cache (OpenAI's
        /// `usage.prompt_tokens_details.cached_tokens`).
        cached_tokens: usize,
    },
    /// Decoding failed (a token the tokenizer cannot decode, the model's error); nothing
    /// follows.
    Failed(String),
}

/// What one sequence asks for.
#[derive(Debug, Clone)]
pub struct DecodeRequest {
    /// At most this many tokens are generated (the end token not counted; 0 ends at once).
    pub max_tokens: usize,
    /// Chooses each token (greedy or seeded sampling, `logit_bias`, minimum length).
    pub sampler: Sampler,
    /// Strings that end the generation; the text stops before the first of them and no
    /// part of it is ever emitted, even when it is split over several tokens. The token that
    /// completed it is the last of [`Decoding::tokens`].
    pub stop: Vec<String>,
    /// Tokens that end the generation (never text): the tokenizer's end-of-generation ids
    /// ([`GgufTokenizer::end_of_generation_ids`]) for a chat, or one end-of-sequence id.
    pub end_ids: Vec<u32>,
    /// Stops [`decode`] between two steps with
    /// [`ModelError::Cancelled`](xfmr_models::ModelError::Cancelled) once cancelled.
    pub cancel: Option<Cancel>,
}

impl DecodeRequest {
    /// Greedy decoding of at most `max_tokens`, ending at any of `tokenizer`'s
    /// end-of-generation ids, no stop string.
    pub fn greedy(tokenizer: &GgufTokenizer, max_tokens: usize) -> Self {
        Self {
            max_tokens,
            sampler: Sampler::greedy(),
            stop: Vec::new(),
            end_ids: tokenizer.end_of_generation_ids().to_vec(),
            cancel: None,
        }
    }

    /// With `sampler`.
    pub fn with_sampler(mut self, sampler: Sampler) -> Self {
        self.sampler = sampler;
        self
    }

    /// With stop strings (empty ones are ignored: [`Decoding::new`] drops them).
    pub fn with_stop(mut self, stop: Vec<String>) -> Self {
        self.stop = stop;
        self
    }
}

/// What [`Decoding::advance`] says the caller does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Feed this token and call [`advance`](Decoding::advance) with the logits that follow.
    Feed(u32),
    /// The sequence is over ([`Event::Done`] or [`Event::Failed`] was emitted).
    Done,
}

/// One sequence being decoded: see the [module](self) docs.
pub struct Decoding<'t> {
    tokenizer: &'t GgufTokenizer,
    request: DecodeRequest,
    text: TextStream<'t>,
    /// Text not yet emitted: it might be the start of a stop string.
    held: String,
    /// Everything decoded so far, emitted or held (what the tokens' full decoding extends).
    decoded: String,
    tokens: Vec<u32>,
    cached: usize,
    finish: Option<Finish>,
    failed: bool,
    /// The tokenizer's error that ended it, until taken.
    error: Option<LlmError>,
}

impl<'t> Decoding<'t> {
    /// A sequence whose prompt has been (or is being) fed.
    pub fn new(tokenizer: &'t GgufTokenizer, mut request: DecodeRequest) -> Self {
        request.stop.retain(|s| !s.is_empty());
        Self {
            tokenizer,
            text: tokenizer.stream(),
            request,
            held: String::new(),
            decoded: String::new(),
            tokens: Vec::new(),
            cached: 0,
            finish: None,
            failed: false,
            error: None,
        }
    }

    /// With `cached` prompt tokens taken from a prefix cache (reported in [`Event::Done`]).
    pub fn with_cached_tokens(mut self, cached: usize) -> Self {
        self.cached = cached;
        self
    }

    /// Prompt tokens taken from a prefix cache.
    pub fn cached_tokens(&self) -> usize {
        self.cached
    }

    /// The tokens generated so far (no end token).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Why it ended, once it has (`None` while running or after a failure).
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// Whether it is over (ended or failed).
    pub fn is_done(&self) -> bool {
        self.finish.is_some() || self.failed
    }

    /// The tokenizer's error that ended it ([`Event::Failed`] said it), once.
    pub fn take_error(&mut self) -> Option<LlmError> {
        self.error.take()
    }

    /// Ends it with [`Event::Failed`] (`message`), as when the model's step failed.
    pub fn fail(&mut self, message: String, emit: &mut dyn FnMut(Event)) {
        if !self.is_done() {
            self.failed = true;
            emit(Event::Failed(message));
        }
    }

    /// Takes the step's `logits` (`[vocab]`, changed in place by the sampler's bias and
    /// minimum length), chooses the next token and handles it: an end token or the token
    /// limit ends the sequence, text is emitted (held back while it might begin a stop
    /// string), a completed stop string ends it. Calling it after the end does nothing; with
    /// `max_tokens` 0 it ends at once (no token chosen).
    pub fn advance(&mut self, logits: &mut [f32], emit: &mut dyn FnMut(Event)) -> Next {
        if self.is_done() {
            return Next::Done;
        }
        if self.request.max_tokens == 0 {
            self.end(Finish::Length, emit);
            return Next::Done;
        }
        let token = self.request.sampler.choose(logits, self.tokens.len());
        // Any end token, even one forced by `logit_bias`: the end, never text.
        if self.request.end_ids.contains(&token) {
            self.finish_with_tail(Finish::Stop, emit);
            return Next::Done;
        }
        self.tokens.push(token);
        let stopped = match self.text.push(token) {
            Ok(piece) => self.push_text(&piece, emit),
            Err(e) => {
                self.fail(e.to_string(), emit);
                self.error = Some(e);
                return Next::Done;
            }
        };
        if stopped {
            self.end(Finish::Stop, emit);
            Next::Done
        } else if self.tokens.len() >= self.request.max_tokens {
            self.finish_with_tail(Finish::Length, emit);
            Next::Done
        } else {
            Next::Feed(token)
        }
    }

    /// Ends at an end token or the limit: the text the streamed pieces have not given yet
    /// (bytes of an incomplete character, decoded as the whole sequence decodes) goes out
    /// first, unless it completes a stop string.
    fn finish_with_tail(&mut self, finish: Finish, emit: &mut dyn FnMut(Event)) {
        let full = self.tokenizer.decode(&self.tokens).unwrap_or_default();
        if let Some(tail) = full.strip_prefix(self.decoded.as_str()) {
            if !tail.is_empty() && self.push_text(tail, emit) {
                return self.end(Finish::Stop, emit);
            }
        }
        self.end(finish, emit)
    }

    fn end(&mut self, finish: Finish, emit: &mut dyn FnMut(Event)) {
        if !self.held.is_empty() {
            emit(Event::Text(std::mem::take(&mut self.held)));
        }
        self.finish = Some(finish);
        emit(Event::Done {
            finish,
            completion_tokens: self.tokens.len(),
            cached_tokens: self.cached,
        });
    }

    /// Takes the next piece of text: emits what can no longer be part of a stop string, and
    /// says whether a stop string was completed (the text before it is emitted, it is not).
    fn push_text(&mut self, piece: &str, emit: &mut dyn FnMut(Event)) -> bool {
        self.decoded.push_str(piece);
        self.held.push_str(piece);
        let stops = &self.request.stop;
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
            emit(Event::Text(std::mem::replace(&mut self.held, rest)));
        }
        false
    }
}
