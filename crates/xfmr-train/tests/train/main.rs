//! Tests of xfmr-train: the loss and schedule against their formulas, token-count batches,
//! the training loop's resume, checkpoints and averaging, data-parallel membership, hostile run
//! directories (an edited, re-sealed model configuration), training with `bf16` products.

mod bucketed;
mod data;
mod distributed;
mod families;
mod hostile;
mod inference;
mod log;
mod objective;
mod precision;
mod run_dir;
mod trainer;
