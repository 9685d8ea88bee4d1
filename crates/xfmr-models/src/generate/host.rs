//! A model's decoding steps with logits on the host ([`HostSteps`]), what every search and
//! decoding loop runs over, and the one adapter through which tensor models give them
//! ([`TensorSteps`]).

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::IncrementalDecoder;
use crate::{int_tensor, ModelError};

/// Decoding steps of a batch of rows, each with its own key/value cache, whose logits come
/// back in host memory: what [`search`](super::search) (greedy, sampled and beam search) and
/// `xfmr-llm`'s decoding loop drive.
///
/// A model that computes on the host (`xfmr-llm`'s `QuantizedLlama`) implements it directly,
/// building no backend tensor; tensor models go through [`TensorSteps`].
pub trait HostSteps {
    /// Size of the output vocabulary: the length of each row of logits.
    fn vocab_size(&self) -> usize;

    /// Feeds `tokens`, `[rows, width]` row-major (`width ≥ 1`, one row per row of the state),
    /// after everything each row has been fed, and returns the logits that follow the last of
    /// them, `[rows, vocab]` row-major, lent until the next call (the caller may change them
    /// in place). With `need_attention`, a model with cross-attention keeps the step's
    /// attention for [`take_attention`](Self::take_attention).
    ///
    /// # Errors
    /// Ids outside the vocabulary, a context longer than the model's, a token count that is
    /// not `rows × width`.
    fn step(
        &mut self,
        tokens: &[u32],
        width: usize,
        need_attention: bool,
    ) -> Result<&mut [f32], ModelError>;

    /// The last step's cross-attention of each row's last query over the source, `[rows][src]`
    /// (last decoder layer, averaged over heads), when it was asked for and the model has
    /// one.
    fn take_attention(&mut self) -> Option<Vec<Vec<f32>>> {
        None
    }

    /// Reorders (or repeats) the rows: row `i` becomes old row `indices[i]`.
    fn reorder(&mut self, indices: &[usize]);
}

/// Any [`IncrementalDecoder`] (xfmr's `f32` models, on any backend) as [`HostSteps`]: each
/// step's token ids go to the device as a tensor and its logits come back to the host. The
/// one adapter between tensor models and the host searches.
pub struct TensorSteps<'m, B: Backend, M: IncrementalDecoder<B>> {
    model: &'m M,
    /// The model's decoding state (its caches).
    pub state: M::State,
    device: B::Device,
    logits: Vec<f32>,
    attention: Option<Vec<Vec<f32>>>,
}

impl<'m, B: Backend, M: IncrementalDecoder<B>> TensorSteps<'m, B, M> {
    /// Steps of `model` from `state`.
    pub fn new(model: &'m M, state: M::State) -> Self {
        Self {
            device: model.device(),
            model,
            state,
            logits: Vec::new(),
            attention: None,
        }
    }
}

impl<B: Backend, M: IncrementalDecoder<B>> HostSteps for TensorSteps<'_, B, M> {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn step(
        &mut self,
        tokens: &[u32],
        width: usize,
        need_attention: bool,
    ) -> Result<&mut [f32], ModelError> {
        if width == 0 || tokens.is_empty() || !tokens.len().is_multiple_of(width) {
            return Err(ModelError::InvalidInput(format!(
                "a step of {} tokens in rows of {width}",
                tokens.len()
            )));
        }
        crate::check_vocabulary(tokens, self.model.vocab_size(), "token")?;
        let ids: Tensor<B, 2, Int> = int_tensor::<B, 2>(
            tokens.iter().map(|&t| i64::from(t)).collect(),
            [tokens.len() / width, width],
            &self.device,
        );
        let step = self.model.step(&mut self.state, ids, need_attention)?;
        self.logits = step
            .logits
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| ModelError::InvalidInput(format!("logits: {e:?}")))?;
        self.attention = match step.attention {
            None => None,
            Some(a) => {
                let [_, src] = a.dims();
                let values = a
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| ModelError::InvalidInput(format!("attention: {e:?}")))?;
                Some(values.chunks(src.max(1)).map(<[f32]>::to_vec).collect())
            }
        };
        Ok(&mut self.logits)
    }

    fn take_attention(&mut self) -> Option<Vec<Vec<f32>>> {
        self.attention.take()
    }

    fn reorder(&mut self, indices: &[usize]) {
        self.model.reorder(&mut self.state, indices);
    }
}
