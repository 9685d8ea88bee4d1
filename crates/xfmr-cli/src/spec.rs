//! What `xfmr train` trains: the task, the model presets, and the run's specification (the
//! objective and the training configuration) from the flags or a `--config` file.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use xfmr::blocks::{LayerConfig, NormPosition};
use xfmr::models::{DecoderOnlyConfig, EncoderOnlyConfig, TransformerConfig};
use xfmr_train::{CausalLm, MaskedLm, SubwordTokenizer, TrainConfig, Translation};

use crate::train::TrainArgs;

/// What `train` teaches a model.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Spanish → English with the encoder-decoder Transformer (the paper's job).
    Translation,
    /// A GPT-like causal language model on the English side.
    Lm,
    /// A BERT-like masked language model on the English side.
    Mlm,
}

impl Task {
    /// The `--task` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Translation => "translation",
            Self::Lm => "lm",
            Self::Mlm => "mlm",
        }
    }
}

/// Model sizes `train` knows.
#[derive(Clone, Copy, Debug, ValueEnum)]
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

/// The BPE vocabulary size of every run but `cpu` translation ([`Preset::vocab_size`]), and of
/// `--config` runs, whose preset flag is not theirs.
pub(crate) const VOCAB_SIZE: usize = 4000;

impl Preset {
    /// The translation model; the language models take its widths and as many layers as its
    /// encoder and decoder together.
    fn translation(self, vocab: usize) -> TransformerConfig {
        match self {
            Self::Tiny => TransformerConfig::tiny(vocab),
            Self::Cpu => TransformerConfig::new(vocab, vocab, LayerConfig::new(128, 4, 512), 3, 3),
            Self::Small => TransformerConfig::small(vocab),
            Self::Base => TransformerConfig::base(vocab),
            Self::Big => TransformerConfig::big(vocab),
        }
    }

    /// The dropout `--dropout` defaults to: the preset's model's (the paper's 0.1; 0.3 for
    /// `big`), except 0 for `cpu` translation, whose ten-minute run under-fits and learns
    /// faster without it (docs/training.md; the language models were not measured so).
    fn dropout(self, task: Task) -> f64 {
        match (self, task) {
            (Self::Cpu, Task::Translation) => 0.0,
            _ => self.translation(8).layer.dropout,
        }
    }

    /// The warm-up and schedule factor `--warmup` and `--lr-factor` default to: 800 and the
    /// paper's 1 for `cpu` translation (measured on its ten-minute run, docs/training.md),
    /// 300 and 0.3 for the rest (the recipe of before, not measured again).
    fn schedule(self, task: Task) -> (usize, f64) {
        match (self, task) {
            (Self::Cpu, Task::Translation) => (800, 1.0),
            _ => (300, 0.3),
        }
    }

    /// The BPE vocabulary size `--vocab-size` defaults to: 8,000 for `cpu` translation (on its
    /// ten-minute run, test BLEU 30.5 beam against 27.7 with 2,000 and 29.5-30.2 with 4,000:
    /// docs/training.md), 4,000 for the rest (not measured again).
    pub(crate) fn vocab_size(self, task: Task) -> usize {
        match (self, task) {
            (Self::Cpu, Task::Translation) => 8000,
            _ => VOCAB_SIZE,
        }
    }

    fn widths(self) -> (usize, usize, usize, usize) {
        let t = self.translation(8);
        let l = t.layer;
        (
            l.d_model,
            l.n_heads,
            l.d_ff,
            t.n_encoder_layers + t.n_decoder_layers,
        )
    }
}

/// A run's task, objective and training configuration: `<run>/train-config.json`, and the file
/// `--config` reads.
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

impl TrainArgs {
    /// The task: `--config`'s when given, else `--task`.
    pub fn task(&self) -> Result<Task> {
        match &self.config {
            Some(path) => task_of(path),
            None => Ok(self.task),
        }
    }

    /// The run directory: `--out`, else the task's default.
    pub fn out(&self) -> Result<PathBuf> {
        Ok(self.out.clone().unwrap_or_else(|| {
            PathBuf::from(match self.task() {
                Ok(Task::Lm) => "runs/en-lm",
                Ok(Task::Mlm) => "runs/en-mlm",
                _ => "runs/es-en",
            })
        }))
    }

    /// The training configuration of the flags.
    pub(crate) fn train_config(&self) -> Result<TrainConfig> {
        if self.steps.is_none() && self.minutes == 0.0 {
            bail!("--minutes 0 without --steps: the run would have no end");
        }
        let (warmup, lr_factor) = self.preset.schedule(self.task);
        Ok(TrainConfig::new()
            .with_steps(self.steps.unwrap_or(usize::MAX))
            .with_minutes((self.minutes != 0.0).then_some(self.minutes))
            .with_max_tokens(self.max_tokens)
            .with_accumulate(self.accumulate)
            .with_warmup(self.warmup.unwrap_or(warmup))
            .with_lr_factor(self.lr_factor.unwrap_or(lr_factor))
            .with_decay(match self.decay {
                crate::train::DecayArg::InverseSqrt => None,
                crate::train::DecayArg::Linear => Some(xfmr_train::Decay::Linear),
            })
            .with_seed(self.seed)
            .with_eval_every(self.eval_every)
            .with_checkpoint_every(self.checkpoint_every)
            .with_keep_checkpoints(self.average.max(1))
            .with_average(self.average.max(1)))
    }

    /// The run of the flags: the task's objective on the preset's model.
    pub(crate) fn spec(&self, tokenizer: &SubwordTokenizer) -> Result<RunSpec> {
        let vocab = tokenizer.vocab_size();
        // The special ids are the tokenizer's.
        let (d_model, heads, d_ff, layers) = self.preset.widths();
        let dropout = self
            .dropout
            .unwrap_or_else(|| self.preset.dropout(self.task));
        let train = self.train_config()?;
        Ok(match self.task {
            Task::Translation => RunSpec::Translation {
                objective: Translation::for_tokenizer(
                    self.preset
                        .translation(vocab)
                        .map_layer(|l| l.with_dropout(dropout)),
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
                    // Room for generating past the longest training sentence.
                    .with_max_len((self.max_len + 2).max(256)),
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
                    .with_max_len(self.max_len + 2)
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

/// Reads `--config`, with the vocabulary size (and mask id) of `tokenizer`.
pub(crate) fn read_spec(path: &Path, tokenizer: &SubwordTokenizer) -> Result<RunSpec> {
    let text = fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut spec: RunSpec = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a run's train-config.json", path.display()))?;
    let vocab = tokenizer.vocab_size();
    match &mut spec {
        RunSpec::Translation { objective, .. } => {
            objective.model.src_vocab_size = vocab;
            objective.model.tgt_vocab_size = vocab;
        }
        RunSpec::Lm { objective, .. } => objective.model.vocab_size = vocab,
        RunSpec::Mlm { objective, .. } => {
            objective.model.vocab_size = vocab;
            objective.mask_id = tokenizer
                .mask_id()
                .context("the vocabulary has no <mask> token")?;
        }
    }
    Ok(spec)
}

/// The task of a `--config` file, before the vocabulary exists.
pub(crate) fn task_of(path: &Path) -> Result<Task> {
    read_task(path)?
        .with_context(|| format!("{}: no \"task\" (translation, lm or mlm)", path.display()))
}

/// The `task` of a `train-config.json`, if it names one.
pub(crate) fn read_task(path: &Path) -> Result<Option<Task>> {
    #[derive(Deserialize)]
    struct Tagged {
        task: Option<Task>,
    }
    let text = fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let tagged: Tagged = serde_json::from_str(&text).with_context(|| path.display().to_string())?;
    Ok(tagged.task)
}

#[cfg(test)]
mod tests {
    use super::{Preset, Task};

    /// `--dropout`'s default: the preset model's, except none for the `cpu` translation run.
    #[test]
    fn dropout_defaults_to_the_presets() {
        assert_eq!(Preset::Cpu.dropout(Task::Translation), 0.0);
        assert_eq!(Preset::Cpu.dropout(Task::Lm), 0.1);
        assert_eq!(Preset::Tiny.dropout(Task::Translation), 0.1);
        assert_eq!(Preset::Small.dropout(Task::Translation), 0.1);
        assert_eq!(Preset::Base.dropout(Task::Mlm), 0.1);
        assert_eq!(Preset::Big.dropout(Task::Translation), 0.3);
    }

    /// `--warmup` and `--lr-factor`'s defaults: the measured recipe for the `cpu` translation
    /// run only.
    #[test]
    fn schedule_defaults_to_the_presets() {
        assert_eq!(Preset::Cpu.schedule(Task::Translation), (800, 1.0));
        assert_eq!(Preset::Cpu.schedule(Task::Lm), (300, 0.3));
        assert_eq!(Preset::Cpu.schedule(Task::Mlm), (300, 0.3));
        assert_eq!(Preset::Tiny.schedule(Task::Translation), (300, 0.3));
        assert_eq!(Preset::Small.schedule(Task::Translation), (300, 0.3));
    }

    /// `--vocab-size`'s default: 8,000 for the `cpu` translation run only.
    #[test]
    fn vocabulary_defaults_to_the_presets() {
        assert_eq!(Preset::Cpu.vocab_size(Task::Translation), 8000);
        assert_eq!(Preset::Cpu.vocab_size(Task::Lm), 4000);
        assert_eq!(Preset::Cpu.vocab_size(Task::Mlm), 4000);
        assert_eq!(Preset::Small.vocab_size(Task::Translation), 4000);
    }
}
