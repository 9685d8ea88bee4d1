//! One module per `xfmr` command: its clap arguments and the library calls it makes. No
//! command module imports another; what several share lives beside `commands/` (`backend.rs`,
//! `runs.rs`, `translation.rs`, `pretrained.rs`, `observe.rs`, `parallel.rs`, `plot.rs`).

pub mod attention;
pub mod demo;
pub mod embed;
pub mod eval;
pub mod fetch_model;
pub mod fill_mask;
pub mod generate;
pub mod prepare_data;
pub mod serve;
pub mod similarity;
pub mod train;
pub mod translate;
