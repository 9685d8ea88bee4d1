//! `xfmr train`'s options, and what they make: the task, the run directory, the training
//! configuration and the run's specification (the library's presets, [`Preset::spec`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use xfmr::attention::MatmulPrecision;
use xfmr::models::ladder::LengthLadder;
use xfmr_train::spec::DEFAULT_VOCAB_SIZE;
use xfmr_train::{Preset, RunSpec, Task, TrainConfig};
use xfmr_translate::SubwordTokenizer;

use crate::backend::BackendArg;
use crate::runs::finite;

/// Options of `xfmr train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArg,
    /// What to train: the paper's translation model, or a GPT-like (`lm`) or BERT-like (`mlm`)
    /// model of the English side.
    #[arg(long, value_enum, default_value_t = TaskArg::Translation)]
    pub task: TaskArg,
    /// Directory holding `train.tsv`, `valid.tsv` and `test.tsv` (source TAB target; `lm` and
    /// `mlm` read the target side); default: the embedded Spanish→English set.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Run directory (tokenizer, checkpoints, metrics, pictures); default `runs/es-en`,
    /// `runs/en-lm` or `runs/en-mlm` by task. A run already there is resumed from its last
    /// checkpoint.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Model size.
    #[arg(long, value_enum, default_value_t = PresetArg::Cpu)]
    pub preset: PresetArg,
    /// A run's `train-config.json` (task, objective, training configuration) instead of
    /// --task, --preset, --dropout and the training flags (--steps, --minutes, --max-tokens,
    /// --accumulate, --warmup, --lr-factor, --decay, --seed, --checkpoint-every, --eval-every,
    /// --average, --precision); its vocabulary size is set from the tokenizer. The other flags
    /// still apply.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// BPE vocabulary size (shared by source and target). Default: 8,000 for the `cpu`
    /// preset's translation run, 4,000 otherwise (and with --config), as measured in
    /// docs/training.md. A resumed run keeps its vocabulary.
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Optimizer steps, counted from the start of the run (on resume: the new total); default:
    /// no limit, the --minutes budget decides.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Wall-clock budget of this invocation's training in minutes (0: none, --steps decides);
    /// the run stops at the budget or at --steps, whichever comes first. Run the command again
    /// to train on from the last checkpoint.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Padded tokens per micro-batch.
    #[arg(long, default_value_t = 2000)]
    pub max_tokens: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Warm-up steps (paper: 4000 over 100k steps). Default: 800 for the `cpu` preset's
    /// translation run, which with --lr-factor 1 peaks at 3.1e-3 for d_model 128 and is still
    /// 1.5e-3 at the end of its ten minutes (measured 28.9 test BLEU, beam, against 23.4-24.0
    /// with warm-up 300 at factor 0.3, a 1.5e-3 peak; docs/training.md); 300 otherwise (the
    /// other runs were not measured again).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Multiplier of the warm-up / inverse-square-root schedule, `factor · d_model^-0.5 ·
    /// min(step^-0.5, step · warmup^-1.5)` (paper: 1). Default: 1 for the `cpu` preset's
    /// translation run (with warm-up 800), 0.3 otherwise. Factor 1 with a warm-up of only 150
    /// peaks at 7.2e-3, where the `cpu` preset diverged (docs/training.md).
    #[arg(long)]
    pub lr_factor: Option<f64>,
    /// The learning rate after warm-up: `inverse-sqrt`, the paper's (no end); `linear` falls to
    /// zero at the end of the budget (--minutes, or --steps: the budget sets the schedule's
    /// length), measured worse for the default ten-minute run (docs/training.md). Part of the
    /// recipe: a resumed run keeps its checkpoint's.
    #[arg(long, value_enum, default_value_t = DecayArg::InverseSqrt)]
    pub decay: DecayArg,
    /// Dropout on the residual, feed-forward and embedding outputs. Default: the preset's, the
    /// paper's 0.1 (0.3 for `big`), except 0 for `cpu` translation, whose ten-minute run
    /// under-fits (docs/training.md). Part of the model: a resumed run keeps its checkpoint's.
    #[arg(long)]
    pub dropout: Option<f64>,
    /// Seed of initialisation, batch order, dropout and masking.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: usize,
    /// Steps between validation losses.
    #[arg(long, default_value_t = 100)]
    pub eval_every: usize,
    /// Checkpoints averaged into the final model (paper: 5); as many are kept on disk.
    #[arg(long, default_value_t = 5)]
    pub average: usize,
    /// Examples longer than this many subword tokens (either side) are left out of training.
    #[arg(long, default_value_t = 100)]
    pub max_len: usize,
    /// Test sentences used at the end (translation: translated and scored; lm: prompts; mlm:
    /// masked and filled in), the first N of the test split; 0 skips them (and, for
    /// translation, the length penalty's choice). Default: the whole split (lm and mlm show
    /// five).
    #[arg(long)]
    pub test_sentences: Option<usize>,
    /// Beam size of the test evaluation's beam search (paper: 4).
    #[arg(long, default_value_t = 4)]
    pub beam: usize,
    /// Beam search's length penalty α (GNMT: log-probability / ((5 + length) / 6)^α) for the
    /// test evaluation, recorded in the run (`decoding.json`) for `xfmr translate`, `eval` and
    /// `serve`. Default: chosen on the validation split among 0.6 (the paper's), 1.0, 1.5 and
    /// 2.0 by BLEU, as the paper chose its 0.6 on its development set (~25-40 s on two
    /// cores): the ten-minute run's beam search ends too early at 0.6, and the chosen α gave
    /// 0.3-1.2 more test BLEU in each of nine runs (docs/training.md).
    #[arg(long, value_parser = finite)]
    pub length_penalty: Option<f64>,
    /// Pad batches to a ladder of sequence lengths (16, 24, 32, 48, 64, 96, 128, … tokens),
    /// each with one row count (`max-tokens / length`), so that training, validation and the
    /// test evaluation's source batches meet a few shapes: the GPU backends compile and
    /// autotune kernels for every new shape (xfmr::models::ladder). `auto`: on for wgpu and cuda,
    /// off for the CPU backends (nothing to compile there; the padding would cost time). Part
    /// of the recipe: a resumed run keeps its checkpoint's batches; the evaluation follows the
    /// flag.
    #[arg(long, value_enum, default_value_t = LadderArg::Auto)]
    pub length_ladder: LadderArg,
    /// What the training step's matrix products may compute in: `f32`, or `bf16` (every
    /// projection's factors rounded to bf16 and summed in f32, forward and backward; the
    /// parameters, gradients and Adam's moments stay f32): faster on the flex backend of a CPU
    /// with AMX or AVX-512 BF16, f32 products elsewhere. Validation and the test evaluation run
    /// in f32. Part of the recipe: a resumed run keeps its checkpoint's.
    #[arg(long, default_value = "f32")]
    pub precision: MatmulPrecision,
    /// Metrics file format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub metrics: Format,
    /// Data-parallel training.
    #[command(flatten)]
    pub parallel: crate::parallel::ParallelArgs,
}

/// `--decay`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DecayArg {
    /// The paper's: the inverse square root of the step.
    InverseSqrt,
    /// Linear to zero at the end of the budget ([`xfmr_train::Decay::Linear`]).
    Linear,
}

/// `--length-ladder`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LadderArg {
    /// On for the GPU backends (wgpu, cuda), off for the CPU ones.
    Auto,
    /// Batches padded to the ladder ([`LengthLadder::default`]).
    On,
    /// Each batch padded to its longest sequence.
    Off,
}

impl LadderArg {
    /// The ladder on a backend (`cpu`: ndarray, flex), if any.
    pub fn ladder(self, cpu: bool) -> Option<LengthLadder> {
        match (self, cpu) {
            (Self::On, _) | (Self::Auto, false) => Some(LengthLadder::default()),
            (Self::Off, _) | (Self::Auto, true) => None,
        }
    }
}

/// Metrics file format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line (`metrics.jsonl`).
    Jsonl,
    /// Comma-separated values with a header (`metrics.csv`).
    Csv,
}

/// `--task`: the library's [`Task`] as a command-line choice.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum TaskArg {
    /// Spanish → English with the encoder-decoder Transformer (the paper's job).
    Translation,
    /// A GPT-like causal language model on the English side.
    Lm,
    /// A BERT-like masked language model on the English side.
    Mlm,
}

impl From<TaskArg> for Task {
    fn from(task: TaskArg) -> Self {
        match task {
            TaskArg::Translation => Task::Translation,
            TaskArg::Lm => Task::Lm,
            TaskArg::Mlm => Task::Mlm,
        }
    }
}

/// `--preset`: the library's [`Preset`] as a command-line choice.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum PresetArg {
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

impl From<PresetArg> for Preset {
    fn from(preset: PresetArg) -> Self {
        match preset {
            PresetArg::Tiny => Preset::Tiny,
            PresetArg::Cpu => Preset::Cpu,
            PresetArg::Small => Preset::Small,
            PresetArg::Base => Preset::Base,
            PresetArg::Big => Preset::Big,
        }
    }
}

impl Args {
    /// The task: `--config`'s when given, else `--task`.
    pub fn task(&self) -> Result<Task> {
        match &self.config {
            Some(path) => RunSpec::read_task(path)?.with_context(|| {
                format!("{}: no \"task\" (translation, lm or mlm)", path.display())
            }),
            None => Ok(self.task.into()),
        }
    }

    /// The run directory: `--out`, else the task's default.
    pub fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            PathBuf::from(match self.task() {
                Ok(Task::Lm) => "runs/en-lm",
                Ok(Task::Mlm) => "runs/en-mlm",
                _ => "runs/es-en",
            })
        })
    }

    /// The vocabulary size of a new run: `--vocab-size`, else the preset's for the task; under
    /// `--config`, whose run names no preset, the library's default.
    pub fn vocab_size(&self, task: Task) -> usize {
        match (self.vocab_size, &self.config) {
            (Some(size), _) => size,
            (None, Some(_)) => DEFAULT_VOCAB_SIZE,
            (None, None) => Preset::from(self.preset).vocab_size(task),
        }
    }

    /// The training configuration of the flags, on the preset's schedule for `--task`, on a
    /// CPU backend or not (`cpu`, which decides `--length-ladder auto`).
    fn train_config(&self, cpu: bool) -> Result<TrainConfig> {
        if self.steps.is_none() && self.minutes == 0.0 {
            bail!("--minutes 0 without --steps: the run would have no end");
        }
        let defaults = Preset::from(self.preset).train_config(self.task.into());
        Ok(defaults
            .clone()
            .with_steps(self.steps.unwrap_or(usize::MAX))
            .with_minutes((self.minutes != 0.0).then_some(self.minutes))
            .with_max_tokens(self.max_tokens)
            .with_ladder(self.length_ladder.ladder(cpu))
            .with_accumulate(self.accumulate)
            .with_warmup(self.warmup.unwrap_or(defaults.warmup))
            .with_lr_factor(self.lr_factor.unwrap_or(defaults.lr_factor))
            .with_decay(match self.decay {
                DecayArg::InverseSqrt => None,
                DecayArg::Linear => Some(xfmr_train::Decay::Linear),
            })
            .with_seed(self.seed)
            .with_eval_every(self.eval_every)
            .with_checkpoint_every(self.checkpoint_every)
            .with_keep_checkpoints(self.average.max(1))
            .with_average(self.average.max(1))
            .with_matmul_precision(Some(self.precision)))
    }

    /// The run's specification over `tokenizer`'s vocabulary: `--config`'s, else the task's
    /// objective on the preset's model with the flags' training configuration (`cpu`: on a
    /// CPU backend).
    pub fn spec(&self, tokenizer: &SubwordTokenizer, cpu: bool) -> Result<RunSpec> {
        Ok(match &self.config {
            Some(path) => RunSpec::read(path)?.with_vocabulary(tokenizer)?,
            None => Preset::from(self.preset).spec(
                self.task.into(),
                tokenizer,
                self.dropout,
                self.max_len,
                self.train_config(cpu)?,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{PresetArg, TaskArg};
    use clap::ValueEnum;
    use xfmr_train::{Preset, Task};

    /// The command line's choices are the library's, under the same names.
    #[test]
    fn choices_are_the_librarys() {
        for arg in TaskArg::value_variants() {
            let name = arg.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(Task::from(*arg), name.parse::<Task>().unwrap());
        }
        for arg in PresetArg::value_variants() {
            let name = arg.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(Preset::from(*arg), name.parse::<Preset>().unwrap());
        }
    }
}
