//! Sentence embeddings from token ids: right-padded batches, the encoder under the padding
//! mask, pooling and normalisation. [`SentenceEncoder`](crate::SentenceEncoder) runs its
//! pretrained model through it after tokenizing; any other [`EncoderOnly`] model with token ids
//! of its own vocabulary (an `xfmr train --task mlm` run's) can use it the same way.
//!
//! ```
//! use burn::backend::NdArray;
//! use xfmr_models::{EncoderOnlyConfig, Pooling};
//! use xfmr_sentence::Embedder;
//!
//! let device = Default::default();
//! let model = EncoderOnlyConfig::new(50, EncoderOnlyConfig::bert_layer(16, 2, 32), 1)
//!     .init::<NdArray>(&device)
//!     .unwrap();
//! let embedder = Embedder::new(&model, &device).with_pooling(Pooling::Mean);
//! let e = embedder.embed_ids(&[vec![1, 5, 7, 2], vec![1, 9, 2]]).unwrap();
//! assert_eq!((e.len(), e[0].len()), (2, 16));
//! let norm: f32 = e[1].iter().map(|x| x * x).sum::<f32>().sqrt();
//! assert!((norm - 1.0).abs() < 1e-5, "normalised by default");
//! ```

use burn::tensor::{backend::Backend, Tensor};
use xfmr_attention::{with_matmul_precision, MatmulPrecision};
use xfmr_models::generate::Cancel;
use xfmr_models::{l2_normalize, padded_ids, EncoderOnly, PadSide, Pooling};

use crate::{SentenceError, TokenBatch};

/// Turns token id rows into sentence embeddings with an encoder-only model (see the module
/// docs). Defaults: mean pooling, L2-normalised (as sentence-transformers pools MiniLM), 32
/// sentences per forward pass, the model's padding id.
#[derive(Debug, Clone)]
pub struct Embedder<'a, B: Backend> {
    model: &'a EncoderOnly<B>,
    device: B::Device,
    /// The id padded rows are filled with. Default: the model's `pad_id`.
    pub pad_id: u32,
    /// Pooling of the token states. Default: [`Pooling::Mean`].
    pub pooling: Pooling,
    /// Whether embeddings are L2-normalised. Default: true.
    pub normalize: bool,
    /// Sentences per forward pass in [`embed_ids`](Self::embed_ids). Default: 32.
    pub batch_size: usize,
    /// What the model's projections may compute in (`xfmr_attention::with_matmul_precision`
    /// around each forward pass). Default: [`MatmulPrecision::F32`].
    pub precision: MatmulPrecision,
}

impl<'a, B: Backend> Embedder<'a, B> {
    /// An embedder over `model`, its batches created on `device`.
    pub fn new(model: &'a EncoderOnly<B>, device: &B::Device) -> Self {
        Self {
            model,
            device: device.clone(),
            pad_id: model.pad_id,
            pooling: Pooling::Mean,
            normalize: true,
            batch_size: 32,
            precision: MatmulPrecision::F32,
        }
    }

    /// With pooling `pooling`.
    pub fn with_pooling(mut self, pooling: Pooling) -> Self {
        self.pooling = pooling;
        self
    }

    /// With normalisation on or off.
    pub fn with_normalize(mut self, normalize: bool) -> Self {
        self.normalize = normalize;
        self
    }

    /// With `batch_size` sentences per forward pass.
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// With the projections' products in `precision` ([`MatmulPrecision::Bf16`]: `bf16`
    /// factors and `f32` sums where the backend and CPU make that faster).
    pub fn with_precision(mut self, precision: MatmulPrecision) -> Self {
        self.precision = precision;
        self
    }

    /// With padding id `pad_id`.
    pub fn with_pad_id(mut self, pad_id: u32) -> Self {
        self.pad_id = pad_id;
        self
    }

    /// Right-pads token id rows into a batch, with the keep-mask.
    ///
    /// # Errors
    /// [`SentenceError::InvalidInput`] for no rows or an empty row.
    pub fn batch(&self, rows: &[Vec<u32>]) -> Result<TokenBatch<B>, SentenceError> {
        if rows.is_empty() || rows.iter().any(Vec::is_empty) {
            return Err(SentenceError::InvalidInput(
                "a batch needs at least one non-empty token sequence".into(),
            ));
        }
        let ones: Vec<Vec<i64>> = rows.iter().map(|r| vec![1; r.len()]).collect();
        Ok(TokenBatch {
            ids: padded_ids(rows, self.pad_id, PadSide::Right, &self.device),
            keep: padded_ids(&ones, 0, PadSide::Right, &self.device),
            lengths: rows.iter().map(Vec::len).collect(),
        })
    }

    /// Last hidden states of a batch (rows at padded positions are not meaningful).
    ///
    /// # Shapes
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// A sequence longer than the position table.
    pub fn hidden_states(&self, batch: &TokenBatch<B>) -> Result<Tensor<B, 3>, SentenceError> {
        Ok(with_matmul_precision(self.precision, || {
            self.model
                .forward(batch.ids.clone(), None, Some(&batch.mask()))
        })?)
    }

    /// Sentence embeddings of a batch: pooled over its real tokens, then normalised if asked.
    ///
    /// # Shapes
    /// - output: `[batch, d_model]`
    ///
    /// # Errors
    /// As [`hidden_states`](Self::hidden_states).
    pub fn embed_batch(&self, batch: &TokenBatch<B>) -> Result<Tensor<B, 2>, SentenceError> {
        let hidden = self.hidden_states(batch)?;
        let pooled = EncoderOnly::pool(hidden, batch.keep.clone(), self.pooling);
        Ok(if self.normalize {
            l2_normalize(pooled)
        } else {
            pooled
        })
    }

    /// Embeds token id rows, `batch_size` at a time, shortest first (as sentence-transformers,
    /// so that each batch pads little); results come back in input order.
    ///
    /// # Errors
    /// An empty row; as [`hidden_states`](Self::hidden_states).
    pub fn embed_ids(&self, ids: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, SentenceError> {
        self.embed_ids_with_cancel(ids, &Cancel::new())
    }

    /// [`embed_ids`](Self::embed_ids), stopping before each batch once `cancel` is cancelled
    /// (its client gone, its deadline passed).
    ///
    /// # Errors
    /// As [`embed_ids`](Self::embed_ids); `SentenceError::Model(ModelError::Cancelled)` when
    /// cancelled.
    pub fn embed_ids_with_cancel(
        &self,
        ids: &[Vec<u32>],
        cancel: &Cancel,
    ) -> Result<Vec<Vec<f32>>, SentenceError> {
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&i| ids[i].len());
        let mut out = vec![Vec::new(); ids.len()];
        for chunk in order.chunks(self.batch_size.max(1)) {
            cancel.check()?;
            let rows: Vec<Vec<u32>> = chunk.iter().map(|&i| ids[i].clone()).collect();
            let emb = self.embed_batch(&self.batch(&rows)?)?;
            let [n, d] = emb.dims();
            let values = emb
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .map_err(|e| SentenceError::InvalidInput(format!("{e:?}")))?;
            debug_assert_eq!(values.len(), n * d);
            for (&i, row) in chunk.iter().zip(values.chunks(d)) {
                out[i] = row.to_vec();
            }
        }
        Ok(out)
    }
}
