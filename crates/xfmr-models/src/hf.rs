//! Hugging Face BERT checkpoints (`BertModel`, sentence-transformers models such as
//! all-MiniLM-L6-v2) into [`EncoderOnly`], by their HF tensor names.
//!
//! | Hugging Face (optionally under `bert.`) | xfmr |
//! |---|---|
//! | `embeddings.word_embeddings.weight` | `token_embedding.weight` |
//! | `embeddings.position_embeddings.weight` | `positions.learned.table` |
//! | `embeddings.token_type_embeddings.weight` | `token_type_embedding.weight` |
//! | `embeddings.LayerNorm.{weight,bias}` | `embedding_norm` |
//! | `encoder.layer.{i}.attention.self.{query,key,value}` | `encoder.layers[i].self_attn.{query,key,value}` |
//! | `encoder.layer.{i}.attention.output.dense` | `encoder.layers[i].self_attn.output` |
//! | `encoder.layer.{i}.attention.output.LayerNorm` | `encoder.layers[i].norm_attn` |
//! | `encoder.layer.{i}.intermediate.dense` | `encoder.layers[i].ffn.linear1` |
//! | `encoder.layer.{i}.output.dense` | `encoder.layers[i].ffn.linear2` |
//! | `encoder.layer.{i}.output.LayerNorm` | `encoder.layers[i].norm_ff` |
//! | `pooler.dense` | `pooler` |
//! | `cls.predictions.transform.{dense,LayerNorm}`, `cls.predictions.bias` | `mlm_head` |
//! | `classifier` | `classifier` |
//!
//! Linear weights are transposed (HF `[out, in]`, burn `[in, out]`). `embeddings.position_ids`
//! (an integer buffer) and `cls.predictions.decoder.weight` (a copy of the tied word
//! embeddings) are not parameters and are ignored. Every other mismatch is reported at once.

use std::path::Path;

use burn::tensor::backend::Backend;
use serde::Deserialize;
use xfmr_blocks::{BlockError, Positions, StateDict, StateDictImporter};

use crate::{EncoderOnly, EncoderOnlyConfig, ModelError};

/// The fields of a Hugging Face `config.json` that a BERT model needs.
#[derive(Debug, Clone, Deserialize)]
pub struct HfBertConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `type_vocab_size`.
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// `layer_norm_eps`.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// `hidden_act`.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// `pad_token_id`.
    #[serde(default)]
    pub pad_token_id: u32,
}

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}

impl HfBertConfig {
    /// Reads a `config.json`.
    ///
    /// # Errors
    /// [`ModelError::Io`] (unreadable) or [`ModelError::Json`] (not a configuration) naming
    /// the file.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        serde_json::from_str(&text).map_err(|e| ModelError::json(path, e))
    }

    /// The matching [`EncoderOnlyConfig`] (eval-ready: dropout is kept as in BERT, burn only
    /// applies it under autodiff).
    ///
    /// # Errors
    /// [`ModelError::InvalidConfig`] for an activation other than exact GELU.
    pub fn to_config(&self) -> Result<EncoderOnlyConfig, ModelError> {
        if self.hidden_act != "gelu" {
            return Err(ModelError::InvalidConfig {
                field: "hidden_act",
                value: self.hidden_act.clone(),
                expected: "\"gelu\" (exact GELU)",
            });
        }
        let layer = EncoderOnlyConfig::bert_layer(
            self.hidden_size,
            self.num_attention_heads,
            self.intermediate_size,
        )
        .with_norm_eps(self.layer_norm_eps);
        Ok(
            EncoderOnlyConfig::new(self.vocab_size, layer, self.num_hidden_layers)
                .with_max_len(self.max_position_embeddings)
                .with_type_vocab_size(self.type_vocab_size)
                .with_pad_id(self.pad_token_id),
        )
    }
}

/// Loads a BERT state dict into `model`, whose configuration must match the checkpoint's.
/// Names may carry a `bert.` prefix (`BertForMaskedLM` and friends). Heads the model has
/// (`pooler`, `mlm_head`, `classifier`) must be in the checkpoint; heads the checkpoint has and
/// the model lacks are reported as unexpected.
///
/// # Errors
/// [`ModelError::Block`] wrapping [`BlockError::Import`], listing every missing, unexpected
/// and wrong-shape tensor.
pub fn load_bert<B: Backend>(
    mut model: EncoderOnly<B>,
    dict: &StateDict,
) -> Result<EncoderOnly<B>, ModelError> {
    let p = if dict.names().any(|n| n.starts_with("bert.")) {
        "bert."
    } else {
        ""
    };
    // `lazy_device`: no random initialisation of a table the import replaces.
    let device = model.token_embedding.weight.lazy_device();
    let mut imp = StateDictImporter::<B>::new(dict, device);
    // Not parameters: a position-index buffer and a copy of the tied word embeddings.
    imp.ignore("embeddings.position_ids");
    imp.ignore("bert.embeddings.position_ids");
    imp.ignore("cls.predictions.decoder.weight");
    imp.ignore("cls.predictions.decoder.bias");
    imp.param(
        &mut model.token_embedding.weight,
        &format!("{p}embeddings.word_embeddings.weight"),
    );
    match model.positions.as_mut() {
        Some(Positions::Learned(learned)) => imp.param(
            &mut learned.table,
            &format!("{p}embeddings.position_embeddings.weight"),
        ),
        _ => imp.report_other("BERT needs learned positions (PositionEncoding::Learned)".into()),
    }
    if let Some(types) = model.token_type_embedding.as_mut() {
        imp.param(
            &mut types.weight,
            &format!("{p}embeddings.token_type_embeddings.weight"),
        );
    }
    if let Some(norm) = model.embedding_norm.as_mut() {
        imp.norm(norm, &format!("{p}embeddings.LayerNorm"));
    }
    for (i, layer) in model.encoder.layers.iter_mut().enumerate() {
        let l = format!("{p}encoder.layer.{i}.");
        let attn = &mut layer.self_attn;
        imp.linear(&mut attn.query, &format!("{l}attention.self.query"));
        imp.linear(&mut attn.key, &format!("{l}attention.self.key"));
        imp.linear(&mut attn.value, &format!("{l}attention.self.value"));
        imp.linear(&mut attn.output, &format!("{l}attention.output.dense"));
        imp.norm(
            &mut layer.norm_attn,
            &format!("{l}attention.output.LayerNorm"),
        );
        imp.linear(&mut layer.ffn.linear1, &format!("{l}intermediate.dense"));
        imp.linear(&mut layer.ffn.linear2, &format!("{l}output.dense"));
        imp.norm(&mut layer.norm_ff, &format!("{l}output.LayerNorm"));
    }
    if let Some(pooler) = model.pooler.as_mut() {
        imp.linear(pooler, &format!("{p}pooler.dense"));
    }
    if let Some(head) = model.mlm_head.as_mut() {
        imp.linear(&mut head.dense, "cls.predictions.transform.dense");
        imp.norm(&mut head.norm, "cls.predictions.transform.LayerNorm");
        imp.param(&mut head.bias, "cls.predictions.bias");
    }
    if let Some(classifier) = model.classifier.as_mut() {
        imp.linear(classifier, "classifier");
    }
    imp.finish("").map_err(ModelError::from)?;
    Ok(model)
}

/// Builds an [`EncoderOnly`] from a Hugging Face model directory holding `config.json` and
/// `model.safetensors`. The pooler is kept when the checkpoint has one.
///
/// # Errors
/// Unreadable files, an unsupported configuration, or an import mismatch (all listed).
pub fn load_bert_dir<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(EncoderOnlyConfig, EncoderOnly<B>), ModelError> {
    let hf = HfBertConfig::from_file(&dir.join("config.json"))?;
    let dict = StateDict::from_file(&dir.join("model.safetensors")).map_err(|e| match e {
        BlockError::Read(msg) => ModelError::io(dir.join("model.safetensors"), msg),
        other => other.into(),
    })?;
    let has_pooler = dict.names().any(|n| n.ends_with("pooler.dense.weight"));
    let config = hf.to_config()?.with_pooler(has_pooler);
    let model = load_bert(config.init(device)?, &dict)?;
    Ok((config, model))
}
