//! Teacher forcing: shifted inputs, the label-smoothed loss against a host computation, and a
//! short training run that learns to copy.

use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{activation::log_softmax, Tensor};
use xfmr_blocks::LayerConfig;
use xfmr_models::{
    shift_right, GenerationOptions, LabelSmoothedCrossEntropyConfig, SmoothingMass,
    TransformerConfig,
};
use xfmr_testing::{to_vec, TestRng};

use crate::{ids, Cpu, Train, BOS, EOS, PAD};

#[test]
fn shift_right_puts_the_start_token_first() {
    let device = Default::default();
    let tgt = ids::<Cpu>(&[vec![5, 6, 2, 0], vec![7, 2, 0, 0]], &device);
    let shifted = shift_right(tgt, BOS);
    let got: Vec<i64> = shifted.into_data().convert::<i64>().to_vec().unwrap();
    assert_eq!(got, [1, 5, 6, 2, 1, 7, 2, 0]);
}

#[test]
fn label_smoothed_cross_entropy_matches_host_formula() {
    let device = Default::default();
    let mut rng = TestRng::new(3);
    let (batch, seq, vocab) = (2, 3, 5);
    let logits: Tensor<Cpu, 3> = rng.tensor([batch, seq, vocab], 2.0, &device);
    let targets = ids::<Cpu>(&[vec![1, 4, 0], vec![3, 0, 0]], &device);
    let log_probs = to_vec(&log_softmax(logits.clone(), 2));
    let rows = [(0, 1), (1, 4), (3, 3)]; // (row, target) for non-pad positions
    for eps in [0.0, 0.1] {
        let expected: f64 = rows
            .iter()
            .map(|&(r, t)| {
                let lp = &log_probs[r * vocab..(r + 1) * vocab];
                (1.0 - eps) * -lp[t] + eps * -lp.iter().sum::<f64>() / vocab as f64
            })
            .sum::<f64>()
            / rows.len() as f64;
        let loss = LabelSmoothedCrossEntropyConfig::new(PAD)
            .with_epsilon(eps)
            .with_mass(SmoothingMass::AllTokens)
            .init()
            .unwrap();
        let got = to_vec(&loss.forward(logits.clone(), targets.clone()).loss)[0];
        assert!(
            (got - expected).abs() < 1e-5,
            "ε = {eps}: {got} vs {expected}"
        );
    }
}

/// A tiny model trained with teacher forcing on a copy task learns it: the loss falls and
/// greedy decoding reproduces held-in sequences.
#[test]
fn teacher_forcing_learns_to_copy() {
    // Seeding draws on a generator global per device type: train on the fixtures' backend,
    // under their lock, so no other test's draws interleave with this one's (or change them).
    let _guard = crate::training_lock();
    let device = Default::default();
    <Train as burn::tensor::backend::Backend>::seed(&device, 0);
    let layer = LayerConfig::new(32, 2, 64).with_dropout(0.0);
    let config = TransformerConfig::new(12, 12, layer, 1, 1);
    let mut model = config.init::<Train>(&device).unwrap();
    let mut optim = AdamConfig::new().init();
    let mut rng = TestRng::new(7);
    let data: Vec<Vec<u32>> = (0..32)
        .map(|_| (0..4).map(|_| 3 + rng.below(9) as u32).collect())
        .collect();
    let src = ids::<Train>(&data, &device);
    let with_eos: Vec<Vec<u32>> = data
        .iter()
        .map(|s| s.iter().copied().chain([EOS]).collect())
        .collect();
    let tgt = ids::<Train>(&with_eos, &device);
    let tgt_in = shift_right(tgt.clone(), BOS);
    let mut losses = Vec::new();
    for _ in 0..150 {
        let logits = model.forward(src.clone(), tgt_in.clone()).unwrap();
        let loss = crate::nll(logits, tgt.clone());
        losses.push(loss.clone().into_scalar());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.1 * first, "loss {first} -> {last}");
    let eval = model.valid();
    let out = eval
        .generate(&data[..8], BOS, &GenerationOptions::greedy(8, EOS, PAD))
        .unwrap();
    let correct = out
        .best_tokens()
        .iter()
        .zip(&data)
        .filter(|(a, b)| a == b)
        .count();
    assert!(
        correct >= 6,
        "copied {correct} of 8: {:?}",
        out.best_tokens()
    );
}
