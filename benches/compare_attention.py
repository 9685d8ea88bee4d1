#!/usr/bin/env python3
"""Self-attention throughput, xfmr vs burn-nn 0.21 vs PyTorch, in one run on one machine.

Runs the Rust example `attention_throughput` (xfmr and burn-nn on ndarray and flex), then
PyTorch's nn.MultiheadAttention on the same shapes when `torch` is importable, and prints each
time with its ratio to burn-nn (same backend) and to PyTorch. All use f32, inference, no mask,
and 2 threads (the Rust backends use every core: run on a 2-core machine or set
RAYON_NUM_THREADS=2).

    python3 benches/compare_attention.py [--batch 8 --seq 256 --d-model 512 --heads 8 --iters 20]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def rust_results(args):
    cmd = [
        "cargo", "run", "--release", "-q", "-p", "xfmr", "--features", args.features,
        "--example", "attention_throughput", "--",
        str(args.batch), str(args.seq), str(args.d_model), str(args.heads), str(args.iters),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def torch_result(args):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(args.threads)
    mha = torch.nn.MultiheadAttention(args.d_model, args.heads, batch_first=True).eval()
    x = torch.rand(args.batch, args.seq, args.d_model)
    times = []
    with torch.inference_mode():
        for i in range(args.iters + 3):
            start = time.perf_counter()
            mha(x, x, x, need_weights=False)
            if i >= 3:
                times.append(time.perf_counter() - start)
    secs = statistics.median(times)
    return {"impl": f"pytorch {torch.__version__}", "backend": "cpu", "median_ms": secs * 1e3,
            "seq_per_s": args.batch / secs}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--features", default="flex",
                   help="cargo features of the xfmr crate (e.g. flex,x86-v4)")
    args = p.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))

    rows = rust_results(args)
    torch_row = torch_result(args)
    burn_nn = {r["backend"]: r["median_ms"] for r in rows if r["impl"] == "burn-nn"}
    print(f"self-attention batch {args.batch}, seq {args.seq}, d_model {args.d_model}, "
          f"{args.heads} heads, f32, {args.threads} threads, median of {args.iters}, "
          f"features {args.features}")
    print(f"{'impl':<24}{'backend':<10}{'ms':>10}{'seq/s':>10}{'vs burn-nn':>12}{'vs pytorch':>12}")
    for r in rows + ([torch_row] if torch_row else []):
        vs_nn = burn_nn.get(r["backend"])
        vs_nn = f"{vs_nn / r['median_ms']:.2f}x" if vs_nn else "-"
        vs_pt = f"{torch_row['median_ms'] / r['median_ms']:.2f}x" if torch_row else "-"
        print(f"{r['impl']:<24}{r['backend']:<10}{r['median_ms']:>10.2f}{r['seq_per_s']:>10.1f}"
              f"{vs_nn:>12}{vs_pt:>12}")
    if torch_row is None:
        print("PyTorch: `import torch` failed in this interpreter, so it was left out.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
