//! [`QuantizedLlama`] as an [`IncrementalDecoder`], so that it decodes through
//! [`xfmr_models::generate`] like the `f32` models (greedy, sampled or beam search).

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_models::generate::{IncrementalDecoder, Step};
use xfmr_models::ModelError;

use super::{QuantizedLlama, QuantizedState, SequenceCache};

impl<B: Backend> IncrementalDecoder<B> for QuantizedLlama {
    type State = QuantizedState;

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn device(&self) -> B::Device {
        Default::default()
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: Tensor<B, 2, Int>,
        _need_attention: bool,
    ) -> Result<Step<B>, ModelError> {
        let [batch, new] = tokens.dims();
        if new == 0 || batch != state.rows.len() {
            return Err(ModelError::InvalidInput(format!(
                "a step of [{batch}, {new}] tokens for a state of {} rows",
                state.rows.len()
            )));
        }
        let ids = tokens
            .into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .map_err(|e| ModelError::InvalidInput(format!("token ids: {e:?}")))?;
        let vocab = self.config.vocab_size;
        if let Some(id) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
            return Err(ModelError::InvalidInput(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let fed: Vec<Vec<u32>> = state
            .rows
            .iter_mut()
            .zip(ids.chunks_exact(new))
            .map(|(row, ids)| {
                let skip = std::mem::take(&mut row.skip).min(new);
                ids[skip..].iter().map(|&t| t as u32).collect()
            })
            .collect();
        let mut rows: Vec<(&mut SequenceCache, &[u32])> = state
            .rows
            .iter_mut()
            .zip(&fed)
            .map(|(row, ids)| (row, ids.as_slice()))
            .collect();
        self.forward_rows(&mut rows, &mut state.scratch, None)?;
        let logits = std::mem::take(&mut state.scratch.logits);
        Ok(Step {
            logits: Tensor::from_data(TensorData::new(logits, [batch, vocab]), &Default::default()),
            attention: None,
        })
    }

    fn reorder(&self, state: &mut Self::State, indices: &[usize]) {
        // `Vec::clone` keeps lengths, not capacities: reserve what the originals had.
        state.rows = indices
            .iter()
            .map(|&i| {
                let row = &state.rows[i];
                let copy = |caches: &[Vec<f32>]| {
                    caches
                        .iter()
                        .map(|c| {
                            let mut v = Vec::with_capacity(c.capacity());
                            v.extend_from_slice(c);
                            v
                        })
                        .collect()
                };
                SequenceCache {
                    keys: copy(&row.keys),
                    values: copy(&row.values),
                    len: row.len,
                    skip: row.skip,
                }
            })
            .collect();
    }
}
