//! Train a small translation model on a TSV file of your own (`source<TAB>target` per line)
//! through the library, with an observer of your own that prints a line per validation. Run it
//! again and it resumes from the run directory's last checkpoint.
//!
//! ```text
//! cargo run --release -p xfmr --features autodiff --example train_custom -- pairs.tsv [RUN_DIR]
//! ```
//!
//! The steps (the run directory, the vocabulary learnt once and kept with the run, the
//! objective with the vocabulary's special ids, `Trainer::open` resuming from a checkpoint,
//! `Trainer::run`) are `xfmr::train::quickstart::train_translation_on_tsv`'s; the CLI's tests
//! call it with the same configuration (`quickstart::small_config`).

use std::error::Error;
use std::path::Path;

use xfmr::burn::backend::{Autodiff, NdArray};
use xfmr::models::TransformerConfig;
use xfmr::train::quickstart::{small_config, train_translation_on_tsv};
use xfmr::train::{Event, Observer, RunDir, TrainError};

type Backend = Autodiff<NdArray>;

/// Our observer: one line per validation, nothing else.
struct PrintValidation;

impl Observer for PrintValidation {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        if let Event::Validation { step, loss, .. } = event {
            let perplexity = loss.perplexity();
            println!(
                "step {step}: validation loss {:.3}, perplexity {perplexity:.1}",
                loss.loss
            );
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let tsv = args
        .next()
        .ok_or("usage: train_custom FILE.tsv [RUN_DIR]")?;
    let run = RunDir::new(args.next().unwrap_or_else(|| "runs/custom".into()));
    // A tiny model, a 1,000-token vocabulary, 200 steps (a tenth of the file held out).
    let config = small_config(200);
    let summary = train_translation_on_tsv::<Backend>(
        Path::new(&tsv),
        &run,
        1000,
        TransformerConfig::tiny,
        config,
        &mut PrintValidation,
        &Default::default(),
    )?;
    let model = summary.final_model.ok_or("no final model")?;
    println!("{} steps; final model in {}", summary.step, model.display());
    Ok(())
}
