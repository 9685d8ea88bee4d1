//! The `bf16` products against `f64` references, on every level this CPU has.

use super::*;

/// Deterministic values in `[-1, 1)` with a spread of magnitudes (a splitmix64 stream).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|i| {
            let z = crate::splitmix64(&mut state);
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            // Every seventh value a hundred times smaller: sums of mixed magnitudes.
            if i % 7 == 3 {
                unit * 0.01
            } else {
                unit
            }
        })
        .collect()
}

/// The levels this CPU has, best first; `Portable` always among them.
fn levels() -> Vec<Bf16Level> {
    let levels: Vec<_> = Bf16Level::ALL
        .into_iter()
        .filter(|l| l.available())
        .collect();
    assert!(levels.contains(&Bf16Level::Portable));
    assert_eq!(levels[0], Bf16Level::detect());
    levels
}

/// Round to nearest, ties to even, against the definition: the nearer of the two `bf16`
/// neighbours in `f64`, the even one on a tie; NaN, infinities and signed zeros kept.
#[test]
fn bf16_rounding_is_to_nearest_even() {
    let mut xs = values(4096, 7);
    xs.extend([
        0.0,
        -0.0,
        1.0,
        -2.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        // Halfway between two `bf16`: to the even one (checked again below).
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
    ]);
    for &x in &xs {
        let h = to_bf16(x);
        if x.is_infinite() || x == 0.0 {
            assert_eq!(from_bf16(h), x);
            assert_eq!(from_bf16(h).is_sign_negative(), x.is_sign_negative());
            continue;
        }
        let down = f32::from_bits(x.to_bits() & 0xffff_0000);
        let up = f32::from_bits((x.to_bits() & 0xffff_0000) + 0x1_0000);
        // Past the largest finite `bf16` the next one up is 2¹²⁸ in magnitude (IEEE's rule
        // for rounding to infinity).
        let up_value = if up.is_infinite() {
            2f64.powi(128).copysign(f64::from(x))
        } else {
            f64::from(up)
        };
        let (dd, du) = (
            (f64::from(x) - f64::from(down)).abs(),
            (up_value - f64::from(x)).abs(),
        );
        let expected = if dd < du || (dd == du && (down.to_bits() >> 16) & 1 == 0) {
            down
        } else {
            up
        };
        assert_eq!(from_bf16(h), expected, "to_bf16({x:e})");
    }
    assert_eq!(from_bf16(to_bf16(1.0 + 2f32.powi(-8))), 1.0);
    assert_eq!(
        from_bf16(to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
        1.0 + 2f32.powi(-6)
    );
    assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
    assert!(from_bf16(to_bf16(f32::from_bits(0x7f80_0001))).is_nan());
    // Every level converts activations the same way (normal values).
    let xs = values(1000, 8);
    for level in levels() {
        let mut dst = vec![0u16; xs.len()];
        convert_row(level, &Strided::row_major(&xs, 1, xs.len()), 0, &mut dst);
        let expected: Vec<u16> = xs.iter().map(|&x| to_bf16(x)).collect();
        assert_eq!(dst, expected, "{level:?}");
    }
}

/// Packing is the documented layout: element `(l, j)` of `W` is at tile `j / 16`, chunk
/// `l / 32`, row `(l % 32) / 2`, position `2·(j % 16) + l % 2`; the padding is zero. On every
/// level this CPU has, from each layout the packer reads its own way: rows adjacent (two rows'
/// 16 columns per tile row), columns adjacent (a transposed view, one column at a time) and
/// neither (element by element).
#[test]
fn bf16_packing_follows_the_layout() {
    let (k, n) = (45, 37);
    let w = values(k * n, 3);
    let wt: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
    let spread: Vec<f32> = w.iter().flat_map(|&x| [x, f32::NAN]).collect();
    let views = [
        ("rows adjacent", Strided::row_major(&w, k, n)),
        (
            "transposed",
            Strided {
                row_stride: 1,
                col_stride: k,
                ..Strided::row_major(&wt, k, n)
            },
        ),
        (
            "strided",
            Strided {
                data: &spread,
                offset: 0,
                rows: k,
                cols: n,
                row_stride: 2 * n,
                col_stride: 2,
            },
        ),
    ];
    for level in levels() {
        for (name, view) in views {
            let packed = PackedBf16::pack_strided_on(level, view);
            assert_eq!(
                (packed.k(), packed.n(), packed.chunks, packed.tiles),
                (k, n, 2, 4)
            );
            let mut seen = 0;
            for t in 0..packed.tiles {
                for c in 0..packed.chunks {
                    let tile = packed.tile(t, c);
                    for r in 0..CHUNK_K / 2 {
                        for col in 0..TILE_N {
                            for p in 0..2 {
                                let (l, j) = (c * CHUNK_K + 2 * r + p, t * TILE_N + col);
                                let got = tile[r * 2 * TILE_N + 2 * col + p];
                                if l < k && j < n {
                                    let want = to_bf16(w[l * n + j]);
                                    assert_eq!(got, want, "{level:?} {name} ({l}, {j})");
                                    seen += 1;
                                } else {
                                    assert_eq!(got, 0, "{level:?} {name}: padding ({l}, {j})");
                                }
                            }
                        }
                    }
                }
            }
            assert_eq!(seen, k * n);
        }
    }
}

/// `matmul_bf16_on` on every level this CPU has (the test fails unless each one ran; CI checks
/// that it ran), shapes with and without whole tiles, blocks and chunks, with and without bias:
/// every element within the module's bound of the exact `f64` product of the `f32` inputs,
///
/// `|C − A·W − b| ≤ (2⁻⁷ + 2⁻¹⁶ + (k+1)·2⁻²⁴) · (Σₗ |A_il|·|W_lj| + |b_j|)`
///
/// (the sums start from the bias: `k + 1` terms), and within `(k+1)·2⁻²⁴` times that mass
/// (the `f32` sums alone) of the exact product of the inputs rounded to `bf16`; the levels
/// within twice that of each other.
#[test]
fn bf16_matmul_is_within_bound_on_every_path() {
    let shapes = [
        (1, 1, 1),
        (1, 384, 384),
        (5, 31, 17),
        (33, 33, 48),
        (70, 384, 130),
        (64, 1536, 384),
        (3, 64, 256),
        // Whole 32-row blocks whose columns are fewer than a block's 128 (AMX's tiles stored
        // straight into the output, six of them), and a block of 128 then one of 32.
        (64, 64, 96),
        (32, 40, 160),
    ];
    let levels = levels();
    let mut ran = Vec::new();
    for (s, &(m, k, n)) in shapes.iter().enumerate() {
        let a = values(m * k, 100 + s as u64);
        let w = values(k * n, 200 + s as u64);
        let bias = values(n, 300 + s as u64);
        let packed = PackedBf16::pack(&w, k, n);
        let mut results: Vec<(Bf16Level, Vec<f32>)> = Vec::new();
        for &level in &levels {
            for with_bias in [false, true] {
                let bias = with_bias.then_some(&bias[..]);
                let mut out = vec![f32::NAN; m * n];
                let rows = Strided::row_major(&a, m, k);
                matmul_bf16_on(level, rows, &packed, bias, &mut out);
                let eps = 2f64.powi(-24);
                for i in 0..m {
                    for j in 0..n {
                        let (mut exact, mut rounded, mut mass) = (0f64, 0f64, 0f64);
                        for l in 0..k {
                            let (x, y) = (f64::from(a[i * k + l]), f64::from(w[l * n + j]));
                            exact += x * y;
                            rounded += f64::from(from_bf16(to_bf16(a[i * k + l])))
                                * f64::from(from_bf16(to_bf16(w[l * n + j])));
                            mass += (x * y).abs();
                        }
                        let b = bias.map_or(0.0, |b| f64::from(b[j]));
                        let got = f64::from(out[i * n + j]);
                        let terms = k as f64 + 1.0;
                        let mass = mass + b.abs();
                        let bound = (2f64.powi(-7) + 2f64.powi(-16) + terms * eps) * mass;
                        assert!(
                            (got - exact - b).abs() <= bound,
                            "{level:?} ({m}, {k}, {n}) [{i}, {j}]: {got} vs {} (bound {bound})",
                            exact + b
                        );
                        // The rounded factors' magnitudes are within 2⁻⁸ of the inputs', their
                        // products within (1 + 2⁻⁸)².
                        let sums = terms * eps * mass * (1.0 + 2f64.powi(-8)).powi(2);
                        assert!(
                            (got - rounded - b).abs() <= sums,
                            "{level:?} ({m}, {k}, {n}) [{i}, {j}]: {got} vs rounded {}",
                            rounded + b
                        );
                    }
                }
                if !with_bias {
                    results.push((level, out));
                }
            }
            if !ran.contains(&level) {
                ran.push(level);
            }
        }
        let (_, reference) = &results[results.len() - 1];
        for (level, out) in &results {
            for i in 0..m {
                for j in 0..n {
                    let mass: f64 = (0..k)
                        .map(|l| f64::from(a[i * k + l] * w[l * n + j]).abs())
                        .sum();
                    let bound = 2.0 * (k as f64 + 1.0) * 2f64.powi(-24) * mass * 1.01;
                    let d = f64::from(out[i * n + j]) - f64::from(reference[i * n + j]);
                    assert!(d.abs() <= bound, "{level:?} vs portable [{i}, {j}]: {d}");
                }
            }
        }
    }
    println!("bf16 levels run: {ran:?} (this CPU's: {levels:?})");
    assert_eq!(ran, levels, "every level this CPU has ran");
    // CI names the levels its CPU reports (`.ci/run`, from /proc/cpuinfo), so that a probe
    // that missed one fails rather than leaving its kernel untested.
    let required = std::env::var("XFMR_REQUIRE_BF16").unwrap_or_default();
    for name in required.split(',').filter(|s| !s.is_empty()) {
        let level = match name {
            "amx" => Bf16Level::Amx,
            "avx512bf16" => Bf16Level::Avx512Bf16,
            other => panic!("XFMR_REQUIRE_BF16: unknown level {other:?} (amx, avx512bf16)"),
        };
        assert!(
            ran.contains(&level),
            "XFMR_REQUIRE_BF16 asks for {level:?}, which did not run (ran: {ran:?})"
        );
    }
}

/// Empty shapes: no rows, no columns, and no inner index (the bias alone).
#[test]
fn bf16_matmul_handles_empty_shapes() {
    for level in levels() {
        let packed = PackedBf16::pack(&[], 0, 3);
        let mut out = vec![f32::NAN; 6];
        matmul_bf16_on(
            level,
            Strided::row_major(&[], 2, 0),
            &packed,
            Some(&[1.0, 2.0, 3.0]),
            &mut out,
        );
        assert_eq!(out, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        matmul_bf16_on(
            level,
            Strided::row_major(&[], 2, 0),
            &packed,
            None,
            &mut out,
        );
        assert_eq!(out, [0.0; 6]);
        let packed = PackedBf16::pack(&[], 4, 0);
        matmul_bf16_on(
            level,
            Strided::row_major(&[1.0; 8], 2, 4),
            &packed,
            None,
            &mut [],
        );
        let packed = PackedBf16::pack(&[1.0; 12], 4, 3);
        matmul_bf16_on(level, Strided::row_major(&[], 0, 4), &packed, None, &mut []);
    }
}

/// Strided operands are read in place: a transposed weight view packs as its row-major copy
/// does, and rows of `A` with a gap between them (and `A` transposed) give exactly the
/// product of their contiguous copy, on every level.
#[test]
fn bf16_strided_operands_equal_their_contiguous_copies() {
    let (m, k, n) = (37, 70, 50);
    // W as the transpose of an `[n, k]` buffer 7 elements into a larger one (as a `Linear`
    // loaded from PyTorch holds it, here also at an offset).
    let wt = values(7 + n * k, 11);
    let w: Vec<f32> = (0..k * n).map(|i| wt[7 + (i % n) * k + i / n]).collect();
    let view = Strided {
        data: &wt,
        offset: 7,
        rows: k,
        cols: n,
        row_stride: 1,
        col_stride: k,
    };
    let packed = PackedBf16::pack_strided(view);
    assert_eq!(packed.data, PackedBf16::pack(&w, k, n).data);
    // A: rows 3 elements apart after an offset of 5; and A transposed.
    let gap = 3;
    let buffer = values(5 + m * (k + gap), 12);
    let a: Vec<f32> = (0..m * k)
        .map(|i| buffer[5 + (i / k) * (k + gap) + i % k])
        .collect();
    let strided = Strided {
        data: &buffer,
        offset: 5,
        rows: m,
        cols: k,
        row_stride: k + gap,
        col_stride: 1,
    };
    let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
    let transposed = Strided {
        data: &at,
        offset: 0,
        rows: m,
        cols: k,
        row_stride: 1,
        col_stride: m,
    };
    for level in levels() {
        let mut expected = vec![0f32; m * n];
        matmul_bf16_on(
            level,
            Strided::row_major(&a, m, k),
            &packed,
            None,
            &mut expected,
        );
        for view in [strided, transposed] {
            let mut out = vec![f32::NAN; m * n];
            matmul_bf16_on(level, view, &packed, None, &mut out);
            assert_eq!(out, expected, "{level:?}");
        }
    }
}
