//! `hf_config`: an arbitrary Hugging Face BERT `config.json` ([`HfBertConfig::from_file`], the
//! first file `xfmr embed` and the sentence encoder read of a model directory) and its
//! translation to xfmr's configuration ([`HfBertConfig::to_config`]): a configuration or an
//! error naming the file or the field. Seed: all-MiniLM-L6-v2's `config.json`.

use std::fs;

use xfmr_models::hf::HfBertConfig;

use super::scratch_dir;

/// The target's body.
pub fn run(data: &[u8]) {
    let path = scratch_dir().join("config.json");
    fs::write(&path, data).expect("write");
    match HfBertConfig::from_file(&path) {
        Ok(config) => {
            let _ = config.to_config();
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("config.json"),
                "the error does not name the file: {message}"
            );
        }
    }
}

/// all-MiniLM-L6-v2's `config.json` (sentence-transformers' copy of the model).
pub fn seeds() -> Vec<Vec<u8>> {
    vec![seed()]
}

fn seed() -> Vec<u8> {
    br#"{
  "_name_or_path": "nreimers/MiniLM-L6-H384-uncased",
  "architectures": ["BertModel"],
  "attention_probs_dropout_prob": 0.1,
  "gradient_checkpointing": false,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 384,
  "initializer_range": 0.02,
  "intermediate_size": 1536,
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 6,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "transformers_version": "4.8.2",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
}
"#
    .to_vec()
}
