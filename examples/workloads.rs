//! The speed workloads of `docs/benchmarks.md` that run inside one program, on the CPU
//! backends (and on wgpu / cuda with those features), printed as one JSON object per line
//! (read by `benches/compare_pytorch.py`, which runs PyTorch on the same shapes in the same
//! run):
//!
//! - `w1`: multi-head self-attention, batch 8, seq 256, d_model 512, 8 heads, inference.
//! - `w2`: the encoder stack at the paper's `base` widths (d_model 512, 8 heads, d_ff 2048, 6
//!   post-norm layers, no dropout), batch 8 × 128 tokens, inference.
//! - `w4`: batch-1 greedy decoding of exactly 128 tokens with the paper's `base`
//!   encoder-decoder (37,000-token shared vocabulary, random weights) from a 24-token source,
//!   through the key/value cache.
//!
//! - `gemm`: the 2-D matrix products those workloads are made of (`[m, k] × [k, n]`: the
//!   attention projections, the feed-forward layers, a fused QKV projection), in GFLOP/s: the
//!   backend's matrix-product rate, for the analysis in `docs/benchmarks.md`.
//!
//! Each is timed `iters` times after 2 warm-ups, reading the result back to the host each time
//! on the CPU backends and waiting for the device (`Backend::sync`, no copy) on the GPU ones,
//! as PyTorch's side ends with `torch.cuda.synchronize()` there; the median counts. f32; the
//! backends use every core (run with `RAYON_NUM_THREADS=2` to match PyTorch's 2 threads).
//!
//! ```text
//! cargo run --release -p xfmr --features flex --example workloads -- w2 [iters] [ndarray|flex]
//! cargo run --release -p xfmr --features flex --example workloads -- w1 30 flex [kernel]
//! ```
//!
//! `kernel` (W1 only): the attention implementation, `auto` (the default), `fused` (burn's
//! `module::attention`, a flash kernel on the GPU backends), `decomposed` or `flex`; a kernel
//! other than `auto` is reported as `backend/kernel`.
//!
//! `--precision bf16` (anywhere among the arguments) times the workload inside
//! [`with_matmul_precision`]`(Bf16, ..)`: the projections' products with `bf16` factors and `f32`
//! sums, as `xfmr embed --precision bf16` and `xfmr train --precision bf16` run them; reported
//! as `backend bf16`. Refused on a backend or CPU where [`takes_bf16_products`] does not hold
//! (the products would silently stay `f32`).
//!
//! ```text
//! cargo run --release -p xfmr --features flex --example workloads -- w2 10 flex --precision bf16
//! ```

use std::time::Instant;

/// mimalloc keeps freed memory for reuse: each op's output buffer otherwise comes fresh from the
/// kernel (glibc maps and unmaps buffers of these sizes), and the page faults cost W1 a third of
/// its time (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use burn::backend::{Flex, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use xfmr::attention::{
    takes_bf16_products, with_matmul_precision, AttentionKernel, MatmulPrecision, MhaInput,
    MultiHeadAttentionConfig,
};
use xfmr::blocks::SelfAttentionInput;

// W2's and W4's models and inputs, shared with the criterion bench.
use xfmr_testing::workloads::{w2_encoder, w4_model, W2_SHAPE, W4_NEW_TOKENS};

/// Median seconds of `iters` runs of `f` after 2 warm-ups.
fn median_secs(iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[iters / 2]
}

/// Waits for `out` to be computed: on a GPU backend by waiting for the device without copying
/// it to the host, as PyTorch's side does; on a CPU backend by reading it back (what the
/// figures of earlier days measured).
fn finish<B: Backend, const D: usize>(gpu: bool, out: Tensor<B, D>) {
    if gpu {
        let device = out.device();
        B::sync(&device).expect("the device finishes its work");
        drop(out);
    } else {
        let _ = out.into_data();
    }
}

/// One JSON line: the workload, the backend, the median time and the throughput in `unit`s.
fn report(workload: &str, backend: &str, secs: f64, units: f64, unit: &str) {
    println!(
        "{{\"workload\": \"{workload}\", \"impl\": \"xfmr\", \"backend\": \"{backend}\", \
         \"median_ms\": {:.3}, \"per_s\": {:.3}, \"unit\": \"{unit}\"}}",
        secs * 1e3,
        units / secs
    );
}

fn w1<B: Backend>(backend: &str, gpu: bool, iters: usize, kernel: AttentionKernel) {
    let (batch, seq, d_model, heads) = (8, 256, 512, 8);
    let device = B::Device::default();
    let x = Tensor::<B, 3>::random([batch, seq, d_model], Distribution::Default, &device);
    let mha = MultiHeadAttentionConfig::new(d_model, heads)
        .with_kernel(kernel)
        .init::<B>(&device)
        .unwrap();
    let secs = median_secs(iters, || {
        finish(gpu, mha.forward(MhaInput::self_attn(x.clone())).context);
    });
    report("W1", backend, secs, batch as f64, "sequences");
}

fn w2<B: Backend>(backend: &str, gpu: bool, iters: usize) {
    let (encoder, x) = w2_encoder::<B>(&B::Device::default());
    let secs = median_secs(iters, || {
        finish(gpu, encoder.forward(SelfAttentionInput::new(x.clone())));
    });
    report(
        "W2",
        backend,
        secs,
        (W2_SHAPE[0] * W2_SHAPE[1]) as f64,
        "tokens",
    );
}

fn w4<B: Backend>(backend: &str, iters: usize) {
    let (model, source, options) = w4_model::<B>(&B::Device::default());
    let secs = median_secs(iters, || {
        let out = model
            .generate(std::slice::from_ref(&source), 1, &options)
            .expect("generation runs");
        assert_eq!(out.best_tokens()[0].len(), W4_NEW_TOKENS);
    });
    report("W4", backend, secs, W4_NEW_TOKENS as f64, "tokens");
}

/// The shapes `[m, k, n]` of the products in W1 and W2: projections, feed-forward in and out,
/// a fused QKV projection.
const GEMM_SHAPES: [[usize; 3]; 4] = [
    [2048, 512, 512],
    [1024, 512, 2048],
    [1024, 2048, 512],
    [2048, 512, 1536],
];

fn gemm<B: Backend>(backend: &str, gpu: bool, iters: usize) {
    let device = B::Device::default();
    for [m, k, n] in GEMM_SHAPES {
        let a = Tensor::<B, 2>::random([m, k], Distribution::Default, &device);
        let b = Tensor::<B, 2>::random([k, n], Distribution::Default, &device);
        let secs = median_secs(iters, || {
            finish(gpu, a.clone().matmul(b.clone()));
        });
        report(
            &format!("gemm {m}x{k}x{n}"),
            backend,
            secs,
            2.0 * (m * k * n) as f64 / 1e9,
            "GFLOP",
        );
    }
}

/// Runs `workload` on `B`, named `backend` in the report (`gpu`: a GPU backend), its
/// projections with `precision` (reported as `backend bf16` for bf16); W1 with the attention
/// `kernel` named `kernel_name` (reported as `backend/kernel_name` unless `auto`).
fn run<B: Backend>(
    workload: &str,
    backend: &str,
    gpu: bool,
    iters: usize,
    (kernel, kernel_name): (AttentionKernel, &str),
    precision: MatmulPrecision,
) {
    assert!(
        workload == "w1" || kernel == AttentionKernel::Auto,
        "the kernel argument applies to w1 only"
    );
    let mut backend = backend.to_string();
    if precision == MatmulPrecision::Bf16 {
        assert!(
            workload != "gemm",
            "gemm times burn's own matmul, which --precision does not change"
        );
        assert!(
            takes_bf16_products::<B>(),
            "--precision bf16: {backend} on this CPU runs its products in f32 (bf16 products \
             need the flex backend and a CPU with AMX or AVX-512 BF16)"
        );
        backend = format!("{backend} bf16");
    }
    let label = match kernel {
        AttentionKernel::Auto => backend.clone(),
        _ => format!("{backend}/{kernel_name}"),
    };
    with_matmul_precision(precision, || match workload {
        "gemm" => gemm::<B>(&backend, gpu, iters),
        "w1" => w1::<B>(&label, gpu, iters, kernel),
        "w2" => w2::<B>(&backend, gpu, iters),
        "w4" => w4::<B>(&backend, iters),
        other => panic!("unknown workload {other:?}: w1, w2, w4 or gemm"),
    });
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let precision = match args.iter().position(|a| a == "--precision") {
        Some(at) => {
            let value = args.get(at + 1).expect("--precision: f32 or bf16").clone();
            args.drain(at..at + 2);
            value.parse().unwrap_or_else(|e| panic!("--precision: {e}"))
        }
        None => MatmulPrecision::F32,
    };
    let workload = args.first().map_or("w1", String::as_str);
    let iters: usize = args
        .get(1)
        .map_or(10, |n| n.parse().expect("iters: a number"));
    let backends = match args.get(2).map(String::as_str) {
        Some(one) => vec![one],
        None => vec!["ndarray", "flex"],
    };
    let kernel_name = args.get(3).map_or("auto", String::as_str);
    let kernel = match kernel_name {
        "auto" => AttentionKernel::Auto,
        "fused" => AttentionKernel::Fused,
        "decomposed" => AttentionKernel::Decomposed,
        "flex" => AttentionKernel::Flex,
        other => panic!("unknown kernel {other:?}: auto, fused, decomposed or flex"),
    };
    let kernel = (kernel, kernel_name);
    for backend in backends {
        match backend {
            "ndarray" => run::<NdArray>(workload, backend, false, iters, kernel, precision),
            "flex" => run::<Flex>(workload, backend, false, iters, kernel, precision),
            #[cfg(feature = "wgpu")]
            "wgpu" => run::<burn::backend::Wgpu>(workload, backend, true, iters, kernel, precision),
            #[cfg(feature = "cuda")]
            "cuda" => run::<burn::backend::Cuda>(workload, backend, true, iters, kernel, precision),
            other => panic!(
                "unknown backend {other:?}: ndarray, flex, or wgpu / cuda with those features"
            ),
        }
    }
}
