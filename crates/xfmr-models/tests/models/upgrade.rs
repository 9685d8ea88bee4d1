//! Configurations of the layout before 2026-12-03 (`positions` inside the layer) load as the
//! configurations they describe, through [`checkpoint::upgrade_config`]; the run directories
//! an older binary wrote are tested end to end in `xfmr-cli`'s `old_runs.rs`.

use std::path::Path;

use serde_json::{json, Value};
use xfmr_blocks::PositionEncoding;
use xfmr_models::checkpoint::{self, ModelConfig, CONFIG_FILE, WEIGHTS_FILE};
use xfmr_models::{DecoderOnlyConfig, EncoderOnlyConfig, TransformerConfig};
use xfmr_testing::max_abs_diff;

use crate::{ids, Cpu, Device, VOCAB};

/// Saves `config`'s model in `dir`, then rewrites its `config.json` in the old layout (the
/// model's `positions` moved into `layer`) and seals the manifest again, as the old binary
/// would have written it.
fn save_in_old_layout<C: ModelConfig>(dir: &Path, config: &C) -> C::Model<Cpu> {
    let model = config.init_model::<Cpu>(&Default::default()).unwrap();
    checkpoint::save::<Cpu, C>(&model, config, dir).unwrap();
    let path = dir.join(CONFIG_FILE);
    let mut value: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let positions = value.as_object_mut().unwrap().remove("positions").unwrap();
    value["layer"]["positions"] = positions;
    std::fs::write(&path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
    xfmr_io::write_manifest(dir, &[CONFIG_FILE, WEIGHTS_FILE]).unwrap();
    model
}

/// Each family, with positions other than its default, loads from the old layout as the same
/// configuration and the same model (equal outputs).
#[test]
fn upgrade_old_layout_checkpoints_load_as_saved() {
    let device: Device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let x = ids::<Cpu>(&[vec![5, 9, 3, 7]], &device);

    let config = TransformerConfig::tiny(VOCAB).with_positions(PositionEncoding::Alibi);
    let path = dir.path().join("transformer");
    let model = save_in_old_layout(&path, &config);
    let (loaded_config, loaded) =
        checkpoint::load::<Cpu, TransformerConfig>(&path, &device).unwrap();
    assert_eq!(loaded_config.positions, PositionEncoding::Alibi);
    let (a, b) = (
        model.forward(x.clone(), x.clone()).unwrap(),
        loaded.forward(x.clone(), x.clone()).unwrap(),
    );
    assert_eq!(max_abs_diff(&a, &b), 0.0);
    // `load_expecting` compares the upgraded configuration with the expected one.
    checkpoint::load_expecting::<Cpu, _>(&path, &config, &device).unwrap();

    let config = DecoderOnlyConfig::tiny(VOCAB).with_positions(PositionEncoding::rotary());
    let path = dir.path().join("decoder-only");
    let model = save_in_old_layout(&path, &config);
    let (loaded_config, loaded) =
        checkpoint::load::<Cpu, DecoderOnlyConfig>(&path, &device).unwrap();
    assert_eq!(loaded_config.positions, PositionEncoding::rotary());
    let (a, b) = (
        model.forward(x.clone()).unwrap(),
        loaded.forward(x.clone()).unwrap(),
    );
    assert_eq!(max_abs_diff(&a, &b), 0.0);

    let config = EncoderOnlyConfig::tiny(VOCAB).with_positions(PositionEncoding::Sinusoidal);
    let path = dir.path().join("encoder-only");
    let model = save_in_old_layout(&path, &config);
    let loaded_config: EncoderOnlyConfig = checkpoint::load_config(&path).unwrap();
    assert_eq!(loaded_config.positions, PositionEncoding::Sinusoidal);
    let loaded = checkpoint::load_expecting::<Cpu, _>(&path, &config, &device).unwrap();
    let (a, b) = (
        model.forward(x.clone(), None, None).unwrap(),
        loaded.forward(x, None, None).unwrap(),
    );
    assert_eq!(max_abs_diff(&a, &b), 0.0);
}

/// The upgrade moves the layer's value, keeps a model-level one when both are present, changes
/// nothing twice, and leaves what is not a model configuration alone.
#[test]
fn upgrade_config_moves_positions_once() {
    let mut old = json!({"layer": {"d_model": 8, "positions": "Learned"}, "max_len": 4});
    assert!(checkpoint::upgrade_config(&mut old));
    assert_eq!(
        old,
        json!({"layer": {"d_model": 8}, "max_len": 4, "positions": "Learned"})
    );
    let upgraded = old.clone();
    assert!(!checkpoint::upgrade_config(&mut old));
    assert_eq!(old, upgraded);

    let mut both = json!({"layer": {"positions": "Learned"}, "positions": "Alibi"});
    assert!(checkpoint::upgrade_config(&mut both));
    assert_eq!(both, json!({"layer": {}, "positions": "Alibi"}));

    for mut other in [
        json!([1, 2]),
        json!("layer"),
        json!({"layer": 3}),
        json!({}),
    ] {
        let before = other.clone();
        assert!(!checkpoint::upgrade_config(&mut other));
        assert_eq!(other, before);
    }
}
