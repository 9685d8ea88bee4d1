//! `model_config`: a real checkpoint of a small model whose `config.json` is arbitrary bytes,
//! the manifest sealed again over it (an edited configuration: the manifest catches damage,
//! not a file written that way), loaded with [`checkpoint::load`] as each model family. The
//! configuration's sizes are checked against their bounds and every saved tensor's shape
//! against the one the configuration implies before a parameter is allocated: the load is a
//! model whose parameters match the weights exactly, or a typed error; never a panic (burn's
//! record loader on another layer count), an abort (a size of 10¹²) or a number printed in
//! 309 digits.
//!
//! Input: one byte choosing the family (its value modulo 3: Transformer, decoder-only,
//! encoder-only), then `config.json`. The weights are fixed: the family's small model (width 8,
//! 2 heads, feed-forward 16, 16 tokens, 2 layers per stack, 16 positions). Seeds: each
//! family's own `config.json`.

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::NdArray;
use xfmr_blocks::{LayerConfig, PositionEncoding};
use xfmr_io::write_manifest;
use xfmr_models::checkpoint::{self, ModelConfig, CONFIG_FILE, WEIGHTS_FILE};
use xfmr_models::{DecoderOnlyConfig, EncoderOnlyConfig, ModelError, TransformerConfig};

use super::scratch_dir;

/// The most values of a sinusoidal table this target builds: 2²² (16 MiB of `f32`, built and
/// copied once into a tensor, within the 64 MiB the allocation bound allows every input).
/// Larger tables that a configuration may ask for (up to
/// [`MAX_TABLE_VALUES`](xfmr_models::limits::MAX_TABLE_VALUES), 1 GiB) are allocated when
/// the model is built, as a valid configuration asks; the hostile-file tests check the bound
/// itself.
const TABLE_VALUES: u64 = 1 << 22;

/// The target's body.
pub fn run(data: &[u8]) {
    let Some((&family, config)) = data.split_first() else {
        return;
    };
    match family % 3 {
        0 => load::<TransformerConfig>(0, config),
        1 => load::<DecoderOnlyConfig>(1, config),
        _ => load::<EncoderOnlyConfig>(2, config),
    }
}

/// Writes `config` over family `family`'s checkpoint (weights unchanged), seals the manifest
/// and loads it as `C`.
fn load<C: ModelConfig>(family: usize, config: &[u8]) {
    if sinusoidal_values(config).is_some_and(|n| n > TABLE_VALUES) {
        return;
    }
    let dir = checkpoint_dir(family);
    fs::write(dir.join(CONFIG_FILE), config).expect("write");
    write_manifest(dir, &[CONFIG_FILE, WEIGHTS_FILE]).expect("manifest");
    let weights = fs::read(dir.join(WEIGHTS_FILE)).expect("read");
    match checkpoint::load::<NdArray, C>(dir, &Default::default()) {
        Ok((_, model)) => {
            // Loaded: every parameter the configuration implies is a saved tensor of the same
            // shape, and every saved tensor has its place.
            let mut expected = checkpoint::module_shapes::<NdArray, _>(&model);
            let mut saved: Vec<(String, Vec<usize>)> = checkpoint::saved_tensors(&weights)
                .expect("the fixed weights are a record")
                .into_iter()
                .map(|t| (t.path, t.shape))
                .collect();
            expected.sort();
            saved.sort();
            assert_eq!(
                expected, saved,
                "a model loaded over weights of other shapes"
            );
        }
        Err(e @ (ModelError::Json { .. } | ModelError::InvalidConfig { .. })) => {
            let message = e.to_string();
            let digits = message
                .split(|c: char| !c.is_ascii_digit())
                .map(str::len)
                .max()
                .unwrap_or(0);
            assert!(
                digits <= 20,
                "a number printed in {digits} digits: {message}"
            );
        }
        Err(_) => {}
    }
}

/// `max_len × d_model` when `config` parses as JSON whose model has sinusoidal positions
/// (named, or absent), as loading reads it (an older layout upgraded first).
fn sinusoidal_values(config: &[u8]) -> Option<u64> {
    let mut json: serde_json::Value = serde_json::from_slice(config).ok()?;
    checkpoint::upgrade_config(&mut json);
    if json
        .get("positions")
        .is_some_and(|p| p.as_str() != Some("Sinusoidal"))
    {
        return None;
    }
    let max_len = json.get("max_len")?.as_u64()?;
    let d_model = json.get("layer")?.get("d_model")?.as_u64()?;
    Some(max_len.saturating_mul(d_model))
}

/// Family `family`'s checkpoint directory, saved on first use.
fn checkpoint_dir(family: usize) -> &'static PathBuf {
    static DIRS: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    DIRS[family].get_or_init(|| {
        let dir = scratch_dir().join(format!("model-config-{family}"));
        let device = Default::default();
        match family {
            0 => save(&dir, transformer(), &device),
            1 => save(&dir, decoder_only(), &device),
            _ => save(&dir, encoder_only(), &device),
        }
        dir
    })
}

fn save<C: ModelConfig>(dir: &std::path::Path, config: C, device: &NdArrayDevice) {
    let model = config.init_model::<NdArray>(device).expect("a small model");
    checkpoint::save::<NdArray, C>(&model, &config, dir).expect("save");
}

fn layer() -> LayerConfig {
    LayerConfig::new(8, 2, 16)
}

fn transformer() -> TransformerConfig {
    TransformerConfig::new(16, 16, layer(), 2, 2).with_max_len(16)
}

fn decoder_only() -> DecoderOnlyConfig {
    DecoderOnlyConfig::new(16, layer(), 2)
        .with_positions(PositionEncoding::Learned)
        .with_max_len(16)
}

fn encoder_only() -> EncoderOnlyConfig {
    EncoderOnlyConfig::new(16, EncoderOnlyConfig::bert_layer(8, 2, 16), 2)
        .with_max_len(16)
        .with_mlm_head(true)
}

/// Each family's `config.json`, behind its family byte.
pub fn seeds() -> Vec<Vec<u8>> {
    let json = [
        serde_json::to_vec_pretty(&transformer()),
        serde_json::to_vec_pretty(&decoder_only()),
        serde_json::to_vec_pretty(&encoder_only()),
    ];
    json.into_iter()
        .enumerate()
        .map(|(family, config)| {
            let mut seed = vec![family as u8];
            seed.extend(config.expect("a configuration serialises"));
            seed
        })
        .collect()
}
