//! Training for every xfmr model family: the paper's encoder-decoder translation model, the
//! GPT-like and the BERT-like. The translation application's corpora, vocabulary, decoding and
//! metrics are `xfmr-translate`'s, which this crate trains with and which needs no trainer.
//!
//! - [`objective`]: what a model learns: the [`Objective`] trait and its three provided
//!   objectives, [`Translation`] (the paper's), [`CausalLm`] (GPT-like) and [`MaskedLm`]
//!   (BERT-like).
//! - [`replicas`]: this process's data-parallel replicas, one thread and device each.
//! - [`data`]: batches by token count and the seeded order of each epoch's batches (the
//!   corpora, `xfmr_translate::data`; batch shapes that compile once, `xfmr_models::ladder`).
//! - [`kernel_cache`]: cubecl's compiled kernels and autotune results in a per-user cache
//!   directory, reused by the next run and by the server.
//! - [`distributed`]: data-parallel training over processes and machines on burn's collective
//!   all-reduce.
//! - [`schedule`]: the warm-up / inverse-square-root learning rate of §5.3 (the label-smoothed
//!   loss of §5.4 is xfmr-models' `LabelSmoothedCrossEntropy`).
//! - [`trainer`]: the training loop (burn's Adam, Noam schedule and gradient accumulator),
//!   checkpoints that resume exactly, checkpoint averaging, validation loss, and the whole run
//!   ([`Trainer::run`]) reported to an [`Observer`].
//! - [`spec`]: what a run trains: the [`Task`], the model [`Preset`]s and their measured
//!   defaults, the run's specification ([`RunSpec`]).
//! - [`run_dir`]: a run directory's layout ([`RunDir`]: specification, vocabulary,
//!   checkpoints, final model, metrics, decoding choice), read and written in one place.
//! - [`inference`]: the language models of `lm` and `mlm` runs put to use (continuing text,
//!   filling in masks).
//! - [`quickstart`]: a translation model trained on one TSV file in one call.
//!
//! This crate sits above `xfmr-models` and below the CLI (see `docs/ARCHITECTURE.md`).

pub mod data;
pub mod distributed;
pub mod inference;
pub mod kernel_cache;
pub mod objective;
pub mod quickstart;
pub mod replicas;
pub mod run_dir;
pub mod schedule;
pub mod spec;
pub mod trainer;

pub use distributed::{DataParallel, DataParallelConfig};
pub use objective::{encode_pairs, CausalLm, Example, MaskedLm, Objective, Translation};
pub use replicas::{local_devices, open_replicas, replica_threads, run_replicas};
pub use run_dir::RunDir;
pub use spec::{Preset, RunSpec, Task};
pub use trainer::{
    Decay, Event, MetricsFormat, MetricsLog, Observer, Progress, RunSummary, Silent, StepReport,
    Tee, TrainConfig, TrainError, Trainer,
};
