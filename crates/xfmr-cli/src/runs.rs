//! A run directory of `xfmr train` on the command line: the model a command needs from it
//! (the run's task checked first, errors saying which `xfmr train` makes one), and the options
//! shared by the commands that use a run.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xfmr::burn::tensor::backend::Backend;
use xfmr::models::checkpoint::ModelConfig;
use xfmr_train::{RunDir, Task};
use xfmr_translate::SubwordTokenizer;

/// The model of run `run`, which must be a `task` run (`command` names the command that needs
/// it, for the error): its averaged final model, else its last checkpoint; and its
/// vocabulary.
pub(crate) fn load_run<B: Backend, C: ModelConfig>(
    run: &Path,
    task: Task,
    command: &str,
) -> Result<(C::Model<B>, SubwordTokenizer)> {
    let dir = RunDir::new(run);
    let Some(found) = dir.task()? else {
        bail!(
            "{}: not a run of `xfmr train` (no {}, {}/ or {}/; train one with `xfmr train --out \
             {}`)",
            run.display(),
            RunDir::SPEC_FILE,
            RunDir::MODEL_DIR,
            RunDir::CHECKPOINTS_DIR,
            run.display()
        );
    };
    if found != task {
        bail!(
            "{} is a `--task {found}` run; `xfmr {command}` needs a `--task {task}` run \
             (`xfmr train --task {task}`)",
            run.display(),
        );
    }
    dir.load_model::<B, C>(&Default::default())
        .with_context(|| {
            format!(
                "{}: (train one with `xfmr train --task {task} --out {}`)",
                run.display(),
                run.display()
            )
        })
}

/// Parses a finite number (clap's `f64` parser also takes `nan` and `inf`).
pub(crate) fn finite(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        Ok(x) => Err(format!("{x}: must be finite")),
        Err(e) => Err(e.to_string()),
    }
}

/// The length penalty of a run's beam search: `given`, else the one chosen for the run at the
/// end of its training (`decoding.json`), else the paper's 0.6.
pub(crate) fn length_penalty(run: &Path, given: Option<f64>) -> Result<f64> {
    Ok(match given {
        Some(alpha) => alpha,
        None => RunDir::new(run).length_penalty()?,
    })
}
