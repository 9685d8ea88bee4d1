//! The chat template: rendered under limits (fuel, output, memory budget), probed at load.

use std::io;
use std::sync::atomic::Ordering;

use minijinja::{context, Environment, ErrorKind};
use thiserror::Error;

use super::{GgufTokenizer, Message};
use crate::budget::{self, OverBudget};
use crate::LlmError;

/// The most instructions one rendering of a chat template may run (minijinja's fuel).
pub const CHAT_TEMPLATE_FUEL: u64 = 10_000_000;

/// The default base of [`TemplateLimits::output_bytes`]: 16 MiB, hundreds of times the largest
/// prompt of the models here (SmolLM2 takes 8,192 tokens, about 40 KB of text).
pub const CHAT_TEMPLATE_OUTPUT_BYTES: usize = 16 << 20;

/// The default base of [`TemplateLimits::memory_bytes`]: 64 MiB (a SmolLM2 conversation
/// renders in well under 1 MiB plus its messages).
pub const CHAT_TEMPLATE_MEMORY_BYTES: usize = 64 << 20;

/// Bytes of output and of memory a rendering may use per byte of its conversation (roles and
/// contents), on top of the bases of [`TemplateLimits`]: a template copies each message a few
/// times (into the engine's values, into intermediate strings, into the output), never 8 times
/// unless it amplifies, which is what the limits are for. So a long but honest conversation is
/// never mistaken for a hostile template.
pub const CHAT_TEMPLATE_BYTES_PER_INPUT_BYTE: usize = 8;

/// The conversation a template is rendered on when it is loaded ([`GgufTokenizer::from_gguf`]).
const PROBE: &[(&str, &str)] = &[
    ("system", "You are a helpful assistant."),
    ("user", "Hello!"),
    ("assistant", "Hello. How can I help?"),
    ("user", "What is 2 + 2?"),
];

/// How much a rendering of a chat template may take. Both limits grow by
/// [`CHAT_TEMPLATE_BYTES_PER_INPUT_BYTE`] per byte of the conversation rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// The most bytes of output (before the per-input allowance). Default:
    /// [`CHAT_TEMPLATE_OUTPUT_BYTES`].
    pub output_bytes: usize,
    /// The most bytes the rendering may have allocated at once (before the per-input
    /// allowance), enforced only when the program installs
    /// [`BudgetAllocator`](crate::budget::BudgetAllocator). Default:
    /// [`CHAT_TEMPLATE_MEMORY_BYTES`].
    pub memory_bytes: usize,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        Self {
            output_bytes: CHAT_TEMPLATE_OUTPUT_BYTES,
            memory_bytes: CHAT_TEMPLATE_MEMORY_BYTES,
        }
    }
}

/// A limit a chat template's rendering went past.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateLimit {
    /// It ran more than [`CHAT_TEMPLATE_FUEL`] instructions.
    #[error("it ran more than {limit} instructions (a loop that does not end, or too long)")]
    Fuel {
        /// The instructions allowed.
        limit: u64,
    },
    /// Its output passed the limit.
    #[error("its output passed {limit} bytes")]
    Output {
        /// The bytes allowed.
        limit: usize,
    },
    /// It needed more memory than its budget (a string or list that keeps doubling, a huge
    /// filter argument...).
    #[error("it needed more than its memory budget of {budget} bytes")]
    Memory {
        /// The bytes allowed.
        budget: usize,
    },
    /// Refused without running: this template went past its memory budget before.
    #[error("refused: an earlier rendering of this template needed more than its memory budget")]
    Refused,
    /// Refused without running: too many templates went past their memory budget in this
    /// process ([`budget::MAX_STUCK`]).
    #[error(
        "refused: {} renderings went past their memory budget in this process",
        budget::MAX_STUCK
    )]
    TooManyIncidents,
}

impl GgufTokenizer {
    /// Renders the chat template (if any) once on [`PROBE`] (system, user, assistant, user,
    /// with the generation prompt) under the limits: a template that goes past a limit, or
    /// does not parse, is an error at load. A template that refuses the system role (some
    /// do, with `raise_exception`) is tried again without it; an error then is the load's.
    pub(super) fn probe_chat_template(&self) -> Result<(), LlmError> {
        if self.chat_template.is_none() {
            return Ok(());
        }
        let messages: Vec<Message> = PROBE.iter().map(|(r, c)| Message::new(r, c)).collect();
        match self.render_chat(&messages, true) {
            Ok(_) => Ok(()),
            Err(LlmError::Template(_)) => self.render_chat(&messages[1..], true).map(|_| ()),
            Err(e) => Err(e),
        }
    }

    /// `messages` rendered through the file's chat template, ending with the assistant's turn
    /// when `add_generation_prompt` (the template decides; SmolLM2's adds its default system
    /// message when the conversation has none).
    ///
    /// The template is a program from the file, rendered under limits ([`TemplateLimits`],
    /// each grown by [`CHAT_TEMPLATE_BYTES_PER_INPUT_BYTE`] per byte of the conversation):
    /// at most [`CHAT_TEMPLATE_FUEL`] instructions, at most `output_bytes` of output, and,
    /// when the program installs [`BudgetAllocator`](crate::budget::BudgetAllocator), at most
    /// `memory_bytes` allocated at once, on a thread of its own
    /// ([`budget::run_with_budget`]). After one rendering over its memory budget, the template
    /// is refused at once ([`TemplateLimit::Refused`]): that thread stays blocked holding at
    /// most the budget. **Without the allocator installed, memory is not bounded**: a template
    /// that doubles a string or a list in a loop, or a filter with a huge width
    /// (`'a'|center(10**12)`), still aborts the process (fuel and output limits do not see it).
    ///
    /// # Errors
    /// [`LlmError::Template`] when the file has no template or it does not render;
    /// [`LlmError::TemplateLimit`] when it goes past a limit.
    pub fn render_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        let source = self
            .chat_template
            .clone()
            .ok_or_else(|| LlmError::Template("the file has no tokenizer.chat_template".into()))?;
        if self.hostile.load(Ordering::Relaxed) {
            return Err(TemplateLimit::Refused.into());
        }
        let input: usize = messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum();
        let extra = input.saturating_mul(CHAT_TEMPLATE_BYTES_PER_INPUT_BYTE);
        let output_limit = self.limits.output_bytes.saturating_add(extra);
        let memory = self.limits.memory_bytes.saturating_add(extra);
        let token = |id: Option<u32>| {
            id.and_then(|id| self.tokenizer.id_to_token(id))
                .unwrap_or_default()
        };
        let job = Render {
            source,
            messages: messages.to_vec(),
            add_generation_prompt,
            bos_token: token(self.bos_id),
            eos_token: token(Some(self.eos_id)),
            output_limit,
        };
        match budget::run_with_budget(memory, move || job.run()) {
            Ok(out) => out,
            Err(OverBudget::Exceeded { budget }) => {
                self.hostile.store(true, Ordering::Relaxed);
                Err(TemplateLimit::Memory { budget }.into())
            }
            Err(OverBudget::TooManyBlocked) => Err(TemplateLimit::TooManyIncidents.into()),
            // Its thread is counted as blocked: refused from now on, as over budget.
            Err(e @ OverBudget::TimedOut { .. }) => {
                self.hostile.store(true, Ordering::Relaxed);
                Err(LlmError::Template(e.to_string()))
            }
            Err(e) => Err(LlmError::Template(e.to_string())),
        }
    }
}

/// One rendering of a chat template, owned (it may run on a thread of its own).
struct Render {
    source: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    bos_token: String,
    eos_token: String,
    output_limit: usize,
}

impl Render {
    /// Renders, under the fuel and the output limit.
    fn run(self) -> Result<String, LlmError> {
        let mut env = Environment::new();
        // The template's loops are bounded by fuel, so that a template that never ends (or
        // takes minutes) is an error, not a request that never answers. Ten million
        // instructions: SmolLM2's template renders a conversation in about thirty per message.
        env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
        // As `transformers` renders chat templates.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    message,
                ))
            },
        );
        let template = env
            .template_from_str(&self.source)
            .map_err(|e| LlmError::Template(e.to_string()))?;
        let mut out = LimitedWriter {
            bytes: Vec::new(),
            limit: self.output_limit,
            exceeded: false,
        };
        let rendered = template.render_captured_to(
            context! {
                messages => self.messages,
                add_generation_prompt => self.add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            },
            &mut out,
        );
        match rendered {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|e| LlmError::Template(format!("the output is not UTF-8: {e}"))),
            Err(_) if out.exceeded => Err(TemplateLimit::Output {
                limit: self.output_limit,
            }
            .into()),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(TemplateLimit::Fuel {
                limit: CHAT_TEMPLATE_FUEL,
            }
            .into()),
            Err(e) => Err(LlmError::Template(e.to_string())),
        }
    }
}

/// A writer into memory that fails past `limit` bytes.
struct LimitedWriter {
    bytes: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for LimitedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("the output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
