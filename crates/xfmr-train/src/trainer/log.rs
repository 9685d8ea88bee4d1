//! The metrics log of a run: one [`MetricRecord`] per training step and per validation, as JSON
//! Lines (`metrics.jsonl`) or CSV (`metrics.csv`), written by the [`MetricsLog`] observer and
//! read back as the same records.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use xfmr_io::write_atomic;

use super::run::{Event, Observer};
use super::TrainError;

/// What a record measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricKind {
    /// One training step (dropout on, the step's batches).
    Train,
    /// The validation loss (dropout off, the validation set).
    Valid,
}

/// One line of the metrics log. A loss that is not finite (a diverged run) is written as
/// `null` (JSON) or `NaN` (CSV) and read back as NaN.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    /// Training step or validation.
    pub kind: MetricKind,
    /// The step (1-based).
    pub step: usize,
    /// The epoch.
    pub epoch: u64,
    /// Label-smoothed loss per predicted token.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Negative log-likelihood per predicted token.
    #[serde(deserialize_with = "nan_if_null")]
    pub nll: f64,
    /// Learning rate (training steps).
    pub lr: Option<f64>,
    /// Tokens read, input and predicted (training steps).
    pub tokens: Option<usize>,
    /// Tokens read per second over the last ~10 s (training steps).
    pub tokens_per_s: Option<f64>,
    /// `exp(nll)` (validation).
    pub perplexity: Option<f64>,
    /// Token accuracy, [`EvalLoss::accuracy`](super::EvalLoss::accuracy) (validation; absent in logs written before
    /// 2026-11-28).
    #[serde(default)]
    pub accuracy: Option<f64>,
    /// Seconds since the run (this invocation) started.
    pub elapsed_s: f64,
}

/// An `f64` that may have been written as `null` (serde_json writes NaN and ±∞ so).
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// The columns of the CSV format.
const CSV_COLUMNS: [&str; 11] = [
    "kind",
    "step",
    "epoch",
    "loss",
    "nll",
    "lr",
    "tokens",
    "tokens_per_s",
    "elapsed_s",
    "perplexity",
    "accuracy",
];

/// The format of a metrics log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum MetricsFormat {
    /// One JSON object per line (`metrics.jsonl`).
    #[default]
    Jsonl,
    /// Comma-separated values with a header (`metrics.csv`).
    Csv,
}

impl MetricsFormat {
    /// The log's file in run directory `run_dir`.
    pub fn path(self, run_dir: &Path) -> PathBuf {
        crate::run_dir::RunDir::new(run_dir).metrics_path(self)
    }

    fn write(self, record: &MetricRecord) -> String {
        match self {
            Self::Jsonl => serde_json::to_string(record).expect("a record serialises"),
            Self::Csv => {
                let opt = |v: Option<String>| v.unwrap_or_default();
                let kind = match record.kind {
                    MetricKind::Train => "train",
                    MetricKind::Valid => "valid",
                };
                [
                    kind.to_string(),
                    record.step.to_string(),
                    record.epoch.to_string(),
                    record.loss.to_string(),
                    record.nll.to_string(),
                    opt(record.lr.map(|v| v.to_string())),
                    opt(record.tokens.map(|v| v.to_string())),
                    opt(record.tokens_per_s.map(|v| v.to_string())),
                    record.elapsed_s.to_string(),
                    opt(record.perplexity.map(|v| v.to_string())),
                    opt(record.accuracy.map(|v| v.to_string())),
                ]
                .join(",")
            }
        }
    }

    /// One record, or why the line is not one.
    fn read(self, line: &str) -> Result<MetricRecord, String> {
        match self {
            Self::Jsonl => serde_json::from_str(line).map_err(|e| e.to_string()),
            Self::Csv => {
                let cells: Vec<&str> = line.split(',').collect();
                // Logs written before the last column (accuracy) was added lack it.
                if !(CSV_COLUMNS.len() - 1..=CSV_COLUMNS.len()).contains(&cells.len()) {
                    return Err(format!(
                        "{} cells, expected {} ({})",
                        cells.len(),
                        CSV_COLUMNS.len(),
                        CSV_COLUMNS.join(",")
                    ));
                }
                // The same record through serde: every cell as a JSON value of its column.
                let mut object = serde_json::Map::new();
                for (column, cell) in CSV_COLUMNS.iter().zip(cells) {
                    let value = if cell.is_empty() || matches!(cell, "NaN" | "inf" | "-inf") {
                        serde_json::Value::Null
                    } else if *column == "kind" {
                        serde_json::Value::String(cell.to_string())
                    } else {
                        serde_json::from_str(cell).map_err(|e| format!("{column} {cell:?}: {e}"))?
                    };
                    object.insert(column.to_string(), value);
                }
                serde_json::from_value(object.into()).map_err(|e| e.to_string())
            }
        }
    }
}

/// Reads every record of a metrics log. A torn last line (a process killed mid-write) is
/// skipped; any other line that is not a record is an error naming the file and line.
///
/// # Errors
/// [`TrainError::Io`] naming the file (and line).
pub fn read_metrics(path: &Path, format: MetricsFormat) -> Result<Vec<MetricRecord>, TrainError> {
    let text = fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut records = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.is_empty() || (format == MetricsFormat::Csv && i == 0) {
            continue;
        }
        match format.read(line) {
            Ok(record) => records.push(record),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => {
                return Err(TrainError::io(path, format!("line {}: {e}", i + 1)));
            }
        }
    }
    Ok(records)
}

/// Tokens read per second over a window of about 10 s, restarted when a window is full: what
/// the metrics log records and a progress display shows.
#[derive(Debug, Clone, Copy)]
pub struct TokenRate {
    since: Instant,
    tokens: usize,
}

impl Default for TokenRate {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenRate {
    /// A window starting now.
    pub fn new() -> Self {
        Self {
            since: Instant::now(),
            tokens: 0,
        }
    }

    /// Counts `tokens` more and returns the rate of the window so far.
    pub fn add(&mut self, tokens: usize) -> f64 {
        self.tokens += tokens;
        let seconds = self.since.elapsed().as_secs_f64().max(1e-9);
        let rate = self.tokens as f64 / seconds;
        if seconds > 10.0 {
            *self = Self::new();
        }
        rate
    }
}

/// The observer that writes a run's metrics log: a training record per step, a validation
/// record per validation. Each record is one write of one line, flushed. When the run starts at
/// step `s` (a resume), the records after `s` (from steps the checkpoint does not hold) and a
/// torn last line are dropped first, by rewriting the file atomically.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    format: MetricsFormat,
    file: Option<fs::File>,
    rate: TokenRate,
}

impl MetricsLog {
    /// The log of run directory `run_dir` in `format`; opened when the run starts.
    pub fn new(run_dir: &Path, format: MetricsFormat) -> Self {
        Self {
            path: format.path(run_dir),
            format,
            file: None,
            rate: TokenRate::new(),
        }
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record in the file.
    ///
    /// # Errors
    /// As [`read_metrics`].
    pub fn records(&self) -> Result<Vec<MetricRecord>, TrainError> {
        read_metrics(&self.path, self.format)
    }

    fn open(&mut self, keep_through: usize) -> Result<(), TrainError> {
        let kept = match self.path.exists() {
            true => read_metrics(&self.path, self.format)?,
            false => Vec::new(),
        };
        let mut text = String::new();
        if self.format == MetricsFormat::Csv {
            text += &CSV_COLUMNS.join(",");
            text.push('\n');
        }
        for record in kept.iter().filter(|r| r.step <= keep_through) {
            text += &self.format.write(record);
            text.push('\n');
        }
        write_atomic(&self.path, text.as_bytes())?;
        let file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| TrainError::io(&self.path, e))?;
        self.file = Some(file);
        self.rate = TokenRate::new();
        Ok(())
    }

    fn append(&mut self, record: &MetricRecord) -> Result<(), TrainError> {
        let line = format!("{}\n", self.format.write(record));
        let file = self.file.as_mut().ok_or_else(|| {
            TrainError::io(
                &self.path,
                "written before the run started (no Started event)",
            )
        })?;
        file.write_all(line.as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }
}

impl Observer for MetricsLog {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        match *event {
            Event::Started {
                progress, leader, ..
            } if leader => self.open(progress.step),
            Event::Step { report, elapsed } if self.file.is_some() => {
                let tokens = report.input_tokens + report.target_tokens;
                let rate = self.rate.add(tokens);
                self.append(&MetricRecord {
                    kind: MetricKind::Train,
                    step: report.step,
                    epoch: report.epoch,
                    loss: report.loss,
                    nll: report.nll,
                    lr: Some(report.lr),
                    tokens: Some(tokens),
                    tokens_per_s: Some(rate.round()),
                    perplexity: None,
                    accuracy: None,
                    elapsed_s: elapsed.as_secs_f64(),
                })
            }
            Event::Validation {
                step,
                epoch,
                loss,
                elapsed,
            } => self.append(&MetricRecord {
                kind: MetricKind::Valid,
                step,
                epoch,
                loss: loss.loss,
                nll: loss.nll,
                lr: None,
                tokens: None,
                tokens_per_s: None,
                perplexity: Some(loss.perplexity()),
                accuracy: Some(loss.accuracy()),
                elapsed_s: elapsed.as_secs_f64(),
            }),
            _ => Ok(()),
        }
    }
}
