//! Rows of token ids made into one batch: the one padding helper of the workspace (training
//! batches, generation prompts, sentence embeddings and the quantised model all pad through
//! it), and the one framing of a sequence by its special tokens ([`framed`]).

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

/// Which end of a row its padding goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadSide {
    /// After the tokens: encoders, teacher-forced training (a padding mask hides it).
    Right,
    /// Before the tokens: prompts of a decoder-only model, so that every row's last token is
    /// at the same position and generation appends to all rows alike.
    Left,
}

/// `rows` padded with `pad` to the longest row's length, each row's tokens kept in order on
/// the other side of its padding.
pub fn pad_rows<T: Copy>(rows: &[impl AsRef<[T]>], pad: T, side: PadSide) -> Vec<Vec<T>> {
    let len = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    rows.iter()
        .map(|row| {
            let row = row.as_ref();
            let padding = std::iter::repeat_n(pad, len - row.len());
            match side {
                PadSide::Right => row.iter().copied().chain(padding).collect(),
                PadSide::Left => padding.chain(row.iter().copied()).collect(),
            }
        })
        .collect()
}

/// `[start] ids [end]`: a token sequence framed by the special ids a model reads and predicts
/// around it (`None`: no token on that side). The one framing of the objectives and of
/// inference: the causal model reads `[bos] ids` and predicts `ids [eos]`, the masked model
/// reads `[bos] ids [eos]`, the translation model's encoder `ids [eos]`.
pub fn framed(start: Option<u32>, ids: &[u32], end: Option<u32>) -> Vec<u32> {
    start
        .into_iter()
        .chain(ids.iter().copied())
        .chain(end)
        .collect()
}

/// `rows` padded as [`pad_rows`] does, as one integer tensor.
///
/// # Shapes
/// - output: `[rows, longest]` (`[rows, 0]` when every row is empty; `[0, 0]` for no rows)
pub fn padded_ids<B: Backend, T: Copy + Into<i64>>(
    rows: &[impl AsRef<[T]>],
    pad: T,
    side: PadSide,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let padded = pad_rows(rows, pad, side);
    let len = padded.first().map_or(0, Vec::len);
    let flat: Vec<i64> = padded.into_iter().flatten().map(Into::into).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), len]), device)
}
