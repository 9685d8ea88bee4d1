//! Tokenising within a limit: [`GgufTokenizer::encode_limited`] and
//! [`GgufTokenizer::encode_chat`] (message contents kept as text).

use tokenizers::Tokenizer;

use super::{GgufTokenizer, Message};
use crate::LlmError;

/// The bytes of texts tokenised at once by [`GgufTokenizer::encode_limited`], between checks
/// of the limit (a chunk ends at the first safe point after this many bytes).
const ENCODE_CHUNK_BYTES: usize = 4096;

impl GgufTokenizer {
    /// [`encode`](Self::encode), but an error as soon as the text has more than `max_tokens`
    /// tokens (the BOS id included), without tokenising the rest: the ids are those of
    /// `encode` when there are at most `max_tokens`.
    ///
    /// Work and memory are bounded by the limit, not by the text: a text longer than
    /// `max_tokens × `[`max_token_bytes`](Self::max_token_bytes) bytes is refused before
    /// anything is tokenised (it cannot have so few tokens); a shorter one is tokenised in
    /// chunks of about 4 KiB, each ending just before a space that follows a printable ASCII
    /// character (a point where GPT-2's split always cuts, and where no control token can
    /// match, so chunks give the ids the whole text gives), stopping at the first chunk that
    /// takes the count past the limit. (Files with a control token containing a space are
    /// tokenised whole, after the same length check.)
    ///
    /// # Errors
    /// [`LlmError::TooManyTokens`]; [`LlmError::Tokenizer`].
    pub fn encode_limited(&self, text: &str, max_tokens: usize) -> Result<Vec<u32>, LlmError> {
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        self.cheap_reject(ids.len(), text.len(), max_tokens)?;
        let tokenizer: &Tokenizer = &self.tokenizer;
        if self.control_has_space {
            Self::encode_piece(tokenizer, text, &mut ids, max_tokens)?;
        } else {
            for chunk in Chunks::new(text) {
                Self::encode_piece(tokenizer, chunk, &mut ids, max_tokens)?;
            }
        }
        Ok(ids)
    }

    /// [`LlmError::TooManyTokens`] when `have` ids and `bytes` more of text must exceed
    /// `max_tokens`.
    fn cheap_reject(&self, have: usize, bytes: usize, max_tokens: usize) -> Result<(), LlmError> {
        let room = max_tokens.saturating_sub(have);
        if have > max_tokens || bytes > room.saturating_mul(self.max_token_bytes) {
            return Err(LlmError::TooManyTokens { limit: max_tokens });
        }
        Ok(())
    }

    /// Appends the ids of `text` (no BOS) to `ids`; an error once they pass `max_tokens`.
    fn encode_piece(
        tokenizer: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
        max_tokens: usize,
    ) -> Result<(), LlmError> {
        if text.is_empty() {
            return Ok(());
        }
        let encoding = tokenizer
            .encode(text, false)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        if ids.len() + encoding.len() > max_tokens {
            return Err(LlmError::TooManyTokens { limit: max_tokens });
        }
        ids.extend(encoding.get_ids());
        Ok(())
    }

    /// Whether `text` spells a control token anywhere.
    fn has_control_text(&self, text: &str) -> bool {
        let mut first = [false; 256];
        for (t, _) in self.control.iter() {
            if let Some(&b) = t.as_bytes().first() {
                first[b as usize] = true;
            }
        }
        let bytes = text.as_bytes();
        (0..bytes.len()).any(|i| {
            first[bytes[i] as usize]
                && self
                    .control
                    .iter()
                    .any(|(t, _)| bytes[i..].starts_with(t.as_bytes()))
        })
    }

    /// `messages` through the chat template ([`render_chat`](Self::render_chat)) and
    /// tokenised, with the text of message contents kept as text: a control token spelled in a
    /// message (`<|im_end|><|im_start|>system`) becomes ordinary tokens, while those the
    /// template writes stay control tokens. When no content spells a control token, the ids
    /// are those of `encode_limited(&render_chat(..)?, max_tokens)`.
    ///
    /// How: each content is rendered between two sentinel characters (Unicode noncharacters
    /// found in no message), its leading and trailing whitespace left outside them so that a
    /// template that trims contents trims the same text; the rendering without the sentinels
    /// must equal the plain rendering (else the template transforms contents, and the call is
    /// refused rather than guessed). Control tokens are then matched only outside the
    /// sentinels (longest first, as the tokenizer matches them), and the text between them is
    /// tokenised without control tokens. Departure: at a control token that a message spells,
    /// the text on either side is tokenised as one piece, as if the token were not there; the
    /// tokenizer would have cut the text there.
    ///
    /// # Errors
    /// As [`render_chat`](Self::render_chat); [`LlmError::TooManyTokens`];
    /// [`LlmError::Template`] when a role spells a control token, or when contents spell one
    /// and the template changes contents (other than trimming them).
    pub fn encode_chat(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>, LlmError> {
        if let Some(m) = messages.iter().find(|m| self.has_control_text(&m.role)) {
            return Err(LlmError::Template(format!(
                "the role {:?} spells a control token",
                m.role
            )));
        }
        if !messages.iter().any(|m| self.has_control_text(&m.content)) {
            let text = self.render_chat(messages, add_generation_prompt)?;
            return self.encode_limited(&text, max_tokens);
        }
        let in_use = |c: char| {
            messages
                .iter()
                .any(|m| m.content.contains(c) || m.role.contains(c))
                || self.chat_template.as_deref().unwrap_or("").contains(c)
        };
        // Unicode's 32 noncharacters U+FDD0..U+FDEF: meant for internal use, never in text.
        let free: Vec<char> = ('\u{FDD0}'..='\u{FDEF}').filter(|&c| !in_use(c)).collect();
        let [open, close] = match free[..] {
            [a, b, ..] => [a, b],
            _ => {
                return Err(LlmError::Template(
                    "the messages use every sentinel character U+FDD0..U+FDEF".into(),
                ))
            }
        };
        let wrapped: Vec<Message> = messages
            .iter()
            .map(|m| {
                let core = m.content.trim();
                let start = m.content.len() - m.content.trim_start().len();
                let lead = &m.content[..start];
                let trail = &m.content[start + core.len()..];
                Message {
                    role: m.role.clone(),
                    content: format!("{lead}{open}{core}{close}{trail}"),
                }
            })
            .collect();
        let marked = self.render_chat(&wrapped, add_generation_prompt)?;
        let plain = self.render_chat(messages, add_generation_prompt)?;
        let stripped: String = marked
            .chars()
            .filter(|&c| c != open && c != close)
            .collect();
        if stripped != plain {
            return Err(LlmError::Template(
                "the template changes message contents, which spell control tokens: \
                 they cannot be kept as text"
                    .into(),
            ));
        }
        drop((stripped, plain));
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        let open_len = open.len_utf8();
        self.cheap_reject(ids.len(), marked.len(), max_tokens)?;
        // Pieces of text (sentinels removed) between the template's control tokens.
        let mut piece = String::new();
        let mut in_content = false;
        let mut i = 0;
        while i < marked.len() {
            let rest = &marked[i..];
            let c = rest
                .chars()
                .next()
                .expect("i is below the length, on a boundary");
            if c == open || c == close {
                in_content = c == open;
                i += open_len;
                continue;
            }
            if !in_content {
                if let Some((t, id)) = self
                    .control
                    .iter()
                    .find(|(t, _)| rest.starts_with(t.as_str()))
                {
                    Self::encode_piece(&self.plain, &piece, &mut ids, max_tokens)?;
                    piece.clear();
                    if ids.len() + 1 > max_tokens {
                        return Err(LlmError::TooManyTokens { limit: max_tokens });
                    }
                    ids.push(*id);
                    i += t.len();
                    continue;
                }
            }
            piece.push(c);
            i += c.len_utf8();
        }
        Self::encode_piece(&self.plain, &piece, &mut ids, max_tokens)?;
        Ok(ids)
    }
}

/// A text cut into chunks of about [`ENCODE_CHUNK_BYTES`], each ending just before a space
/// that follows a printable ASCII character (see [`GgufTokenizer::encode_limited`]).
struct Chunks<'a> {
    rest: &'a str,
}

impl<'a> Chunks<'a> {
    fn new(text: &'a str) -> Self {
        Self { rest: text }
    }
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        let bytes = self.rest.as_bytes();
        let cut = (ENCODE_CHUNK_BYTES.max(1)..bytes.len())
            .find(|&p| bytes[p] == b' ' && (0x21..0x7F).contains(&bytes[p - 1]))
            .unwrap_or(bytes.len());
        let (chunk, rest) = self.rest.split_at(cut);
        self.rest = rest;
        Some(chunk)
    }
}
