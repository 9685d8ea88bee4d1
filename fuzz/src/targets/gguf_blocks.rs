//! `gguf_blocks`: one weight matrix of any type GGUF files hold, with arbitrary block bytes.
//!
//! The first byte picks the type (F32, F16, BF16 or one of the 11 block formats), the second
//! the rows (1–4) and the third the columns (one or two blocks); the rest, repeated to length,
//! are the blocks (so their scales are any bit pattern: NaN, infinities, subnormals). The file
//! is written with [`GgufWriter`], then: dequantised, loaded as a [`QuantizedLinear`] (which
//! must refuse exactly the blocks whose scales are not finite), each row read back, which must
//! equal the dequantised row bit for bit, and multiplied with a row of activations.

use burn::backend::NdArray;
use burn::tensor::Tensor;
use xfmr_kernels::quant::BlockFormat;
use xfmr_llm::gguf::{GgmlType, GgufWriter};
use xfmr_llm::{Gguf, QuantizedLinear};

/// The target's body.
pub fn run(data: &[u8]) {
    let [kind, rows, cols, blocks @ ..] = data else {
        return;
    };
    let types: Vec<GgmlType> = [GgmlType::F32, GgmlType::F16, GgmlType::Bf16]
        .into_iter()
        .chain(BlockFormat::ALL.map(GgmlType::Quant))
        .collect();
    let ty = types[*kind as usize % types.len()];
    let (block_len, block_bytes) = match ty {
        GgmlType::F32 => (1, 4),
        GgmlType::F16 | GgmlType::Bf16 => (1, 2),
        GgmlType::Quant(f) => (f.block_len(), f.block_bytes()),
        GgmlType::Other(_) => unreachable!(),
    };
    let rows = 1 + *rows as usize % 4;
    // Float types: 1–64 columns; block formats: one or two blocks a row.
    let cols = if block_len == 1 {
        1 + *cols as usize % 64
    } else {
        block_len * (1 + *cols as usize % 2)
    };
    let size = rows * cols / block_len * block_bytes;
    let bytes: Vec<u8> = if blocks.is_empty() {
        vec![0; size]
    } else {
        blocks.iter().copied().cycle().take(size).collect()
    };
    let file = GgufWriter::new()
        .tensor_raw("w", &[rows, cols], ty, bytes)
        .to_bytes();
    let gguf = Gguf::parse(file).expect("a file GgufWriter wrote parses");
    let dequantised = gguf.dequantize("w");
    let linear = QuantizedLinear::from_gguf(&gguf, "w", Some([rows, cols]));
    match (&dequantised, &linear) {
        (Ok(values), Ok(linear)) => {
            assert_eq!(values.len(), rows * cols);
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                linear.row_into(r, &mut row);
                let want = &values[r * cols..(r + 1) * cols];
                assert!(
                    row.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} row {r}: QuantizedLinear::row_into differs from Gguf::dequantize"
                );
            }
            let x = Tensor::<NdArray, 2>::ones([1, cols], &Default::default());
            let y = linear.forward(x);
            assert_eq!(y.dims(), [1, rows]);
        }
        (Err(_), Err(_)) => {}
        (d, l) => panic!(
            "{ty:?}: dequantize and QuantizedLinear::from_gguf disagree: {:?} vs {:?}",
            d.as_ref().err(),
            l.as_ref().err()
        ),
    }
}

/// Every type, two rows of one block, with small finite scales (f16 0x2000 ≈ 0.0078) and
/// varied quants.
pub fn seeds() -> Vec<Vec<u8>> {
    (0u8..14)
        .map(|kind| {
            let mut seed = vec![kind, 1, 0];
            seed.extend((0..40u8).flat_map(|i| [0x00, 0x20, i.wrapping_mul(37), 0x11]));
            seed
        })
        .collect()
}
