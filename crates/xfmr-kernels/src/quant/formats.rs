//! ggml's block formats, each unpacked into one canonical form: sub-blocks of 32 unsigned
//! quants with a scale and a minimum per half (16 elements).
//!
//! Element `j` of half `h` of a sub-block is `scale[h]·(q[j] − offset) + min[h]`, `offset` a
//! per-format constant (8 for `Q4_0`, 32 for `Q6_K`...). Every format fits: the legacy
//! formats have one scale (and minimum) per block of 32, `Q4_K`/`Q5_K` one per 32, `Q2_K`,
//! `Q3_K` and `Q6_K` one per 16. Signed quants are stored shifted up by `offset` so that every
//! `q` is a `u8`, which is what the `u8 × i8` products of [`super::dot`] take.
//!
//! The layouts and formulas are ggml's `ggml-common.h` and `dequantize_row_*` of
//! `ggml-quants.c` (the `gguf` Python package ports the same); each is checked against that
//! package's dequantisation of real and random blocks (the `block_dequant` test of xfmr-llm).

use half::f16;

/// Elements of a sub-block.
pub const SUB: usize = 32;

/// One sub-block of 32 elements in the canonical form: element `j` of half `h = j / 16` is
/// `scale[h]·(q[j] − offset) + min[h]`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sub32 {
    /// Quants, shifted to be unsigned.
    pub q: [u8; SUB],
    /// Scale of each half.
    pub scale: [f32; 2],
    /// Minimum (added after scaling) of each half; 0 for formats without one.
    pub min: [f32; 2],
}

/// A ggml block format (the quantised types of a GGUF file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// 32 × 4 bits, `d·(q − 8)`.
    Q4_0,
    /// 32 × 4 bits, `d·q + m`.
    Q4_1,
    /// 32 × 5 bits, `d·(q − 16)`.
    Q5_0,
    /// 32 × 5 bits, `d·q + m`.
    Q5_1,
    /// 32 × 8 bits, `d·q`.
    Q8_0,
    /// 256 × 2 bits, 16 groups of 16 with 4-bit scales and minimums.
    Q2K,
    /// 256 × 3 bits, 16 groups of 16 with 6-bit signed scales.
    Q3K,
    /// 256 × 4 bits, 8 groups of 32 with 6-bit scales and minimums.
    Q4K,
    /// 256 × 5 bits, 8 groups of 32 with 6-bit scales and minimums.
    Q5K,
    /// 256 × 6 bits, 16 groups of 16 with 8-bit signed scales.
    Q6K,
    /// 256 × 8 bits, one `f32` scale (ggml's activation format for K-quant products).
    Q8K,
}

impl BlockFormat {
    /// Every format.
    pub const ALL: [Self; 11] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2K,
        Self::Q3K,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q8K,
    ];

    /// Elements per block.
    pub const fn block_len(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Q8K => 292,
        }
    }

    /// ggml's name of the format (`Q4_K`...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
        }
    }

    /// The constant subtracted from every unsigned quant.
    pub const fn offset(self) -> i32 {
        match self {
            Self::Q4_0 => 8,
            Self::Q5_0 => 16,
            Self::Q8_0 | Self::Q8K => 128,
            Self::Q3K => 4,
            Self::Q6K => 32,
            Self::Q4_1 | Self::Q5_1 | Self::Q2K | Self::Q4K | Self::Q5K => 0,
        }
    }

    /// Sub-blocks of 32 per block.
    pub const fn subs(self) -> usize {
        self.block_len() / SUB
    }

    /// Whether the block's floating-point scales (`d`, and `dmin` or `m` where the format
    /// has one) are finite: a corrupt block is caught by its reader instead of spreading NaN.
    pub fn scales_finite(self, block: &[u8]) -> bool {
        // Finite unless the five exponent bits are all set (±∞, NaN): no conversion needed.
        let f16_at = |i: usize| u16::from_le_bytes([block[i], block[i + 1]]) & 0x7c00 != 0x7c00;
        match self {
            Self::Q4_0 | Self::Q5_0 | Self::Q8_0 => f16_at(0),
            Self::Q4_1 | Self::Q5_1 | Self::Q4K | Self::Q5K => f16_at(0) && f16_at(2),
            Self::Q2K => f16_at(80) && f16_at(82),
            Self::Q3K => f16_at(108),
            Self::Q6K => f16_at(208),
            Self::Q8K => f32::from_le_bytes([block[0], block[1], block[2], block[3]]).is_finite(),
        }
    }

    /// Unpacks one block (`block_bytes()` bytes) into `subs()` sub-blocks.
    pub fn unpack(self, block: &[u8], out: &mut [Sub32]) {
        debug_assert_eq!(block.len(), self.block_bytes());
        debug_assert_eq!(out.len(), self.subs());
        match self {
            Self::Q4_0 => q4_0(block, &mut out[0]),
            Self::Q4_1 => q4_1(block, &mut out[0]),
            Self::Q5_0 => q5(block, false, &mut out[0]),
            Self::Q5_1 => q5(block, true, &mut out[0]),
            Self::Q8_0 => q8_0(block, &mut out[0]),
            Self::Q2K => q2_k(block, out),
            Self::Q3K => q3_k(block, out),
            Self::Q4K => q45_k(block, false, out),
            Self::Q5K => q45_k(block, true, out),
            Self::Q6K => q6_k(block, out),
            Self::Q8K => q8_k(block, out),
        }
    }
}

fn half(bytes: &[u8]) -> f32 {
    f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

fn one_scale(sub: &mut Sub32, d: f32, m: f32) {
    sub.scale = [d, d];
    sub.min = [m, m];
}

/// `{ f16 d; u8 qs[16] }`: element `j < 16` is the low nibble of `qs[j]`, `16 + j` its high.
fn q4_0(b: &[u8], sub: &mut Sub32) {
    one_scale(sub, half(&b[0..2]), 0.0);
    nibbles(&b[2..18], &mut sub.q);
}

/// `{ f16 d; f16 m; u8 qs[16] }`.
fn q4_1(b: &[u8], sub: &mut Sub32) {
    one_scale(sub, half(&b[0..2]), half(&b[2..4]));
    nibbles(&b[4..20], &mut sub.q);
}

#[inline(always)]
fn nibbles(qs: &[u8], q: &mut [u8; SUB]) {
    let qs: &[u8; 16] = qs.try_into().expect("16 bytes");
    for j in 0..16 {
        q[j] = qs[j] & 0x0f;
        q[j + 16] = qs[j] >> 4;
    }
}

/// `{ f16 d; [f16 m;] u8 qh[4]; u8 qs[16] }`: bit `j` of `qh` (a little-endian `u32`) is the
/// fifth bit of element `j`.
fn q5(b: &[u8], with_min: bool, sub: &mut Sub32) {
    let (m, rest) = match with_min {
        true => (half(&b[2..4]), &b[4..]),
        false => (0.0, &b[2..]),
    };
    one_scale(sub, half(&b[0..2]), m);
    let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
    nibbles(&rest[4..20], &mut sub.q);
    for j in 0..SUB {
        sub.q[j] |= (((qh >> j) & 1) as u8) << 4;
    }
}

/// `{ f16 d; i8 qs[32] }`.
fn q8_0(b: &[u8], sub: &mut Sub32) {
    one_scale(sub, half(&b[0..2]), 0.0);
    for j in 0..SUB {
        sub.q[j] = b[2 + j] ^ 0x80;
    }
}

/// `{ f32 d; i8 qs[256]; i16 bsums[16] }`.
fn q8_k(b: &[u8], out: &mut [Sub32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (s, sub) in out.iter_mut().enumerate() {
        one_scale(sub, d, 0.0);
        for j in 0..SUB {
            sub.q[j] = b[4 + s * SUB + j] ^ 0x80;
        }
    }
}

/// `{ u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }`. Two halves of 128; in each, four 2-bit
/// planes (shift 0, 2, 4, 6) of 32 bytes, each plane two groups of 16 with scale
/// `d·(sc & 15)` and minimum `−dmin·(sc >> 4)`.
fn q2_k(b: &[u8], out: &mut [Sub32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half(&b[80..82]), half(&b[82..84]));
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for plane in 0..4 {
            let sub = &mut out[4 * n + plane];
            let shift = 2 * plane;
            for h in 0..2 {
                let sc = scales[8 * n + 2 * plane + h];
                sub.scale[h] = d * f32::from(sc & 0x0f);
                sub.min[h] = -(dmin * f32::from(sc >> 4));
            }
            for j in 0..SUB {
                sub.q[j] = (q[j] >> shift) & 3;
            }
        }
    }
}

/// `{ u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }`: 16 six-bit scales (stored minus 32)
/// packed in 12 bytes; quants are 2 low bits from `qs` (planes as in `Q2_K`) and a high bit
/// from `hmask` (set: +4), so `q − 4` with `q` in 0..8.
fn q3_k(b: &[u8], out: &mut [Sub32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3_k_scales(b[96..108].try_into().expect("12 bytes"));
    let d = half(&b[108..110]);
    for n in 0..2 {
        let q = &qs[32 * n..32 * n + 32];
        for plane in 0..4 {
            let sub = &mut out[4 * n + plane];
            let shift = 2 * plane;
            let bit = 4 * n + plane;
            for h in 0..2 {
                sub.scale[h] = d * f32::from(scales[8 * n + 2 * plane + h] as i8 - 32);
            }
            sub.min = [0.0; 2];
            for j in 0..SUB {
                sub.q[j] = ((q[j] >> shift) & 3) | (((hmask[j] >> bit) & 1) << 2);
            }
        }
    }
}

/// The 16 six-bit scales of a `Q3_K` block (ggml's `kmask1`/`kmask2` unpacking).
fn q3_k_scales(raw: &[u8; 12]) -> [u8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0u8; 16];
    for (i, a) in aux.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&a.to_le_bytes());
    }
    out
}

/// Scale and minimum `j` (0..8) of the 12 packed bytes of `Q4_K`/`Q5_K` (ggml's
/// `get_scale_min_k4`); the in-place kernels' decoding too.
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `Q4_K`: `{ f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }`; `Q5_K` adds `u8 qh[32]` before
/// `qs`. Four chunks of 64: the low nibbles of 32 bytes are sub-block `2c`, the high ones
/// `2c + 1`; `Q5_K`'s fifth bit of sub-block `s` is bit `s` of `qh[j]`.
fn q45_k(b: &[u8], five: bool, out: &mut [Sub32]) {
    let (d, dmin) = (half(&b[0..2]), half(&b[2..4]));
    let scales = &b[4..16];
    let (qh, qs) = match five {
        true => (Some(&b[16..48]), &b[48..176]),
        false => (None, &b[16..144]),
    };
    for (s, sub) in out.iter_mut().enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        one_scale(sub, d * f32::from(sc), -(dmin * f32::from(m)));
        let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for j in 0..SUB {
            sub.q[j] = (q[j] >> shift) & 0x0f;
        }
        if let Some(qh) = qh {
            for j in 0..SUB {
                sub.q[j] |= ((qh[j] >> s) & 1) << 4;
            }
        }
    }
}

/// `{ u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }`. Two halves of 128; in half `n`, element
/// `32k + l` (k in 0..4, l in 0..32) has its low nibble from `ql[64n + l + 32(k & 1)]`
/// (low nibble for k < 2, high for k ≥ 2), its two high bits from bits `2k` of
/// `qh[32n + l]`, and scale `d·scales[8n + 2k + l / 16]`; the value is `q − 32`.
fn q6_k(b: &[u8], out: &mut [Sub32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(&b[208..210]);
    for n in 0..2 {
        for k in 0..4 {
            let sub = &mut out[4 * n + k];
            for h in 0..2 {
                sub.scale[h] = d * f32::from(scales[8 * n + 2 * k + h] as i8);
            }
            sub.min = [0.0; 2];
            let low = &ql[64 * n + 32 * (k & 1)..64 * n + 32 * (k & 1) + 32];
            let high = &qh[32 * n..32 * n + 32];
            let shift = 4 * (k / 2);
            for l in 0..SUB {
                sub.q[l] = ((low[l] >> shift) & 0x0f) | (((high[l] >> (2 * k)) & 3) << 4);
            }
        }
    }
}

/// Dequantises whole blocks of `format`: `out[i]` is element `i`, computed as
/// `scale·(q − offset) + min` in `f32` (each product of ggml's formats is exact in `f32`, so
/// this equals ggml's `dequantize_row_*` bit for bit).
///
/// # Panics
/// If `bytes` is not whole blocks or `out` not their length.
pub fn dequantize(format: BlockFormat, bytes: &[u8], out: &mut [f32]) {
    let (len, size) = (format.block_len(), format.block_bytes());
    assert!(
        bytes.len().is_multiple_of(size) && out.len() == bytes.len() / size * len,
        "dequantize {}: {} bytes into {} values",
        format.name(),
        bytes.len(),
        out.len()
    );
    let offset = format.offset();
    let mut subs = [Sub32::default(); 8];
    let subs = &mut subs[..format.subs()];
    for (block, values) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(len)) {
        format.unpack(block, subs);
        for (sub, values) in subs.iter().zip(values.chunks_exact_mut(SUB)) {
            for (j, v) in values.iter_mut().enumerate() {
                let h = j / 16;
                *v = sub.scale[h] * (i32::from(sub.q[j]) - offset) as f32 + sub.min[h];
            }
        }
    }
}
