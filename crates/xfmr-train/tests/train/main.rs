//! Tests of xfmr-train: metrics against sacreBLEU, the loss and schedule against their formulas,
//! the training loop's resume, checkpoints and averaging, data-parallel membership, hostile run
//! directories (an edited, re-sealed model configuration).

mod bucketed;
mod data;
mod decoding;
mod distributed;
mod families;
mod hostile;
mod inference;
mod log;
mod metrics;
mod objective;
mod run_dir;
mod tokenizer;
mod trainer;
