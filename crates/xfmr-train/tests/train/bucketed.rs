//! Batches on a length ladder (`xfmr_models::ladder`): a bounded number of shapes over an epoch,
//! every example exactly once, and the loss of the real tokens unchanged by the padding, for
//! each objective. Test names carry `bucketed_batches`.

use burn::backend::{Autodiff, NdArray};
use xfmr_models::checkpoint::{self, ModelConfig};
use xfmr_models::ladder::{BatchShape, LengthLadder};
use xfmr_models::{DecoderOnlyConfig, EncoderOnlyConfig, TransformerConfig};
use xfmr_train::data::token_batches;
use xfmr_train::objective::ModelOf;
use xfmr_train::trainer::evaluate_loss;
use xfmr_train::{CausalLm, Example, MaskedLm, Objective, TrainConfig, Trainer, Translation};
use xfmr_translate::data::SplitMix64;

type Infer = NdArray<f32>;

/// Relative tolerance on a loss computed over differently padded batches: the real tokens'
/// values are the same, only the order of float additions differs (f32).
const TOLERANCE: f64 = 1e-5;

const VOCAB: usize = 40;
const BOS: u32 = 1;
const EOS: u32 = 2;
/// Ids below this are special (pad 0, bos 1, eos 2, unk 3).
const FIRST: u32 = 4;

/// `n` `(input, output)` lengths, each side uniform in `1..=max`.
fn lengths(n: usize, max: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut rng = SplitMix64(seed);
    (0..n)
        .map(|_| {
            let mut side = || 1 + (rng.next() % max as u64) as usize;
            (side(), side())
        })
        .collect()
}

fn longest(batch: &[usize], lengths: &[(usize, usize)]) -> usize {
    batch
        .iter()
        .map(|&i| lengths[i].0.max(lengths[i].1))
        .max()
        .unwrap()
}

/// Over an epoch of 3,000 examples of up to 101 tokens, micro-batches of 2,000 padded tokens
/// meet one shape per rung up to 128 (7, within the 16 a run may meet), each within the token
/// budget and holding its batch; capped by a learned table of 101 positions, the last rung is
/// 101. Padded to its longest sequence instead, the same epoch meets hundreds of shapes.
#[test]
fn bucketed_batches_meet_at_most_one_shape_per_rung() {
    let (ladder, max_tokens) = (LengthLadder::default(), 2000);
    let lengths = lengths(3000, 101, 7);
    let batches = ladder.batches(&lengths, max_tokens, None);
    let shapes = ladder.shapes(&batches, &lengths, max_tokens, None);
    let mut rungs: Vec<usize> = shapes.iter().map(|s| s.len).collect();
    rungs.sort_unstable();
    assert_eq!(rungs, [16, 24, 32, 48, 64, 96, 128]);
    for s in &shapes {
        assert_eq!(s.rows, max_tokens / s.len, "{s:?}");
    }
    for batch in &batches {
        let shape = ladder.shape(longest(batch, &lengths), max_tokens, None);
        assert!(batch.len() <= shape.rows && shape.rows * shape.len <= max_tokens);
    }
    let capped = ladder.shapes(&batches, &lengths, max_tokens, Some(101));
    assert_eq!(capped.iter().map(|s| s.len).max(), Some(101));
    assert_eq!(capped.len(), 7);
    // The premise: without the ladder nearly every batch is a shape of its own.
    let plain: std::collections::BTreeSet<[usize; 3]> = token_batches(&lengths, max_tokens)
        .iter()
        .map(|b| {
            let side = |f: fn(&(usize, usize)) -> usize| b.iter().map(|&i| f(&lengths[i])).max();
            [b.len(), side(|l| l.0).unwrap(), side(|l| l.1).unwrap()]
        })
        .collect();
    assert!(plain.len() > 100, "{} shapes", plain.len());
    // A pair longer than the budget gets a batch of one row.
    let long = ladder.shape(3000, max_tokens, None);
    assert_eq!((long.rows, long.len), (1, 3072));
}

/// Every example lands in exactly one batch of the epoch, on the ladder as without it; and the
/// trainer, over one epoch of steps on the ladder, reads every example's target tokens once.
#[test]
fn bucketed_batches_cover_every_example_exactly_once_per_epoch() {
    let lengths = lengths(1000, 60, 3);
    for ladder in [LengthLadder::default(), LengthLadder::new(5)] {
        let mut seen: Vec<usize> = ladder.batches(&lengths, 500, Some(50)).concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
    }
    let _guard = crate::trainer::lock();
    let examples = pairs(40, 30, 5);
    let config = TrainConfig::new()
        .with_max_tokens(64)
        .with_warmup(10)
        .with_ladder(Some(LengthLadder::new(4)));
    let objective = Translation::new(TransformerConfig::tiny(VOCAB), BOS, EOS);
    let device = Default::default();
    let mut trainer =
        Trainer::<Autodiff<Infer>, _>::new(objective, config, examples.clone(), &device).unwrap();
    // Examples of 2–31 tokens a side: the rungs 6, 8, 12, 16, 24 and 32 of a ladder from 4.
    assert!(
        trainer.batch_shapes().len() <= 6,
        "{:?}",
        trainer.batch_shapes()
    );
    let steps = trainer.batches_per_epoch();
    let read: usize = (0..steps)
        .map(|_| trainer.step().unwrap().target_tokens)
        .sum();
    let all: usize = examples.iter().map(|e| e.tgt.len() + 1).sum();
    assert_eq!(read, all);
    assert_eq!(trainer.progress().epoch, 0);
}

/// `n` random sequences of 1..=`max` ordinary ids.
fn sequences(n: usize, max: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = SplitMix64(seed);
    let span = (VOCAB as u64) - 1 - u64::from(FIRST);
    (0..n)
        .map(|_| {
            let len = 1 + (rng.next() % max as u64) as usize;
            (0..len)
                .map(|_| FIRST + (rng.next() % span) as u32)
                .collect()
        })
        .collect()
}

fn pairs(n: usize, max: usize, seed: u64) -> Vec<Example> {
    let (src, tgt) = (sequences(n, max, seed), sequences(n, max, seed + 1));
    src.into_iter()
        .zip(tgt)
        .map(|(src, tgt)| Example { src, tgt })
        .collect()
}

/// The loss of `examples` as one batch padded to its longest sequence, and padded to a shape
/// with 3 more rows and 9 more positions: the same loss, negative log-likelihood and token
/// counts. Then the validation loss of all of them batched on a ladder (shapes capped by the
/// model's learned positions, if any) and without: the same.
fn keeps_the_loss<O: Objective>(objective: O, examples: Vec<O::Example>) {
    let _guard = crate::trainer::lock();
    let device = Default::default();
    let model: ModelOf<O, Infer> = objective.model().init_model::<Infer>(&device).unwrap();
    checkpoint::materialise(&model);
    let batch: Vec<&O::Example> = examples.iter().take(6).collect();
    let draws: Vec<u64> = (0..batch.len() as u64).map(|i| i * 7919 + 1).collect();
    let longest = batch
        .iter()
        .map(|e| {
            let (input, output) = objective.lengths(e);
            input.max(output)
        })
        .max()
        .unwrap();
    let shape = BatchShape {
        rows: batch.len() + 3,
        len: longest + 9,
    };
    let plain = objective
        .loss(&model, &batch, &draws, None, &device)
        .unwrap();
    let padded = objective
        .loss(&model, &batch, &draws, Some(shape), &device)
        .unwrap();
    assert_eq!(plain.input_tokens, padded.input_tokens);
    assert_eq!(plain.loss.tokens, padded.loss.tokens);
    let value = |t: burn::tensor::Tensor<Infer, 1>| f64::from(t.into_scalar());
    for (a, b) in [
        (value(plain.loss.loss), value(padded.loss.loss)),
        (value(plain.loss.nll), value(padded.loss.nll)),
    ] {
        assert!(
            (a - b).abs() <= TOLERANCE * a.abs(),
            "unpadded {a} vs padded {b}"
        );
    }
    let config = TrainConfig::new().with_max_tokens(40);
    let ladder = config.clone().with_ladder(Some(LengthLadder::new(4)));
    let eval = |config: &TrainConfig| evaluate_loss(&objective, &model, config, &examples).unwrap();
    let (a, b) = (eval(&config), eval(&ladder));
    assert_eq!(a.tokens, b.tokens);
    for (a, b) in [(a.loss, b.loss), (a.nll, b.nll)] {
        assert!((a - b).abs() <= TOLERANCE * a, "{a} vs {b} on the ladder");
    }
}

/// Translation: filler pairs and padding change neither side's loss.
#[test]
fn bucketed_batches_keep_the_translation_loss() {
    let objective = Translation::new(TransformerConfig::tiny(VOCAB), BOS, EOS);
    keeps_the_loss(objective, pairs(30, 12, 11));
}

/// Causal language modelling: filler rows read the start token only and predict nothing.
#[test]
fn bucketed_batches_keep_the_lm_loss() {
    let objective = CausalLm::new(DecoderOnlyConfig::tiny(VOCAB).with_max_len(64), BOS, EOS);
    keeps_the_loss(objective, sequences(30, 12, 13));
}

/// Masked language modelling, whose learned position table (24 rows) caps the ladder.
#[test]
fn bucketed_batches_keep_the_mlm_loss() {
    let model = EncoderOnlyConfig::tiny(VOCAB)
        .with_max_len(24)
        .with_type_vocab_size(0)
        .with_pooler(false)
        .with_mlm_head(true);
    let objective = MaskedLm::new(model, VOCAB as u32 - 1, FIRST, BOS, EOS);
    assert_eq!(objective.max_positions(), Some(24));
    assert_eq!(LengthLadder::new(4).rung(20, objective.max_positions()), 24);
    keeps_the_loss(objective, sequences(30, 12, 17));
}
