//! Tests of xfmr-translate: corpora (errors naming file and line, the near-duplicate-aware
//! split), the BPE vocabulary, BLEU and chrF against sacreBLEU, and translation (the length
//! penalty chosen on held-out pairs, batching, cancellation, sources beyond the model's
//! positions).

mod data;
mod decoding;
mod metrics;
mod tokenizer;
