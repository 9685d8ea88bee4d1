//! `checkpoint`: a model checkpoint directory whose `config.json` and `model.mpk` are arbitrary
//! bytes under a manifest that matches them (a checkpoint made by someone else, or by another
//! version: the manifest's hashes catch damage, not a file written that way).
//!
//! Fields, split at the first `0xFF` byte: `config.json`, then `model.mpk`. The manifest is
//! sealed over them ([`write_manifest`]) and [`checkpoint::load`] reads a
//! [`Transformer`](xfmr_models::Transformer) on ndarray: a model, or an error naming the file;
//! its memory bounded by the files' size (a
//! configuration that describes a model far larger than its weights file is refused, not
//! allocated). Seed: a real checkpoint of a small model.

use std::fs;

use burn::backend::NdArray;
use xfmr_io::write_manifest;
use xfmr_models::{checkpoint, TransformerConfig};

use super::scratch_dir;
use crate::split_field;

/// The target's body.
pub fn run(data: &[u8]) {
    let (config, weights) = split_field(data);
    let dir = scratch_dir().join("checkpoint");
    fs::create_dir_all(&dir).expect("scratch directory");
    fs::write(dir.join("config.json"), config).expect("write");
    fs::write(dir.join("model.mpk"), weights).expect("write");
    write_manifest(&dir, &["config.json", "model.mpk"]).expect("manifest");
    let _ = checkpoint::load::<NdArray, TransformerConfig>(&dir, &Default::default());
}

/// A real checkpoint's two files, joined as the target reads them.
pub fn seeds() -> Vec<Vec<u8>> {
    vec![seed()]
}

fn seed() -> Vec<u8> {
    use xfmr_blocks::LayerConfig;
    let config = TransformerConfig::new(16, 16, LayerConfig::new(8, 2, 16), 1, 1);
    let model = config
        .init::<NdArray>(&Default::default())
        .expect("a small model");
    let dir = scratch_dir().join("checkpoint-seed");
    checkpoint::save::<NdArray, _>(&model, &config, &dir).expect("save");
    let mut out = fs::read(dir.join("config.json")).expect("read");
    out.push(0xFF);
    out.extend(fs::read(dir.join("model.mpk")).expect("read"));
    out
}
