//! The three provided objectives trained through one trainer: each learns a toy task, resumes
//! exactly through [`Trainer::run`]'s checkpoints, and trains as two data-parallel replicas in
//! one process exactly as one replica does. Test names carry `objective_translation`,
//! `objective_lm` and `objective_mlm` (the translation objective's learning and resume tests
//! live in `trainer.rs`).

use std::path::Path;
use std::time::Duration;

use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use xfmr_models::{padded_ids, DecoderOnlyConfig, EncoderOnlyConfig, PadSide, TransformerConfig};
use xfmr_train::objective::{mask_tokens, ModelOf};
use xfmr_train::trainer::{evaluate_loss, load_model, Event, Silent};
use xfmr_train::{
    run_replicas, CausalLm, DataParallelConfig, Example, MaskedLm, Objective, Observer, StepReport,
    TrainConfig, TrainError, Trainer, Translation,
};
use xfmr_translate::data::SplitMix64;

use crate::trainer::{lock, params};

type Train = Autodiff<NdArray<f32>>;
type Infer = NdArray<f32>;

const VOCAB: usize = 24;
/// Ids below this are special (pad 0, bos 1, eos 2, unk 3); the tasks use the others.
const FIRST: u32 = 4;
/// The start and end ids of these synthetic vocabularies (no tokenizer here).
const BOS: u32 = 1;
const EOS: u32 = 2;

/// Counting sequences `a, a+1, …` (wrapping within the ordinary ids) of 2–8 tokens: after the
/// first token every next one is determined.
fn counting(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = SplitMix64(seed);
    let span = VOCAB as u64 - u64::from(FIRST);
    (0..n)
        .map(|_| {
            let len = 2 + (rng.next() % 7) as usize;
            let start = rng.next() % span;
            (0..len as u64)
                .map(|k| FIRST + ((start + k) % span) as u32)
                .collect()
        })
        .collect()
}

/// Sequences of one repeated token, 4–8 long: any unmasked token tells a masked one.
fn repeated(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = SplitMix64(seed);
    let span = VOCAB as u64 - 1 - u64::from(FIRST);
    (0..n)
        .map(|_| {
            let len = 4 + (rng.next() % 5) as usize;
            vec![FIRST + (rng.next() % span) as u32; len]
        })
        .collect()
}

/// An id tensor's values, row after row.
fn int_values(t: burn::tensor::Tensor<Infer, 2, burn::tensor::Int>) -> Vec<i64> {
    t.to_data().convert::<i64>().to_vec::<i64>().unwrap()
}

fn lm() -> CausalLm {
    CausalLm::new(DecoderOnlyConfig::tiny(VOCAB).with_max_len(32), BOS, EOS)
}

fn mlm() -> MaskedLm {
    // The last id is the mask token; random replacements come from the ordinary ids.
    MaskedLm::new(
        EncoderOnlyConfig::tiny(VOCAB)
            .with_max_len(32)
            .with_type_vocab_size(0)
            .with_pooler(false)
            .with_mlm_head(true),
        VOCAB as u32 - 1,
        FIRST,
        BOS,
        EOS,
    )
}

fn translation() -> Translation {
    Translation::new(TransformerConfig::tiny(VOCAB), BOS, EOS)
}

fn copies(n: usize, seed: u64) -> Vec<Example> {
    counting(n, seed)
        .into_iter()
        .map(|s| Example {
            src: s.clone(),
            tgt: s,
        })
        .collect()
}

fn config() -> TrainConfig {
    TrainConfig::new()
        .with_max_tokens(96)
        .with_warmup(30)
        .with_lr_factor(0.3)
        .with_eval_every(1000)
        .with_checkpoint_every(1000)
        .with_keep_checkpoints(2)
        .with_average(1)
}

/// Trains `steps` steps and returns the validation negative log-likelihood per predicted token
/// before and after.
fn learn<O: Objective>(
    objective: O,
    train: Vec<O::Example>,
    valid: &[O::Example],
    steps: usize,
) -> (f64, f64)
where
    ModelOf<O, Train>: AutodiffModule<Train, InnerModule = ModelOf<O, Infer>>,
{
    let _guard = lock();
    let config = config();
    let mut trainer = Trainer::<Train, O>::new(
        objective.clone(),
        config.clone(),
        train,
        &Default::default(),
    )
    .unwrap();
    let nll = |t: &Trainer<Train, O>| {
        evaluate_loss(&objective, &t.inference_model(), &config, valid)
            .unwrap()
            .nll
    };
    let before = nll(&trainer);
    for _ in 0..steps {
        trainer.step().unwrap();
    }
    (before, nll(&trainer))
}

/// Trains 200 steps: the untrained model's validation loss is near the uniform guess's, ln V,
/// and the trained one's below half of it, ln V / 2 (what a model that learnt the task's rule
/// beats: see each task's expected loss in its test).
fn learns<O: Objective>(objective: O, train: Vec<O::Example>, valid: &[O::Example])
where
    ModelOf<O, Train>: AutodiffModule<Train, InnerModule = ModelOf<O, Infer>>,
{
    let (before, after) = learn(objective, train, valid, 200);
    let uniform = (VOCAB as f64).ln();
    assert!((before - uniform).abs() < 1.0, "untrained: {before}");
    assert!(
        after < uniform / 2.0,
        "after 200 steps: {after} (bound {})",
        uniform / 2.0
    );
}

/// Next-token prediction on counting sequences. A model that learnt the rule pays only for the
/// first token (ln 20 ≈ 3.0) and for where a sequence ends (at most ln 7 ≈ 1.9 spread over its
/// tokens): ≈ 0.9 nats per predicted token on average, below ln 24 / 2 ≈ 1.59; an untrained one
/// pays ≈ ln 24 ≈ 3.18.
#[test]
fn objective_lm_learns_to_count() {
    learns(lm(), counting(400, 1), &counting(40, 2));
}

/// Masked-token prediction on sequences of one repeated token: every unmasked token gives the
/// masked ones away, so a model that learnt it pays nearly nothing, far below ln 24 / 2.
#[test]
fn objective_mlm_learns_to_fill_in_repeated_tokens() {
    learns(mlm(), repeated(400, 3), &repeated(40, 4));
}

/// Token accuracy counts the predicted targets that the logits rank first, padding left out:
/// `Outputs::correct` against the same count on the host, for the masked model untrained
/// (misses) and trained (hits), and `evaluate_loss`'s accuracy is that count over the
/// predicted tokens.
#[test]
fn objective_mlm_accuracy_counts_what_the_logits_rank_first() {
    let _guard = lock();
    let objective = mlm();
    let (config, valid) = (config(), repeated(40, 4));
    let mut trainer = Trainer::<Train, MaskedLm>::new(
        objective.clone(),
        config.clone(),
        repeated(400, 3),
        &Default::default(),
    )
    .unwrap();
    let batch: Vec<&Vec<u32>> = valid.iter().collect();
    let draws: Vec<u64> = (0..valid.len() as u64).map(|i| i * 7 + 1).collect();
    let pad = objective.pad_id();
    let mut counts = Vec::new();
    for steps in [0, 60] {
        for _ in 0..steps {
            trainer.step().unwrap();
        }
        let model = trainer.inference_model();
        let out = objective
            .outputs(&model, &batch, &draws, None, &Default::default())
            .unwrap();
        let [_, _, vocab] = out.logits.dims();
        let logits = out.logits.to_data().to_vec::<f32>().unwrap();
        let targets = int_values(out.targets.clone());
        let (mut predicted, mut hits) = (0, 0);
        for (row, &target) in logits.chunks(vocab).zip(&targets) {
            if target == i64::from(pad) {
                continue;
            }
            predicted += 1;
            let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            hits += usize::from(best as i64 == target);
        }
        assert_eq!(out.correct(pad), hits, "after {steps} steps");
        let eval = evaluate_loss(&objective, &model, &config, &valid).unwrap();
        assert!(eval.correct <= eval.tokens);
        assert_eq!(eval.accuracy(), eval.correct as f64 / eval.tokens as f64);
        counts.push((hits, predicted));
    }
    let [(untrained, predicted), (trained, _)] = counts[..] else {
        unreachable!()
    };
    assert!(untrained < predicted && trained > 0, "{counts:?}");
}

/// The masked model's outputs are its full head's logits at the chosen positions, in batch
/// order, and nothing else: the gathered head (dense, GELU, LayerNorm and the vocabulary
/// projection on the chosen rows only) against the head over every position (f32, 1e-5).
#[test]
fn objective_mlm_scores_only_the_chosen_positions() {
    // The model's draws come from the device's one generator, which other tests seed.
    let _guard = lock();
    let objective = mlm();
    let device = Default::default();
    let model = objective.model.init::<Infer>(&device).unwrap();
    let examples = repeated(6, 9);
    let batch: Vec<&Vec<u32>> = examples.iter().collect();
    let draws: Vec<u64> = (0..batch.len() as u64).map(|i| 3 * i + 2).collect();
    let out = objective
        .outputs(&model, &batch, &draws, None, &device)
        .unwrap();

    // The reference: the whole batch through the head, then the chosen rows read on the host.
    let maskings: Vec<_> = batch
        .iter()
        .zip(&draws)
        .map(|(example, &draw)| mask_tokens(&objective, example, draw))
        .collect();
    let rows: Vec<Vec<u32>> = maskings
        .iter()
        .map(|m| [vec![BOS], m.input.clone(), vec![EOS]].concat())
        .collect();
    let len = rows.iter().map(Vec::len).max().unwrap();
    let ids = padded_ids::<Infer, u32>(&rows, objective.pad_id(), PadSide::Right, &device);
    let mask = model.padding_mask(ids.clone());
    let hidden = model.forward(ids, None, Some(&mask)).unwrap();
    let full = model
        .mlm_logits(hidden)
        .unwrap()
        .to_data()
        .to_vec::<f32>()
        .unwrap();
    let (mut expected_logits, mut expected_targets) = (Vec::new(), Vec::new());
    for (row, (example, masking)) in batch.iter().zip(&maskings).enumerate() {
        for &i in &masking.chosen {
            let at = (row * len + i + 1) * VOCAB;
            expected_logits.extend_from_slice(&full[at..at + VOCAB]);
            expected_targets.push(i64::from(example[i]));
        }
    }

    assert_eq!(out.logits.dims(), [1, expected_targets.len(), VOCAB]);
    assert_eq!(int_values(out.targets), expected_targets);
    let logits = out.logits.to_data().to_vec::<f32>().unwrap();
    for (k, (a, b)) in logits.iter().zip(&expected_logits).enumerate() {
        assert!((a - b).abs() <= 1e-5, "logit {k}: gathered {a}, full {b}");
    }
}

/// BERT's masking: about 15% of the positions chosen (at least one per sequence), of which
/// about 80% become the mask token, 10% a random ordinary token and 10% stay; the same draw
/// always masks the same way.
#[test]
fn objective_mlm_masks_as_bert_does() {
    let objective = mlm();
    let tokens: Vec<u32> = (0..10_000).map(|i| FIRST + (i % 19) as u32).collect();
    let masking = mask_tokens(&objective, &tokens, 11);
    assert_eq!(masking, mask_tokens(&objective, &tokens, 11));
    let chosen = masking.chosen.len() as f64 / tokens.len() as f64;
    assert!((chosen - 0.15).abs() < 0.01, "chosen share {chosen}");
    let (mut masked, mut kept, mut random) = (0, 0, 0);
    for &i in &masking.chosen {
        match masking.input[i] {
            t if t == objective.mask_id => masked += 1,
            t if t == tokens[i] => kept += 1,
            t => {
                assert!(t >= FIRST && (t as usize) < VOCAB - 1, "random token {t}");
                random += 1;
            }
        }
    }
    let n = masking.chosen.len() as f64;
    // A random draw equal to the original token counts as kept: 1/19 of the 10%.
    for (what, count, expected) in [
        ("mask", masked, 0.8),
        ("random", random, 0.1 * 18.0 / 19.0),
        ("kept", kept, 0.1 + 0.1 / 19.0),
    ] {
        let share = f64::from(count) / n;
        assert!(
            (share - expected).abs() < 0.03,
            "{what}: {share} vs {expected}"
        );
    }
    // A short sequence with no position drawn still gets one.
    assert!((0..200).all(|d| !mask_tokens(&objective, &[5, 6], d).chosen.is_empty()));
}

/// Collects the training steps' losses and learning rates.
#[derive(Default)]
struct Losses(Vec<(usize, f64, f64)>);

impl Observer for Losses {
    fn event(&mut self, event: &Event<'_>) -> Result<(), TrainError> {
        if let Event::Step {
            report: StepReport { step, loss, lr, .. },
            ..
        } = event
        {
            self.0.push((*step, *loss, *lr));
        }
        Ok(())
    }
}

/// Runs `objective` through [`Trainer::run`] to 8 steps in one go, and in another directory to
/// 4 steps, then (a new process would do the same) opened again and run to 8: the resumed
/// steps' losses and learning rates, and the final models' validation losses, equal the
/// uninterrupted run's (≤ 1e-4, see `xfmr_train::trainer` on why not bit for bit).
fn resumes_exactly<O: Objective>(objective: O, train: Vec<O::Example>, valid: &[O::Example])
where
    ModelOf<O, Train>: AutodiffModule<Train, InnerModule = ModelOf<O, Infer>>,
{
    let _guard = lock();
    let device = Default::default();
    let config = config()
        .with_accumulate(2)
        .with_checkpoint_every(2)
        .with_eval_every(4);
    let run = |dir: &Path, steps: usize| {
        let mut losses = Losses::default();
        let mut trainer = Trainer::<Train, O>::open(
            dir,
            objective.clone(),
            config.clone().with_steps(steps),
            train.clone(),
            &device,
        )
        .unwrap();
        let summary = trainer.run(dir, valid, &mut losses).unwrap();
        (losses.0, summary)
    };
    let dir = tempfile::tempdir().unwrap();
    let (straight, whole) = run(&dir.path().join("straight"), 8);
    assert_eq!(straight.len(), 8);
    let resumed_dir = dir.path().join("resumed");
    let (head, first) = run(&resumed_dir, 4);
    let (tail, second) = run(&resumed_dir, 8);
    assert_eq!((first.step, second.start_step, second.step), (4, 4, 8));
    let resumed: Vec<_> = head.into_iter().chain(tail).collect();
    assert_eq!(resumed.len(), 8);
    for (a, b) in resumed.iter().zip(&straight) {
        assert_eq!((a.0, a.2), (b.0, b.2), "steps and learning rates");
        assert!(
            (a.1 - b.1).abs() <= 1e-4,
            "step {}: {} vs {}",
            a.0,
            a.1,
            b.1
        );
    }
    let (a, b) = (whole.validation.unwrap(), second.validation.unwrap());
    assert!((a.loss - b.loss).abs() <= 1e-4, "validation {a:?} vs {b:?}");
    // Control: the runs did train (the loss moved), so equal losses are not two frozen models.
    assert!((straight[0].1 - straight[7].1).abs() > 1e-2, "{straight:?}");
}

#[test]
fn objective_translation_resumes_exactly_through_run() {
    resumes_exactly(translation(), copies(60, 5), &copies(10, 6));
}

#[test]
fn objective_lm_resumes_exactly() {
    resumes_exactly(lm(), counting(60, 7), &counting(10, 8));
}

#[test]
fn objective_mlm_resumes_exactly() {
    resumes_exactly(mlm(), repeated(60, 9), &repeated(10, 10));
}

/// The final model of `dir` (its checkpoint at step 6).
fn final_params<O: Objective>(dir: &Path) -> Vec<Vec<f32>> {
    let step6 = dir.join("checkpoints/step-00000006");
    let (_, model) = load_model::<Infer, O::Config>(&step6, &Default::default()).unwrap();
    params::<Infer>(&model)
}

/// Two replicas in one process (two threads sharing ndarray's device, burn's collective
/// summing their gradients) train as one: after 6 steps the parameters equal a single
/// process's to 1e-4. Dropout is off and Adam's ε is 0.1 for the reason the CLI's
/// data-parallel test gives (`crates/xfmr-cli/tests/cli/parallel.rs`): a gradient that is zero but for
/// rounding moves by ±lr under ε = 1e-9 whichever way it rounds.
fn two_replicas_train_as_one<O: Objective>(objective: O, train: Vec<O::Example>)
where
    ModelOf<O, Train>: AutodiffModule<Train, InnerModule = ModelOf<O, Infer>>,
{
    let _guard = lock();
    let device = Default::default();
    let config = config()
        .with_steps(6)
        .with_epsilon(0.1)
        .with_checkpoint_every(3);
    let dir = tempfile::tempdir().unwrap();
    let (single, parallel) = (dir.path().join("single"), dir.path().join("parallel"));
    let mut alone =
        Trainer::<Train, O>::new(objective.clone(), config.clone(), train.clone(), &device)
            .unwrap();
    alone.run(&single, &[], &mut Silent).unwrap();

    let replicas = (0..2)
        .map(|_| {
            Trainer::<Train, O>::new(objective.clone(), config.clone(), train.clone(), &device)
        })
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let data_parallel = DataParallelConfig::new(1, 0, "127.0.0.1:1", "127.0.0.1", 2)
        .with_devices(2)
        .with_timeout(Duration::from_secs(120));
    let (mut a, mut b) = (Silent, Silent);
    let summary = run_replicas(
        replicas,
        Some(&data_parallel),
        &[(7, "a value both hold")],
        &parallel,
        &[],
        vec![&mut a as &mut (dyn Observer + Send), &mut b],
        &|e| panic!("a replica failed: {e}"),
    )
    .unwrap();
    assert_eq!(summary.step, 6);
    let (expected, got) = (final_params::<O>(&single), final_params::<O>(&parallel));
    let worst = expected
        .iter()
        .flatten()
        .zip(got.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-4, "max |parallel − single| = {worst}");
    // Control: training moved the weights far more than that.
    let start = dir.path().join("start");
    let untrained =
        Trainer::<Train, O>::new(objective, config.with_steps(0), train, &device).unwrap();
    untrained.save_checkpoint(&start).unwrap();
    let (_, initial) = load_model::<Infer, O::Config>(
        &start.join("checkpoints/step-00000000"),
        &Default::default(),
    )
    .unwrap();
    let moved = params::<Infer>(&initial)
        .iter()
        .flatten()
        .zip(expected.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(moved > 1e-3, "6 steps moved the weights by only {moved}");
}

#[test]
fn objective_translation_two_replicas_train_as_one() {
    let objective = Translation::new(
        TransformerConfig::tiny(VOCAB).map_layer(|l| l.with_dropout(0.0)),
        BOS,
        EOS,
    );
    two_replicas_train_as_one(objective, copies(40, 11));
}

#[test]
fn objective_lm_two_replicas_train_as_one() {
    let model = lm().model.map_layer(|l| l.with_dropout(0.0));
    let objective = CausalLm::new(model, BOS, EOS);
    two_replicas_train_as_one(objective, counting(40, 12));
}

#[test]
fn objective_mlm_two_replicas_train_as_one() {
    let model = mlm()
        .model
        .map_layer(|l| l.with_dropout(0.0).with_attention_dropout(0.0));
    two_replicas_train_as_one(
        MaskedLm::new(model, VOCAB as u32 - 1, FIRST, BOS, EOS),
        repeated(40, 13),
    );
}

/// Two replicas in one process on flex, with dropout on (0.1 everywhere, the lm recipe's):
/// the run repeats bit for bit. Both replicas share flex's one generator; each draws its
/// masks from its own thread's stream of seeds (`with_dropout_seed`), so the scheduler's
/// interleaving of the two cannot change them, and each runs its kernels on a pool of its own.
#[test]
fn objective_lm_two_replicas_on_flex_repeat_with_dropout() {
    use burn::backend::Flex;
    type FlexTrain = Autodiff<Flex>;
    let _guard = lock();
    let device = Default::default();
    let model = DecoderOnlyConfig::tiny(VOCAB)
        .with_max_len(32)
        .map_layer(|l| l.with_dropout(0.1).with_attention_dropout(0.1));
    let objective = CausalLm::new(model, BOS, EOS);
    let config = config().with_steps(6).with_checkpoint_every(3);
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        let replicas = (0..2)
            .map(|_| {
                Trainer::<FlexTrain, CausalLm>::new(
                    objective.clone(),
                    config.clone(),
                    counting(40, 21),
                    &device,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let data_parallel = DataParallelConfig::new(1, 0, "127.0.0.1:1", "127.0.0.1", 2)
            .with_devices(2)
            .with_timeout(Duration::from_secs(120));
        let (mut a, mut b) = (Silent, Silent);
        let out = dir.path().join(name);
        run_replicas(
            replicas,
            Some(&data_parallel),
            &[],
            &out,
            &[],
            vec![&mut a as &mut (dyn Observer + Send), &mut b],
            &|e| panic!("a replica failed: {e}"),
        )
        .unwrap();
        final_params::<CausalLm>(&out)
    };
    let (first, second) = (run("first"), run("second"));
    assert!(
        first == second,
        "two runs of one seed trained different weights"
    );
}

/// A wall-clock budget stops the run before its step budget, with a checkpoint of the last
/// step and the final model; `Stop::Minutes` says why.
#[test]
fn objective_lm_run_stops_at_its_time_budget() {
    let _guard = lock();
    let dir = tempfile::tempdir().unwrap();
    // 60 ms: the first step starts well within it, and a step takes longer than that here.
    let config = config().with_steps(1000).with_minutes(Some(0.001));
    let mut trainer =
        Trainer::<Train, CausalLm>::new(lm(), config, counting(40, 14), &Default::default())
            .unwrap();
    let summary = trainer.run(dir.path(), &[], &mut Silent).unwrap();
    assert_eq!(summary.stop, xfmr_train::trainer::Stop::Minutes);
    assert!((1..1000).contains(&summary.step), "{summary:?}");
    let last = xfmr_train::RunDir::new(dir.path())
        .latest_checkpoint()
        .unwrap()
        .unwrap();
    assert!(last.ends_with(format!("step-{:08}", summary.step)));
    assert!(summary.final_model.unwrap().join("model.mpk").exists());
}
