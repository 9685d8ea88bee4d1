//! The paper's objective: translation with teacher forcing.

use burn::config::Config;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use xfmr_models::framed;
use xfmr_models::ladder::{record_shape, BatchShape};
use xfmr_models::TransformerConfig;
use xfmr_translate::Pair;
use xfmr_translate::SubwordTokenizer;

use super::{
    check_ids, check_length, check_pad, check_smoothing, check_special, padded, position_limit,
    ModelOf, Objective, Outputs,
};
use crate::TrainError;

/// One training pair as token ids, without start or end tokens (the objective adds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Source ids.
    pub src: Vec<u32>,
    /// Target ids.
    pub tgt: Vec<u32>,
}

/// Subword ids of every pair (no start or end tokens: the trainer adds them).
///
/// # Errors
/// [`TrainError::Tokenizer`] if a sentence cannot be encoded.
pub fn encode_pairs(
    tokenizer: &SubwordTokenizer,
    pairs: &[Pair],
) -> Result<Vec<Example>, TrainError> {
    let ids = |text: &str| -> Result<Vec<u32>, TrainError> { Ok(tokenizer.encode(text)?) };
    pairs
        .iter()
        .map(|p| {
            Ok(Example {
                src: ids(&p.src)?,
                tgt: ids(&p.tgt)?,
            })
        })
        .collect()
}

/// A padded translation batch, ready for the model.
#[derive(Debug, Clone)]
pub struct TranslationBatch<B: Backend> {
    /// Sources followed by the end token, right-padded: `[rows, seq_src]`.
    pub src: Tensor<B, 2, Int>,
    /// The start token followed by the targets (teacher forcing): `[rows, seq_tgt]`.
    pub tgt_in: Tensor<B, 2, Int>,
    /// The targets followed by the end token: what each position predicts, `[rows, seq_tgt]`.
    pub tgt_out: Tensor<B, 2, Int>,
    /// Non-padding source tokens.
    pub src_tokens: usize,
    /// Non-padding target tokens (the loss's denominator).
    pub tgt_tokens: usize,
}

impl<B: Backend> TranslationBatch<B> {
    /// Pads `examples` into one batch with the given special ids, each side to its longest
    /// sequence.
    ///
    /// # Panics
    /// If `examples` is empty.
    pub fn new(examples: &[&Example], pad: u32, bos: u32, eos: u32, device: &B::Device) -> Self {
        Self::with_shape(examples, pad, bos, eos, None, device)
    }

    /// [`TranslationBatch::new`], both sides padded to `shape.len` tokens and completed up to
    /// `shape.rows` rows by filler pairs (an empty source and target: the end token read, the
    /// start token fed, nothing predicted); with `None`, as `new`.
    ///
    /// # Panics
    /// If `examples` is empty.
    pub fn with_shape(
        examples: &[&Example],
        pad: u32,
        bos: u32,
        eos: u32,
        shape: Option<BatchShape>,
        device: &B::Device,
    ) -> Self {
        assert!(!examples.is_empty(), "TranslationBatch::new: no examples");
        let rows =
            |f: &dyn Fn(&Example) -> Vec<u32>| examples.iter().map(|e| f(e)).collect::<Vec<_>>();
        let src = rows(&|e| framed(None, &e.src, Some(eos)));
        let tgt_in = rows(&|e| framed(Some(bos), &e.tgt, None));
        let tgt_out = rows(&|e| framed(None, &e.tgt, Some(eos)));
        Self {
            src: padded(src, pad, &[eos], shape, device),
            tgt_in: padded(tgt_in, pad, &[bos], shape, device),
            tgt_out: padded(tgt_out, pad, &[], shape, device),
            src_tokens: examples.iter().map(|e| e.src.len() + 1).sum(),
            tgt_tokens: examples.iter().map(|e| e.tgt.len() + 1).sum(),
        }
    }
}

/// Translation (§5): the encoder reads the source followed by the end token; the decoder reads
/// the start token followed by the target and predicts the target followed by the end token,
/// under the label-smoothed loss (paper: ε = 0.1).
#[derive(Config, Debug)]
pub struct Translation {
    /// The model (its `layer.dropout` is the paper's P_drop, 0.1 for `base`).
    pub model: TransformerConfig,
    /// Label smoothing ε (paper: 0.1).
    #[config(default = 0.1)]
    pub label_smoothing: f64,
    /// Start-of-sentence id (the decoder's first input): the tokenizer's.
    pub bos_id: u32,
    /// End-of-sentence id (appended to sources and targets): the tokenizer's.
    pub eos_id: u32,
}

impl Translation {
    /// The objective for `model` with every special id (the model's padding, start and end)
    /// taken from `tokenizer`, the one place they are defined.
    pub fn for_tokenizer(model: TransformerConfig, tokenizer: &SubwordTokenizer) -> Self {
        Self::new(
            model.with_pad_id(tokenizer.pad_id()),
            tokenizer.bos_id(),
            tokenizer.eos_id(),
        )
    }
}

impl Objective for Translation {
    type Config = TransformerConfig;
    type Example = Example;

    fn model(&self) -> &TransformerConfig {
        &self.model
    }

    fn d_model(&self) -> usize {
        self.model.layer.d_model
    }

    fn check(&self) -> Result<(), TrainError> {
        check_smoothing(self.label_smoothing)?;
        let vocab = self.model.tgt_vocab_size;
        check_special("bos_id", self.bos_id, vocab, self.model.pad_id)?;
        check_special("eos_id", self.eos_id, vocab, self.model.pad_id)?;
        check_pad(self.model.pad_id, vocab)
    }

    fn check_example(&self, example: &Example) -> Result<(), String> {
        check_ids(&example.src, self.model.src_vocab_size, self.model.pad_id)?;
        check_ids(&example.tgt, self.model.tgt_vocab_size, self.model.pad_id)?;
        let (src, tgt) = self.lengths(example);
        check_length(src.max(tgt), &self.model.positions, self.model.max_len)
    }

    fn lengths(&self, example: &Example) -> (usize, usize) {
        (example.src.len() + 1, example.tgt.len() + 1)
    }

    fn targets(&self, example: &Example, _draw: u64) -> usize {
        example.tgt.len() + 1
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
        batch: &[&Example],
        _draws: &[u64],
        shape: Option<BatchShape>,
        device: &B::Device,
    ) -> Result<Outputs<B>, TrainError> {
        let (pad, bos, eos) = (self.model.pad_id, self.bos_id, self.eos_id);
        let batch = TranslationBatch::<B>::with_shape(batch, pad, bos, eos, shape, device);
        let ([rows, src], [_, tgt]) = (batch.src.dims(), batch.tgt_in.dims());
        record_shape("translation", [rows, src, tgt]);
        Ok(Outputs {
            logits: model.forward(batch.src, batch.tgt_in)?,
            targets: batch.tgt_out,
            input_tokens: batch.src_tokens,
        })
    }
}
