//! `xfmr train`: arguments → the run's specification (the library's presets, or `--config`)
//! and vocabulary in its run directory ([`RunDir`]) → the library's run
//! ([`xfmr_train::run_replicas`], `session.rs`) with the progress bar and the metrics log as
//! observers → what the task shows at the end (`show.rs`): test BLEU/chrF and attention maps
//! (translation), continued text (`lm`), filled-in masks (`mlm`). The training loop is the
//! library's.

mod args;
mod session;
mod show;

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use xfmr::burn::tensor::backend::AutodiffBackend;
use xfmr::models::ladder::SourceBatches;
use xfmr_train::{encode_pairs, Objective, RunDir, RunSpec, Task};
use xfmr_translate::data::{self, Pair};
use xfmr_translate::SubwordTokenizer;

pub use args::Args;

use crate::backend::{with_backend, BackendKind};
use crate::translation::TRANSLATION_BATCH;

/// The embedded Spanish→English set (see `data/es-en/README.md`).
const EMBEDDED: [(&str, &str); 3] = [
    ("train.tsv", include_str!("../../data/es-en/train.tsv")),
    ("valid.tsv", include_str!("../../data/es-en/valid.tsv")),
    ("test.tsv", include_str!("../../data/es-en/test.tsv")),
];

/// Runs `xfmr train` on the chosen backend under autodiff.
pub fn run(args: Args) -> Result<()> {
    let kind = args.backend.resolve();
    if args.backend.backend == BackendKind::Auto {
        eprintln!("backend: {} (--backend auto)", kind.name());
    }
    with_backend!(
        kind,
        "train",
        |B| train::<xfmr::burn::backend::Autodiff<B>>(&args, kind.is_cpu())
    )
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

/// The run's vocabulary: the one saved in the run directory, else learnt for the task on the
/// training split ([`Task::learn_vocabulary`]) and saved (by rank 0).
fn vocabulary(args: &Args, task: Task, run: &RunDir, train: &[Pair]) -> Result<SubwordTokenizer> {
    if run.has_tokenizer() {
        return Ok(run.read_tokenizer()?);
    }
    let vocab_size = args.vocab_size(task);
    eprintln!(
        "learning a {}-token BPE vocabulary on {} training pairs",
        vocab_size,
        train.len()
    );
    let tokenizer = task.learn_vocabulary(train, vocab_size)?;
    if args.parallel.rank == 0 {
        run.write_tokenizer(&tokenizer)?;
    }
    Ok(tokenizer)
}

/// `xfmr train` on backend `B`; `cpu`: whether it runs on the CPU (one replica per core by
/// default).
fn train<B: AutodiffBackend>(args: &Args, cpu: bool) -> Result<()> {
    let started = Instant::now();
    let task = args.task()?;
    let run = RunDir::new(args.out());
    let data_dir = args.data.as_deref();
    let (train_pairs, valid_pairs, test_pairs) = (
        split(data_dir, "train.tsv")?,
        split(data_dir, "valid.tsv")?,
        split(data_dir, "test.tsv")?,
    );
    // In a data-parallel run only rank 0 writes into the run directory.
    let leader = args.parallel.rank == 0;
    if leader {
        run.create()?;
    }
    let tokenizer = vocabulary(args, task, &run, &train_pairs)?;
    let spec = args.spec(&tokenizer, cpu)?;
    if leader && run.latest_checkpoint()?.is_none() {
        run.write_spec(&spec)?;
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
    let session = session::Session {
        args,
        task,
        run: &run,
        tokenizer: &tokenizer,
        cpu,
    };
    match spec {
        RunSpec::Translation { objective, train } => {
            // The evaluation's source batches: on the ladder when training is.
            let batches = SourceBatches::new(TRANSLATION_BATCH)
                .with_ladder(train.ladder, objective.max_positions());
            let examples = encode_pairs(&tokenizer, &train_pairs)?
                .into_iter()
                .filter(|e| short(&e.src) && short(&e.tgt))
                .collect();
            let valid = encode_pairs(&tokenizer, &valid_pairs)?;
            if session.train::<B, _>(objective, train, examples, &valid)? {
                show::translation::<B::InnerBackend>(
                    &run,
                    &tokenizer,
                    &valid_pairs,
                    &test,
                    args.beam,
                    args.length_penalty,
                    batches,
                )?;
            }
        }
        RunSpec::Lm { objective, train } => {
            let examples = sentences(&train_pairs)?.into_iter().filter(short).collect();
            let valid: Vec<_> = sentences(&valid_pairs)?.into_iter().filter(short).collect();
            if session.train::<B, _>(objective, train, examples, &valid)? {
                show::lm::<B::InnerBackend>(&run, &tokenizer, &test)?;
            }
        }
        RunSpec::Mlm { objective, train } => {
            let examples = sentences(&train_pairs)?.into_iter().filter(short).collect();
            let valid: Vec<_> = sentences(&valid_pairs)?.into_iter().filter(short).collect();
            if session.train::<B, _>(objective, train, examples, &valid)? {
                show::mlm::<B::InnerBackend>(&run, &tokenizer, &test)?;
            }
        }
    }
    let shapes = xfmr::models::ladder::shapes_seen();
    let decoding = shapes
        .iter()
        .filter(|(what, _)| *what == "decoding")
        .count();
    eprintln!(
        "batch shapes met: {} in training and validation, {decoding} in decoding's source \
         batches",
        shapes.len() - decoding
    );
    eprintln!("done in {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    Ok(())
}
