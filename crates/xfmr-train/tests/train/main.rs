//! Tests of xfmr-train: metrics against sacreBLEU, the loss and schedule against their formulas.

mod data;
mod metrics;
mod objective;
mod tokenizer;
