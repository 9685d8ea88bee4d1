//! `xfmr train`: arguments → the task's objective and [`TrainConfig`] → the library's run
//! ([`xfmr_train::run_replicas`]) with the progress bar and the metrics log as observers → what
//! the task shows at the end: test BLEU/chrF and attention maps (translation), continued text
//! (`lm`), filled-in masks (`mlm`). The training loop is the library's.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use xfmr::burn::module::AutodiffModule;
use xfmr::burn::tensor::backend::AutodiffBackend;
use xfmr::io::write_atomic;
use xfmr_train::data::{self, Pair};
use xfmr_train::objective::ModelOf;
use xfmr_train::trainer::{self, MetricKind};
use xfmr_train::translate::encode_pairs;
use xfmr_train::{
    DataParallelConfig, Event, MetricsFormat, MetricsLog, Objective, Observer, RunSummary,
    SubwordTokenizer, TrainConfig, TrainError,
};

use crate::observe::ProgressLines;
use crate::spec::{read_spec, Preset, RunSpec, Task};
use crate::{lm, plot, translation};

/// The embedded Spanish→English set (see `data/es-en/README.md`).
const EMBEDDED: [(&str, &str); 3] = [
    ("train.tsv", include_str!("../data/es-en/train.tsv")),
    ("valid.tsv", include_str!("../data/es-en/valid.tsv")),
    ("test.tsv", include_str!("../data/es-en/test.tsv")),
];

/// Options of `xfmr train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// What to train: the paper's translation model, or a GPT-like (`lm`) or BERT-like (`mlm`)
    /// model of the English side.
    #[arg(long, value_enum, default_value_t = Task::Translation)]
    pub task: Task,
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
    #[arg(long, value_enum, default_value_t = Preset::Cpu)]
    pub preset: Preset,
    /// A run's `train-config.json` (task, objective, training configuration) instead of
    /// --task, --preset, --dropout and the training flags (--steps, --minutes, --max-tokens,
    /// --accumulate, --warmup, --lr-factor, --decay, --seed, --checkpoint-every, --eval-every,
    /// --average); its vocabulary size is set from the tokenizer. The other flags still apply.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// BPE vocabulary size (shared by source and target). Default: 8,000 for the `cpu`
    /// preset's translation run (measured on its ten-minute run: test BLEU 30.5 beam against
    /// 27.7 with 2,000 and 29.5-30.2 with 4,000, docs/training.md), 4,000 otherwise (and with
    /// --config). A resumed run keeps its vocabulary.
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
    /// paper's 0.1 (0.3 for `big`), except 0 for `cpu` translation: its ten-minute run sees the
    /// data about six times, its validation loss is still falling at the end, and without
    /// dropout it reached test BLEU 24.3 against 20.8 beam (docs/training.md). Part of the
    /// model: a resumed run keeps its checkpoint's.
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
    /// Metrics file format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub metrics: Format,
    /// Data-parallel training.
    #[command(flatten)]
    pub parallel: crate::parallel::ParallelArgs,
    /// Whether the backend runs on the CPU (set from `--backend`, not a flag): the default
    /// number of replicas is then one per core.
    #[arg(skip)]
    pub cpu_backend: bool,
}

/// `--decay`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum DecayArg {
    /// The paper's: the inverse square root of the step.
    InverseSqrt,
    /// Linear to zero at the end of the budget ([`xfmr_train::Decay::Linear`]).
    Linear,
}

/// Metrics file format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line (`metrics.jsonl`).
    Jsonl,
    /// Comma-separated values with a header (`metrics.csv`).
    Csv,
}

/// Reads a split from `--data` or the embedded set.
fn split(data: Option<&Path>, name: &str) -> Result<Vec<Pair>> {
    Ok(match data {
        Some(dir) => data::read_tsv(&dir.join(name))?,
        None => {
            let text = EMBEDDED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| *t)
                .unwrap_or_default();
            data::parse_tsv(text.as_bytes(), &Path::new("<embedded es-en>").join(name))?
        }
    })
}

/// The run's vocabulary: the one saved in the run directory, else learnt on the training split
/// (both sides for translation, the target side for `lm` and `mlm`; `mlm` adds `<mask>`).
fn vocabulary(
    args: &TrainArgs,
    task: Task,
    out: &Path,
    train: &[Pair],
) -> Result<SubwordTokenizer> {
    let path = translation::tokenizer_path(out);
    // Under --config the preset flag is not the run's, so the default is the one of before.
    let vocab_size = match (args.vocab_size, &args.config) {
        (Some(size), _) => size,
        (None, Some(_)) => crate::spec::VOCAB_SIZE,
        (None, None) => args.preset.vocab_size(task),
    };
    let tokenizer = if path.exists() {
        SubwordTokenizer::load(&path)?
    } else {
        eprintln!(
            "learning a {}-token BPE vocabulary on {} training pairs",
            vocab_size,
            train.len()
        );
        let tokenizer = match task {
            Task::Translation => SubwordTokenizer::train(
                train.iter().flat_map(|p| [p.src.as_str(), p.tgt.as_str()]),
                vocab_size,
            )?,
            Task::Lm | Task::Mlm => {
                SubwordTokenizer::train(train.iter().map(|p| p.tgt.as_str()), vocab_size)?
            }
        };
        let tokenizer = match task {
            Task::Mlm => tokenizer.with_mask(),
            _ => tokenizer,
        };
        if args.parallel.rank == 0 {
            tokenizer.save(&path)?;
        }
        tokenizer
    };
    Ok(tokenizer)
}

/// Parses a finite number (clap's `f64` parser also takes `nan` and `inf`).
pub(crate) fn finite(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        Ok(x) => Err(format!("{x}: must be finite")),
        Err(e) => Err(e.to_string()),
    }
}

/// `xfmr train`.
pub fn train<B: AutodiffBackend>(args: &TrainArgs) -> Result<()> {
    let started = Instant::now();
    let task = args.task()?;
    let out = args.out()?;
    let data_dir = args.data.as_deref();
    let (train_pairs, valid_pairs, test_pairs) = (
        split(data_dir, "train.tsv")?,
        split(data_dir, "valid.tsv")?,
        split(data_dir, "test.tsv")?,
    );
    // In a data-parallel run only rank 0 writes into the run directory.
    let leader = args.parallel.rank == 0;
    if leader {
        fs::create_dir_all(&out).with_context(|| out.display().to_string())?;
    }
    let tokenizer = vocabulary(args, task, &out, &train_pairs)?;
    let spec = match &args.config {
        Some(path) => read_spec(path, &tokenizer)?,
        None => args.spec(&tokenizer)?,
    };
    if leader && trainer::latest_checkpoint(&out)?.is_none() {
        write_atomic(
            &out.join("train-config.json"),
            &serde_json::to_vec_pretty(&spec)?,
        )?;
    }
    let test: Vec<Pair> = test_pairs
        .into_iter()
        .take(args.test_sentences.unwrap_or(usize::MAX))
        .collect();
    let sentences = |pairs: &[Pair]| -> Result<Vec<Vec<u32>>> {
        let ids = encode_pairs(&tokenizer, pairs)?;
        Ok(ids.into_iter().map(|e| e.tgt).collect())
    };
    let short = |e: &Vec<u32>| e.len() <= args.max_len;
    match spec {
        RunSpec::Translation { objective, train } => {
            let examples = encode_pairs(&tokenizer, &train_pairs)?
                .into_iter()
                .filter(|e| short(&e.src) && short(&e.tgt))
                .collect();
            let valid = encode_pairs(&tokenizer, &valid_pairs)?;
            if run::<B, _>(args, task, objective, train, examples, &valid, &tokenizer)?.is_some() {
                translation::show_run::<B::InnerBackend>(
                    &out,
                    &tokenizer,
                    &valid_pairs,
                    &test,
                    args.beam,
                    args.length_penalty,
                )?;
            }
        }
        RunSpec::Lm { objective, train } => {
            let examples = sentences(&train_pairs)?.into_iter().filter(short).collect();
            let valid: Vec<_> = sentences(&valid_pairs)?.into_iter().filter(short).collect();
            if run::<B, _>(args, task, objective, train, examples, &valid, &tokenizer)?.is_some() {
                lm::show_lm_run::<B::InnerBackend>(&out, &tokenizer, &test)?;
            }
        }
        RunSpec::Mlm { objective, train } => {
            let examples = sentences(&train_pairs)?.into_iter().filter(short).collect();
            let valid: Vec<_> = sentences(&valid_pairs)?.into_iter().filter(short).collect();
            if run::<B, _>(args, task, objective, train, examples, &valid, &tokenizer)?.is_some() {
                lm::show_mlm_run::<B::InnerBackend>(&out, &tokenizer, &test)?;
            }
        }
    }
    eprintln!("done in {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    Ok(())
}

/// What the first replica of a process observes: the progress bar, and on rank 0 the metrics
/// log.
struct Leader {
    lines: ProgressLines,
    metrics: Option<MetricsLog>,
}

impl Observer for Leader {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        self.lines.event(event)?;
        match &mut self.metrics {
            Some(metrics) => metrics.event(event),
            None => Ok(()),
        }
    }
}

/// Trains this process's replicas of the run in `out` through the library, then (rank 0) draws
/// the loss curve. Returns the summary on rank 0, `None` on the other ranks.
fn run<B: AutodiffBackend, O: Objective>(
    args: &TrainArgs,
    task: Task,
    objective: O,
    config: TrainConfig,
    examples: Vec<O::Example>,
    valid: &[O::Example],
    tokenizer: &SubwordTokenizer,
) -> Result<Option<RunSummary>>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    let out = &args.out()?;
    let parallel = &args.parallel;
    let replicas = parallel.replicas(args.cpu_backend);
    let local = xfmr_train::local_devices::<B>(replicas)?;
    if local.shared {
        eprintln!(
            "{replicas} replicas share {:?}, each on its own thread{}",
            local.devices[0],
            if args.cpu_backend {
                ""
            } else {
                " (the backend has fewer devices: correct, but no faster than one)"
            }
        );
    } else if local.devices.len() > 1 {
        eprintln!("{} replicas on {:?}", local.devices.len(), local.devices);
    }
    let trainers =
        xfmr_train::open_replicas::<B, O>(out, &objective, &config, &examples, &local.devices)?;
    let first = &trainers[0];
    let start = first.progress().step;
    if start > 0 {
        let dir = trainer::latest_checkpoint(out)?.unwrap_or_default();
        eprintln!(
            "resuming {} from step {start} ({})",
            out.display(),
            dir.display()
        );
    }
    eprintln!(
        "{} training examples ({} micro-batches per epoch), {} validation, vocabulary {}, \
         {} parameters, steps {start}→{}{}",
        first.num_examples(),
        first.batches_per_epoch(),
        valid.len(),
        tokenizer.vocab_size(),
        xfmr::burn::module::Module::num_params(first.model()),
        match first.config().steps {
            usize::MAX => "∞".to_string(),
            steps => steps.to_string(),
        },
        first
            .config()
            .minutes
            .map(|m| format!(", at most {m} minutes"))
            .unwrap_or_default(),
    );
    let data_parallel: Option<DataParallelConfig> = parallel.config(replicas)?;
    let leader = parallel.rank == 0;
    let agreements = parallel.nodes > 1 || parallel.devices.is_some();
    let format = match args.metrics {
        Format::Jsonl => MetricsFormat::Jsonl,
        Format::Csv => MetricsFormat::Csv,
    };
    let mut first_observer = Leader {
        lines: ProgressLines::new(true, agreements),
        metrics: leader.then(|| MetricsLog::new(out, format)),
    };
    let mut others: Vec<ProgressLines> = (1..trainers.len())
        .map(|_| ProgressLines::new(false, agreements))
        .collect();
    let mut observers = vec![&mut first_observer as &mut (dyn Observer + Send)];
    observers.extend(others.iter_mut().map(|o| o as &mut (dyn Observer + Send)));
    let fingerprint = tokenizer.fingerprint();
    let summary = xfmr_train::run_replicas(
        trainers,
        data_parallel.as_ref(),
        &[(fingerprint, "the BPE vocabulary")],
        out,
        valid,
        observers,
        &crate::parallel::fail_fast,
    )?;
    if !leader {
        eprintln!(
            "rank {}: {} steps done; rank 0 writes the run to {}",
            parallel.rank,
            summary.step,
            out.display()
        );
        return Ok(None);
    }
    if summary.stop == trainer::Stop::Minutes {
        eprintln!(
            "the {}-minute budget ran out at step {}",
            config.minutes.unwrap_or_default(),
            summary.step
        );
    }
    let records = first_observer
        .metrics
        .as_ref()
        .map(MetricsLog::records)
        .transpose()?
        .unwrap_or_default();
    let curve = |kind| {
        records
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| (r.step as f64, r.loss))
            .collect::<Vec<_>>()
    };
    let path = out.join("loss-curve.png");
    plot::loss_curve(
        &path,
        &format!("xfmr train --task {}: loss per step", task.name()),
        &curve(MetricKind::Train),
        &curve(MetricKind::Valid),
    )?;
    eprintln!("loss curve: {}", path.display());
    if summary.final_model.is_none() {
        bail!(
            "{}: no checkpoint to build the final model from",
            out.display()
        );
    }
    Ok(Some(summary))
}
