//! The whole run ([`Trainer::run`]): the budget, the validation and checkpoint cadence, the
//! replicas' agreement checks, the average of the last checkpoints as the final model, each
//! reported to an [`Observer`] as a typed [`Event`].

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use super::{
    average_checkpoints, evaluate_loss, parameter_fingerprint, save_model, EvalLoss, Progress,
    StepReport, TrainError, Trainer,
};
use crate::distributed::DataParallel;
use crate::objective::{ModelOf, Objective};
use crate::run_dir::RunDir;

/// What a run tells its observer, in order: `Started`, then per step `Step`, and when due
/// `Validation`, `Agreement` (data-parallel replicas, at each checkpoint) and `Checkpoint`, and
/// at the end `Finished`.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// The run starts (fresh, or resumed at `progress`).
    Started {
        /// Where the run stands.
        progress: Progress,
        /// The step the run trains to (`TrainConfig::steps`).
        target_steps: usize,
        /// Training examples.
        examples: usize,
        /// Micro-batches per epoch.
        batches_per_epoch: usize,
        /// Whether this replica writes the run (validation, checkpoints, the final model).
        leader: bool,
    },
    /// One optimiser step was taken.
    Step {
        /// What it did.
        report: &'a StepReport,
        /// Time since the run started.
        elapsed: Duration,
    },
    /// The replicas of a data-parallel run were found to hold the same parameters (checked at
    /// every checkpoint; every replica reports it).
    Agreement {
        /// The step.
        step: usize,
        /// This replica's index in the run.
        replica: u32,
        /// This replica's process (rank).
        rank: u32,
        /// This replica's device in its process.
        device: u32,
        /// The parameters' fingerprint ([`parameter_fingerprint`]).
        fingerprint: u64,
    },
    /// The validation loss (leader only).
    Validation {
        /// The step.
        step: usize,
        /// The epoch.
        epoch: u64,
        /// The loss.
        loss: &'a EvalLoss,
        /// Time since the run started.
        elapsed: Duration,
    },
    /// A checkpoint was written (leader only).
    Checkpoint {
        /// The step.
        step: usize,
        /// Its directory.
        dir: &'a Path,
    },
    /// The run is over.
    Finished(&'a RunSummary),
}

/// Receives a run's events: a progress bar, a metrics file, a line per validation. An error
/// stops the run (nothing is left half-written: checkpoints are atomic).
pub trait Observer {
    /// Called once per event, in the order of [`Event`].
    ///
    /// # Errors
    /// Whatever the observer could not do (writing a file); the run stops with it.
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError>;
}

/// An observer that ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {
    fn event(&mut self, _: &Event<'_>) -> Result<(), TrainError> {
        Ok(())
    }
}

impl<F: FnMut(&Event<'_>) -> Result<(), TrainError>> Observer for F {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        self(event)
    }
}

/// Two observers, each told every event (the first first): nest them for more.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tee<A, B>(pub A, pub B);

impl<A: Observer, B: Observer> Observer for Tee<A, B> {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        self.0.event(event)?;
        self.1.event(event)
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It reached `TrainConfig::steps`.
    Steps,
    /// Its wall-clock budget (`TrainConfig::minutes`) ran out first.
    Minutes,
}

/// How a run went.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// The step the run started from (0, or a checkpoint's).
    pub start_step: usize,
    /// The step it ended at.
    pub step: usize,
    /// Why it stopped.
    pub stop: Stop,
    /// The last validation loss computed (leader only; none without validation examples).
    pub validation: Option<EvalLoss>,
    /// The final model's directory, the average of the last checkpoints (leader only).
    pub final_model: Option<PathBuf>,
    /// Checkpoints averaged into it.
    pub averaged: usize,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl<B: AutodiffBackend, O: Objective> Trainer<B, O>
where
    ModelOf<O, B>: AutodiffModule<B, InnerModule = ModelOf<O, B::InnerBackend>>,
{
    /// Trains data-parallel as one replica of `run` (see [`crate::distributed`]): every step
    /// then reads this replica's share of each micro-batch and sums the gradients over the
    /// replicas. All replicas must start from the same state (the same configuration and seed,
    /// or the same checkpoint): the step to start from is checked here against the others,
    /// the objective, configuration and batches when [`Trainer::run`] starts, the parameters at
    /// every checkpoint.
    ///
    /// # Errors
    /// [`TrainError::Peer`] when the replicas start from different steps or do not answer.
    pub fn with_data_parallel(
        mut self,
        run: DataParallel<B::InnerBackend>,
    ) -> Result<Self, TrainError> {
        run.agree(self.progress.step as u64, "the step to start from")?;
        self.data_parallel = Some(run);
        Ok(self)
    }

    /// The data-parallel run this trainer is a replica of, if any.
    pub fn data_parallel(&self) -> Option<&DataParallel<B::InnerBackend>> {
        self.data_parallel.as_ref()
    }

    /// Whether this trainer writes the run (checkpoints, the final model): alone, or replica 0
    /// of a data-parallel run.
    pub fn is_leader(&self) -> bool {
        self.data_parallel
            .as_ref()
            .is_none_or(DataParallel::is_leader)
    }

    /// Leaves the data-parallel run, if any ([`Trainer::run`] does it when it ends).
    ///
    /// # Errors
    /// [`TrainError::Peer`] when the other replicas do not answer.
    pub fn finish(&mut self) -> Result<(), TrainError> {
        match self.data_parallel.take() {
            Some(run) => run.finish(),
            None => Ok(()),
        }
    }

    /// Runs the training to its budget (`config.steps`, and `config.minutes` when set) in run
    /// directory `run_dir`: validation on `valid` every `eval_every` steps, a checkpoint every
    /// `checkpoint_every` (both also after the last step), in a data-parallel run the replicas'
    /// objective, configuration and batches compared first and their parameters at every
    /// checkpoint, then the average of the last `average`
    /// checkpoints saved as the final model in `<run_dir>/model`, and the data-parallel run
    /// left. Only the leader ([`Trainer::is_leader`]) validates and writes. Every event goes to
    /// `observer`.
    ///
    /// # Errors
    /// A failed step, checkpoint or observer; [`TrainError::Peer`] when replicas disagree or do
    /// not answer. Checkpoints already written stay: run again to resume.
    pub fn run(
        &mut self,
        run_dir: &Path,
        valid: &[O::Example],
        observer: &mut dyn Observer,
    ) -> Result<RunSummary, TrainError> {
        let started = Instant::now();
        let leader = self.is_leader();
        if leader {
            fs::create_dir_all(run_dir).map_err(|e| TrainError::io(run_dir, e))?;
        }
        let start_step = self.progress.step;
        if let Some(run) = &self.data_parallel {
            // The budget and cadence decide which collective calls a replica makes (the time
            // budget's, the checkpoints' agreement), and the objective and the batches what
            // their gradients mean: replicas that differ in any of them would pair unrelated
            // calls or sum unrelated gradients.
            run.agree(
                self.recipe_fingerprint(),
                "the objective, configuration and batches",
            )?;
        }
        observer.event(&Event::Started {
            progress: self.progress,
            target_steps: self.config.steps,
            examples: self.examples.len(),
            batches_per_epoch: self.batches.len(),
            leader,
        })?;
        // A budget too large for a `Duration` or an `Instant` is no budget.
        let deadline = self.config.minutes.and_then(|m| {
            Duration::try_from_secs_f64(m * 60.0)
                .ok()
                .and_then(|d| started.checked_add(d))
        });
        let (mut stop, mut validation) = (Stop::Steps, None);
        let (mut evaluated, mut saved) = (false, false);
        while self.progress.step < self.config.steps {
            if let Some(deadline) = deadline {
                if self.out_of_time(leader && Instant::now() >= deadline)? {
                    stop = Stop::Minutes;
                    break;
                }
            }
            if let Some(minutes) = self.config.minutes {
                self.set_time_spent(started.elapsed().as_secs_f64() / (minutes * 60.0));
            }
            let report = self.step()?;
            observer.event(&Event::Step {
                report: &report,
                elapsed: started.elapsed(),
            })?;
            evaluated = report.step % self.config.eval_every == 0;
            if evaluated {
                validation = self
                    .validate(valid, (report.step, report.epoch), started, observer)?
                    .or(validation);
            }
            saved = report.step % self.config.checkpoint_every == 0;
            if saved {
                self.checkpoint(run_dir, observer)?;
            }
        }
        if self.progress.step > start_step {
            let step = self.progress.step;
            if !evaluated {
                let at = (step, self.progress.epoch);
                validation = self.validate(valid, at, started, observer)?.or(validation);
            }
            if !saved {
                self.checkpoint(run_dir, observer)?;
            }
        }
        let (mut final_model, mut averaged) = (None, 0);
        if leader {
            let dirs: Vec<PathBuf> = RunDir::new(run_dir)
                .checkpoints()?
                .into_iter()
                .rev()
                .take(self.config.average)
                .map(|(_, d)| d)
                .collect();
            if !dirs.is_empty() {
                let (config, model) =
                    average_checkpoints::<B::InnerBackend, O::Config>(&dirs, &self.device)?;
                let dir = RunDir::new(run_dir).model_dir();
                save_model::<B::InnerBackend, O::Config>(&model, &config, &dir)?;
                (final_model, averaged) = (Some(dir), dirs.len());
            }
        }
        self.finish()?;
        let summary = RunSummary {
            start_step,
            step: self.progress.step,
            stop,
            validation,
            final_model,
            averaged,
            elapsed: started.elapsed(),
        };
        observer.event(&Event::Finished(&summary))?;
        Ok(summary)
    }

    /// FNV-1a of the objective and the configuration (as JSON) and of the batches' example
    /// indices.
    fn recipe_fingerprint(&self) -> u64 {
        let mut bytes = serde_json::to_vec(&(&self.objective, &self.config))
            .expect("an objective and a configuration serialise");
        for batch in &self.batches {
            bytes.extend(batch.iter().flat_map(|&i| (i as u64).to_le_bytes()));
            bytes.push(0xFF);
        }
        xfmr_io::fnv1a(&bytes)
    }

    /// Whether the time budget is spent: the leader's clock decides, and in a data-parallel run
    /// every replica learns its decision (so that all stop at the same step).
    fn out_of_time(&self, leader_says: bool) -> Result<bool, TrainError> {
        match &self.data_parallel {
            Some(run) => {
                let what = format!("the time budget before step {}", self.progress.step + 1);
                Ok(run.sum(&[f64::from(u8::from(leader_says))], &what)?[0] > 0.0)
            }
            None => Ok(leader_says),
        }
    }

    /// The leader's validation loss at `(step, epoch)`, reported to `observer`.
    fn validate(
        &self,
        valid: &[O::Example],
        (step, epoch): (usize, u64),
        started: Instant,
        observer: &mut dyn Observer,
    ) -> Result<Option<EvalLoss>, TrainError> {
        if !self.is_leader() || valid.is_empty() {
            return Ok(None);
        }
        let loss = evaluate_loss(
            &self.objective,
            &self.inference_model(),
            &self.config,
            valid,
        )?;
        observer.event(&Event::Validation {
            step,
            epoch,
            loss: &loss,
            elapsed: started.elapsed(),
        })?;
        Ok(Some(loss))
    }

    /// The replicas' agreement check and, on the leader, a checkpoint.
    fn checkpoint(&self, run_dir: &Path, observer: &mut dyn Observer) -> Result<(), TrainError> {
        let step = self.progress.step;
        if let Some(run) = &self.data_parallel {
            let fingerprint = parameter_fingerprint(self.model());
            run.agree(fingerprint, &format!("the parameters at step {step}"))?;
            observer.event(&Event::Agreement {
                step,
                replica: run.replica(),
                rank: run.rank(),
                device: run.device_index(),
                fingerprint,
            })?;
        }
        if self.is_leader() {
            let dir = self.save_checkpoint(run_dir)?;
            observer.event(&Event::Checkpoint { step, dir: &dir })?;
        }
        Ok(())
    }
}
