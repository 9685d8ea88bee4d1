//! Tests of xfmr-models: generation invariants (cached == recomputed, beam 1 == greedy,
//! batched == one by one, seeded sampling), parameter counts against the paper, teacher
//! forcing and training, checkpoints, the encoder-only and decoder-only models, long inputs
//! (an 803-token prompt over a 49,152-token vocabulary on ndarray, flex and wgpu), hostile
//! checkpoints (an edited, re-sealed `config.json`).

mod generation;
mod hf;
mod hostile;
mod long_inputs;
mod loss;
mod models;
mod training;
mod upgrade;
mod variants;

use std::sync::Mutex;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use xfmr_models::{
    shift_right, DecoderOnly, DecoderOnlyConfig, IncrementalDecoder,
    LabelSmoothedCrossEntropyConfig, Transformer, TransformerConfig,
};
use xfmr_testing::{assert_close_slices, to_vec, TestRng};

/// The mean negative log-likelihood of the non-padding targets (the label-smoothed loss at
/// ε = 0).
pub fn nll<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    LabelSmoothedCrossEntropyConfig::new(PAD)
        .with_epsilon(0.0)
        .init()
        .unwrap()
        .forward(logits, targets)
        .loss
}

/// Default CPU backend.
pub type Cpu = NdArray<f32>;
/// Its device.
pub type Device = burn::backend::ndarray::NdArrayDevice;

/// Token ids of the toy models: 0 pad, 1 start, 2 end, 3.. words.
pub const PAD: u32 = 0;
/// Start token.
pub const BOS: u32 = 1;
/// End token.
pub const EOS: u32 = 2;
/// Vocabulary of the toy models.
pub const VOCAB: usize = 24;

/// An int tensor `[rows, len]` from equal-length rows.
pub fn ids<B: Backend>(rows: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2, Int> {
    let len = rows[0].len();
    let flat: Vec<i64> = rows.iter().flatten().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), len]), device)
}

/// A tiny seeded translation model, partly trained (`steps` Adam steps) to reverse word
/// sequences. Random weights make degenerate decoders (the same token at every step, whatever
/// the input), on which the generation invariants would hold trivially; a little training gives
/// input-dependent, still uncertain distributions.
pub fn tiny_transformer(seed: u64) -> Transformer<Cpu> {
    trained_transformer(&TransformerConfig::tiny(VOCAB), seed)
}

/// [`tiny_transformer`] for another configuration (dropout switched off).
pub fn trained_transformer(config: &TransformerConfig, seed: u64) -> Transformer<Cpu> {
    let _guard = training_lock();
    let train_device = Default::default();
    <Train as Backend>::seed(&train_device, seed);
    let config = config.clone().map_layer(|l| l.with_dropout(0.0));
    let mut model = config.init::<Train>(&train_device).unwrap();
    let (src, tgt) = reversal_data(seed);
    let src = ids::<Train>(&src, &train_device);
    let tgt = ids::<Train>(&tgt, &train_device);
    let tgt_in = shift_right(tgt.clone(), BOS);
    let mut optim = AdamConfig::new().init();
    for _ in 0..STEPS {
        let logits = model.forward(src.clone(), tgt_in.clone()).unwrap();
        let loss = nll(logits, tgt.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    to_cpu(
        model.valid(),
        config.init::<Cpu>(&Default::default()).unwrap(),
    )
}

/// A tiny seeded language model, partly trained on "words, then the words reversed, end".
pub fn tiny_lm(seed: u64) -> DecoderOnly<Cpu> {
    trained_lm(&DecoderOnlyConfig::tiny(VOCAB), seed)
}

/// [`tiny_lm`] for another configuration (dropout switched off).
pub fn trained_lm(config: &DecoderOnlyConfig, seed: u64) -> DecoderOnly<Cpu> {
    let _guard = training_lock();
    let train_device = Default::default();
    <Train as Backend>::seed(&train_device, seed);
    let config = config.clone().map_layer(|l| l.with_dropout(0.0));
    let mut model = config.init::<Train>(&train_device).unwrap();
    let (src, tgt) = reversal_data(seed);
    let rows: Vec<Vec<u32>> = src
        .iter()
        .zip(&tgt)
        .map(|(s, t)| {
            s.iter()
                .filter(|&&x| x != PAD)
                .chain(t.iter())
                .copied()
                .collect()
        })
        .collect();
    let width = rows.iter().map(Vec::len).max().unwrap();
    let padded: Vec<Vec<u32>> = rows
        .into_iter()
        .map(|mut r| {
            r.resize(width, PAD);
            r
        })
        .collect();
    let x = ids::<Train>(&padded, &train_device);
    let mut optim = AdamConfig::new().init();
    for _ in 0..STEPS {
        let logits = model.forward(x.clone().narrow(1, 0, width - 1)).unwrap();
        let loss = nll(logits, x.clone().narrow(1, 1, width - 1));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
    }
    to_cpu(
        model.valid(),
        config.init::<Cpu>(&Default::default()).unwrap(),
    )
}

/// Training backend of the fixtures above: flex, which no other test here uses, so that its
/// global (per device type) random generator is drawn from by one fixture at a time (under
/// [`TRAINING`]) and the fixtures are the same whatever tests run beside them.
pub type Train = Autodiff<Flex>;

/// Serialises the fixtures' seeding, lazy initialisation and training.
static TRAINING: Mutex<()> = Mutex::new(());

/// Holds flex's generator for one seeded training run (see [`Train`]).
pub fn training_lock() -> std::sync::MutexGuard<'static, ()> {
    TRAINING.lock().unwrap_or_else(|e| e.into_inner())
}

/// The same weights on flex (under [`TRAINING`]: flex's generator belongs to the fixtures).
pub fn transformer_on_flex(model: &Transformer<Cpu>) -> Transformer<Flex> {
    let _guard = training_lock();
    let target = TransformerConfig::tiny(VOCAB)
        .map_layer(|l| l.with_dropout(0.0))
        .init::<Flex>(&Default::default())
        .unwrap();
    convert::<Cpu, Flex, _, _>(model.clone(), target)
}

/// Moves a module to the test backend through its record bytes (full precision).
fn to_cpu<M: Module<Flex>, N: Module<Cpu>>(model: M, target: N) -> N {
    convert::<Flex, Cpu, M, N>(model, target)
}

/// Copies the weights of `model` (backend `A`) into `target` (backend `C`), an identically
/// configured module, through full-precision record bytes.
fn convert<A: Backend, C: Backend, M: Module<A>, N: Module<C>>(model: M, target: N) -> N {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = Recorder::<A>::record(&recorder, model.into_record(), ()).unwrap();
    let record = Recorder::<C>::load(&recorder, bytes, &target.devices()[0]).unwrap();
    target.load_record(record)
}

/// Adam steps of the partly trained fixtures.
const STEPS: usize = 40;

/// 48 random word sequences (lengths 2–6, right-padded) and their reversals + end token.
fn reversal_data(seed: u64) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut rng = TestRng::new(seed);
    let seqs: Vec<Vec<u32>> = (0..48)
        .map(|_| {
            let len = 2 + rng.below(5);
            (0..len).map(|_| 3 + rng.below(VOCAB - 3) as u32).collect()
        })
        .collect();
    let pad = |mut r: Vec<u32>, w: usize| {
        r.resize(w, PAD);
        r
    };
    let src = seqs.iter().map(|s| pad(s.clone(), 6)).collect();
    let tgt = seqs
        .iter()
        .map(|s| pad(s.iter().rev().copied().chain([EOS]).collect(), 7))
        .collect();
    (src, tgt)
}

/// Source sentences of different lengths.
pub fn sources() -> Vec<Vec<u32>> {
    vec![vec![5, 9, 3, 17, 11, 4], vec![8, 13], vec![21, 6, 6, 10]]
}

/// Greedy decoding by hand through the encoder-decoder's `step`, `steps` tokens after `BOS`: each
/// step's logits must equal the last row of a full recomputation over the prefix (≤ 1e-4).
/// Returns the prefix (`BOS`, then the chosen tokens).
pub fn greedy_by_steps_transformer(
    model: &Transformer<Cpu>,
    src: Vec<u32>,
    steps: usize,
    what: &str,
) -> Vec<u32> {
    let device: Device = Default::default();
    let memory = model.encode(ids::<Cpu>(&[src], &device)).unwrap();
    let mut state = model.start(&memory);
    let mut prefix = vec![BOS];
    let mut next = ids::<Cpu>(&[vec![BOS]], &device);
    for _ in 0..steps {
        let step = model.step(&mut state, next, false).unwrap();
        let full = model
            .decode(ids::<Cpu>(&[prefix.clone()], &device), &memory)
            .unwrap();
        let token = step_equals_last_row(&step.logits, full, what);
        prefix.push(token);
        next = ids::<Cpu>(&[vec![token]], &device);
    }
    prefix
}

/// As [`greedy_by_steps_transformer`] for the decoder-only model: the prompt in one step, then
/// one token at a time. Returns the prompt followed by the chosen tokens.
pub fn greedy_by_steps_lm(
    model: &DecoderOnly<Cpu>,
    prompt: Vec<u32>,
    steps: usize,
    what: &str,
) -> Vec<u32> {
    let device: Device = Default::default();
    let mut state = model.start(1);
    let mut prefix = prompt.clone();
    let mut next = ids::<Cpu>(&[prompt], &device);
    for _ in 0..steps {
        let step = model.step(&mut state, next, false).unwrap();
        let full = model
            .forward(ids::<Cpu>(&[prefix.clone()], &device))
            .unwrap();
        let token = step_equals_last_row(&step.logits, full, what);
        prefix.push(token);
        next = ids::<Cpu>(&[vec![token]], &device);
    }
    prefix
}

/// Asserts a step's `[1, vocab]` logits equal the last row of a full pass `[1, len, vocab]`
/// (≤ 1e-4) and returns the step's argmax, the first on ties (as greedy generation chooses).
fn step_equals_last_row(step: &Tensor<Cpu, 2>, full: Tensor<Cpu, 3>, what: &str) -> u32 {
    let [_, len, vocab] = full.dims();
    let last = full.narrow(1, len - 1, 1).reshape([1, vocab]);
    let logits = to_vec(step);
    assert_close_slices(
        &logits,
        &step.dims(),
        &to_vec(&last),
        &last.dims(),
        1e-4,
        0.0,
        &format!("{what}: cached step logits vs full prefix"),
    );
    (0..vocab)
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

/// `pad_rows` and `padded_ids` (the one padding helper every batch goes through).
#[test]
fn rows_are_padded_on_the_side_asked_and_keep_their_tokens() {
    use xfmr_models::{pad_rows, padded_ids, PadSide};
    let rows = [vec![5u32, 6, 7], vec![8], vec![]];
    assert_eq!(
        pad_rows(&rows, 0, PadSide::Right),
        [vec![5, 6, 7], vec![8, 0, 0], vec![0, 0, 0]]
    );
    assert_eq!(
        pad_rows(&rows, 9, PadSide::Left),
        [vec![5, 6, 7], vec![9, 9, 8], vec![9, 9, 9]]
    );
    let no_rows: [Vec<u32>; 0] = [];
    assert!(pad_rows(&no_rows, 0, PadSide::Right).is_empty());
    let ids = padded_ids::<NdArray, u32>(&rows, 1, PadSide::Left, &Default::default());
    assert_eq!(ids.dims(), [3, 3]);
    let values: Vec<i64> = ids.into_data().convert::<i64>().to_vec().unwrap();
    assert_eq!(values, [5, 6, 7, 1, 1, 8, 1, 1, 1]);
}
