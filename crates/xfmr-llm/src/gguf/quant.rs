//! ggml tensor types and their dequantisation to `f32`.

use std::fmt;

use half::{bf16, f16};

/// A ggml tensor type (the ids of `ggml.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, scale only, blocks of 32.
    Q4_0,
    /// 4-bit, scale and minimum, blocks of 32.
    Q4_1,
    /// 8-bit, scale, blocks of 32.
    Q8_0,
    /// Any other defined type (K-quants, I-quants, integers...): known, not dequantised here.
    Other(u32),
}

impl GgmlType {
    /// The type of a ggml id, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            30 => Self::Bf16,
            // Q5_0..Q8_K, IQ*, I8..F64, TQ*, MXFP4 (4 and 5 were removed Q4_2/Q4_3).
            6 | 7 | 9..=29 | 31..=39 => Self::Other(id),
            _ => return None,
        })
    }

    /// The ggml id (the inverse of [`from_id`](Self::from_id)).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::Bf16 => 30,
            Self::Other(id) => id,
        }
    }

    /// `(elements per block, bytes per block)` for the types read here.
    pub(crate) fn block(self) -> Option<(usize, usize)> {
        Some(match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q8_0 => (32, 34),
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
            Self::Q4_0 => f.write_str("Q4_0"),
            Self::Q4_1 => f.write_str("Q4_1"),
            Self::Q8_0 => f.write_str("Q8_0"),
            Self::Other(id) => write!(f, "ggml type {id}"),
        }
    }
}

fn half(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

/// Dequantises `count` elements of type `ty` from `data` (which holds exactly their blocks).
pub(crate) fn dequantize(ty: GgmlType, data: &[u8], count: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(count);
    match ty {
        GgmlType::F32 => out.extend(
            data.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(data.chunks_exact(2).map(half)),
        GgmlType::Bf16 => out.extend(
            data.chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::Q4_0 => {
            for block in data.chunks_exact(18) {
                let d = half(&block[..2]);
                let qs = &block[2..];
                out.extend(qs.iter().map(|&q| d * ((q & 0x0f) as f32 - 8.0)));
                out.extend(qs.iter().map(|&q| d * ((q >> 4) as f32 - 8.0)));
            }
        }
        GgmlType::Q4_1 => {
            for block in data.chunks_exact(20) {
                let d = half(&block[..2]);
                let m = half(&block[2..4]);
                let qs = &block[4..];
                out.extend(qs.iter().map(|&q| d * (q & 0x0f) as f32 + m));
                out.extend(qs.iter().map(|&q| d * (q >> 4) as f32 + m));
            }
        }
        GgmlType::Q8_0 => {
            for block in data.chunks_exact(34) {
                let d = half(&block[..2]);
                out.extend(block[2..].iter().map(|&q| d * (q as i8) as f32));
            }
        }
        GgmlType::Other(_) => unreachable!("refused by dequantize_info"),
    }
    debug_assert_eq!(out.len(), count);
    out
}
