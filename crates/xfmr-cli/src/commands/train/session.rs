//! One invocation's training through the library: this process's replicas
//! ([`xfmr_train::open_replicas`], [`xfmr_train::run_replicas`]) with the progress bar and, on
//! rank 0, the metrics log as observers; then the loss curve.

use anyhow::{bail, Result};
use xfmr::burn::module::AutodiffModule;
use xfmr::burn::tensor::backend::AutodiffBackend;
use xfmr_train::kernel_cache::KernelCache;
use xfmr_train::objective::ModelOf;
use xfmr_train::trainer::{MetricKind, Stop};
use xfmr_train::{
    DataParallelConfig, Event, MetricsFormat, MetricsLog, Objective, Observer, RunDir, Task,
    TrainConfig, TrainError,
};
use xfmr_translate::SubwordTokenizer;

use super::args::{Args, Format};
use crate::observe::ProgressLines;
use crate::parallel::fail_fast;
use crate::plot;

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

/// What every task's training shares: the options, the run directory, the vocabulary.
pub(super) struct Session<'a> {
    pub args: &'a Args,
    pub task: Task,
    pub run: &'a RunDir,
    pub tokenizer: &'a SubwordTokenizer,
    /// Whether the backend runs on the CPU: one replica per core by default.
    pub cpu: bool,
}

impl Session<'_> {
    /// Trains this process's replicas of the run through the library, then (rank 0) draws the
    /// loss curve. Returns whether this process is rank 0 (which then holds the final model).
    pub fn train<B: AutodiffBackend, O: Objective>(
        &self,
        objective: O,
        config: TrainConfig,
        examples: Vec<O::Example>,
        valid: &[O::Example],
    ) -> Result<bool>
    where
        ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
    {
        let (args, run) = (self.args, self.run);
        let out = run.root();
        let parallel = &args.parallel;
        let replicas = parallel.replicas(self.cpu);
        let local = xfmr_train::local_devices::<B>(replicas)?;
        if local.shared {
            eprintln!(
                "{replicas} replicas share {:?}, each with {} of its own{}",
                local.devices[0],
                match xfmr_train::replica_threads(replicas as usize) {
                    1 => "a thread".to_string(),
                    n => format!("{n} threads"),
                },
                if self.cpu {
                    ""
                } else {
                    " (the backend has fewer devices: correct, but no faster than one)"
                }
            );
        } else if local.devices.len() > 1 {
            eprintln!("{} replicas on {:?}", local.devices.len(), local.devices);
        }
        if !self.cpu {
            match crate::backend::kernel_cache() {
                KernelCache::Set(dir) => eprintln!("kernel cache: {}", dir.display()),
                KernelCache::UserConfig(file) => {
                    eprintln!("kernel cache: as {} says", file.display())
                }
                KernelCache::AlreadySet => {}
            }
        }
        let trainers =
            xfmr_train::open_replicas::<B, O>(out, &objective, &config, &examples, &local.devices)?;
        let first = &trainers[0];
        let start = first.progress().step;
        // The products of the run's own recipe (a resumed run's checkpoint, or --config's).
        let precision = first.config().precision();
        if precision != args.precision {
            eprintln!(
                "training with {precision} products, as the run's configuration says (not \
                 --precision {})",
                args.precision
            );
        }
        crate::pretrained::precision_for::<B>(precision, "--precision");
        if start > 0 {
            let dir = run.latest_checkpoint()?.unwrap_or_default();
            eprintln!(
                "resuming {} from step {start} ({})",
                out.display(),
                dir.display()
            );
        }
        eprintln!(
            "{} training examples ({} micro-batches per epoch, {} shapes{}), {} validation, \
             vocabulary {}, {} parameters, steps {start}→{}{}",
            first.num_examples(),
            first.batches_per_epoch(),
            first.batch_shapes().len(),
            match first.config().ladder {
                Some(l) => format!(" on a length ladder from {}", l.min_len),
                None => String::new(),
            },
            valid.len(),
            self.tokenizer.vocab_size(),
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
        let fingerprint = self.tokenizer.fingerprint();
        let summary = xfmr_train::run_replicas(
            trainers,
            data_parallel.as_ref(),
            &[(fingerprint, "the BPE vocabulary")],
            out,
            valid,
            observers,
            &fail_fast,
        )?;
        if !leader {
            eprintln!(
                "rank {}: {} steps done; rank 0 writes the run to {}",
                parallel.rank,
                summary.step,
                out.display()
            );
            return Ok(false);
        }
        if summary.stop == Stop::Minutes {
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
        let path = run.loss_curve_path();
        plot::loss_curve(
            &path,
            &format!("xfmr train --task {}: loss per step", self.task),
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
        Ok(true)
    }
}
