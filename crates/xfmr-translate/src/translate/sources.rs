//! The limit on source length that every front end of translation shares (the library, the
//! CLI's `translate` and `eval`, the server): a source longer than the model's positions is
//! refused, naming it, or truncated where the caller says so.

use burn::tensor::backend::Backend;
use xfmr_blocks::Positions;
use xfmr_models::Transformer;

use xfmr_models::framed;

use crate::error::TranslateError;
use crate::tokenizer::SubwordTokenizer;

/// What a [`SourceLimit`] does with a source longer than it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlong {
    /// Refuse it: [`TranslateError::SourceTooLong`] naming its index.
    Refuse,
    /// Keep its first tokens, the end token still appended.
    Truncate,
}

/// How long a source sentence may be, in tokens (its end token included), and what happens to
/// a longer one. Every front end translates under one: [`translate`](super::translate()) under
/// the model's ([`SourceLimit::of_model`]), refusing; `xfmr translate` and `xfmr eval` the same, truncating
/// with `--truncate`. A source's cost grows with the square of its length (self-attention), so
/// a limit is what keeps one hostile line from holding the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLimit {
    /// The most tokens of a source, its end token included.
    pub max_tokens: usize,
    /// What happens to a longer one.
    pub overlong: Overlong,
}

/// The source limit of a model without a position table (RoPE, ALiBi or no positions):
/// [`TransformerConfig`](xfmr_models::TransformerConfig)'s default `max_len`, the table a run
/// gets unless its configuration says otherwise.
pub const DEFAULT_MAX_SOURCE_TOKENS: usize = 1024;

impl SourceLimit {
    /// The model's own limit ([`max_source_tokens`]), refusing longer sources.
    pub fn of_model<B: Backend>(model: &Transformer<B>) -> Self {
        Self {
            max_tokens: max_source_tokens(model),
            overlong: Overlong::Refuse,
        }
    }

    /// With `overlong` deciding what happens to a longer source.
    pub fn with_overlong(mut self, overlong: Overlong) -> Self {
        self.overlong = overlong;
        self
    }

    /// The longest source, in bytes, that can fit in `max_tokens` tokens of `tokenizer`: a
    /// longer one is refused (or cut there before tokenising, [`Overlong::Truncate`]) without
    /// being tokenised whole.
    ///
    /// Each token stands for at most `longest` characters of the normalised text (`longest`:
    /// the vocabulary's longest piece, at least 1; an unknown character is one `<unk>`; the
    /// metaspace `▁` stands for one space); NFC composes at most 4 code points into one (the
    /// longest canonical decompositions, such as U+1F82's, have 4) and a code point is at most
    /// 4 bytes. So a source of `n` tokens has at most `16 · longest · n` bytes: the bound
    /// refuses nothing that fits.
    pub fn max_bytes(&self, tokenizer: &SubwordTokenizer) -> usize {
        let longest = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.piece(id))
            .map(|piece| piece.chars().count())
            .max()
            .unwrap_or(1)
            .max(1);
        self.max_tokens.saturating_mul(16 * longest)
    }
}

/// The longest source `model` takes, end token included: the rows of its position table (a
/// learned table's, or the sinusoids' configured `max_len`, the length the run's configuration
/// chose), else [`DEFAULT_MAX_SOURCE_TOKENS`] for a model whose positions have no table.
pub fn max_source_tokens<B: Backend>(model: &Transformer<B>) -> usize {
    match &model.positions {
        Some(Positions::Sinusoidal(s)) => s.table.dims()[0],
        Some(Positions::Learned(l)) => l.table.val().dims()[0],
        None => DEFAULT_MAX_SOURCE_TOKENS,
    }
}

/// Sources as the model reads them ([`encode_sources`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedSources {
    /// Per source, its ids with the end token appended, as in training.
    pub ids: Vec<Vec<u32>>,
    /// The indices of the sources that were truncated ([`Overlong::Truncate`]), ascending.
    pub truncated: Vec<usize>,
}

/// Encodes `sentences` for translation under `limit`: each source's ids with the end token
/// appended. A source longer than `limit.max_tokens` (end token included) is refused or
/// truncated as `limit.overlong` says; one longer than [`SourceLimit::max_bytes`] is refused
/// before it is tokenised, or only that many of its first bytes are tokenised.
///
/// # Errors
/// [`TranslateError::SourceTooLong`] naming the first source over the limit (with
/// [`Overlong::Refuse`]); [`TranslateError::Tokenizer`].
pub fn encode_sources(
    tokenizer: &SubwordTokenizer,
    sentences: &[&str],
    limit: SourceLimit,
) -> Result<EncodedSources, TranslateError> {
    let max_bytes = limit.max_bytes(tokenizer);
    let eos = tokenizer.eos_id();
    let mut ids = Vec::with_capacity(sentences.len());
    let mut truncated = Vec::new();
    for (index, &sentence) in sentences.iter().enumerate() {
        let too_long = |tokens| TranslateError::SourceTooLong {
            index,
            tokens,
            bytes: sentence.len(),
            max_tokens: limit.max_tokens,
        };
        let text = if sentence.len() > max_bytes {
            match limit.overlong {
                Overlong::Refuse => return Err(too_long(None)),
                Overlong::Truncate => {
                    // The longest prefix that ends on a character boundary.
                    let mut end = max_bytes;
                    while !sentence.is_char_boundary(end) {
                        end -= 1;
                    }
                    &sentence[..end]
                }
            }
        } else {
            sentence
        };
        let mut tokens = tokenizer.encode(text)?;
        // The end token takes one position.
        let room = limit.max_tokens.saturating_sub(1);
        if tokens.len() > room || text.len() < sentence.len() {
            match limit.overlong {
                Overlong::Refuse => return Err(too_long(Some(tokens.len() + 1))),
                Overlong::Truncate => {
                    tokens.truncate(room);
                    truncated.push(index);
                }
            }
        }
        ids.push(framed(None, &tokens, Some(eos)));
    }
    Ok(EncodedSources { ids, truncated })
}
