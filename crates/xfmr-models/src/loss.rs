//! Teacher forcing: shifted decoder inputs and the label-smoothed cross-entropy of the paper
//! (§5.4, ε_ls = 0.1).

use burn::tensor::{activation::log_softmax, backend::Backend, Int, Tensor};

/// Decoder input for teacher forcing: the target shifted right behind `bos_id`
/// (`[bos, y₀, …, y_{n-2}]`), so position `i` predicts `yᵢ` from `y_{<i}`.
///
/// # Shapes
/// - `targets`: `[batch, seq]`; output `[batch, seq]`
pub fn shift_right<B: Backend>(targets: Tensor<B, 2, Int>, bos_id: u32) -> Tensor<B, 2, Int> {
    let [batch, seq] = targets.dims();
    let bos = Tensor::<B, 2, Int>::full([batch, 1], bos_id as i64, &targets.device());
    Tensor::cat(vec![bos, targets.narrow(1, 0, seq - 1)], 1)
}

/// Mean cross-entropy over the non-padding targets, with label smoothing `ε`:
/// `(1 − ε)·(−log p(y)) + ε·mean_v(−log p(v))` (the uniform-mixture form used by
/// tensor2tensor and PyTorch's `label_smoothing`). `ε = 0` is plain cross-entropy.
///
/// Padding targets are left out of the average, but the smoothing mass is spread over the whole
/// vocabulary, padding included (hence the name); the trainer's loss,
/// `xfmr_train::loss::label_smoothed_loss_skipping_pad`, gives padding none.
///
/// # Shapes
/// - `logits`: `[batch, seq, vocab]`; `targets`: `[batch, seq]`
/// - output: `[1]`
///
/// # Panics
/// If the shapes disagree.
pub fn cross_entropy_smoothed_over_vocab<B: Backend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
    pad_id: u32,
    label_smoothing: f64,
) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    assert_eq!(
        targets.dims(),
        [batch, seq],
        "cross_entropy_smoothed_over_vocab: targets {:?} do not match logits {:?}",
        targets.dims(),
        logits.dims()
    );
    let log_probs = log_softmax(logits.reshape([batch * seq, vocab]), 1);
    let targets = targets.reshape([batch * seq, 1]);
    let keep = targets
        .clone()
        .not_equal_elem(pad_id as i64)
        .float()
        .reshape([batch * seq]);
    let nll = log_probs
        .clone()
        .gather(1, targets)
        .reshape([batch * seq])
        .neg();
    let smooth = log_probs.mean_dim(1).reshape([batch * seq]).neg();
    let per_token = nll.mul_scalar(1.0 - label_smoothing) + smooth.mul_scalar(label_smoothing);
    let count = keep.clone().sum().clamp_min(1.0);
    (per_token * keep).sum() / count
}
