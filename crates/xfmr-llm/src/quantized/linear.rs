//! A linear layer whose weight stays in its GGUF blocks.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;
use xfmr_kernels::quant::{ActivationRows, Layout, Path, QuantizedMatrix};

use crate::gguf::{GgmlType, Gguf, GgufError};

/// `y = x Wᵀ` (no bias) with `W` (`[out, in]`) kept as stored in a GGUF file: the blocks of a
/// quantised type (products on the blocks with activations quantised to `i8` per block of 32,
/// see [`xfmr_kernels::quant`]), or `f32` values for `F32`/`F16`/`BF16` tensors (products in
/// `f32`).
///
/// Not a burn `Module`: its weights are constants read from a file, not parameters to train.
/// It runs on the host; [`forward`](Self::forward) takes and returns tensors of any backend
/// (on `flex` the host copies are its own buffers).
#[derive(Debug, Clone)]
pub struct QuantizedLinear {
    weight: Weight,
}

#[derive(Debug, Clone)]
enum Weight {
    Blocks(QuantizedMatrix),
    Dense {
        values: Vec<f32>,
        rows: usize,
        cols: usize,
    },
}

/// How [`QuantizedLinear::forward_fused`] multiplies quantised blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activations {
    /// Activations quantised to `i8` per block of 32, integer products on the blocks
    /// (llama.cpp's scheme; the fast path).
    #[default]
    Int8,
    /// The weights dequantised to `f32` on each call and multiplied with `f32` activations:
    /// a slow reference that isolates the model's arithmetic from the activation
    /// quantisation (tests).
    F32,
}

/// Buffers a product reuses between calls (no allocation per token once warm).
#[derive(Debug, Default)]
pub struct ProductScratch {
    acts: ActivationRows,
    part: Vec<f32>,
}

impl QuantizedLinear {
    /// The 2-D tensor `name` of `gguf` (`[out, in]`), kept as stored: quantised types share the
    /// file's buffer, float types are widened to `f32`.
    ///
    /// # Errors
    /// [`GgufError::NoTensor`]; a tensor that is not 2-D or not `[rows, cols]` when given
    /// ([`GgufError::Metadata`]); an unsupported type; a corrupt block.
    pub fn from_gguf(
        gguf: &Gguf,
        name: &str,
        expected: Option<[usize; 2]>,
    ) -> Result<Self, GgufError> {
        Self::from_gguf_in(gguf, name, expected, Layout::Rows)
    }

    /// As [`from_gguf`](Self::from_gguf), the blocks of a quantised tensor in `layout`:
    /// [`Layout::Interleaved`] for a tensor whose bytes the caller checked and permuted in
    /// place ([`QuantizedLlama::from_gguf_owned`](crate::QuantizedLlama::from_gguf_owned)).
    pub(crate) fn from_gguf_in(
        gguf: &Gguf,
        name: &str,
        expected: Option<[usize; 2]>,
        layout: Layout,
    ) -> Result<Self, GgufError> {
        let info = gguf
            .tensor(name)
            .ok_or_else(|| GgufError::NoTensor(name.into()))?;
        let shape = info.shape();
        let &[rows, cols] = &shape[..] else {
            return Err(GgufError::metadata(
                name,
                format!("shape {shape:?} is not 2-D"),
            ));
        };
        if let Some(want) = expected.filter(|w| *w != [rows, cols]) {
            return Err(GgufError::metadata(
                name,
                format!("shape {shape:?}, the model needs {want:?}"),
            ));
        }
        let weight = match info.ty {
            GgmlType::Quant(format) => {
                let (data, range) = match layout {
                    Layout::Rows => gguf.tensor_data(info)?,
                    Layout::Interleaved => gguf.tensor_bytes(info),
                };
                let matrix =
                    QuantizedMatrix::from_shared_in(format, data, range, rows, cols, layout)
                        .map_err(|e| GgufError::BadTensor {
                            tensor: name.into(),
                            offset: info.offset as u64,
                            reason: e.to_string(),
                        })?;
                Weight::Blocks(matrix)
            }
            _ => Weight::Dense {
                values: gguf.dequantize_info(info)?,
                rows,
                cols,
            },
        };
        Ok(Self { weight })
    }

    /// Output features (rows of `W`).
    pub fn rows(&self) -> usize {
        match &self.weight {
            Weight::Blocks(m) => m.rows(),
            Weight::Dense { rows, .. } => *rows,
        }
    }

    /// Input features (columns of `W`).
    pub fn cols(&self) -> usize {
        match &self.weight {
            Weight::Blocks(m) => m.cols(),
            Weight::Dense { cols, .. } => *cols,
        }
    }

    /// The weight's block format name (`Q4_1`...), or `F32` for float tensors (`F32`, `F16`
    /// and `BF16` are all held as `f32`).
    pub fn format(&self) -> &'static str {
        match &self.weight {
            Weight::Blocks(m) => m.format().name(),
            Weight::Dense { .. } => "F32",
        }
    }

    /// The layout of the weight's blocks (`None` for float tensors, held as `f32`).
    pub fn layout(&self) -> Option<Layout> {
        match &self.weight {
            Weight::Blocks(m) => Some(m.layout()),
            Weight::Dense { .. } => None,
        }
    }

    /// Bytes the weight holds (its blocks, or its `f32` values).
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::Blocks(m) => m.bytes().len(),
            Weight::Dense { values, .. } => values.len() * 4,
        }
    }

    /// Row `r` of `W` as `f32` (an embedding lookup), into `out` (`cols` values).
    ///
    /// # Panics
    /// If `r ≥ rows` or `out` is not `cols` long.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match &self.weight {
            Weight::Blocks(m) => m.dequantize_row(r, out),
            Weight::Dense { values, cols, .. } => {
                out.copy_from_slice(&values[r * cols..(r + 1) * cols])
            }
        }
    }

    /// `x Wᵀ` for a tensor of any backend.
    ///
    /// # Shapes
    /// - `x`: `[..., in]`
    /// - output: `[..., out]`
    ///
    /// # Panics
    /// If the last dimension of `x` is not `in`, or `x` is not a float tensor.
    pub fn forward<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let device = x.device();
        let mut dims = x.dims();
        assert_eq!(dims[D - 1], self.cols(), "QuantizedLinear: input width");
        let x = x
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("a float tensor");
        let n = x.len() / self.cols();
        let mut y = vec![0f32; n * self.rows()];
        Self::forward_fused(
            &[self],
            &x,
            n,
            &mut y,
            &mut ProductScratch::default(),
            Activations::Int8,
        );
        dims[D - 1] = self.rows();
        Tensor::from_data(TensorData::new(y, dims), &device)
    }

    /// Products of several layers with the same input as one pass: `y` (`[n, Σ out]`) holds
    /// each row's outputs of `parts[0]`, then `parts[1]`... (a fused query/key/value
    /// projection). `x` is `[n, in]`, quantised once for every part.
    ///
    /// # Panics
    /// If the parts' widths differ from `x`'s, or `y` is not `n·Σ out` long.
    pub fn forward_fused(
        parts: &[&Self],
        x: &[f32],
        n: usize,
        y: &mut [f32],
        scratch: &mut ProductScratch,
        activations: Activations,
    ) {
        assert!(
            !parts.is_empty() && parts.iter().all(|p| p.cols() == parts[0].cols()),
            "QuantizedLinear::forward_fused: parts of different widths"
        );
        let cols = parts[0].cols();
        assert_eq!(
            x.len(),
            n * cols,
            "QuantizedLinear::forward_fused: input width"
        );
        if n == 0 {
            return;
        }
        if let (Some(blocks), Activations::Int8) = (matrices(parts), activations) {
            scratch.acts.quantize(x, n, cols);
            QuantizedMatrix::matmul_fused(Path::detect(), &blocks[..parts.len()], &scratch.acts, y);
            return;
        }
        // A dense part, or f32 products: each part on its own, scattered into its columns
        // (the activations quantised once for the block parts).
        let total: usize = parts.iter().map(|p| p.rows()).sum();
        let blocks_i8 = activations == Activations::Int8
            && parts.iter().any(|p| matches!(p.weight, Weight::Blocks(_)));
        if blocks_i8 {
            scratch.acts.quantize(x, n, cols);
        }
        let mut start = 0;
        for part in parts {
            let rows = part.rows();
            scratch.part.clear();
            scratch.part.resize(n * rows, 0.0);
            match &part.weight {
                Weight::Blocks(m) if activations == Activations::F32 => {
                    dense_product(&m.dequantize(), cols, x, n, &mut scratch.part)
                }
                Weight::Blocks(m) => {
                    QuantizedMatrix::matmul_fused(
                        Path::detect(),
                        &[m],
                        &scratch.acts,
                        &mut scratch.part,
                    );
                }
                Weight::Dense { values, cols, .. } => {
                    dense_product(values, *cols, x, n, &mut scratch.part)
                }
            }
            for i in 0..n {
                y[i * total + start..i * total + start + rows]
                    .copy_from_slice(&scratch.part[i * rows..(i + 1) * rows]);
            }
            start += rows;
        }
    }
}

/// The most parts of one [`QuantizedLinear::forward_fused`] read as blocks (query, key and
/// value are three).
const MAX_PARTS: usize = 4;

/// The block matrices of `parts` (at most [`MAX_PARTS`], all of them blocks) in the first
/// `parts.len()` places of an array: no list allocated for every product of every token.
fn matrices<'a>(parts: &[&'a QuantizedLinear]) -> Option<[&'a QuantizedMatrix; MAX_PARTS]> {
    let matrix = |p: &'a QuantizedLinear| match &p.weight {
        Weight::Blocks(m) => Some(m),
        Weight::Dense { .. } => None,
    };
    if parts.len() > MAX_PARTS {
        return None;
    }
    let mut out = [matrix(parts.first()?)?; MAX_PARTS];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = matrix(p)?;
    }
    Some(out)
}

/// `y[i][r] = Σ_k w[r][k]·x[i][k]` in `f32`, in parallel over `w`'s rows.
fn dense_product(w: &[f32], cols: usize, x: &[f32], n: usize, y: &mut [f32]) {
    let rows = w.len() / cols;
    if n == 1 {
        // One row (a decoding step): `y` is the only output, no buffer to allocate.
        y.par_iter_mut()
            .zip(w.par_chunks(cols))
            .for_each(|(o, row)| *o = row.iter().zip(x).map(|(a, b)| a * b).sum());
        return;
    }
    let mut transposed = vec![0f32; rows * n];
    transposed
        .par_chunks_mut(n)
        .zip(w.par_chunks(cols))
        .for_each(|(out, row)| {
            for (i, o) in out.iter_mut().enumerate() {
                *o = row
                    .iter()
                    .zip(&x[i * cols..(i + 1) * cols])
                    .map(|(a, b)| a * b)
                    .sum();
            }
        });
    for (r, col) in transposed.chunks_exact(n).enumerate() {
        for (i, v) in col.iter().enumerate() {
            y[i * rows + r] = *v;
        }
    }
}
