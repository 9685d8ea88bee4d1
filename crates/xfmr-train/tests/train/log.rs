//! The metrics log: what the observer writes reads back as the same records, in both formats,
//! non-finite losses included; a resumed run's log drops the records after its checkpoint.

use std::time::Duration;

use xfmr_train::trainer::{read_metrics, EvalLoss, Event, MetricKind, MetricsFormat, MetricsLog};
use xfmr_train::{Observer, Progress, StepReport};

fn started(step: usize) -> Event<'static> {
    Event::Started {
        progress: Progress {
            step,
            epoch: 0,
            batch: 0,
        },
        target_steps: 10,
        examples: 100,
        batches_per_epoch: 5,
        leader: true,
    }
}

fn report(step: usize, loss: f64) -> StepReport {
    StepReport {
        step,
        epoch: 0,
        loss,
        nll: loss / 2.0,
        lr: 1e-3,
        input_tokens: 30,
        target_tokens: 20,
    }
}

/// Steps 1–4 with a validation at 2 and a diverged (NaN, +∞) loss at 3, then the log reopened
/// as a run resumed from step 2: records of steps 1–2 stay, the rest are gone, and a step 3
/// appended after them reads back.
#[test]
fn metrics_read_back_as_written_and_resume_drops_later_steps() {
    for format in [MetricsFormat::Jsonl, MetricsFormat::Csv] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::new(dir.path(), format);
        log.event(&started(0)).unwrap();
        let losses = [2.5, 2.0, f64::NAN, f64::INFINITY];
        let elapsed = Duration::from_millis(1500);
        for (i, &loss) in losses.iter().enumerate() {
            log.event(&Event::Step {
                report: &report(i + 1, loss),
                elapsed,
            })
            .unwrap();
            if i + 1 == 2 {
                let eval = EvalLoss {
                    loss: 1.75,
                    nll: 1.5,
                    tokens: 40,
                    correct: 10,
                };
                log.event(&Event::Validation {
                    step: 2,
                    epoch: 0,
                    loss: &eval,
                    elapsed,
                })
                .unwrap();
            }
        }
        let records = read_metrics(log.path(), format).unwrap();
        assert_eq!(records.len(), 5, "{format:?}");
        let train: Vec<_> = records
            .iter()
            .filter(|r| r.kind == MetricKind::Train)
            .collect();
        assert_eq!(train.len(), 4);
        assert_eq!((train[0].step, train[0].loss, train[0].nll), (1, 2.5, 1.25));
        assert_eq!(train[0].lr, Some(1e-3));
        assert_eq!(train[0].tokens, Some(50));
        assert_eq!(train[0].elapsed_s, 1.5);
        assert!(
            train[2].loss.is_nan() && train[3].loss.is_nan(),
            "{format:?}"
        );
        let valid = records
            .iter()
            .find(|r| r.kind == MetricKind::Valid)
            .unwrap();
        assert_eq!((valid.step, valid.loss, valid.nll), (2, 1.75, 1.5));
        assert_eq!(valid.perplexity, Some(1.5f64.exp()));
        assert_eq!(valid.accuracy, Some(0.25));
        assert_eq!(valid.lr, None);

        let mut resumed = MetricsLog::new(dir.path(), format);
        resumed.event(&started(2)).unwrap();
        resumed
            .event(&Event::Step {
                report: &report(3, 1.0),
                elapsed,
            })
            .unwrap();
        let steps: Vec<(MetricKind, usize)> = resumed
            .records()
            .unwrap()
            .iter()
            .map(|r| (r.kind, r.step))
            .collect();
        assert_eq!(
            steps,
            [
                (MetricKind::Train, 1),
                (MetricKind::Train, 2),
                (MetricKind::Valid, 2),
                (MetricKind::Train, 3)
            ],
            "{format:?}"
        );
    }
}

/// A line that is not a record is an error naming the file and the line, except a torn last
/// line (a writer killed mid-line), which is skipped.
#[test]
fn a_bad_metrics_line_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let good = r#"{"kind":"train","step":1,"epoch":0,"loss":2.0,"nll":1.0,"lr":0.001,"tokens":5,"tokens_per_s":10.0,"perplexity":null,"elapsed_s":0.5}"#;
    std::fs::write(&path, format!("{good}\n{{\"kind\":\"tra")).unwrap();
    // A line written before the accuracy field existed reads as one without it.
    let records = read_metrics(&path, MetricsFormat::Jsonl).unwrap();
    assert_eq!((records.len(), records[0].accuracy), (1, None));
    let csv = dir.path().join("metrics.csv");
    std::fs::write(
        &csv,
        "kind,step,epoch,loss,nll,lr,tokens,tokens_per_s,elapsed_s,perplexity\n\
         valid,2,0,1.75,1.5,,,,0.5,4.5\n",
    )
    .unwrap();
    let records = read_metrics(&csv, MetricsFormat::Csv).unwrap();
    assert_eq!(
        (records[0].perplexity, records[0].accuracy),
        (Some(4.5), None)
    );
    std::fs::write(&path, format!("not json\n{good}\n")).unwrap();
    let err = read_metrics(&path, MetricsFormat::Jsonl)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("metrics.jsonl") && err.contains("line 1"),
        "{err}"
    );
}
