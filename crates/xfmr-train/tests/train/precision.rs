//! Training with `bf16` products (`TrainConfig::matmul_precision`) against the same run in
//! `f32`.

use burn::backend::{Autodiff, Flex};
use xfmr_attention::{takes_bf16_products, MatmulPrecision};
use xfmr_models::TransformerConfig;
use xfmr_train::{Example, TrainConfig, Trainer, Translation};
use xfmr_translate::data::SplitMix64;

use crate::trainer::lock;

type Train = Autodiff<Flex>;

const VOCAB: usize = 24;

/// Copying random id sequences over ids 4..VOCAB.
fn copies(n: usize) -> Vec<Example> {
    let mut rng = SplitMix64(3);
    (0..n)
        .map(|_| {
            let len = 3 + (rng.next() % 8) as usize;
            let src: Vec<u32> = (0..len)
                .map(|_| 4 + (rng.next() % (VOCAB as u64 - 4)) as u32)
                .collect();
            Example {
                tgt: src.clone(),
                src,
            }
        })
        .collect()
}

/// The training losses of `steps` steps of the tiny translation model in `precision`.
fn losses(precision: MatmulPrecision, steps: usize) -> Vec<f64> {
    let objective = Translation::new(TransformerConfig::tiny(VOCAB), 1, 2);
    let config = TrainConfig::new()
        .with_max_tokens(256)
        .with_warmup(20)
        .with_lr_factor(0.1)
        .with_matmul_precision(Some(precision));
    let mut trainer =
        Trainer::<Train>::new(objective, config, copies(200), &Default::default()).unwrap();
    (0..steps)
        .map(|_| trainer.step().expect("a step").loss)
        .collect()
}

/// 120 steps of the tiny translation model (copying) on `Autodiff<Flex>` with `bf16` products
/// (forward and backward) follow the `f32` run's losses: every step's loss within 2% of the
/// `f32` run's (a tolerance fixed before the run: each product's factors are rounded by at
/// most 2⁻⁸ relative, and 120 steps of Adam compound the difference; 0.4% measured on the
/// Intel Xeon kind), and both learn the copy (below a uniform guess's loss at the end).
/// The products are `bf16` ones wherever the CPU multiplies `bf16` in hardware
/// (`takes_bf16_products` agrees with the CPU probe; with `XFMR_REQUIRE_BF16` naming levels,
/// as `.ci/run` sets it from `/proc/cpuinfo`, it must), and there the step took them: the
/// first step's loss (the same initial model, the same batch) differs from the `f32` run's by
/// more than ten times the difference between two `f32` runs' first steps (flex's `f32`
/// products need not repeat bit for bit, so exact equality cannot tell the paths apart).
/// `bf16_linear_autodiff_gradients_within_bound` (xfmr-attention) holds the kernel's
/// gradients to its bound.
#[test]
fn bf16_training_follows_the_f32_loss_trajectory() {
    let _guard = lock();
    let takes = takes_bf16_products::<Train>();
    assert_eq!(takes, xfmr_kernels::cpu::has_bf16_products());
    if std::env::var("XFMR_REQUIRE_BF16").is_ok_and(|levels| !levels.is_empty()) {
        assert!(
            takes,
            "XFMR_REQUIRE_BF16 names levels: the bf16 products must run"
        );
    } else if !takes {
        eprintln!("this CPU has no bf16 products: both runs are f32");
    }
    let steps = 120;
    let f32_losses = losses(MatmulPrecision::F32, steps);
    let bf16_losses = losses(MatmulPrecision::Bf16, steps);
    eprintln!("f32:  {f32_losses:.4?}\nbf16: {bf16_losses:.4?}");
    for (step, (b, f)) in bf16_losses.iter().zip(&f32_losses).enumerate() {
        assert!(
            (b - f).abs() <= 0.02 * f,
            "step {}: loss {b} with bf16 products, {f} in f32",
            step + 1
        );
    }
    let again = losses(MatmulPrecision::F32, 1)[0];
    let (f32_gap, bf16_gap) = (
        (again - f32_losses[0]).abs(),
        (bf16_losses[0] - f32_losses[0]).abs(),
    );
    eprintln!("first step: f32 runs {f32_gap:e} apart, bf16 {bf16_gap:e} from f32");
    if takes {
        assert!(
            bf16_gap > 10.0 * f32_gap,
            "the step did not take bf16 products: the first loss {} with them, {} and {again} \
             in f32",
            bf16_losses[0],
            f32_losses[0]
        );
    }
    // Learning the copy, not only the ids' frequencies: the last ten steps' mean loss below
    // ln 20, that of a uniform guess among the 20 content ids (about where both runs sit
    // from step 12 to step 70).
    let uniform = ((VOCAB - 4) as f64).ln();
    for run in [&f32_losses, &bf16_losses] {
        let tail = run[steps - 10..].iter().sum::<f64>() / 10.0;
        assert!(tail < uniform, "the copy was not learnt: {run:?}");
    }
}
