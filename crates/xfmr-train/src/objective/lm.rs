//! Causal language modelling (GPT): every token predicted from the ones before it.

use burn::config::Config;
use burn::tensor::backend::Backend;
use xfmr_models::framed;
use xfmr_models::ladder::{record_shape, BatchShape};
use xfmr_models::DecoderOnlyConfig;
use xfmr_translate::SubwordTokenizer;

use super::{
    check_ids, check_length, check_pad, check_smoothing, check_special, padded, position_limit,
    ModelOf, Objective, Outputs,
};
use crate::TrainError;

/// Next-token prediction on token sequences (one sentence, or a window of a text, per example):
/// the model reads the start token followed by the sequence and predicts the sequence followed by
/// the end token, so that generation can start from the start token alone or from a prompt after
/// it, and learns where a sequence ends.
#[derive(Config, Debug)]
pub struct CausalLm {
    /// The model.
    pub model: DecoderOnlyConfig,
    /// Label smoothing ε (GPT: none).
    #[config(default = 0.0)]
    pub label_smoothing: f64,
    /// Start-of-sequence id (the first input): the tokenizer's.
    pub bos_id: u32,
    /// End-of-sequence id (the last prediction): the tokenizer's.
    pub eos_id: u32,
}

impl CausalLm {
    /// The objective for `model` with every special id (the model's padding, start and end)
    /// taken from `tokenizer`, the one place they are defined.
    pub fn for_tokenizer(model: DecoderOnlyConfig, tokenizer: &SubwordTokenizer) -> Self {
        Self::new(
            model.with_pad_id(tokenizer.pad_id()),
            tokenizer.bos_id(),
            tokenizer.eos_id(),
        )
    }
}

impl Objective for CausalLm {
    type Config = DecoderOnlyConfig;
    type Example = Vec<u32>;

    fn model(&self) -> &DecoderOnlyConfig {
        &self.model
    }

    fn d_model(&self) -> usize {
        self.model.layer.d_model
    }

    fn check(&self) -> Result<(), TrainError> {
        check_smoothing(self.label_smoothing)?;
        let vocab = self.model.vocab_size;
        check_special("bos_id", self.bos_id, vocab, self.model.pad_id)?;
        check_special("eos_id", self.eos_id, vocab, self.model.pad_id)?;
        check_pad(self.model.pad_id, vocab)
    }

    fn check_example(&self, example: &Vec<u32>) -> Result<(), String> {
        check_ids(example, self.model.vocab_size, self.model.pad_id)?;
        check_length(example.len() + 1, &self.model.positions, self.model.max_len)
    }

    fn lengths(&self, example: &Vec<u32>) -> (usize, usize) {
        (example.len() + 1, example.len() + 1)
    }

    fn targets(&self, example: &Vec<u32>, _draw: u64) -> usize {
        example.len() + 1
    }

    fn max_positions(&self) -> Option<usize> {
        position_limit(&self.model.positions, self.model.max_len)
    }

    fn label_smoothing(&self) -> f64 {
        self.label_smoothing
    }

    fn pad_id(&self) -> u32 {
        self.model.pad_id
    }

    fn outputs<B: Backend>(
        &self,
        model: &ModelOf<Self, B>,
        batch: &[&Vec<u32>],
        _draws: &[u64],
        shape: Option<BatchShape>,
        device: &B::Device,
    ) -> Result<Outputs<B>, TrainError> {
        let inputs: Vec<Vec<u32>> = batch
            .iter()
            .map(|e| framed(Some(self.bos_id), e, None))
            .collect();
        let outputs: Vec<Vec<u32>> = batch
            .iter()
            .map(|e| framed(None, e, Some(self.eos_id)))
            .collect();
        let pad = self.model.pad_id;
        let input_tokens = inputs.iter().map(Vec::len).sum();
        // A filler row reads the start token and predicts nothing.
        let ids = padded(inputs, pad, &[self.bos_id], shape, device);
        let [rows, len] = ids.dims();
        record_shape("lm", [rows, len, len]);
        Ok(Outputs {
            logits: model.forward(ids)?,
            targets: padded(outputs, pad, &[], shape, device),
            input_tokens,
        })
    }
}
