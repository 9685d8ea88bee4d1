//! ggml block formats and the quantised products.
//!
//! - `block_dequant`: every type of `gguf/quants.safetensors` (raw blocks and the `gguf`
//!   package's dequantisation; types, block sizes and counts read from its metadata) read
//!   through a GGUF file and dequantised: **exactly equal** (each value of these formats is
//!   an exact product rounded once, see fixtures/README.md).
//! - `quantized_matmul`: products on the blocks with `i8`-quantised activations against the
//!   `f64` product of the exact weights, on every path this CPU has. The bound is derived from
//!   the activation quantisation (xfmr_kernels::quant's docs): each activation moves by at most
//!   `d/2` for its block's scale `d`, so the error is at most
//!   `Σ_b (d_b/2)·Σ_{j∈b}|w_j|` plus the `f32` rounding of the block terms, bounded by
//!   `4ε·(K/32)·Σ_j m_j·(|x_j| + d_b)` (`K/32` terms summed, each with a few roundings;
//!   `m_j = |scale|·max(q_j, offset) + |min|` the size of the canonical form's terms, read by
//!   unpacking the blocks).

use burn::backend::{Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use xfmr_kernels::quant::interleave::interleavable;
use xfmr_kernels::quant::{ActivationRows, BlockFormat, Layout, Path, QuantizedMatrix, Sub32};
use xfmr_kernels::KEY_BLOCK;
use xfmr_llm::gguf::{GgmlType, Gguf, GgufError, GgufWriter};
use xfmr_llm::quantized::{Activations, CachePrecision, PrefixCache, Scratch};
use xfmr_llm::{LanguageModel, QuantizedLinear, QuantizedLlama};
use xfmr_models::generate::HostSteps;
use xfmr_models::{BeamOptions, GenerationOptions, Strategy};
use xfmr_testing::{assert_close_slices, to_vec, Fixture, TestRng};

use crate::row;

const PATHS: [Path; 4] = [Path::Avx512Vnni, Path::AvxVnni, Path::Avx2, Path::Portable];

fn fixture() -> Fixture {
    Fixture::load("gguf/quants")
}

/// `(name, type, blocks)` of every type in the fixture's metadata.
fn fixture_types(f: &Fixture) -> Vec<(String, GgmlType, usize)> {
    let types = f.config()["types"]
        .as_object()
        .expect("config.types is an object");
    assert!(!types.is_empty(), "the fixture lists no type");
    types
        .iter()
        .map(|(name, t)| {
            let get = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{name}.{k}")) as usize;
            let ty = GgmlType::from_id(get("ggml_type_id") as u32)
                .unwrap_or_else(|| panic!("{name}: unknown id"));
            assert_eq!(
                ty.to_string(),
                *name,
                "ggml id {} names another type",
                get("ggml_type_id")
            );
            let (len, size) = match ty {
                GgmlType::Quant(f) => (f.block_len(), f.block_bytes()),
                GgmlType::F16 | GgmlType::Bf16 => (1, 2),
                GgmlType::F32 => (1, 4),
                GgmlType::Other(_) => panic!("{name} is not read here"),
            };
            assert_eq!(
                (len, size),
                (get("block_size"), get("type_size")),
                "{name} sizes"
            );
            (name.clone(), ty, get("blocks"))
        })
        .collect()
}

fn bytes(f: &Fixture, name: &str) -> Vec<u8> {
    f.host(name).values.iter().map(|&v| v as u8).collect()
}

#[test]
fn block_dequant_of_every_type_equals_the_gguf_package() {
    let f = fixture();
    for (name, ty, blocks) in fixture_types(&f) {
        let raw = bytes(&f, &format!("raw.{name}"));
        let want = &f.host(&format!("deq.{name}")).values;
        let len = want.len();
        assert_eq!(len % blocks, 0, "{name}: {len} values in {blocks} blocks");
        let file = GgufWriter::new()
            .tensor_raw("t", &[len], ty, raw)
            .to_bytes();
        let got = Gguf::parse(file).unwrap().dequantize("t").unwrap();
        assert_eq!(got.len(), len, "{name}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                f64::from(*g) == *w || (g.is_nan() && w.is_nan()),
                "{name} element {i} (block {}): {g} vs the gguf package's {w}",
                i / (len / blocks)
            );
        }
    }
}

/// Per element of the blocks `raw`, `|scale|·max(q, offset) + |min|` of its canonical form.
fn magnitudes(format: BlockFormat, raw: &[u8]) -> Vec<f32> {
    let mut subs = vec![Sub32::default(); format.subs()];
    let mut out = Vec::new();
    for block in raw.chunks_exact(format.block_bytes()) {
        format.unpack(block, &mut subs);
        for s in &subs {
            out.extend((0..32).map(|j| {
                let h = j / 16;
                s.scale[h].abs() * i32::from(s.q[j]).max(format.offset()) as f32 + s.min[h].abs()
            }));
        }
    }
    out
}

/// Checks `y` (`[n, rows]`) against the exact product of `w` (`[rows, cols]`, terms of size
/// `mags`) and `x`.
fn check_product(
    what: &str,
    (w, mags): (&[f32], &[f32]),
    x: &[f32],
    acts: &ActivationRows,
    y: &[f32],
) {
    let (n, cols) = (acts.n(), acts.cols());
    let rows = w.len() / cols;
    for i in 0..n {
        let blocks = acts.row(i);
        for r in 0..rows {
            let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
            let exact: f64 = wr
                .iter()
                .zip(xr)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let mut bound = 0.0;
            for (b, block) in blocks.iter().enumerate() {
                let d = f64::from(block.d);
                let range = 32 * b..32 * b + 32;
                let abs_w: f64 = wr[range.clone()].iter().map(|v| f64::from(v.abs())).sum();
                let mr = &mags[r * cols..(r + 1) * cols];
                let mag: f64 = mr[range.clone()]
                    .iter()
                    .zip(&xr[range])
                    .map(|(m, x)| f64::from(*m) * (f64::from(x.abs()) + d))
                    .sum();
                bound += d / 2.0 * abs_w + 4.0 * f64::from(f32::EPSILON) * (cols / 32) as f64 * mag;
            }
            let err = (f64::from(y[i * rows + r]) - exact).abs();
            assert!(
                err <= bound,
                "{what} [{i}, {r}]: {} vs exact {exact}, error {err} > bound {bound}",
                y[i * rows + r]
            );
        }
    }
}

fn activations(rng: &mut TestRng, n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|_| rng.uniform(-1.0, 1.0) as f32)
        .collect()
}

/// `matrix` (in ggml's row layout) times `x` on every path, and so is its interleaved copy
/// where the format has one.
fn every_path(what: &str, matrix: &QuantizedMatrix, w: &[f32], x: &[f32], n: usize) {
    let mut acts = ActivationRows::new();
    acts.quantize(x, n, matrix.cols());
    let mags = magnitudes(matrix.format(), matrix.bytes());
    let copy = interleaved(matrix);
    for m in std::iter::once(matrix).chain(&copy) {
        for path in available_paths() {
            let mut y = vec![0f32; n * m.rows()];
            QuantizedMatrix::matmul_fused(path, &[m], &acts, &mut y);
            let what = format!("{what}, {:?} layout, on {path:?}", m.layout());
            check_product(&what, (w, &mags), x, &acts, &y);
        }
    }
}

/// `matrix` (ggml's row layout) interleaved by groups of sixteen rows, for the formats that
/// have that layout; its dequantisation, whole and row by row, is the original's exactly.
fn interleaved(matrix: &QuantizedMatrix) -> Option<QuantizedMatrix> {
    assert_eq!(matrix.layout(), Layout::Rows);
    let (format, rows, cols) = (matrix.format(), matrix.rows(), matrix.cols());
    let made = QuantizedMatrix::with_layout(
        format,
        matrix.bytes().to_vec(),
        rows,
        cols,
        Layout::Interleaved,
    );
    if !interleavable(format) {
        assert!(made.is_err(), "{format:?} interleaved");
        return None;
    }
    let copy = made.unwrap();
    let w = matrix.dequantize();
    assert_eq!(
        copy.dequantize(),
        w,
        "{format:?}: the interleaved copy's values"
    );
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        copy.dequantize_row(r, &mut row);
        assert_eq!(row, w[r * cols..(r + 1) * cols], "{format:?}: row {r}");
    }
    Some(copy)
}

/// The paths this CPU has (printed: on a CPU without AVX2 only the portable one is tested).
fn available_paths() -> Vec<Path> {
    let paths: Vec<Path> = PATHS.into_iter().filter(|p| p.available()).collect();
    eprintln!("quantized products tested on {paths:?}");
    assert!(paths.contains(&Path::Portable));
    paths
}

#[test]
fn quantized_matmul_on_real_blocks_is_within_the_bound() {
    let f = fixture();
    let mut rng = TestRng::new(11);
    for (name, ty, blocks) in fixture_types(&f) {
        let GgmlType::Quant(format) = ty else {
            continue;
        };
        // One block per row: every block of the fixture is a row of the matrix.
        let raw = bytes(&f, &format!("raw.{name}"));
        let w: Vec<f32> = f
            .host(&format!("deq.{name}"))
            .values
            .iter()
            .map(|&v| v as f32)
            .collect();
        let matrix = QuantizedMatrix::new(format, raw, blocks, format.block_len()).unwrap();
        for n in [1, 5, 8] {
            let x = activations(&mut rng, n, format.block_len());
            every_path(
                &format!("{name} fixture blocks, {n} rows"),
                &matrix,
                &w,
                &x,
                n,
            );
        }
    }
}

/// Random blocks of `format` with finite scales: every other byte random.
fn random_blocks(format: BlockFormat, blocks: usize, rng: &mut TestRng) -> Vec<u8> {
    let mut out: Vec<u8> = (0..blocks * format.block_bytes())
        .map(|_| rng.below(256) as u8)
        .collect();
    for block in out.chunks_exact_mut(format.block_bytes()) {
        let scale =
            |rng: &mut TestRng| half::f16::from_f32(rng.uniform(-0.05, 0.05) as f32).to_le_bytes();
        let fields: &[usize] = match format {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 => &[0],
            BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
            BlockFormat::Q2K => &[80, 82],
            BlockFormat::Q3K => &[108],
            BlockFormat::Q6K => &[208],
            BlockFormat::Q8K => {
                block[..4].copy_from_slice(&(rng.uniform(-0.01, 0.01) as f32).to_le_bytes());
                &[]
            }
        };
        for &at in fields {
            block[at..at + 2].copy_from_slice(&scale(rng));
        }
        assert!(format.scales_finite(block));
    }
    out
}

/// Random blocks of every format times 1 activation row (the one-row kernels), 6 (a partial
/// panel of activation rows) and 13 (a whole panel and a partial one), on every path.
#[test]
fn quantized_matmul_of_every_format_is_within_the_bound() {
    let mut rng = TestRng::new(12);
    let (rows, cols) = (40, 512);
    for format in BlockFormat::ALL {
        let raw = random_blocks(format, rows * cols / format.block_len(), &mut rng);
        let matrix = QuantizedMatrix::new(format, raw, rows, cols).unwrap();
        let w = matrix.dequantize();
        for n in [1, 6, 13] {
            let x = activations(&mut rng, n, cols);
            every_path(
                &format!("{} random blocks, {n} rows", format.name()),
                &matrix,
                &w,
                &x,
                n,
            );
        }
    }
}

fn linear_forward<B: Backend>(layer: &QuantizedLinear, x: &[f32], n: usize) -> Vec<f32> {
    let t = Tensor::<B, 2>::from_data(
        TensorData::new(x.to_vec(), [n, layer.cols()]),
        &Default::default(),
    );
    let y = layer.forward(t.reshape([1, n, layer.cols()]));
    assert_eq!(y.dims(), [1, n, layer.rows()]);
    y.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

#[test]
fn quantized_matmul_through_the_linear_layer_on_flex_and_ndarray() {
    let mut rng = TestRng::new(13);
    let (rows, cols, n) = (24, 256, 4);
    for format in [BlockFormat::Q4_1, BlockFormat::Q4K, BlockFormat::Q6K] {
        let raw = random_blocks(format, rows * cols / format.block_len(), &mut rng);
        let file = GgufWriter::new()
            .tensor_raw("w", &[rows, cols], GgmlType::Quant(format), raw.clone())
            .to_bytes();
        let gguf = Gguf::parse(file).unwrap();
        let layer = QuantizedLinear::from_gguf(&gguf, "w", Some([rows, cols])).unwrap();
        assert_eq!(layer.format(), format.name());
        let w = QuantizedMatrix::new(format, raw.clone(), rows, cols)
            .unwrap()
            .dequantize();
        let x = activations(&mut rng, n, cols);
        let mut acts = ActivationRows::new();
        acts.quantize(&x, n, cols);
        let flex = linear_forward::<Flex>(&layer, &x, n);
        let mags = magnitudes(format, &raw);
        check_product(
            &format!("{} QuantizedLinear on flex", format.name()),
            (&w, &mags),
            &x,
            &acts,
            &flex,
        );
        assert_eq!(
            flex,
            linear_forward::<NdArray>(&layer, &x, n),
            "flex and ndarray differ"
        );
    }
}

#[test]
fn corrupt_and_truncated_k_quant_blocks_are_typed_errors() {
    let mut rng = TestRng::new(14);
    for format in [
        BlockFormat::Q2K,
        BlockFormat::Q3K,
        BlockFormat::Q4K,
        BlockFormat::Q5K,
        BlockFormat::Q6K,
    ] {
        let name = format.name();
        // A NaN scale in the second block.
        let mut raw = random_blocks(format, 2, &mut rng);
        let d_at = match format {
            BlockFormat::Q2K => 80,
            BlockFormat::Q3K => 108,
            BlockFormat::Q6K => 208,
            _ => 0,
        };
        let at = format.block_bytes() + d_at;
        raw[at..at + 2].copy_from_slice(&half::f16::NAN.to_le_bytes());
        let file = GgufWriter::new()
            .tensor_raw("w", &[512], GgmlType::Quant(format), raw)
            .to_bytes();
        let gguf = Gguf::parse(file).unwrap();
        let err = gguf.dequantize("w").unwrap_err();
        assert!(
            matches!(&err, GgufError::BadTensor { tensor, reason, .. } if tensor == "w" && reason.contains("block 1")),
            "{name}: {err}"
        );
        let err = QuantizedLinear::from_gguf(&gguf, "w", None).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::Metadata { .. } | GgufError::BadTensor { .. }
            ),
            "{name}: {err}"
        );
        // Two blocks declared, one and a half present.
        let raw = random_blocks(format, 2, &mut rng);
        let mut file = GgufWriter::new()
            .tensor_raw("w", &[512], GgmlType::Quant(format), raw)
            .to_bytes();
        file.truncate(file.len() - format.block_bytes() / 2);
        let err = Gguf::parse(file).unwrap_err();
        assert!(
            matches!(&err, GgufError::BadTensor { tensor, .. } if tensor == "w"),
            "{name}: {err}"
        );
        // A row that is not whole blocks.
        let raw = random_blocks(format, 1, &mut rng);
        let file = GgufWriter::new()
            .tensor_raw("w", &[2, 128], GgmlType::Quant(format), raw)
            .to_bytes();
        assert!(Gguf::parse(file).is_err(), "{name}: rows of 128 accepted");
    }
}

/// Several matrices (formats and row counts that do not line up with the parallel tasks'
/// ranges of rows, nor with the four weight rows of a panel product) in one fused product: each
/// one's columns within the bound of its own exact product, on every path, for 1 to 9
/// activation rows.
#[test]
fn quantized_matmul_fused_over_several_matrices_is_within_each_bound() {
    let mut rng = TestRng::new(15);
    let cols = 256;
    // Each format that has one in the interleaved layout: the first part's two groups line up
    // with the tasks' ranges of rows, the last part's group does not.
    let (parts, mags): (Vec<QuantizedMatrix>, Vec<Vec<f32>>) = [
        (BlockFormat::Q4_0, 32),
        (BlockFormat::Q4_1, 13),
        (BlockFormat::Q6K, 7),
        (BlockFormat::Q8_0, 21),
    ]
    .into_iter()
    .map(|(format, rows)| {
        let raw = random_blocks(format, rows * cols / format.block_len(), &mut rng);
        let mags = magnitudes(format, &raw);
        let m = QuantizedMatrix::new(format, raw, rows, cols).unwrap();
        (interleaved(&m).unwrap_or(m), mags)
    })
    .unzip();
    let refs: Vec<&QuantizedMatrix> = parts.iter().collect();
    let total: usize = parts.iter().map(QuantizedMatrix::rows).sum();
    for n in [1, 4, 5, 9] {
        let x = activations(&mut rng, n, cols);
        let mut acts = ActivationRows::new();
        acts.quantize(&x, n, cols);
        for path in available_paths() {
            let mut fused = vec![0f32; n * total];
            QuantizedMatrix::matmul_fused(path, &refs, &acts, &mut fused);
            let mut start = 0;
            for (part, mags) in parts.iter().zip(&mags) {
                let columns: Vec<f32> = (0..n)
                    .flat_map(|i| {
                        fused[i * total + start..i * total + start + part.rows()].to_vec()
                    })
                    .collect();
                let w = part.dequantize();
                let what = format!(
                    "{path:?}, {n} rows, {} part at column {start}",
                    part.format().name()
                );
                check_product(&what, (&w, mags), &x, &acts, &columns);
                start += part.rows();
            }
        }
    }
}

/// The quantised model on the tiny file (every weight type the tiny model uses), without
/// SmolLM2: with `f32` products it equals the `f32` model within 1e-4 (the same arithmetic in
/// another order), whether the prompt is fed at once or one token at a time through the cache;
/// a left-padded batch decodes as each prompt alone; beam search runs on it.
#[test]
fn quantized_model_equals_the_f32_model_on_the_tiny_file() {
    let g = Gguf::parse(crate::tiny::tiny_gguf(8)).unwrap();
    let device = Default::default();
    let lm = LanguageModel::<NdArray>::from_gguf(&g, &device).unwrap();
    let q = QuantizedLlama::from_gguf(&g, lm.tokenizer.pad_id())
        .unwrap()
        .with_activations(Activations::F32)
        .with_cache_precision(CachePrecision::F32);
    let vocab = q.config.vocab_size;
    let prompt: Vec<u32> = (0..9).map(|i| (7 * i + 3) % vocab as u32).collect();
    let f32_model = lm.f32_model().unwrap();
    let want = to_vec(
        &f32_model
            .last_logits(row::<NdArray>(&prompt, &device))
            .unwrap(),
    );
    let shape = [want.len()];
    let mut steps = q.steps(1, prompt.len());
    let at_once = xfmr_testing::widen(steps.step(&prompt, prompt.len(), false).unwrap());
    assert_close_slices(&at_once, &shape, &want, &shape, 1e-4, 0.0, "prompt at once");
    let mut steps = q.steps(1, prompt.len());
    let mut last = Vec::new();
    for &t in &prompt {
        last = xfmr_testing::widen(steps.step(&[t], 1, false).unwrap());
    }
    assert_close_slices(
        &last,
        &shape,
        &want,
        &shape,
        1e-4,
        0.0,
        "one token at a time",
    );

    let options =
        GenerationOptions::greedy(6, lm.tokenizer.eos_id(), lm.tokenizer.pad_id()).with_min_len(6);
    let short = prompt[..4].to_vec();
    let batch = q
        .generate_streaming(&[prompt.clone(), short.clone()], &options, &mut |_, _| {})
        .unwrap()
        .best_tokens();
    for (i, p) in [prompt.clone(), short].iter().enumerate() {
        let alone = q
            .generate_streaming(std::slice::from_ref(p), &options, &mut |_, _| {})
            .unwrap()
            .best_tokens();
        assert_eq!(batch[i], alone[0], "prompt {i} in a left-padded batch");
    }
    let expected = f32_model
        .generate(std::slice::from_ref(&prompt), &options)
        .unwrap()
        .best_tokens();
    assert_eq!(batch[0], expected[0], "greedy tokens of the f32 model");

    let beam = options.with_strategy(Strategy::Beam(BeamOptions {
        beam_size: 3,
        n_best: 2,
        ..Default::default()
    }));
    let out = q
        .generate_streaming(&[prompt], &beam, &mut |_, _| {})
        .unwrap();
    assert_eq!(out.hypotheses[0].len(), 2, "beam search's n-best");

    let err = q.steps(1, 4).step(&[vocab as u32], 1, false).map(|_| ());
    assert!(err.is_err(), "a token outside the vocabulary was fed");
    let err = q.steps(2, 4).step(&[1, 2, 3], 1, false).map(|_| ());
    assert!(err.is_err(), "three tokens for two rows of one");
}

/// The logits after `prompt` fed to a fresh cache of `q` in one step, starting from what
/// `prefixes` restores; and how many positions were restored. Then `prefixes` keeps the
/// sequence.
pub(crate) fn logits_after(
    q: &QuantizedLlama,
    prefixes: &mut PrefixCache,
    prompt: &[u32],
) -> (Vec<f32>, usize) {
    let mut cache = q.sequence(prompt.len());
    let reused = prefixes.restore(prompt, &mut cache);
    let logits = q
        .forward_batch(&mut [(&mut cache, &prompt[reused..])], &mut Scratch::new())
        .unwrap();
    assert_eq!(cache.len(), prompt.len());
    prefixes.store(prompt, &cache);
    (logits, reused)
}

/// Prefix caching on the tiny file (quantised activations, the serving path): a prompt
/// restored from a kept sequence it shares a prefix with, then fed the rest, gives the logits
/// of the whole prompt fed at once (within 1e-5 of their largest magnitude: a different number
/// of rows per product may take another kernel, which sums in another order) and the same
/// greedy token; the longest shared prefix is taken and the prompt's last token is always fed;
/// kept sequences extended are replaced, and the least recently used go beyond the budget.
#[test]
fn prefix_cache_restores_shared_prefixes_as_if_fed() {
    let g = Gguf::parse(crate::tiny::tiny_gguf(8)).unwrap();
    let lm = LanguageModel::<NdArray>::from_gguf(&g, &Default::default()).unwrap();
    let q = QuantizedLlama::from_gguf(&g, lm.tokenizer.pad_id()).unwrap();
    let vocab = q.config.vocab_size as u32;
    let tokens = |seed: u32, n: usize| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (seed * 31 + 7 * i + 3) % vocab)
            .collect()
    };
    let system = tokens(1, 11);
    let with = |tail: &[u32]| [system.as_slice(), tail].concat();
    let (a, b) = (with(&tokens(2, 6)), with(&tokens(3, 9)));
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
    let close = |got: &[f32], want: &[f32], what: &str| {
        let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let scale = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        let shape = [want.len()];
        assert_close_slices(
            &wide(got),
            &shape,
            &wide(want),
            &shape,
            1e-5 * scale,
            0.0,
            what,
        );
        assert_eq!(argmax(got), argmax(want), "{what}: greedy token");
    };

    let mut none = PrefixCache::new(0);
    let (want_a, reused) = logits_after(&q, &mut none, &a);
    assert_eq!((reused, none.len()), (0, 0), "a budget of 0 keeps nothing");
    let (want_b, _) = logits_after(&q, &mut none, &b);

    // Per layer and key/value head: the keys in whole blocks of `KEY_BLOCK` positions, the
    // values by position, each element in the cache's precision (f16 by default); four bytes
    // a token.
    let entry = |n: usize| {
        let elements = n.div_ceil(KEY_BLOCK) * KEY_BLOCK + n;
        let size = q.cache_precision().bytes();
        elements * q.config.n_layers * q.config.n_kv_heads * q.config.d_k() * size + n * 4
    };
    let mut prefixes = PrefixCache::new(2 * entry(b.len()));
    let (got_a, reused) = logits_after(&q, &mut prefixes, &a);
    assert_eq!(reused, 0, "nothing kept yet");
    close(&got_a, &want_a, "a, fed whole");
    assert_eq!((prefixes.len(), prefixes.bytes()), (1, entry(a.len())));
    let (got_b, reused) = logits_after(&q, &mut prefixes, &b);
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared >= system.len());
    assert_eq!(reused, shared, "b starts from what it shares with a");
    close(&got_b, &want_b, "b after the shared prefix");
    let (again, reused) = logits_after(&q, &mut prefixes, &a);
    assert_eq!(reused, a.len() - 1, "a kept prompt: all but its last token");
    close(&again, &want_a, "a again");
    assert_eq!(
        (prefixes.len(), prefixes.bytes()),
        (2, entry(a.len()) + entry(b.len())),
        "a stored again is not kept twice"
    );
    let mut fed = q.sequence(a.len());
    q.forward_batch(&mut [(&mut fed, &a[..3])], &mut Scratch::new())
        .unwrap();
    assert_eq!(prefixes.restore(&a, &mut fed), 0, "a cache already fed");
    assert_eq!(fed.len(), 3, "left alone");
    let mut default = PrefixCache::default();
    default.store(&a, &fed);
    assert!(default.is_empty(), "the default budget is 0");

    // `a` extended replaces `a`; a third sequence then evicts the least recently used (`b`).
    let longer = [a.as_slice(), &tokens(4, 3)].concat();
    logits_after(&q, &mut prefixes, &longer);
    assert_eq!(prefixes.len(), 2, "the extension replaced a");
    assert_eq!(prefixes.bytes(), entry(longer.len()) + entry(b.len()));
    let other = tokens(5, 12);
    let (_, reused) = logits_after(&q, &mut prefixes, &other);
    assert_eq!(reused, 0);
    assert_eq!(prefixes.len(), 2, "within the budget of two");
    let mut probe = q.sequence(b.len());
    assert_eq!(
        prefixes.restore(&b, &mut probe),
        shared,
        "b was evicted: only what it shares with the extended a is found"
    );
}
