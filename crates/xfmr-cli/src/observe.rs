//! What `xfmr train` shows while the library trains: the progress bar and the lines it prints
//! (validation, the replicas' agreement), as an [`Observer`].

use indicatif::{ProgressBar, ProgressStyle};
use xfmr_train::trainer::TokenRate;
use xfmr_train::{Event, Observer, TrainError};

/// The progress bar of a replica (hidden for all but the process's first), and the lines
/// printed above it.
pub(crate) struct ProgressLines {
    bar: ProgressBar,
    rate: TokenRate,
    agreements: bool,
}

impl ProgressLines {
    /// A bar on the terminal (`visible`), or none that prints only the lines; the replicas'
    /// parameter fingerprints are printed when `agreements` (data parallelism asked for, rather
    /// than the CPU's default replicas).
    pub(crate) fn new(visible: bool, agreements: bool) -> Self {
        let bar = if visible {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}  ETA {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        Self {
            bar,
            rate: TokenRate::new(),
            agreements,
        }
    }

    /// Prints a line above the bar (`bar.println` prints nothing on a hidden bar).
    fn line(&self, text: String) {
        self.bar.suspend(|| eprintln!("{text}"));
    }
}

impl Observer for ProgressLines {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        match *event {
            Event::Started {
                progress,
                target_steps,
                ..
            } => {
                if target_steps == usize::MAX {
                    // No step limit (a time budget): a count, not a bar.
                    self.bar.set_style(
                        ProgressStyle::with_template("{elapsed_precise} {pos} steps  {msg}")
                            .expect("a valid template"),
                    );
                } else {
                    self.bar.set_length(target_steps as u64);
                }
                self.bar.set_position(progress.step as u64);
                self.rate = TokenRate::new();
            }
            Event::Step { report, .. } => {
                let rate = self.rate.add(report.input_tokens + report.target_tokens);
                self.bar.set_message(format!(
                    "loss {:.3}  {rate:.0} tok/s  lr {:.2e}  epoch {}",
                    report.loss, report.lr, report.epoch
                ));
                self.bar.set_position(report.step as u64);
            }
            Event::Agreement {
                step,
                rank,
                device,
                fingerprint,
                ..
            } if self.agreements => self.line(format!(
                "rank {rank} device {device}: parameters at step {step}: fingerprint \
                 {fingerprint:016x}"
            )),
            Event::Validation { step, loss, .. } => self.line(format!(
                "step {step}: validation loss {:.3}, perplexity {:.1}, token accuracy {:.1}%",
                loss.loss,
                loss.perplexity(),
                100.0 * loss.accuracy()
            )),
            Event::Checkpoint { .. } | Event::Agreement { .. } => {}
            Event::Finished(summary) => {
                self.bar.finish();
                if let Some(dir) = &summary.final_model {
                    eprintln!(
                        "final model: the average of {} checkpoint(s) → {}",
                        summary.averaged,
                        dir.display()
                    );
                }
            }
        }
        Ok(())
    }
}
