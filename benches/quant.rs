//! The quantised products of `xfmr_kernels::quant` on SmolLM2-135M's shapes (random blocks,
//! random activations), for 1, 8 and 40 activation rows (1 and 8 for the streamed case): one
//! sequence decoding, eight sequences decoding together (`xfmr serve` with eight clients), and
//! a 40-token prompt.
//!
//! - `gate_up_q4_1`: `[3072, 576]` `Q4_1` (a layer's fused gate and up projections);
//! - `down_q4_1`: `[576, 1536]` `Q4_1`;
//! - `output_q8_0`: `[49152, 576]` `Q8_0` (the tied output projection);
//! - each of the three again with `/interleaved` after its name: the blocks in the layout the
//!   model loads them in on AVX-512 VNNI (`xfmr_kernels::quant::interleave`, sixteen rows side
//!   by side), on CPUs with that kernel;
//! - `gate_up_q4_1/streamed`: `gate_up_q4_1` in the layout the model loads, over 64 such
//!   matrices in turn (71 MB), so that the weights come from memory as in a decoding step;
//! - `attend_cached`: one query position's attention over a cache of 256 positions for the
//!   three query heads of one key/value head (SmolLM2-135M: `d_k` 64, three key/value heads a
//!   row), one thread: the inner loop of decoding's attention, over a `HeadCache` (keys in
//!   transposed blocks of 16 positions, values as rows; xfmr-llm's layout);
//!   `streamed_per_head`: the same over every head of 30 layers in turn, so that each cache
//!   comes from L3 or memory as in a decoding step; both with the cache in `f16` (the
//!   default; group `cached attention`) and in `f32` (group `cached attention f32`).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo bench -p xfmr-kernels --bench quant
//! ```
//! Criterion reports the time per product and the throughput in multiply-adds (its
//! "elements"/s); figures go to docs/benchmarks.md.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use xfmr_kernels::quant::{ActivationRows, BlockFormat, Layout, Path, QuantizedMatrix};
use xfmr_kernels::{attend_cached, CachePrecision, HeadCache};

/// xorshift64: reproducible bytes and values without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `rows × cols` random blocks of `format` (`Q4_0`, `Q4_1` or `Q8_0`) with small finite scales.
fn random_matrix(
    format: BlockFormat,
    rows: usize,
    cols: usize,
    layout: Layout,
    rng: &mut Rng,
) -> QuantizedMatrix {
    let blocks = rows * cols / format.block_len();
    let mut bytes: Vec<u8> = (0..blocks * format.block_bytes())
        .map(|_| rng.next() as u8)
        .collect();
    let scales = if format == BlockFormat::Q4_1 { 2 } else { 1 };
    for block in bytes.chunks_exact_mut(format.block_bytes()) {
        for s in 0..scales {
            let v = f16::from_f32(rng.uniform() * 0.05).to_le_bytes();
            block[2 * s..2 * s + 2].copy_from_slice(&v);
        }
    }
    QuantizedMatrix::with_layout(format, bytes, rows, cols, layout).expect("whole blocks")
}

fn products(c: &mut Criterion) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let path = Path::detect();
    let shapes = [
        ("gate_up_q4_1", BlockFormat::Q4_1, 3072, 576),
        ("down_q4_1", BlockFormat::Q4_1, 576, 1536),
        ("output_q8_0", BlockFormat::Q8_0, 49152, 576),
    ];
    let mut group = c.benchmark_group(format!("quant products ({path:?})"));
    let layouts = [(Layout::Rows, ""), (Layout::Interleaved, "/interleaved")];
    for ((name, format, rows, cols), (layout, suffix)) in shapes
        .into_iter()
        .flat_map(|s| layouts.map(|l| (s, l)))
        .filter(|&((_, format, _, _), (layout, _))| {
            layout == Layout::Rows || Layout::fastest(path, format) == layout
        })
    {
        let name = format!("{name}{suffix}");
        let matrix = random_matrix(format, rows, cols, layout, &mut rng);
        for n in [1, 8, 40] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform()).collect();
            let mut acts = ActivationRows::new();
            acts.quantize(&x, n, cols);
            let mut y = vec![0f32; n * rows];
            group.throughput(Throughput::Elements((n * rows * cols) as u64));
            group.bench_with_input(BenchmarkId::new(&name, n), &n, |b, _| {
                b.iter(|| QuantizedMatrix::matmul_fused(path, &[&matrix], &acts, &mut y));
            });
        }
    }
    // The gate and up projections of 64 layers in turn (71 MB of Q4_1, more than the
    // caches hold), eight rows: each product's weights come from memory, as in a decoding
    // step of eight sequences.
    let (rows, cols) = (3072, 576);
    let layout = Layout::fastest(path, BlockFormat::Q4_1);
    let layers: Vec<QuantizedMatrix> = (0..64)
        .map(|_| random_matrix(BlockFormat::Q4_1, rows, cols, layout, &mut rng))
        .collect();
    for n in [1, 8] {
        let x: Vec<f32> = (0..n * cols).map(|_| rng.uniform()).collect();
        let mut acts = ActivationRows::new();
        acts.quantize(&x, n, cols);
        let mut y = vec![0f32; n * rows];
        let mut at = 0;
        group.throughput(Throughput::Elements((n * rows * cols) as u64));
        group.bench_with_input(BenchmarkId::new("gate_up_q4_1/streamed", n), &n, |b, _| {
            b.iter(|| {
                at = (at + 1) % layers.len();
                QuantizedMatrix::matmul_fused(path, &[&layers[at]], &acts, &mut y)
            });
        });
    }
    group.finish();
}

fn cached_attention(c: &mut Criterion) {
    for precision in [CachePrecision::F16, CachePrecision::F32] {
        cached_attention_in(c, precision);
    }
}

fn cached_attention_in(c: &mut Criterion, precision: CachePrecision) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (group_heads, d_k, kv_heads, len, layers) = (3, 64, 3, 256, 30);
    let q: Vec<f32> = (0..group_heads * d_k).map(|_| rng.uniform()).collect();
    // One cache per layer and key/value head, as xfmr-llm keeps them.
    let heads: Vec<HeadCache> = (0..layers * kv_heads)
        .map(|_| {
            let mut head = HeadCache::with_capacity(d_k, len, precision);
            for _ in 0..len {
                let k: Vec<f32> = (0..d_k).map(|_| rng.uniform()).collect();
                let v: Vec<f32> = (0..d_k).map(|_| rng.uniform()).collect();
                head.push(&k, &v);
            }
            head
        })
        .collect();
    let (mut scores, mut out) = (Vec::new(), vec![0f32; group_heads * d_k]);
    let name = match precision {
        CachePrecision::F16 => "cached attention",
        CachePrecision::F32 => "cached attention f32",
    };
    let mut group = c.benchmark_group(name);
    // Multiply-adds: scores and weighted values.
    group.throughput(Throughput::Elements((2 * group_heads * d_k * len) as u64));
    // One head over and over: its cache stays in L1/L2.
    group.bench_function("attend_cached", |b| {
        let one = heads[1].view(len);
        b.iter(|| attend_cached(&q, one, 0.125, &mut scores, &mut out));
    });
    // Every head of 30 layers in turn (5.9 MB of keys and values in f16, 11.8 MB in f32, as a
    // decoding step reads them): each call's cache comes from L3 or memory.
    let mut at = 0;
    group.bench_function("streamed_per_head", |b| {
        b.iter(|| {
            at = (at + 1) % heads.len();
            attend_cached(&q, heads[at].view(len), 0.125, &mut scores, &mut out)
        });
    });
    group.finish();
}

criterion_group!(benches, products, cached_attention);
criterion_main!(benches);
