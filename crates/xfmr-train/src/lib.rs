//! The paper's main job on xfmr models: train an encoder-decoder translation model, translate,
//! evaluate.
//!
//! - [`metrics`]: corpus and sentence BLEU and chrF, as sacreBLEU 2.6 computes them.
//! - [`data`]: `source<TAB>target` corpora, a split that keeps near-duplicates on one side,
//!   batches by token count.
//! - [`distributed`]: data-parallel training over processes and machines on burn's collective
//!   all-reduce.
//! - [`loss`]: the label-smoothed cross-entropy of §5.4 with padding left out of the average and
//!   of the smoothing mass, and the warm-up / inverse-square-root learning rate of §5.3.
//! - [`tokenizer`]: the shared BPE vocabulary, learnt on the training split.
//! - [`trainer`]: the training loop (burn's Adam, Noam schedule and gradient accumulator),
//!   checkpoints that resume exactly, checkpoint averaging, validation loss.
//! - [`translate`]: corpus encoding, translation (greedy or beam, n-best), BLEU and chrF of the
//!   output.
//!
//! This crate sits above `xfmr-models` and below the CLI (see `docs/ARCHITECTURE.md`).

pub mod data;
pub mod distributed;
pub mod loss;
pub mod metrics;
pub mod tokenizer;
pub mod trainer;
pub mod translate;

pub use distributed::{DataParallel, DataParallelConfig};
pub use metrics::{corpus_bleu, corpus_chrf, sentence_bleu, tokenize_13a, BleuScore, MetricError};
pub use tokenizer::SubwordTokenizer;
pub use trainer::{Example, Progress, StepReport, TrainConfig, TrainError, Trainer};
