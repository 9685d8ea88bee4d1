//! The training metrics log of `xfmr train`: one record per line, JSON Lines or CSV.

use std::fs::{self, OpenOptions};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde_json::Value;
use xfmr::models::checkpoint::write_atomic;

use crate::translation::io_err;

/// Metrics file format.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum MetricsFormat {
    /// One JSON object per line (`metrics.jsonl`).
    Jsonl,
    /// Comma-separated values with a header (`metrics.csv`).
    Csv,
}

/// The metrics file of a run in `format`.
fn metrics_path(run: &Path, format: MetricsFormat) -> PathBuf {
    run.join(match format {
        MetricsFormat::Jsonl => "metrics.jsonl",
        MetricsFormat::Csv => "metrics.csv",
    })
}

const CSV_COLUMNS: [&str; 10] = [
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
];

/// (step, loss) points.
pub(crate) type Curve = Vec<(f64, f64)>;

/// An append-only metrics log. Each record is one `write` of one line, flushed; on resume the
/// records after the checkpoint (and a torn last line, if the process died mid-write) are
/// dropped by rewriting the file atomically.
pub(crate) struct Metrics {
    path: PathBuf,
    format: MetricsFormat,
    file: fs::File,
}

impl Metrics {
    /// Opens the log of run `run`, keeping the records up to step `keep_through`.
    pub(crate) fn open(
        run: &Path,
        format: MetricsFormat,
        keep_through: usize,
    ) -> Result<Self, String> {
        let path = metrics_path(run, format);
        let mut kept = Vec::new();
        if let Ok(file) = fs::File::open(&path) {
            for line in std::io::BufReader::new(file).lines() {
                let line = line.map_err(io_err(&path))?;
                if let Some((_, step, _)) = Self::parse(&line, format) {
                    if step <= keep_through {
                        kept.push(line);
                    }
                }
            }
        }
        let mut text = String::new();
        if format == MetricsFormat::Csv {
            text += &CSV_COLUMNS.join(",");
            text.push('\n');
        }
        for line in kept {
            text += &line;
            text.push('\n');
        }
        write_atomic(&path, text.as_bytes()).map_err(|e| e.to_string())?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(Self { path, format, file })
    }

    /// (kind, step, loss) of one record; `None` for the CSV header or a torn line.
    fn parse(line: &str, format: MetricsFormat) -> Option<(String, usize, Option<f64>)> {
        match format {
            MetricsFormat::Jsonl => {
                let v = serde_json::from_str::<Value>(line).ok()?;
                let kind = v["kind"].as_str().unwrap_or_default().to_string();
                Some((kind, v["step"].as_u64()? as usize, v["loss"].as_f64()))
            }
            MetricsFormat::Csv => {
                let cells: Vec<&str> = line.split(',').collect();
                if cells.len() != CSV_COLUMNS.len() {
                    return None;
                }
                let step = cells[1].parse().ok()?;
                Some((cells[0].to_string(), step, cells[3].parse().ok()))
            }
        }
    }

    /// Appends one record (a JSON object; CSV takes its known columns).
    pub(crate) fn write(&mut self, record: Value) -> Result<(), String> {
        let line = match self.format {
            MetricsFormat::Jsonl => record.to_string(),
            MetricsFormat::Csv => CSV_COLUMNS
                .iter()
                .map(|c| match &record[*c] {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
        };
        self.file
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(io_err(&self.path))
    }

    /// (step, loss) of the training and validation records in the file.
    pub(crate) fn curves(&self) -> Result<(Curve, Curve), String> {
        let text = fs::read_to_string(&self.path).map_err(io_err(&self.path))?;
        let (mut train, mut valid) = (Vec::new(), Vec::new());
        for line in text.lines() {
            if let Some((kind, step, Some(loss))) = Self::parse(line, self.format) {
                match kind.as_str() {
                    "train" => train.push((step as f64, loss)),
                    "valid" => valid.push((step as f64, loss)),
                    _ => {}
                }
            }
        }
        Ok((train, valid))
    }
}
