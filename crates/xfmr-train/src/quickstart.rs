//! A translation model trained on one TSV file of your own in one call, resumable: the
//! library's pieces ([`RunDir`], [`Task::learn_vocabulary`], [`Translation::for_tokenizer`],
//! [`Trainer::open`], [`Trainer::run`]) put together as `examples/train_custom.rs` shows them.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use xfmr_models::TransformerConfig;
use xfmr_translate::data;

use crate::objective::encode_pairs;
use crate::objective::Translation;
use crate::run_dir::RunDir;
use crate::spec::Task;
use crate::trainer::{Observer, RunSummary, TrainConfig, TrainError, Trainer};

/// A training configuration for a small file and `steps` steps: 1,000-token batches, warm-up
/// 20, validation and a checkpoint every 10 steps, the last 2 kept and averaged
/// (`examples/train_custom.rs`'s run).
pub fn small_config(steps: usize) -> TrainConfig {
    TrainConfig::new()
        .with_steps(steps)
        .with_max_tokens(1000)
        .with_warmup(20)
        .with_eval_every(10)
        .with_checkpoint_every(10)
        .with_keep_checkpoints(2)
        .with_average(2)
}

/// Trains a translation model on the pairs of `tsv` (`source<TAB>target` per line; the first
/// tenth, at least one pair, held out for validation) in run directory `run`, telling
/// `observer` what happens. The vocabulary (at most `vocab_size` tokens) is learnt on the
/// training pairs the first time and kept with the run (a resumed run needs the same ids); the
/// model is `model(vocabulary size)` with every special id from the vocabulary; a run with a
/// checkpoint resumes from it ([`Trainer::open`]), so a second call with a larger
/// `config.steps` trains on. The run's directory then holds the vocabulary and the final model
/// ([`RunDir::model_dir`]).
///
/// # Errors
/// The file's ([`TrainError::Data`], naming the line), the vocabulary's, and the trainer's.
pub fn train_translation_on_tsv<B: AutodiffBackend>(
    tsv: &Path,
    run: &RunDir,
    vocab_size: usize,
    model: impl FnOnce(usize) -> TransformerConfig,
    config: TrainConfig,
    observer: &mut dyn Observer,
    device: &B::Device,
) -> Result<RunSummary, TrainError> {
    let pairs = data::read_tsv(tsv)?;
    let (valid, train) = pairs.split_at((pairs.len() / 10).max(1).min(pairs.len()));
    let tokenizer = if run.has_tokenizer() {
        run.read_tokenizer()?
    } else {
        let tokenizer = Task::Translation.learn_vocabulary(train, vocab_size)?;
        run.create()?;
        run.write_tokenizer(&tokenizer)?;
        tokenizer
    };
    let objective = Translation::for_tokenizer(model(tokenizer.vocab_size()), &tokenizer);
    let examples = encode_pairs(&tokenizer, train)?;
    let mut trainer = Trainer::<B, _>::open(run.root(), objective, config, examples, device)?;
    let valid = encode_pairs(&tokenizer, valid)?;
    trainer.run(run.root(), &valid, observer)
}
