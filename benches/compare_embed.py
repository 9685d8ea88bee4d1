#!/usr/bin/env python3
"""Sentence-embedding throughput: `xfmr embed` vs sentence-transformers (PyTorch), in one run
on one machine, same model files (all-MiniLM-L6-v2), same 1,000 sentences
(benches/data/kjv_1000.txt: King James verses, public domain), batch 32, CPU; f32, and with
`--bf16` both sides again with bf16 products permitted: `xfmr embed --precision bf16` (bf16
factors, f32 sums: AMX or AVX-512 BF16 on the flex backend) beside sentence-transformers under
`torch.autocast("cpu", dtype=torch.bfloat16)` (oneDNN's bf16 kernels), each line with its
minimum cosine to the f32 peer's vectors.

Both sides are timed on the embedding call only (tokenization + forward + pooling +
normalisation; model loading excluded): xfmr reports it on stderr, sentence-transformers is
timed around `encode` after a warm-up. Each side runs `--repeats` times; the best time counts.
The script also checks that both produced the same vectors (minimum cosine).

    python3 benches/compare_embed.py [--backends ndarray flex] [--repeats 3]
        [--xfmr-bin target/release/xfmr] [--bf16]

Without `--xfmr-bin` it builds `cargo build --release -p xfmr-cli` first and runs that binary.

Needs the model (`cargo run -p xfmr-cli -- fetch-model minilm`) and, for the peer,
`pip install sentence-transformers` (a venv with torch).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_dir(binary):
    out = subprocess.run(
        [binary, "fetch-model", "minilm"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return out.strip().splitlines()[-1]


def xfmr(binary, backend, path, model, repeats, precision="f32"):
    best, vectors = None, None
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            run = subprocess.run(
                [binary, "embed",
                 "--file", path, "--json", out, "--backend", backend, "--model-dir", model,
                 "--batch-size", "32",
                 # Only when asked: a binary older than the option still runs the f32 rows.
                 *(["--precision", precision] if precision != "f32" else [])],
                cwd=ROOT, check=True, capture_output=True, text=True,
            )
            timed = re.search(r"embedded \d+ sentences in ([0-9.]+) s", run.stderr)
            seconds = float(timed.group(1))
            if best is None or seconds < best:
                best = seconds
                with open(out) as f:
                    vectors = [row["embedding"] for row in json.load(f)]
    return best, vectors


def peer(sentences, model, repeats, threads, bf16=False):
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        print(f"sentence-transformers not importable ({e}): peer skipped", file=sys.stderr)
        return None, None
    import contextlib
    torch.set_num_threads(threads)
    st = SentenceTransformer(model, device="cpu")

    def context():
        if bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    with context():
        st.encode(sentences[:64], batch_size=32)  # warm-up
    best, vectors = None, None
    for _ in range(repeats):
        with context():
            start = time.perf_counter()
            out = st.encode(sentences, batch_size=32, convert_to_numpy=False)
            seconds = time.perf_counter() - start
        out = [v.float().tolist() for v in out]
        if best is None or seconds < best:
            best, vectors = seconds, out
    return best, vectors


def min_cosine(a, b):
    def cos(x, y):
        dot = sum(p * q for p, q in zip(x, y))
        nx = sum(p * p for p in x) ** 0.5
        ny = sum(q * q for q in y) ** 0.5
        return dot / (nx * ny)
    return min(cos(x, y) for x, y in zip(a, b))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", nargs="+", default=["ndarray", "flex"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--file", default=os.path.join(ROOT, "benches/data/kjv_1000.txt"))
    parser.add_argument("--xfmr-bin", help="an xfmr binary (default: build the release one)")
    parser.add_argument("--bf16", action="store_true",
                        help="also both sides with bf16 products permitted")
    args = parser.parse_args()
    with open(args.file) as f:
        sentences = [line.strip() for line in f if line.strip()]
    binary = args.xfmr_bin
    if binary is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "xfmr-cli"], cwd=ROOT,
                       check=True)
        binary = os.path.join(ROOT, "target", "release", "xfmr")
    model = model_dir(binary)
    n = len(sentences)
    torch_s, torch_v = peer(sentences, model, args.repeats, args.threads)
    if torch_s is not None:
        import torch
        print(f"sentence-transformers (torch {torch.__version__}, {args.threads} threads): "
              f"{n / torch_s:8.1f} sentences/s ({torch_s:.2f} s)")
    for backend in args.backends:
        seconds, vectors = xfmr(binary, backend, args.file, model, args.repeats)
        line = f"xfmr embed --backend {backend:8}: {n / seconds:8.1f} sentences/s ({seconds:.2f} s)"
        if torch_s is not None:
            line += (f"   xfmr/torch {torch_s / seconds:.2f}x"
                     f"   min cosine to torch {min_cosine(vectors, torch_v):.6f}")
        print(line)
    if not args.bf16:
        return
    bf16_s, bf16_v = peer(sentences, model, args.repeats, args.threads, bf16=True)
    if bf16_s is not None:
        print(f"sentence-transformers, bf16 autocast: {n / bf16_s:8.1f} sentences/s "
              f"({bf16_s:.2f} s)   min cosine to its f32 {min_cosine(bf16_v, torch_v):.6f}")
    for backend in args.backends:
        seconds, vectors = xfmr(binary, backend, args.file, model, args.repeats, "bf16")
        line = (f"xfmr embed --backend {backend:8} --precision bf16: {n / seconds:8.1f} "
                f"sentences/s ({seconds:.2f} s)")
        if torch_s is not None:
            line += (f"   /torch f32 {torch_s / seconds:.2f}x"
                     f"   min cosine to torch f32 {min_cosine(vectors, torch_v):.6f}")
        if bf16_s is not None:
            line += f"   /torch bf16 {bf16_s / seconds:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
