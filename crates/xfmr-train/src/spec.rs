//! What a run trains: the [`Task`], the model [`Preset`]s with the training defaults measured
//! for them, and the run's specification ([`RunSpec`]: the objective, the model inside it, and
//! the [`TrainConfig`]), which a run directory keeps as `train-config.json`
//! ([`RunDir::write_spec`](crate::run_dir::RunDir::write_spec)).
//!
//! ```
//! use xfmr_train::spec::{Preset, Task};
//!
//! // The `cpu` preset's translation run: the recipe measured on its ten-minute run.
//! assert_eq!(Preset::Cpu.vocab_size(Task::Translation), 8000);
//! assert_eq!(Preset::Cpu.schedule(Task::Translation), (800, 1.0));
//! assert_eq!(Preset::Cpu.dropout(Task::Translation), 0.0);
//! assert_eq!("mlm".parse::<Task>().unwrap(), Task::Mlm);
//! ```

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use xfmr_blocks::{LayerConfig, NormPosition};
use xfmr_models::{DecoderOnlyConfig, EncoderOnlyConfig, TransformerConfig};
use xfmr_translate::Pair;
use xfmr_translate::SubwordTokenizer;

use crate::objective::{CausalLm, MaskedLm, Translation};
use crate::trainer::{TrainConfig, TrainError};

/// What a run teaches a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Source → target with the encoder-decoder Transformer (the paper's job).
    Translation,
    /// A GPT-like causal language model of the target side.
    Lm,
    /// A BERT-like masked language model of the target side.
    Mlm,
}

impl Task {
    /// Every task, in the order above.
    pub const ALL: [Task; 3] = [Task::Translation, Task::Lm, Task::Mlm];

    /// The task's name: `translation`, `lm` or `mlm` (its JSON value and `FromStr` input).
    pub fn name(self) -> &'static str {
        match self {
            Self::Translation => "translation",
            Self::Lm => "lm",
            Self::Mlm => "mlm",
        }
    }

    /// Learns the task's BPE vocabulary of at most `vocab_size` tokens on `pairs`: both sides
    /// for translation (one vocabulary shared by source and target), the target side for the
    /// language models; `mlm` adds the mask token ([`SubwordTokenizer::with_mask`]).
    ///
    /// # Errors
    /// [`TrainError::Tokenizer`] if the `tokenizers` trainer fails.
    pub fn learn_vocabulary(
        self,
        pairs: &[Pair],
        vocab_size: usize,
    ) -> Result<SubwordTokenizer, TrainError> {
        let tokenizer = match self {
            Self::Translation => SubwordTokenizer::train(
                pairs.iter().flat_map(|p| [p.src.as_str(), p.tgt.as_str()]),
                vocab_size,
            )?,
            Self::Lm | Self::Mlm => {
                SubwordTokenizer::train(pairs.iter().map(|p| p.tgt.as_str()), vocab_size)?
            }
        };
        Ok(match self {
            Self::Mlm => tokenizer.with_mask(),
            _ => tokenizer,
        })
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Task {
    type Err = String;

    /// `translation`, `lm` or `mlm`.
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown task {s:?}: expected translation, lm or mlm"))
    }
}

/// Model sizes with their training defaults (the `xfmr train --preset` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Preset {
    /// d_model 64, 4 heads, d_ff 128, 2 + 2 layers (tests).
    Tiny,
    /// d_model 128, 4 heads, d_ff 512, 3 + 3 layers (no dropout for translation): the 2-core
    /// CPU default.
    Cpu,
    /// d_model 256, 4 heads, d_ff 1024, 3 + 3 layers.
    Small,
    /// The paper's base model: d_model 512, 8 heads, d_ff 2048, 6 + 6 layers.
    Base,
    /// The paper's big model: d_model 1024, 16 heads, d_ff 4096, 6 + 6 layers, dropout 0.3.
    Big,
}

/// The BPE vocabulary size of every preset's run but `cpu` translation
/// ([`Preset::vocab_size`]), and the default of runs from a `train-config.json`, which name no
/// preset.
pub const DEFAULT_VOCAB_SIZE: usize = 4000;

impl Preset {
    /// Every preset, smallest first.
    pub const ALL: [Preset; 5] = [
        Preset::Tiny,
        Preset::Cpu,
        Preset::Small,
        Preset::Base,
        Preset::Big,
    ];

    /// The preset's name: `tiny`, `cpu`, `small`, `base` or `big` (its `FromStr` input).
    pub fn name(self) -> &'static str {
        match self {
            Self::Tiny => "tiny",
            Self::Cpu => "cpu",
            Self::Small => "small",
            Self::Base => "base",
            Self::Big => "big",
        }
    }

    /// The translation model over a vocabulary of `vocab` tokens; the language models take its
    /// widths and as many layers as its encoder and decoder together.
    pub fn transformer(self, vocab: usize) -> TransformerConfig {
        match self {
            Self::Tiny => TransformerConfig::tiny(vocab),
            Self::Cpu => TransformerConfig::new(vocab, vocab, LayerConfig::new(128, 4, 512), 3, 3),
            Self::Small => TransformerConfig::small(vocab),
            Self::Base => TransformerConfig::base(vocab),
            Self::Big => TransformerConfig::big(vocab),
        }
    }

    /// The dropout of the preset's run of `task`: the preset's model's (the paper's 0.1; 0.3
    /// for `big`), except 0 for `cpu` translation, whose ten-minute run under-fits and learns
    /// faster without it (docs/training.md; the language models were not measured so).
    pub fn dropout(self, task: Task) -> f64 {
        match (self, task) {
            (Self::Cpu, Task::Translation) => 0.0,
            _ => self.transformer(8).layer.dropout,
        }
    }

    /// The warm-up steps and schedule factor of the preset's run of `task`: 800 and the paper's
    /// 1 for `cpu` translation (measured on its ten-minute run, docs/training.md), 300 and 0.3
    /// for the rest (the recipe of before, not measured again).
    pub fn schedule(self, task: Task) -> (usize, f64) {
        match (self, task) {
            (Self::Cpu, Task::Translation) => (800, 1.0),
            _ => (300, 0.3),
        }
    }

    /// The BPE vocabulary size of the preset's run of `task`: 8,000 for `cpu` translation (the
    /// best of 2,000, 4,000 and 8,000 on its ten-minute run: docs/training.md),
    /// [`DEFAULT_VOCAB_SIZE`] for the rest (not measured again).
    pub fn vocab_size(self, task: Task) -> usize {
        match (self, task) {
            (Self::Cpu, Task::Translation) => 8000,
            _ => DEFAULT_VOCAB_SIZE,
        }
    }

    /// `TrainConfig::new()` with the preset's schedule for `task` ([`Preset::schedule`]).
    pub fn train_config(self, task: Task) -> TrainConfig {
        let (warmup, lr_factor) = self.schedule(task);
        TrainConfig::new()
            .with_warmup(warmup)
            .with_lr_factor(lr_factor)
    }

    /// The run of `task` on the preset's model: the task's objective with every special id
    /// from `tokenizer` and the vocabulary its size, `dropout` (`None`: [`Preset::dropout`]),
    /// examples of at most `max_len` tokens (the language models' position tables hold them
    /// with their start and end tokens; the causal model's at least 256, room to generate past
    /// them), trained as `train` says.
    ///
    /// # Errors
    /// [`TrainError::InvalidConfig`] for `mlm` with a vocabulary without the mask token.
    pub fn spec(
        self,
        task: Task,
        tokenizer: &SubwordTokenizer,
        dropout: Option<f64>,
        max_len: usize,
        train: TrainConfig,
    ) -> Result<RunSpec, TrainError> {
        let vocab = tokenizer.vocab_size();
        let dropout = dropout.unwrap_or_else(|| self.dropout(task));
        let t = self.transformer(vocab);
        let (d_model, heads, d_ff) = (t.layer.d_model, t.layer.n_heads, t.layer.d_ff);
        let layers = t.n_encoder_layers + t.n_decoder_layers;
        Ok(match task {
            Task::Translation => RunSpec::Translation {
                objective: Translation::for_tokenizer(
                    t.map_layer(|l| l.with_dropout(dropout)),
                    tokenizer,
                ),
                train,
            },
            Task::Lm => RunSpec::Lm {
                objective: CausalLm::for_tokenizer(
                    DecoderOnlyConfig::new(
                        vocab,
                        DecoderOnlyConfig::gpt_layer(d_model, heads, d_ff).with_dropout(dropout),
                        layers,
                    )
                    .with_max_len((max_len + 2).max(256)),
                    tokenizer,
                ),
                train,
            },
            Task::Mlm => RunSpec::Mlm {
                objective: MaskedLm::for_tokenizer(
                    EncoderOnlyConfig::new(
                        vocab,
                        // Pre-norm: BERT's post-norm layers collapsed to unigram predictions
                        // at this schedule's learning rate (docs/training.md).
                        EncoderOnlyConfig::bert_layer(d_model, heads, d_ff)
                            .with_norm_position(NormPosition::Pre)
                            .with_dropout(dropout),
                        layers,
                    )
                    .with_max_len(max_len + 2)
                    .with_type_vocab_size(0)
                    .with_pooler(false)
                    .with_mlm_head(true),
                    tokenizer,
                )?,
                train,
            },
        })
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = String;

    /// `tiny`, `cpu`, `small`, `base` or `big`.
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown preset {s:?}: expected tiny, cpu, small, base or big"))
    }
}

/// A run's task, objective and training configuration: a run directory's `train-config.json`
/// (`{"task": "translation" | "lm" | "mlm", "objective": {..}, "train": {..}}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "lowercase")]
pub enum RunSpec {
    /// Translation.
    Translation {
        /// The objective (the model inside).
        objective: Translation,
        /// How to train.
        train: TrainConfig,
    },
    /// Causal language modelling.
    Lm {
        /// The objective (the model inside).
        objective: CausalLm,
        /// How to train.
        train: TrainConfig,
    },
    /// Masked language modelling.
    Mlm {
        /// The objective (the model inside).
        objective: MaskedLm,
        /// How to train.
        train: TrainConfig,
    },
}

impl RunSpec {
    /// The run's task.
    pub fn task(&self) -> Task {
        match self {
            Self::Translation { .. } => Task::Translation,
            Self::Lm { .. } => Task::Lm,
            Self::Mlm { .. } => Task::Mlm,
        }
    }

    /// How the run trains.
    pub fn train_config(&self) -> &TrainConfig {
        match self {
            Self::Translation { train, .. } | Self::Lm { train, .. } | Self::Mlm { train, .. } => {
                train
            }
        }
    }

    /// The same run over `tokenizer`'s vocabulary: its size, and for `mlm` its mask id (a
    /// specification read from another run's file keeps that run's model otherwise).
    ///
    /// # Errors
    /// [`TrainError::InvalidConfig`] for `mlm` with a vocabulary without the mask token.
    pub fn with_vocabulary(mut self, tokenizer: &SubwordTokenizer) -> Result<Self, TrainError> {
        let vocab = tokenizer.vocab_size();
        match &mut self {
            Self::Translation { objective, .. } => {
                objective.model.src_vocab_size = vocab;
                objective.model.tgt_vocab_size = vocab;
            }
            Self::Lm { objective, .. } => objective.model.vocab_size = vocab,
            Self::Mlm { objective, .. } => {
                objective.model.vocab_size = vocab;
                objective.mask_id = tokenizer.mask_id().ok_or(TrainError::InvalidConfig {
                    field: "mask_id",
                    value: "none".into(),
                    expected: "a vocabulary with the mask token (SubwordTokenizer::with_mask)",
                })?;
            }
        }
        Ok(self)
    }

    /// Reads a `train-config.json`, its model configuration brought up to date first
    /// ([`xfmr_models::checkpoint::upgrade_config`]).
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file when it cannot be read or is not a run's
    /// specification.
    pub fn read(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let invalid = |e| TrainError::io(path, format!("not a run's train-config.json: {e}"));
        let mut value: serde_json::Value = serde_json::from_str(&text).map_err(invalid)?;
        upgrade_objective(&mut value);
        serde_json::from_value(value).map_err(invalid)
    }

    /// The `task` a `train-config.json` names, if it names one (read before the vocabulary,
    /// which the task decides, exists).
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file when it cannot be read or is not JSON with a valid
    /// `task`.
    pub fn read_task(path: &Path) -> Result<Option<Task>, TrainError> {
        #[derive(Deserialize)]
        struct Tagged {
            task: Option<Task>,
        }
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let tagged: Tagged = serde_json::from_str(&text).map_err(|e| TrainError::io(path, e))?;
        Ok(tagged.task)
    }

    /// Writes it to `path` as pretty JSON, atomically (a temporary file, then a rename).
    ///
    /// # Errors
    /// [`TrainError::Io`] naming the file.
    pub fn write(&self, path: &Path) -> Result<(), TrainError> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| TrainError::io(path, e))?;
        Ok(xfmr_io::write_atomic(path, &json)?)
    }
}

/// Brings the model configuration inside a run's specification or a checkpoint's training
/// state (`objective.model`) up to date, as an earlier xfmr may have written it
/// ([`xfmr_models::checkpoint::upgrade_config`]); anything else is left alone.
pub(crate) fn upgrade_objective(value: &mut serde_json::Value) {
    if let Some(model) = value.pointer_mut("/objective/model") {
        xfmr_models::checkpoint::upgrade_config(model);
    }
}
