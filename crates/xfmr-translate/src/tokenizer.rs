//! The shared source/target subword vocabulary (§5.1: "byte-pair encoding, which has a shared
//! source-target vocabulary"), learnt with the `tokenizers` crate's BPE trainer on the training
//! split and saved as a standard `tokenizer.json` beside the checkpoint.
//!
//! Text is NFC-normalised; spaces become `▁` (SentencePiece's metaspace) and punctuation is split
//! off, so decoding is the exact inverse of encoding up to whitespace runs: what the model
//! writes comes back as detokenised text, ready for sacreBLEU-style scoring.
//!
//! Ids are `u32` here as everywhere between text and the models (the `tokenizers` crate's,
//! the training examples', generation's), and the special ids are this vocabulary's
//! ([`SubwordTokenizer::pad_id`], ...): the objectives take them from it
//! (`Translation::for_tokenizer`, ...).

use std::path::{Path, PathBuf};

use thiserror::Error;
use tokenizers::decoders::metaspace::Metaspace as MetaspaceDecoder;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::metaspace::Metaspace;
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder,
};

/// Padding token, id 0.
pub const PAD: &str = "<pad>";
/// Start of a target sequence, id 1.
pub const BOS: &str = "<s>";
/// End of a sequence, id 2.
pub const EOS: &str = "</s>";
/// Unknown token (a character never seen in training), id 3.
pub const UNK: &str = "<unk>";
/// The mask token of masked-language-model training (BERT's `[MASK]`): not among the four
/// learnt specials; [`SubwordTokenizer::with_mask`] adds it after the learnt vocabulary.
pub const MASK: &str = "<mask>";

/// What can go wrong learning, saving or loading a vocabulary.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The `tokenizers` crate failed (training, encoding, decoding).
    #[error("tokenizer: {0}")]
    Tokenizers(String),
    /// A vocabulary file that cannot be read or is not a tokenizer of this kind.
    #[error("{}: {problem}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    IdOutOfRange {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
}

/// A shared BPE vocabulary with the four special tokens at ids 0–3.
#[derive(Clone)]
pub struct SubwordTokenizer {
    inner: Tokenizer,
}

impl std::fmt::Debug for SubwordTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubwordTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl SubwordTokenizer {
    /// Learns a BPE vocabulary of at most `vocab_size` tokens (merges of pairs seen at least
    /// twice) from `sentences`, source and target sides together.
    ///
    /// # Errors
    /// [`TokenizerError::Tokenizers`] if training fails.
    pub fn train<S: AsRef<str> + Send>(
        sentences: impl Iterator<Item = S> + Send,
        vocab_size: usize,
    ) -> Result<Self, TokenizerError> {
        let err = |e: tokenizers::Error| TokenizerError::Tokenizers(e.to_string());
        let model = BPE::builder().unk_token(UNK.into()).build().map_err(err)?;
        let pre: PreTokenizerWrapper = Sequence::new(vec![
            Metaspace::default().into(),
            Punctuation::default().into(),
        ])
        .into();
        let mut tokenizer = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >::new()
        .with_model(model)
        .with_normalizer(Some(NFC.into()))
        .with_pre_tokenizer(Some(pre))
        .with_decoder(Some(MetaspaceDecoder::default().into()))
        .build()
        .map_err(err)?;
        let specials = [PAD, BOS, EOS, UNK]
            .iter()
            .map(|t| AddedToken::from(*t, true))
            .collect();
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .special_tokens(specials)
            .show_progress(false)
            .build();
        tokenizer.train(&mut trainer, sentences).map_err(err)?;
        Self::checked(tokenizer.into(), None)
    }

    /// Checks the special tokens sit at ids 0–3, and that the ids are `0..vocab_size` (a file
    /// that gives two tokens one id, or skips ids, would encode to ids past the model's
    /// embedding table: found by fuzzing, `fuzz/src/targets/tokenizer_json.rs`).
    fn checked(inner: Tokenizer, path: Option<&Path>) -> Result<Self, TokenizerError> {
        let refuse = |problem: String| match path {
            Some(p) => TokenizerError::File {
                path: p.to_owned(),
                problem,
            },
            None => TokenizerError::Tokenizers(problem),
        };
        for (id, token) in [PAD, BOS, EOS, UNK].iter().enumerate() {
            if inner.token_to_id(token) != Some(id as u32) {
                return Err(refuse(format!("special token {token} is not id {id}")));
            }
        }
        let size = inner.get_vocab_size(true);
        if let Some((token, id)) = inner
            .get_vocab(true)
            .into_iter()
            .find(|&(_, id)| id as usize >= size)
        {
            return Err(refuse(format!(
                "token {token:?} has id {id}, but the vocabulary has {size} tokens: its ids are \
                 not 0..{size}"
            )));
        }
        Ok(Self { inner })
    }

    /// Loads a `tokenizer.json` written by [`save`](Self::save).
    ///
    /// # Errors
    /// [`TokenizerError::File`] naming the file (missing, unreadable, not a tokenizer, special
    /// tokens elsewhere than ids 0–3).
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        let inner = xfmr_io::tokenizer_json::load(path).map_err(|e| TokenizerError::File {
            path: path.to_owned(),
            problem: e.message,
        })?;
        Self::checked(inner, Some(path))
    }

    /// Saves as `tokenizer.json` content at `path`, atomically (a temporary file, then a rename).
    ///
    /// # Errors
    /// [`TokenizerError::File`] naming the file.
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        let json = self
            .inner
            .to_string(false)
            .map_err(|e| TokenizerError::File {
                path: path.to_owned(),
                problem: e.to_string(),
            })?;
        xfmr_io::write_atomic(path, json.as_bytes()).map_err(|e| TokenizerError::File {
            path: e.path,
            problem: e.message,
        })
    }

    /// Number of tokens, special ones included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of [`PAD`].
    pub fn pad_id(&self) -> u32 {
        0
    }

    /// Id of [`BOS`].
    pub fn bos_id(&self) -> u32 {
        1
    }

    /// Id of [`EOS`].
    pub fn eos_id(&self) -> u32 {
        2
    }

    /// The first id that is not one of the four learnt specials ([`PAD`], [`BOS`], [`EOS`],
    /// [`UNK`]): where regular subwords start.
    pub fn first_regular_id(&self) -> u32 {
        4
    }

    /// This vocabulary with [`MASK`] added as a special token after the last id (if it is not
    /// there yet): masked-language-model training needs it, translation does not.
    pub fn with_mask(mut self) -> Self {
        if self.mask_id().is_none() {
            self.inner
                .add_special_tokens(&[AddedToken::from(MASK, true)]);
        }
        self
    }

    /// Id of [`MASK`], if the vocabulary has it.
    pub fn mask_id(&self) -> Option<u32> {
        self.inner.token_to_id(MASK)
    }

    /// Subword ids of `text` (no special tokens added; [`MASK`] written in the text, with the
    /// vocabulary [`with_mask`](Self::with_mask), becomes its id).
    ///
    /// # Errors
    /// [`TokenizerError::Tokenizers`] if encoding fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The subword strings of `text`, as the model sees them.
    ///
    /// # Errors
    /// [`TokenizerError::Tokenizers`] if encoding fails.
    pub fn pieces(&self, text: &str) -> Result<Vec<String>, TokenizerError> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))?;
        Ok(encoding.get_tokens().to_vec())
    }

    /// The subword string of one id (`None` outside the vocabulary).
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// A fingerprint of the vocabulary: FNV-1a over every piece in id order. Equal
    /// fingerprints mean the same pieces under the same ids (data-parallel ranks compare theirs
    /// before training).
    pub fn fingerprint(&self) -> u64 {
        let bytes: Vec<u8> = (0..self.vocab_size() as u32)
            .flat_map(|id| {
                self.piece(id)
                    .unwrap_or_default()
                    .into_bytes()
                    .into_iter()
                    .chain([0])
            })
            .collect();
        xfmr_io::fnv1a(&bytes)
    }

    /// Detokenised text of `ids`, special tokens left out.
    ///
    /// # Errors
    /// [`TokenizerError::IdOutOfRange`] for an id outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let vocab = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(TokenizerError::IdOutOfRange { id, vocab });
        }
        self.inner
            .decode(ids, true)
            .map_err(|e| TokenizerError::Tokenizers(e.to_string()))
    }
}
