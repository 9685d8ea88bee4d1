//! The translation application on xfmr models, everything but training (which is
//! `xfmr-train`'s, whose `Translation` objective reads this crate's corpora and vocabulary):
//!
//! - [`data`]: `source<TAB>target` corpora, read with errors naming the file and line, written
//!   atomically, and split so that near-duplicates stay on one side.
//! - [`tokenizer`]: the shared source/target BPE vocabulary ([`SubwordTokenizer`]), learnt on
//!   the training split and saved as a standard `tokenizer.json` (every model family of
//!   `xfmr-train` uses it).
//! - [`translate`](mod@translate): translation with a trained
//!   [`Transformer`](xfmr_models::Transformer) (greedy or beam, n-best, sources batched and bounded by the model's positions), the
//!   attention maps of one translation, and beam search's [`DecodingChoice`] (the length penalty
//!   chosen on held-out pairs, kept in the run directory).
//! - [`metrics`]: corpus and sentence BLEU and chrF, as sacreBLEU 2.6 computes them.
//!
//! `xfmr serve` translates through this crate without the trainer (and so without burn's
//! collective and its runtime).
//!
//! ```
//! use xfmr_translate::{corpus_bleu, SubwordTokenizer};
//!
//! let corpus = ["el gato negro", "the black cat", "el perro", "the dog"];
//! let tokenizer = SubwordTokenizer::train(corpus.iter(), 64).unwrap();
//! let ids = tokenizer.encode("el gato").unwrap();
//! assert_eq!(tokenizer.decode(&ids).unwrap(), "el gato");
//!
//! // One hypothesis, one stream of references.
//! let bleu = corpus_bleu(&["the black cat sat"], &[vec!["the black cat sat"]]).unwrap();
//! assert!((bleu.score - 100.0).abs() < 1e-9);
//! ```

#![warn(missing_docs)]

pub mod data;
mod error;
pub mod metrics;
pub mod tokenizer;
pub mod translate;

pub use data::{DataError, Pair};
pub use error::TranslateError;
pub use metrics::{corpus_bleu, corpus_chrf, sentence_bleu, tokenize_13a, BleuScore, MetricError};
pub use tokenizer::{SubwordTokenizer, TokenizerError};
pub use translate::{
    choose_length_penalty, translate, translate_best, translate_ids, translation_attention,
    Candidate, DecodingChoice, TranslationAttention,
};
