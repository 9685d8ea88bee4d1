//! The activations' quantisation on every path; the in-place kernels against the unpacked
//! product.

use super::*;
use crate::quant::interleave::GROUP;

/// The dispatched quantisation (AVX2 where the CPU has it), and that of every level the CPU
/// has, equals the portable loop block for block, bit for bit, on values with exact halves
/// (`round` takes them away from zero), an all-zero block and a block of one huge value.
#[test]
fn quantize_blocks_is_the_same_on_every_path() {
    let mut x: Vec<f32> = (0..SUB * 40)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25 + if i % 7 == 0 { 0.5 } else { 0.0 })
        .collect();
    x[SUB..2 * SUB].fill(0.0);
    x[2 * SUB] = 1e30;
    let (mut dispatched, mut portable) =
        (vec![ActBlock::default(); 40], vec![ActBlock::default(); 40]);
    quantize_blocks(&x, &mut dispatched);
    quantize_blocks_portable(&x, &mut portable);
    assert_eq!(dispatched, portable);
    for level in FloatLevel::ALL {
        if !level.available() {
            eprintln!("quantize_blocks: this CPU has no {level:?}, its path is not compared");
            continue;
        }
        let mut blocks = vec![ActBlock::default(); 40];
        quantize_blocks_on(level, &x, &mut blocks);
        assert_eq!(blocks, portable, "{level:?}");
    }
    // The plain formula: `round`, clamp, a saturating cast (NaN → 0), integer sums.
    let mut odd = x.clone();
    odd[3 * SUB..4 * SUB].fill(0.0);
    odd[3 * SUB] = 1e-38; // d subnormal, 1/d infinite: 0·∞ in the others
    odd[4 * SUB + 5] = f32::NAN;
    odd[5 * SUB + 1] = -0.0;
    let mut blocks = vec![ActBlock::default(); 40];
    quantize_blocks(&odd, &mut blocks);
    for (b, x) in blocks.iter().zip(odd.chunks_exact(SUB)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<i8> = x
            .iter()
            .map(|v| (v * id).round().clamp(-127.0, 127.0) as i8)
            .collect();
        let half = |h: usize| {
            q[16 * h..16 * h + 16]
                .iter()
                .map(|&v| i32::from(v))
                .sum::<i32>()
        };
        assert_eq!(b.q.as_slice(), q.as_slice());
        assert_eq!(b.d, d);
        assert_eq!(b.sum, [d * half(0) as f32, d * half(1) as f32]);
    }
    // The rounding is `round`'s, ties and all.
    for v in [
        0.5f32, 1.5, 2.5, -0.5, -2.5, 0.49999997, 126.5, -126.5, 8388607.5,
    ] {
        assert_eq!((v + HALF_DOWN.copysign(v)).trunc(), v.round(), "{v}");
    }
    assert_eq!(dispatched[1], ActBlock::default());
    assert_eq!(dispatched[2].q[0], 127);
    for (b, x) in dispatched.iter().zip(x.chunks_exact(SUB)) {
        for (q, v) in b.q.iter().zip(x) {
            assert!(
                (*q as f32 * b.d - v).abs() <= b.d / 2.0 * 1.0001,
                "{v} as {q}·{}",
                b.d
            );
        }
    }
}

/// Random bytes from a splitmix64 stream.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    (0..len)
        .map(|_| crate::splitmix64(&mut state) as u8)
        .collect()
}

/// `rows` rows of `cols / block_len` random blocks of `format`, their `f16` scales set to
/// finite values of either sign (`Q5_0`'s `d` at 0; `Q4_K`'s and `Q5_K`'s `d` and `dmin` at 0
/// and 2; `Q6_K`'s `d` at 208).
fn random_rows(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> Vec<Vec<u8>> {
    let per_row = cols / format.block_len() * format.block_bytes();
    let mut scales = random_bytes(seed ^ 0x5ca1e, 2 * rows * cols).into_iter();
    (0..rows)
        .map(|r| {
            let mut row = random_bytes(seed + r as u64, per_row);
            for block in row.chunks_exact_mut(format.block_bytes()) {
                let fields: &[usize] = match format {
                    BlockFormat::Q5_0 => &[0],
                    BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
                    _ => &[208],
                };
                for &at in fields {
                    let v = (f32::from(scales.next().unwrap()) - 127.5) / 2_000.0;
                    block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
            row
        })
        .collect()
}

/// The portable product of unpacked rows ([`dot_row`]'s reference) and the scale of its
/// terms, `Σ_j (|scale_h|·max(q_j, offset) + |min_h|)·|d_x·q_xj|`.
fn reference(format: BlockFormat, row: &[u8], x: &[ActBlock]) -> (f32, f32) {
    let mut unpacked = vec![Sub32::default(); x.len()];
    for (block, out) in row
        .chunks_exact(format.block_bytes())
        .zip(unpacked.chunks_exact_mut(format.subs()))
    {
        format.unpack(block, out);
    }
    let offset = format.offset();
    let mut magnitude = 0f32;
    for (s, a) in unpacked.iter().zip(x) {
        for j in 0..SUB {
            let h = j / 16;
            let w = s.scale[h].abs() * i32::from(s.q[j]).max(offset) as f32 + s.min[h].abs();
            magnitude += w * (f32::from(a.q[j]).abs() * a.d);
        }
    }
    let exact = dot_row(DotLevel::Portable, &unpacked, offset, x);
    (exact, magnitude)
}

/// `Q5_0` (read as `Q8_0`'s signed quants) and `Q4_K`, `Q5_K` and `Q6_K` (read by sub-block)
/// in place, through every kernel that reads them on every SIMD level this CPU has, against the
/// portable product of the unpacked rows: within `10⁻⁵` of the terms' magnitude (the integer
/// sums are exact; only the `f32` scaling and summation orders differ, a few ulps of the
/// magnitude over 16 blocks). Each level the CPU has is required to take these kernels, so a
/// level that would fall back to unpacking fails here.
#[test]
fn in_place_q5_0_and_k_quant_kernels_equal_the_unpacked_product() {
    let cols = 512;
    let acts: Vec<Vec<ActBlock>> = (0..PANEL)
        .map(|c| {
            let x: Vec<f32> = random_bytes(100 + c as u64, cols)
                .into_iter()
                .map(|b| (f32::from(b) - 127.5) / 64.0)
                .collect();
            let mut blocks = vec![ActBlock::default(); cols / SUB];
            quantize_blocks(&x, &mut blocks);
            blocks
        })
        .collect();
    let xs: Vec<&[ActBlock]> = acts.iter().map(|a| a.as_slice()).collect();
    let panel: Vec<PanelBlock> = (0..cols / SUB)
        .map(|i| PanelBlock::gather(&xs, i))
        .collect();
    let mut levels = 0;
    for path in DotLevel::ALL {
        if path == DotLevel::Portable || !path.available() {
            continue;
        }
        levels += 1;
        for format in [
            BlockFormat::Q5_0,
            BlockFormat::Q4K,
            BlockFormat::Q5K,
            BlockFormat::Q6K,
        ] {
            let rows = random_rows(format, 4, cols, 7);
            let rows: [&[u8]; 4] = std::array::from_fn(|r| rows[r].as_slice());
            let check = |what: &str, r: usize, c: usize, got: f32| {
                let (exact, magnitude) = reference(format, rows[r], xs[c]);
                assert!(
                    (got - exact).abs() <= 1e-5 * magnitude,
                    "{format:?} {what} on {path:?}, row {r} by activations {c}: {got} vs {exact} \
                     (terms of {magnitude})"
                );
            };
            if format == BlockFormat::Q5_0 {
                assert!(reads_in_place(path, format), "{format:?} on {path:?}");
                check(
                    "dot_blocks",
                    0,
                    0,
                    dot_blocks(path, format, rows[0], xs[0]).unwrap(),
                );
                let four = [xs[0], xs[1], xs[2], xs[3]];
                let sums = dot_blocks4(path, format, rows[1], four).unwrap();
                (0..4).for_each(|c| check("dot_blocks4", 1, c, sums[c]));
                let sums = dot_rows4(path, format, rows, xs[5]).unwrap();
                (0..4).for_each(|r| check("dot_rows4", r, 5, sums[r]));
                let tile = dot_panel(path, format, rows, &panel).unwrap();
                for r in 0..4 {
                    (0..PANEL).for_each(|c| check("dot_panel", r, c, tile[r][c]));
                }
                if has_group_kernel(path, format) {
                    // Sixteen rows interleaved (`super::super::interleave`) through the group
                    // kernel, by three activation rows.
                    let group = random_rows(format, GROUP, cols, 9);
                    let mut tiles = group.concat();
                    crate::quant::interleave::interleave(format, &mut tiles, GROUP, cols);
                    let three = [xs[1], xs[3], xs[6]];
                    let sums = dot_group(path, format, &tiles, three).unwrap();
                    for (c, sums) in sums.iter().enumerate() {
                        for (r, &got) in sums.iter().enumerate() {
                            let (exact, magnitude) = reference(format, &group[r], three[c]);
                            assert!(
                                (got - exact).abs() <= 1e-5 * magnitude,
                                "Q5_0 dot_group on {path:?}, row {r} by {c}: {got} vs {exact}"
                            );
                        }
                    }
                }
            } else {
                assert!(has_ktile(path, format), "{format:?} on {path:?}");
                let tile = dot_ktile(path, format, rows, [xs[2]]).unwrap();
                (0..4).for_each(|r| check("dot_ktile 4×1", r, 2, tile[0][r]));
                let tile = dot_ktile(path, format, rows, [xs[4], xs[5]]).unwrap();
                for (c, sums) in tile.iter().enumerate() {
                    (0..4).for_each(|r| check("dot_ktile 4×2", r, 4 + c, sums[r]));
                }
                let tile = dot_ktile(path, format, rows, [xs[4], xs[5], xs[6]]).unwrap();
                for (c, sums) in tile.iter().enumerate() {
                    (0..4).for_each(|r| check("dot_ktile 4×3", r, 4 + c, sums[r]));
                }
                // Two panels: the same rows, and the rows in reverse.
                let reversed: Vec<&[ActBlock]> = xs.iter().rev().copied().collect();
                let two: Vec<PanelBlock> = (0..cols / SUB)
                    .map(|i| PanelBlock::gather(&xs, i))
                    .chain((0..cols / SUB).map(|i| PanelBlock::gather(&reversed, i)))
                    .collect();
                let mut tiles = [[[0f32; PANEL]; 4]; 2];
                assert!(dot_kpanels(path, format, rows, &two, &mut tiles));
                for r in 0..4 {
                    for c in 0..PANEL {
                        check("dot_kpanels", r, c, tiles[0][r][c]);
                        check(
                            "dot_kpanels, second panel",
                            r,
                            PANEL - 1 - c,
                            tiles[1][r][c],
                        );
                    }
                }
                let tile = dot_ktile(path, format, [rows[3]], [xs[0], xs[1], xs[2], xs[7]]);
                for (c, sums) in tile.unwrap().iter().enumerate() {
                    check("dot_ktile 1×4", 3, [0, 1, 2, 7][c], sums[0]);
                }
            }
        }
    }
    assert!(!has_ktile(DotLevel::Portable, BlockFormat::Q4K));
    eprintln!("in-place Q5_0 / Q4_K / Q5_K / Q6_K kernels compared on {levels} SIMD levels");
}
