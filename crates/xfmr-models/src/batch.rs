//! Rows of token ids made into one batch: the one padding helper of the workspace (training
//! batches, generation prompts, sentence embeddings and the quantised model all pad through
//! it).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_padded_on_the_side_asked_and_keep_their_tokens() {
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
        let ids =
            padded_ids::<burn::backend::NdArray, u32>(&rows, 1, PadSide::Left, &Default::default());
        assert_eq!(ids.dims(), [3, 3]);
        let values: Vec<i64> = ids.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(values, [5, 6, 7, 1, 1, 8, 1, 1, 1]);
    }
}
