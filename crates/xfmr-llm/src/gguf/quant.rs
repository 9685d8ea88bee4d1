//! ggml tensor types and their dequantisation to `f32`.

use std::fmt;

use half::{bf16, f16};
use xfmr_kernels::quant::{self, BlockFormat};

/// A ggml tensor type (the ids of `ggml.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// A quantised block format (`Q4_0` … `Q8_0`, `Q2_K` … `Q8_K`).
    Quant(BlockFormat),
    /// Any other defined type (I-quants, integers, ternary...): known, not read here.
    Other(u32),
}

/// `(ggml id, format)` of the block formats read here.
const FORMATS: [(u32, BlockFormat); 11] = [
    (2, BlockFormat::Q4_0),
    (3, BlockFormat::Q4_1),
    (6, BlockFormat::Q5_0),
    (7, BlockFormat::Q5_1),
    (8, BlockFormat::Q8_0),
    (10, BlockFormat::Q2K),
    (11, BlockFormat::Q3K),
    (12, BlockFormat::Q4K),
    (13, BlockFormat::Q5K),
    (14, BlockFormat::Q6K),
    (15, BlockFormat::Q8K),
];

#[allow(non_upper_case_globals)]
impl GgmlType {
    /// `Q4_0`.
    pub const Q4_0: Self = Self::Quant(BlockFormat::Q4_0);
    /// `Q4_1`.
    pub const Q4_1: Self = Self::Quant(BlockFormat::Q4_1);
    /// `Q5_0`.
    pub const Q5_0: Self = Self::Quant(BlockFormat::Q5_0);
    /// `Q5_1`.
    pub const Q5_1: Self = Self::Quant(BlockFormat::Q5_1);
    /// `Q8_0`.
    pub const Q8_0: Self = Self::Quant(BlockFormat::Q8_0);
    /// `Q2_K`.
    pub const Q2_K: Self = Self::Quant(BlockFormat::Q2K);
    /// `Q3_K`.
    pub const Q3_K: Self = Self::Quant(BlockFormat::Q3K);
    /// `Q4_K`.
    pub const Q4_K: Self = Self::Quant(BlockFormat::Q4K);
    /// `Q5_K`.
    pub const Q5_K: Self = Self::Quant(BlockFormat::Q5K);
    /// `Q6_K`.
    pub const Q6_K: Self = Self::Quant(BlockFormat::Q6K);
    /// `Q8_K`.
    pub const Q8_K: Self = Self::Quant(BlockFormat::Q8K);

    /// The type of a ggml id, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        if let Some(&(_, format)) = FORMATS.iter().find(|(i, _)| *i == id) {
            return Some(Self::Quant(format));
        }
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            30 => Self::Bf16,
            // Q8_1, IQ*, I8..F64, TQ*, MXFP4 (4 and 5 were removed Q4_2/Q4_3).
            9 | 16..=29 | 31..=39 => Self::Other(id),
            _ => return None,
        })
    }

    /// The ggml id (the inverse of [`from_id`](Self::from_id)).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Bf16 => 30,
            Self::Quant(format) => {
                FORMATS
                    .iter()
                    .find(|(_, f)| *f == format)
                    .expect("every format has an id")
                    .0
            }
            Self::Other(id) => id,
        }
    }

    /// `(elements per block, bytes per block)` for the types read here.
    pub(crate) fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Quant(format) => (format.block_len(), format.block_bytes()),
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("F32"),
            Self::F16 => f.write_str("F16"),
            Self::Bf16 => f.write_str("BF16"),
            Self::Quant(format) => f.write_str(format.name()),
            Self::Other(id) => write!(f, "ggml type {id}"),
        }
    }
}

/// Dequantises `count` elements of type `ty` from `data` (which holds exactly their blocks).
pub(crate) fn dequantize(ty: GgmlType, data: &[u8], count: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(count);
    match ty {
        GgmlType::F32 => out.extend(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(
            data.chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::Bf16 => out.extend(
            data.chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::Quant(format) => {
            out.resize(count, 0.0);
            quant::dequantize(format, data, &mut out);
        }
        GgmlType::Other(_) => unreachable!("refused by dequantize_info"),
    }
    debug_assert_eq!(out.len(), count);
    out
}
