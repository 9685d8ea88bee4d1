//! Train a small translation model on a TSV file of your own (`source<TAB>target` per line)
//! through the library, with an observer of your own that prints a line per validation. Run it
//! again and it resumes from the run directory's last checkpoint.
//!
//! ```text
//! cargo run --release -p xfmr --features autodiff --example train_custom -- pairs.tsv [RUN_DIR]
//! ```

use std::error::Error;
use std::path::Path;

use xfmr::burn::backend::{Autodiff, NdArray};
use xfmr::models::TransformerConfig;
use xfmr::train::translate::encode_pairs;
use xfmr::train::{data, Event, Observer, RunSummary, SubwordTokenizer, TrainError};
use xfmr::train::{TrainConfig, Trainer, Translation};

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

/// Trains `steps` steps on `tsv` (a tenth of it held out for validation) in `run_dir`, which
/// then holds the vocabulary (`tokenizer.json`) and the final model (`model/`).
pub fn train(tsv: &Path, run_dir: &Path, steps: usize) -> Result<RunSummary, Box<dyn Error>> {
    let pairs = data::read_tsv(tsv)?;
    let (valid, train) = pairs.split_at((pairs.len() / 10).max(1));
    // The vocabulary is learnt once and kept with the run (a resumed run needs the same ids).
    let vocabulary = run_dir.join("tokenizer.json");
    let tokenizer = if vocabulary.exists() {
        SubwordTokenizer::load(&vocabulary)?
    } else {
        let sides = train.iter().flat_map(|p| [p.src.as_str(), p.tgt.as_str()]);
        let tokenizer = SubwordTokenizer::train(sides, 1000)?;
        std::fs::create_dir_all(run_dir)?;
        tokenizer.save(&vocabulary)?;
        tokenizer
    };
    // Every special id (padding, start, end) from the tokenizer.
    let objective =
        Translation::for_tokenizer(TransformerConfig::tiny(tokenizer.vocab_size()), &tokenizer);
    let config = TrainConfig::new()
        .with_steps(steps)
        .with_max_tokens(1000)
        .with_warmup(20)
        .with_eval_every(10)
        .with_checkpoint_every(10)
        .with_keep_checkpoints(2)
        .with_average(2);
    let examples = encode_pairs(&tokenizer, train)?;
    let device = Default::default();
    let mut trainer = Trainer::<Backend, _>::open(run_dir, objective, config, examples, &device)?;
    let valid = encode_pairs(&tokenizer, valid)?;
    Ok(trainer.run(run_dir, &valid, &mut PrintValidation)?)
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let tsv = args
        .next()
        .ok_or("usage: train_custom FILE.tsv [RUN_DIR]")?;
    let run_dir = args.next().unwrap_or_else(|| "runs/custom".into());
    let summary = train(Path::new(&tsv), Path::new(&run_dir), 200)?;
    let model = summary.final_model.ok_or("no final model")?;
    println!("{} steps; final model in {}", summary.step, model.display());
    Ok(())
}
