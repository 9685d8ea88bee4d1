//! Tests of xfmr-train: metrics against sacreBLEU, the loss and schedule against their formulas,
//! the training loop's resume, checkpoints and averaging.

mod data;
mod metrics;
mod objective;
mod tokenizer;
mod trainer;
