//! [`QuantizedSteps`]: the quantised model's decoding steps over a batch of sequences, each
//! with its own cache, logits in host memory: what the library's searches
//! ([`xfmr_models::generate::search`]: greedy, sampled, beam) and the decoding loop
//! ([`crate::decode::run`]) drive. No backend tensor is built.

use xfmr_models::generate::HostSteps;
use xfmr_models::ModelError;

use xfmr_kernels::HeadCache;

use super::{QuantizedLlama, Scratch, SequenceCache};

/// [`QuantizedLlama`] over some sequences' key/value caches (rows), as [`HostSteps`]: a step
/// feeds every row at once (the weights streamed once for all of them) and lends the logits
/// from one buffer reused every step.
#[derive(Debug)]
pub struct QuantizedSteps<'m> {
    model: &'m QuantizedLlama,
    rows: Vec<SequenceCache>,
    scratch: Scratch,
    /// The ids fed to each row at the last step (its leading padding dropped).
    fed: Vec<Vec<u32>>,
}

impl<'m> QuantizedSteps<'m> {
    /// Steps of `model` over one sequence from `cache` (empty, or restored from a
    /// [`PrefixCache`](super::PrefixCache)).
    pub fn new(model: &'m QuantizedLlama, cache: SequenceCache) -> Self {
        Self::from_caches(model, vec![cache])
    }

    /// Steps of `model` over one row per cache.
    pub fn from_caches(model: &'m QuantizedLlama, rows: Vec<SequenceCache>) -> Self {
        Self {
            model,
            rows,
            scratch: Scratch::new(),
            fed: Vec::new(),
        }
    }

    /// Each row's cache.
    pub fn caches(&self) -> &[SequenceCache] {
        &self.rows
    }

    /// Drops the first `skip[i]` tokens of row `i`'s first step (left padding of a batch of
    /// prompts of unequal lengths: never fed, so each row decodes as it would alone).
    pub fn skip_first(&mut self, skip: &[usize]) {
        for (row, &skip) in self.rows.iter_mut().zip(skip) {
            row.skip = skip;
        }
    }
}

impl HostSteps for QuantizedSteps<'_> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn step(
        &mut self,
        tokens: &[u32],
        width: usize,
        _need_attention: bool,
    ) -> Result<&mut [f32], ModelError> {
        let rows = self.rows.len();
        if width == 0 || tokens.len() != rows * width {
            return Err(ModelError::InvalidInput(format!(
                "a step of {} tokens in rows of {width} for {rows} rows",
                tokens.len()
            )));
        }
        self.fed.resize_with(rows, Vec::new);
        for ((fed, row), ids) in self
            .fed
            .iter_mut()
            .zip(&mut self.rows)
            .zip(tokens.chunks_exact(width))
        {
            // A row's padding is at most all but its last token of the first step.
            let skip = std::mem::take(&mut row.skip).min(width - 1);
            fed.clear();
            fed.extend_from_slice(&ids[skip..]);
        }
        if let ([row], [ids]) = (self.rows.as_mut_slice(), self.fed.as_slice()) {
            // One sequence (decoding a prompt): no list of rows to allocate per step.
            return self
                .model
                .forward_batch_in(&mut [(row, ids.as_slice())], &mut self.scratch);
        }
        let mut batch: Vec<(&mut SequenceCache, &[u32])> = self
            .rows
            .iter_mut()
            .zip(&self.fed)
            .map(|(row, ids)| (row, ids.as_slice()))
            .collect();
        self.model.forward_batch_in(&mut batch, &mut self.scratch)
    }

    /// Moves each row whose last use this is, copies the others (keeping the reserved
    /// capacity, so that the copies grow without reallocating).
    fn reorder(&mut self, indices: &[usize]) {
        let mut last_use = vec![None; self.rows.len()];
        for (i, &from) in indices.iter().enumerate() {
            last_use[from] = Some(i);
        }
        let mut old: Vec<Option<SequenceCache>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        let mut rows: Vec<Option<SequenceCache>> = indices
            .iter()
            .enumerate()
            .map(|(i, &from)| match last_use[from] == Some(i) {
                true => None,
                false => Some(old[from].as_ref().expect("not moved yet").copy()),
            })
            .collect();
        for (i, &from) in indices.iter().enumerate() {
            if rows[i].is_none() {
                rows[i] = old[from].take();
            }
        }
        self.rows = rows
            .into_iter()
            .map(|r| r.expect("every row set"))
            .collect();
    }
}

impl SequenceCache {
    /// A copy with the same reserved room (`clone` keeps lengths, not capacities).
    fn copy(&self) -> Self {
        Self {
            heads: self.heads.iter().map(HeadCache::copy_reserved).collect(),
            len: self.len,
            skip: self.skip,
        }
    }
}
