#!/usr/bin/env python3
"""Sentence-embedding throughput: `xfmr embed` vs sentence-transformers (PyTorch), in one run
on one machine, same model files (all-MiniLM-L6-v2), same 1,000 sentences
(benches/data/kjv_1000.txt: King James verses, public domain), batch 32, f32, CPU.

Both sides are timed on the embedding call only (tokenization + forward + pooling +
normalisation; model loading excluded): xfmr reports it on stderr, sentence-transformers is
timed around `encode` after a warm-up. Each side runs `--repeats` times; the best time counts.
The script also checks that both produced the same vectors (minimum cosine).

    python3 benches/compare_embed.py [--backends ndarray flex] [--repeats 3]
        [--xfmr-bin target/release/xfmr]

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


def xfmr(binary, backend, path, model, repeats):
    best, vectors = None, None
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            run = subprocess.run(
                [binary, "embed",
                 "--file", path, "--json", out, "--backend", backend, "--model-dir", model,
                 "--batch-size", "32"],
                cwd=ROOT, check=True, capture_output=True, text=True,
            )
            timed = re.search(r"embedded \d+ sentences in ([0-9.]+) s", run.stderr)
            seconds = float(timed.group(1))
            if best is None or seconds < best:
                best = seconds
                with open(out) as f:
                    vectors = [row["embedding"] for row in json.load(f)]
    return best, vectors


def peer(sentences, model, repeats, threads):
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        print(f"sentence-transformers not importable ({e}): peer skipped", file=sys.stderr)
        return None, None
    torch.set_num_threads(threads)
    st = SentenceTransformer(model, device="cpu")
    st.encode(sentences[:64], batch_size=32)  # warm-up
    best, vectors = None, None
    for _ in range(repeats):
        start = time.perf_counter()
        out = st.encode(sentences, batch_size=32)
        seconds = time.perf_counter() - start
        if best is None or seconds < best:
            best, vectors = seconds, out.tolist()
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


if __name__ == "__main__":
    main()
