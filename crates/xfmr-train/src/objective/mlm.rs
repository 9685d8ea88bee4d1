//! Masked language modelling (BERT, Devlin et al. 2019, §3.1): 15% of the tokens are chosen;
//! of those, 80% are replaced by the mask token, 10% by a random token and 10% kept; the model
//! predicts the chosen tokens from the whole (bidirectional) sequence.

use burn::config::Config;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_models::framed;
use xfmr_models::ladder::{record_shape, BatchShape};
use xfmr_models::EncoderOnlyConfig;
use xfmr_translate::data::SplitMix64;
use xfmr_translate::SubwordTokenizer;

use super::{
    check_ids, check_length, check_pad, check_smoothing, check_special, padded, position_limit,
    ModelOf, Objective, Outputs,
};
use crate::TrainError;

/// The masked-language-model objective on token sequences. The model reads the start token
/// (BERT's `[CLS]`), the sequence with some tokens masked, and the end token (`[SEP]`), and
/// predicts the original tokens at the chosen positions; the start and end tokens are never
/// chosen.
///
/// Departure from BERT: a sequence in which no position was chosen gets one chosen position
/// (drawn uniformly), so every example contributes to the loss and a step never predicts zero
/// tokens. BERT's next-sentence prediction is left out (as in RoBERTa).
#[derive(Config, Debug)]
pub struct MaskedLm {
    /// The model (its `mlm_head` must be on).
    pub model: EncoderOnlyConfig,
    /// The mask token's id (BERT's `[MASK]`).
    pub mask_id: u32,
    /// Share of the positions chosen (BERT: 0.15).
    #[config(default = 0.15)]
    pub mask_prob: f64,
    /// Of the chosen positions, the share replaced by the mask token (BERT: 0.8).
    #[config(default = 0.8)]
    pub replace_prob: f64,
    /// Of the chosen positions, the share replaced by a random token (BERT: 0.1); the rest
    /// keep their token.
    #[config(default = 0.1)]
    pub random_prob: f64,
    /// Random replacements are drawn from ids `first_regular_id..vocab` (not the special
    /// tokens below it, nor the mask token): the tokenizer's first learnt id.
    pub first_regular_id: u32,
    /// Start-of-sequence id (`[CLS]`): the tokenizer's.
    pub bos_id: u32,
    /// End-of-sequence id (`[SEP]`): the tokenizer's.
    pub eos_id: u32,
    /// Label smoothing ε (BERT: none).
    #[config(default = 0.0)]
    pub label_smoothing: f64,
}

impl MaskedLm {
    /// The objective for `model` with every special id (the model's padding, the mask, start
    /// and end, the first regular id) taken from `tokenizer`, the one place they are defined.
    ///
    /// # Errors
    /// [`TrainError::InvalidConfig`] if the vocabulary has no mask token
    /// ([`SubwordTokenizer::with_mask`] adds it).
    pub fn for_tokenizer(
        model: EncoderOnlyConfig,
        tokenizer: &SubwordTokenizer,
    ) -> Result<Self, TrainError> {
        let mask_id = tokenizer.mask_id().ok_or(TrainError::InvalidConfig {
            field: "mask_id",
            value: "none".into(),
            expected: "a vocabulary with the mask token (SubwordTokenizer::with_mask)",
        })?;
        Ok(Self::new(
            model.with_pad_id(tokenizer.pad_id()),
            mask_id,
            tokenizer.first_regular_id(),
            tokenizer.bos_id(),
            tokenizer.eos_id(),
        ))
    }
}

/// One example after masking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masking {
    /// The input ids with the chosen positions replaced (the start and end tokens not
    /// included).
    pub input: Vec<u32>,
    /// The chosen positions (indices into the sequence), ascending.
    pub chosen: Vec<usize>,
}

/// BERT's masking of `tokens` with `draw` (see [`MaskedLm`]); the same draw always gives the
/// same masking.
pub fn mask_tokens(objective: &MaskedLm, tokens: &[u32], draw: u64) -> Masking {
    let mut rng = SplitMix64(draw);
    let mut uniform = move || (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    let mut chosen: Vec<usize> = (0..tokens.len())
        .filter(|_| uniform() < objective.mask_prob)
        .collect();
    if chosen.is_empty() && !tokens.is_empty() {
        chosen.push(((uniform() * tokens.len() as f64) as usize).min(tokens.len() - 1));
    }
    let mut input = tokens.to_vec();
    let regular = objective
        .model
        .vocab_size
        .saturating_sub(objective.first_regular_id as usize);
    for &i in &chosen {
        let u = uniform();
        if u < objective.replace_prob {
            input[i] = objective.mask_id;
        } else if u < objective.replace_prob + objective.random_prob && regular > 0 {
            let id = objective.first_regular_id
                + ((uniform() * regular as f64) as usize).min(regular - 1) as u32;
            // The mask token is never a random replacement: that position keeps its token.
            if id != objective.mask_id {
                input[i] = id;
            }
        }
    }
    Masking { input, chosen }
}

impl Objective for MaskedLm {
    type Config = EncoderOnlyConfig;
    type Example = Vec<u32>;

    fn model(&self) -> &EncoderOnlyConfig {
        &self.model
    }

    fn d_model(&self) -> usize {
        self.model.layer.d_model
    }

    fn check(&self) -> Result<(), TrainError> {
        check_smoothing(self.label_smoothing)?;
        if !self.model.mlm_head {
            return Err(TrainError::InvalidConfig {
                field: "model.mlm_head",
                value: "false".into(),
                expected: "true: the objective predicts tokens through the MLM head",
            });
        }
        let probabilities = [
            ("mask_prob", self.mask_prob),
            ("replace_prob", self.replace_prob),
            ("random_prob", self.random_prob),
            (
                "replace_prob + random_prob",
                self.replace_prob + self.random_prob,
            ),
        ];
        for (field, p) in probabilities {
            if !(0.0..=1.0).contains(&p) || (field == "mask_prob" && p == 0.0) {
                return Err(TrainError::InvalidConfig {
                    field,
                    value: p.to_string(),
                    expected: "a probability (mask_prob above 0)",
                });
            }
        }
        let vocab = self.model.vocab_size;
        check_special("mask_id", self.mask_id, vocab, self.model.pad_id)?;
        check_special("bos_id", self.bos_id, vocab, self.model.pad_id)?;
        check_special("eos_id", self.eos_id, vocab, self.model.pad_id)?;
        check_special(
            "first_regular_id",
            self.first_regular_id,
            vocab,
            self.model.pad_id,
        )?;
        check_pad(self.model.pad_id, vocab)
    }

    fn check_example(&self, example: &Vec<u32>) -> Result<(), String> {
        check_ids(example, self.model.vocab_size, self.model.pad_id)?;
        check_length(example.len() + 2, &self.model.positions, self.model.max_len)
    }

    fn lengths(&self, example: &Vec<u32>) -> (usize, usize) {
        (example.len() + 2, example.len() + 2)
    }

    fn targets(&self, example: &Vec<u32>, draw: u64) -> usize {
        mask_tokens(self, example, draw).chosen.len()
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
        draws: &[u64],
        shape: Option<BatchShape>,
        device: &B::Device,
    ) -> Result<Outputs<B>, TrainError> {
        let pad = self.model.pad_id;
        let (mut inputs, mut chosen) = (Vec::new(), Vec::new());
        for (example, &draw) in batch.iter().zip(draws) {
            let masking = mask_tokens(self, example, draw);
            let row = inputs.len();
            chosen.extend(masking.chosen.iter().map(|&i| (row, i + 1, example[i])));
            inputs.push(framed(Some(self.bos_id), &masking.input, Some(self.eos_id)));
        }
        let input_tokens = inputs.iter().map(Vec::len).sum();
        // A filler row reads the framing of an empty sequence and predicts nothing.
        let filler = [self.bos_id, self.eos_id];
        let ids = padded::<B>(inputs, pad, &filler, shape, device);
        let [rows, len] = ids.dims();
        record_shape("mlm", [rows, len, len]);
        let mask = model.padding_mask(ids.clone());
        let hidden = model.forward(ids, None, Some(&mask))?;
        // The head (dense, GELU, LayerNorm, the vocabulary projection) runs on the chosen
        // positions only, about 15% of them, as BERT's own pre-training code gathers them
        // (`gather_indexes` in google-research/bert): the other positions' logits are never
        // scored. On a ladder the count is padded to a power of two (the first position,
        // target padding), so that it takes few values.
        let mut count = chosen.len().max(1);
        if shape.is_some() {
            count = count.next_power_of_two();
        }
        let (mut positions, mut targets) = (vec![0_i64; count], vec![pad; count]);
        for (k, &(row, position, token)) in chosen.iter().enumerate() {
            positions[k] = (row * len + position) as i64;
            targets[k] = token;
        }
        let [_, _, d_model] = hidden.dims();
        let positions = Tensor::<B, 1, Int>::from_data(TensorData::new(positions, [count]), device);
        let gathered = hidden
            .reshape([rows * len, d_model])
            .select(0, positions)
            .reshape([1, count, d_model]);
        Ok(Outputs {
            logits: model.mlm_logits(gathered)?,
            targets: padded(vec![targets], pad, &[], None, device),
            input_tokens,
        })
    }
}
