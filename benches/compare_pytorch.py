#!/usr/bin/env python3
"""xfmr (ndarray, flex) against PyTorch on the speed workloads of issue 13, side by side in one
run on one machine, printed as one ratio table (throughput, higher is better; xfmr / PyTorch).

- W1: multi-head self-attention, batch 8, seq 256, d_model 512, 8 heads, inference.
  PyTorch: `nn.MultiheadAttention(batch_first=True)`, `need_weights=False`.
- W2: encoder stack, `base` widths (512, 8 heads, d_ff 2048, 6 post-norm layers), batch 8 × 128
  tokens, inference. PyTorch: `nn.TransformerEncoder` of 6 `nn.TransformerEncoderLayer`s.
- W3: one training step (forward, backward, Adam) of the CPU-sized encoder-decoder (`xfmr
  train`'s default preset: d_model 128, 4 heads, d_ff 512, 3 + 3 layers; dropout 0.1, given
  explicitly since that preset's default became 0 on 2026-11-27; shared and
  tied embeddings, label smoothing 0.1) on the embedded Spanish-English batches (verses of
  every length since 2026-11-27, of at most 100 characters before): the same BPE
  vocabulary (the run's tokenizer.json), the same token-count batches in the same order (the
  batching and the seeded shuffle ported from `xfmr_train::data`). Median step time and tokens/s
  (source + target tokens) over the steps after `--skip`. PyTorch: `nn.Transformer` with the same
  embeddings, positions and loss, `torch.optim.Adam(β = (0.9, 0.98), ε = 1e-9)`.
- W3S: the same step at a GPU's size: `xfmr train --preset small` (d_model 256, 4 heads, d_ff
  1024, 3 + 3 layers, dropout 0.1, its 4,000-token vocabulary) with 16,000-token batches,
  against the same model in PyTorch on the same batches in the same order (issue 41).
- W4: batch-1 greedy decoding of exactly 128 tokens with the `base` encoder-decoder (random
  weights, 37,000-token vocabulary) from a 24-token source. PyTorch: Hugging Face
  transformers' `MarianMTModel` at the same widths (sinusoidal positions, post-norm, ReLU,
  shared embeddings: the paper's model) through `generate` with its key/value cache.
- W5: all-MiniLM-L6-v2 embeddings of 1,000 sentences, batch 32 (`benches/compare_embed.py`).
- W6: SmolLM2-135M generation tokens/s (`benches/compare_generate.py`).

f32, `--threads` threads on both sides (`RAYON_NUM_THREADS` for xfmr, and as many training
replicas for W3's `xfmr train`; `torch.set_num_threads`), median of `--iters` timed runs after
warm-ups. Every measurement runs in a process of its own, so the peak resident memory (RSS) of
each is reported too.

    python3 benches/compare_pytorch.py [--workloads w1 w2 w3 w4 w5 w6] [--iters 10] [--rounds 3]

The GPU side, on a machine with an NVIDIA GPU: `--device cuda` runs PyTorch on CUDA (W1: its
`nn.MultiheadAttention` inference fast path, which calls `scaled_dot_product_attention`; each
timed run ends with `torch.cuda.synchronize()`) and xfmr on `--backends wgpu cuda` (default
there), built with the `wgpu` and `cuda` features; W1-W3 and W6 (W4 and W5 stay CPU workloads).

    python3 benches/compare_pytorch.py --device cuda --workloads w1 w2 w3 w3s w6

`--bf16` (W1, W2, W4 on the CPU): each round also runs xfmr's flex backend with `--precision
bf16` (the projections' products with bf16 factors and f32 sums, on AMX or AVX-512 BF16) and
PyTorch under `torch.autocast("cpu", dtype=torch.bfloat16)` (oneDNN's bf16 kernels), each
reported beside the f32 rows with its ratio to PyTorch's f32 and, in the last column, to
PyTorch's bf16 autocast.

    python3 benches/compare_pytorch.py --workloads w1 w2 w4 --backends flex --bf16

W1-W4 run in `--rounds` rounds that alternate xfmr (each backend) and PyTorch; each reported row
is its median round. This shared 2-core machine varies by up to 1.5x over minutes, and a single
pass of one side after the other measured that drift as much as the implementations.

Needs `torch` for the peer (and `transformers` for W4 and W6, `sentence-transformers` for W5,
`tokenizers` for W3); a missing one skips that peer with a note.
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
EXAMPLE = os.path.join(TARGET, "release/examples/workloads")
XFMR = os.path.join(TARGET, "release/xfmr")


def run_measured(cmd, env=None, timeout=None):
    """Runs `cmd`; returns (exit code, stdout, stderr, peak RSS in MiB of that process alone).
    After `timeout` seconds the process is killed (exit code -9)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        if timer:
            timer.cancel()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
        return os.waitstatus_to_exitcode(status), stdout, stderr, usage.ru_maxrss / 1024


class CommandFailed(Exception):
    """An xfmr command that exited non-zero (its backend is then left out of the table)."""


def checked(cmd, env=None):
    """`run_measured` for a command that must succeed: (stdout, stderr, peak RSS in MiB)."""
    code, stdout, stderr, rss = run_measured(cmd, env)
    if code != 0:
        raise CommandFailed(f"{' '.join(cmd)} failed ({code}):\n{stderr[-4000:]}")
    return stdout, stderr, rss


def median_round(rounds):
    """One row per implementation from `rounds` (lists of rows in the same order): the round
    with its median time, and the largest peak RSS of all rounds."""
    merged = []
    for same in zip(*rounds):
        ordered = sorted(same, key=lambda r: r["median_ms"])
        row = dict(ordered[len(ordered) // 2])
        row["rss_mib"] = max(r["rss_mib"] for r in same)
        merged.append(row)
    return merged


def xfmr_env(threads):
    return dict(os.environ, RAYON_NUM_THREADS=str(threads))


def torch_worker(workload, args, *extra, autocast=False):
    """Runs this script as a PyTorch worker in its own process (under bf16 autocast when
    `autocast`); None if the peer is missing (the worker exits with 3 then)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", workload, "--iters",
           str(args.iters), "--threads", str(args.threads), "--skip", str(args.skip),
           "--device", args.device, *extra, *(["--autocast"] if autocast else [])]
    code, stdout, stderr, rss = run_measured(cmd)
    if code == 3:
        print(f"{workload}: PyTorch peer skipped: {stderr.strip()}", file=sys.stderr)
        return None
    if code != 0:
        sys.exit(f"the PyTorch worker for {workload} failed ({code}):\n{stderr}")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["rss_mib"] = rss
    return result


# ---------------------------------------------------------------------------------------------
# The PyTorch side (run with --worker).


# The worker's device ("cpu" or "cuda"), set by `worker`.
DEVICE = "cpu"


def sync(torch):
    """Waits for the GPU's queued work (a no-op on the CPU), so a timed run includes it."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def median_secs(iters, f, warmup=2):
    import torch
    for _ in range(warmup):
        f()
    sync(torch)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        f()
        sync(torch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker_w1(torch, iters):
    batch, seq, d_model, heads = 8, 256, 512, 8
    mha = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval().to(DEVICE)
    x = torch.rand(batch, seq, d_model, device=DEVICE)
    with torch.inference_mode():
        secs = median_secs(iters, lambda: mha(x, x, x, need_weights=False))
    return secs, batch, "sequences"


def worker_w2(torch, iters):
    batch, seq = 8, 128
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).eval().to(DEVICE)
    x = torch.rand(batch, seq, 512, device=DEVICE)
    with torch.inference_mode():
        secs = median_secs(iters, lambda: encoder(x))
    return secs, batch * seq, "tokens"


def worker_w4(torch, iters):
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError as e:
        print(f"transformers not importable ({e})", file=sys.stderr)
        sys.exit(3)
    new_tokens = 128
    config = MarianConfig(
        vocab_size=37000, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, activation_function="relu", max_position_embeddings=1024,
        scale_embedding=True, pad_token_id=0, eos_token_id=2, decoder_start_token_id=1,
        forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    model = MarianMTModel(config).eval().to(DEVICE)
    source = torch.tensor([[10 + 37 * i for i in range(24)]], device=DEVICE)
    with torch.inference_mode():
        def run():
            out = model.generate(source, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 num_beams=1, do_sample=False)
            assert out.shape[1] == new_tokens + 1, out.shape  # + the start token
        secs = median_secs(iters, run, warmup=1)
    return secs, new_tokens, "tokens"


class SplitMix64:
    """`xfmr_translate::data::SplitMix64`, bit for bit."""

    def __init__(self, state):
        self.state = state

    def next(self):
        m = (1 << 64) - 1
        self.state = (self.state + 0x9E3779B97F4A7C15) & m
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)


def model_positions(m):
    """Where positions enter: the model's `positions` (a run's configuration of before
    2026-12-03 kept it in its layer, `layer.positions`)."""
    return m["positions"] if "positions" in m else m["layer"]["positions"]


def shuffled(n, seed, epoch):
    """`xfmr_train::data::shuffled`: the batch order of an epoch."""
    rng = SplitMix64(seed ^ ((epoch * 0xD1B54A32D192ED03) & ((1 << 64) - 1)))
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.next() % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def token_batches(lengths, max_tokens):
    """`xfmr_train::data::token_batches`: pairs sorted by length, cut by padded size."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][1], lengths[i][0], i))
    batches, batch, longest = [], [], 0
    for i in order:
        length = max(lengths[i])
        wider = max(longest, length)
        if batch and (len(batch) + 1) * wider > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        longest = max(longest, length)
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


# W3's and W3S's models: (d_model, heads, d_ff, layers a side, tokens a batch); `xfmr train`'s
# presets `cpu` and `small`.
W3_SHAPES = {"w3": (128, 4, 512, 3, 2000), "w3s": (256, 4, 1024, 3, 16000)}


def worker_w3(torch, iters, tokenizer_json, skip, shape=W3_SHAPES["w3"], max_len=100, seed=42):
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        print(f"tokenizers not importable ({e})", file=sys.stderr)
        sys.exit(3)
    nn = torch.nn
    d_model, heads, d_ff, layers, max_tokens = shape
    tok = Tokenizer.from_file(tokenizer_json)
    pad, bos, eos = 0, 1, 2
    pairs = []
    with open(os.path.join(ROOT, "crates/xfmr-cli/data/es-en/train.tsv")) as f:
        for line in f:
            src, tgt = line.rstrip("\n").split("\t")
            s = tok.encode(src, add_special_tokens=False).ids
            t = tok.encode(tgt, add_special_tokens=False).ids
            # The pairs `xfmr train` keeps: at most `--max-len` (100) tokens a side.
            if len(s) <= max_len and len(t) <= max_len:
                pairs.append((s, t))
    batches = token_batches([(len(s) + 1, len(t) + 1) for s, t in pairs], max_tokens)
    order = shuffled(len(batches), seed, 0)
    vocab = tok.get_vocab_size()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.core = nn.Transformer(d_model, heads, layers, layers, d_ff, dropout=0.1,
                                       batch_first=True)
            self.drop = nn.Dropout(0.1)
            position = torch.arange(1024).unsqueeze(1)
            div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            table = torch.zeros(1024, d_model)
            table[:, 0::2], table[:, 1::2] = torch.sin(position * div), torch.cos(position * div)
            self.register_buffer("table", table)

        def inputs(self, ids):
            x = self.embed(ids) * math.sqrt(d_model) + self.table[: ids.shape[1]]
            return self.drop(x)

        def forward(self, src, tgt_in):
            causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1],
                                                                    device=DEVICE)
            h = self.core(self.inputs(src), self.inputs(tgt_in), tgt_mask=causal,
                          src_key_padding_mask=src == pad, tgt_key_padding_mask=tgt_in == pad,
                          memory_key_padding_mask=src == pad, tgt_is_causal=True)
            return h @ self.embed.weight.T  # tied output projection

    model = Model().train().to(DEVICE)
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)

    def padded(rows, length):
        return torch.tensor([r + [pad] * (length - len(r)) for r in rows], device=DEVICE)

    times, tokens = [], []
    for step in range(skip + iters):
        rows = [pairs[i] for i in batches[order[step % len(order)]]]
        src = padded([s + [eos] for s, _ in rows], max(len(s) + 1 for s, _ in rows))
        t_len = max(len(t) + 1 for _, t in rows)
        tgt_in = padded([[bos] + t for _, t in rows], t_len)
        tgt_out = padded([t + [eos] for _, t in rows], t_len)
        start = time.perf_counter()
        logits = model(src, tgt_in)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tgt_out.reshape(-1),
                                           ignore_index=pad, label_smoothing=0.1)
        optim.zero_grad()
        loss.backward()
        optim.step()
        float(loss)
        if step >= skip:
            times.append(time.perf_counter() - start)
            tokens.append(sum(len(s) + len(t) + 2 for s, t in rows))
    return statistics.median(times), sum(tokens) / len(tokens), "tokens"


def worker(args):
    try:
        import torch
    except ImportError as e:
        print(f"torch not importable ({e})", file=sys.stderr)
        sys.exit(3)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("torch.cuda.is_available() is False", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.worker in W3_SHAPES:
        secs, units, unit = worker_w3(torch, args.iters, args.tokenizer, args.skip,
                                      W3_SHAPES[args.worker])
    else:
        # The model is built inside the autocast region too; autocast changes only the dtype
        # its products (and the ops autocast lists) compute in, not the f32 parameters.
        autocast = (torch.autocast(DEVICE, dtype=torch.bfloat16) if args.autocast
                    else contextlib.nullcontext())
        with autocast:
            secs, units, unit = {"w1": worker_w1, "w2": worker_w2, "w4": worker_w4}[
                args.worker](torch, args.iters)
    backend = f"{DEVICE} bf16 autocast" if args.autocast else DEVICE
    print(json.dumps({"workload": args.worker.upper(), "impl": f"pytorch {torch.__version__}",
                      "backend": backend, "median_ms": secs * 1e3, "per_s": units / secs,
                      "unit": unit}))


# ---------------------------------------------------------------------------------------------
# The xfmr side and the table.


def xfmr_example(workload, backend, iters, threads, bf16=False):
    precision = ["--precision", "bf16"] if bf16 else []
    stdout, _, rss = checked([EXAMPLE, workload, str(iters), backend, *precision],
                             xfmr_env(threads))
    result = json.loads(stdout.strip().splitlines()[-1])
    result["rss_mib"] = rss
    return result


def xfmr_w3(backend, iters, skip, threads, out, workload="w3", timeout=None):
    """`xfmr train` for `skip + iters` steps; the median step time after `skip`. A run that
    `timeout` cuts short (a GPU backend compiling kernels for each new shape) is reported from
    the steps it logged, marked `partial`; `first_step_s` is the time to the end of step 1
    (kernel compilation and autotuning included on a GPU)."""
    steps = skip + iters
    run = os.path.join(out, f"{workload}-{backend}")
    # W3S: the `small` preset (its own vocabulary size and dropout 0.1) at 16,000 tokens a batch.
    size = []
    if workload == "w3s":
        size = ["--preset", "small", "--max-tokens", str(W3_SHAPES["w3s"][4])]
    # A fresh run every round: `xfmr train` resumes a run directory that is already there, and
    # would only read back the previous round's metrics.
    shutil.rmtree(run, ignore_errors=True)
    # On a CPU backend one replica per thread, the step's batch split between them (the
    # default of `xfmr train` is one per core); on a GPU one.
    replicas = threads if backend in ("ndarray", "flex") else 1
    # `--dropout 0.1` as the PyTorch side (the `cpu` preset's own default is 0 since
    # 2026-11-27): W3 stays the step it was.
    cmd = [XFMR, "train", "--backend", backend, "--out", run, "--steps", str(steps), *size,
           "--dropout", "0.1", "--checkpoint-every", str(steps), "--eval-every", "1000000",
           "--average", "1", "--test-sentences", "0", "--devices", str(replicas)]
    code, _, stderr, rss = run_measured(cmd, xfmr_env(threads), timeout)
    rows = []
    metrics = os.path.join(run, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if '"train"' in line]
    partial = code != 0
    if partial and len(rows) < 3:
        raise CommandFailed(f"{' '.join(cmd)} failed ({code}) after {len(rows)} steps:\n"
                            f"{stderr[-4000:]}")
    if partial:
        print(f"{workload} {backend}: cut off after {len(rows)} of {steps} steps; the steps "
              f"after the first count", file=sys.stderr)
    first = min(skip, len(rows) - 2) if partial else skip
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])][first - 1:]
    tokens = [r["tokens"] for r in rows][first:]
    secs = statistics.median(times)
    return {"workload": workload.upper(), "impl": "xfmr", "backend": backend,
            "median_ms": secs * 1e3,
            "per_s": statistics.mean(tokens) / secs, "unit": "tokens", "rss_mib": rss,
            "steps": len(rows), "partial": partial, "first_step_s": rows[0]["elapsed_s"],
            "tokenizer": os.path.join(run, "tokenizer.json")}


def w5_rows(backends, repeats, threads):
    import compare_embed as ce
    with open(os.path.join(ROOT, "benches/data/kjv_1000.txt")) as f:
        sentences = [line.strip() for line in f if line.strip()]
    model = ce.model_dir()
    path = os.path.join(ROOT, "benches/data/kjv_1000.txt")
    rows = []
    seconds, reference = ce.peer(sentences, model, repeats, threads)
    if seconds is not None:
        import torch
        rows.append({"workload": "W5", "impl": f"pytorch {torch.__version__}", "backend": "peer",
                     "per_s": len(sentences) / seconds, "unit": "sentences"})
    for backend in backends:
        seconds, vectors = ce.xfmr(backend, path, model, repeats)
        if reference is not None:
            # The speed counts only if the vectors are sentence-transformers' own.
            cosine = ce.min_cosine(vectors, reference)
            print(f"W5 {backend}: minimum cosine to PyTorch's vectors {cosine:.6f}",
                  file=sys.stderr)
            if cosine < 0.9999:
                sys.exit(f"W5 {backend}: vectors differ from PyTorch's (cosine {cosine})")
        rows.append({"workload": "W5", "impl": "xfmr", "backend": backend,
                     "per_s": len(sentences) / seconds, "unit": "sentences"})
    return rows


def w6_rows(backends, repeats, threads, device):
    import compare_generate as cg
    path = cg.gguf_path()
    rows = []
    runs, _, name = cg.peer(path, repeats, threads, device)
    if runs:
        rows.append({"workload": "W6", "impl": f"transformers ({name})", "backend": "peer",
                     "per_s": statistics.median(r[2] for r in runs), "unit": "tokens"})
    for backend in backends:
        runs, _ = cg.xfmr(backend, path, repeats)
        rows.append({"workload": "W6", "impl": "xfmr", "backend": backend,
                     "per_s": statistics.median(r[2] for r in runs), "unit": "tokens"})
    return rows


def print_table(rows):
    bf16 = any(r["backend"].endswith("bf16 autocast") for r in rows)
    extra = (" vs PyTorch bf16 |", "---|") if bf16 else ("", "")
    print(f"\n| workload | implementation | backend | time (ms) | throughput | vs PyTorch "
          f"| peak RSS (MiB) |{extra[0]}\n|---|---|---|---|---|---|---|{extra[1]}")
    for workload in sorted({r["workload"] for r in rows}):
        group = [r for r in rows if r["workload"] == workload]
        peers = [r for r in group if r["impl"] != "xfmr"]
        # The f32 PyTorch row is the reference; the autocast one the last column's.
        peer = next((r for r in peers if not r["backend"].endswith("autocast")), None)
        peer_bf16 = next((r for r in peers if r["backend"].endswith("autocast")), None)
        for r in group:
            ratio = f"{r['per_s'] / peer['per_s']:.2f}×" if peer else "–"
            ms = f"{r['median_ms']:.1f}" if "median_ms" in r else "–"
            rss = f"{r['rss_mib']:.0f}" if "rss_mib" in r else "–"
            last = ""
            if bf16:
                last = f" {r['per_s'] / peer_bf16['per_s']:.2f}× |" if peer_bf16 else " – |"
            print(f"| {workload} | {r['impl']} | {r['backend']} | {ms} "
                  f"| {r['per_s']:.1f} {r['unit']}/s | {ratio} | {rss} |{last}")
    for r in rows:
        if "first_step_s" in r:
            cut = ", cut off by --xfmr-timeout" if r["partial"] else ""
            print(f"{r['workload']} xfmr {r['backend']}: step 1 ended after "
                  f"{r['first_step_s']:.1f} s; {r['steps']} steps logged{cut}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+",
                   help="default: w1-w6; with --device cuda: w1 w2 w3 w6 (w3s: W3 at the `small` "
                        "preset's size, 16,000-token batches)")
    p.add_argument("--backends", nargs="+",
                   help="xfmr's backends (default: ndarray flex; with --device cuda: wgpu cuda)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="PyTorch's device (cuda: the GPU side, see the docstring)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--skip", type=int, default=5, help="W3: warm-up steps left out")
    p.add_argument("--xfmr-timeout", type=float,
                   help="W3/W3S: seconds after which xfmr's run is cut off and reported from "
                        "the steps it logged (a GPU backend compiling kernels)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3,
                   help="W1-W4: alternating rounds of every implementation; the median counts")
    p.add_argument("--prebuilt", action="store_true",
                   help="use the binaries already in $CARGO_TARGET_DIR/release instead of "
                        "building them (a GPU machine without cargo: build here, carry them)")
    p.add_argument("--bf16", action="store_true",
                   help="W1, W2, W4: also xfmr flex with --precision bf16 and PyTorch under "
                        "bf16 autocast (see the docstring)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    gpu = args.device == "cuda"
    if gpu and args.bf16:
        sys.exit("--bf16 is a CPU comparison (xfmr's bf16 products run on flex)")
    if args.workloads is None:
        args.workloads = ["w1", "w2", "w3", "w6"] if gpu else ["w1", "w2", "w3", "w4", "w5", "w6"]
    if args.backends is None:
        args.backends = ["wgpu", "cuda"] if gpu else ["ndarray", "flex"]
    # `flex`: the facade's flex backend as users get it (AVX-512 gemm kernels, xfmr's attention
    # kernel); on a GPU machine also wgpu and CUDA.
    gpu_features = ["wgpu", "cuda"] if gpu else []
    if args.prebuilt:
        for path in (EXAMPLE, XFMR):
            if not os.access(path, os.X_OK):
                sys.exit(f"--prebuilt: {path} is missing; build it with the features "
                         f"{['flex', *gpu_features]} first")
    else:
        # One build of both binaries, so that burn is compiled once with the union of features.
        features = ["xfmr/flex", *(f"xfmr/{f}" for f in gpu_features),
                    *(f"xfmr-cli/{f}" for f in gpu_features)]
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "xfmr", "-p", "xfmr-cli",
                        "--features", ",".join(features), "--example", "workloads",
                        "--bin", "xfmr"], cwd=ROOT, check=True)
    rows = []
    bf16 = args.bf16
    with tempfile.TemporaryDirectory() as out:
        for w in args.workloads:
            print(f"{w} ...", file=sys.stderr, flush=True)
            if w in ("w1", "w2", "w3", "w3s", "w4"):
                # Rounds alternate the implementations, so that a slow spell of this shared
                # machine hits every side alike; each row is the round with the median time.
                rounds = []
                backends = list(args.backends)
                for _ in range(args.rounds):
                    this = []
                    for backend in list(backends):
                        try:
                            if w in W3_SHAPES:
                                this.append(xfmr_w3(backend, args.iters, args.skip,
                                                    args.threads, out, w, args.xfmr_timeout))
                            else:
                                this.append(xfmr_example(w, backend, args.iters,
                                                         args.threads))
                        except CommandFailed as e:
                            # One backend that fails (a GPU driver missing, say) is reported
                            # and left out; the others are still measured.
                            print(f"{w} {backend}: left out: {e}", file=sys.stderr)
                            backends.remove(backend)
                            if rounds:
                                rounds = [[r for r in rr if r["backend"] != backend]
                                          for rr in rounds]
                    if not this:
                        break
                    # W3: the same BPE vocabulary as xfmr's runs (they learn the same one).
                    extra = ("--tokenizer", this[-1]["tokenizer"]) if w in W3_SHAPES else ()
                    peer = torch_worker(w, args, *extra)
                    if peer:
                        this.append(peer)
                    if bf16 and w in ("w1", "w2", "w4"):
                        try:
                            this.append(xfmr_example(w, "flex", args.iters, args.threads, True))
                            peer = torch_worker(w, args, autocast=True)
                            if peer:
                                this.append(peer)
                        except CommandFailed as e:
                            # No bf16 products on this CPU: the example refuses; the f32
                            # rows stand alone (every round, so the rounds still line up).
                            print(f"{w} flex bf16: left out: {e}", file=sys.stderr)
                            bf16 = False
                            rounds = [[r for r in rr if "bf16" not in r["backend"]]
                                      for rr in rounds]
                    rounds.append(this)
                    print("  round %d: %s" % (len(rounds), ", ".join(
                        f"{r['impl'].split()[0]} {r['backend']} {r['median_ms']:.1f} ms"
                        for r in this)), file=sys.stderr, flush=True)
                rows.extend(median_round(rounds))
                peer = None
            elif w == "w5":
                rows.extend(w5_rows(args.backends, max(3, args.iters // 3), args.threads))
                peer = None
            elif w == "w6":
                rows.extend(w6_rows(args.backends, max(3, args.iters // 2), args.threads,
                                   args.device))
                peer = None
            else:
                sys.exit(f"unknown workload {w}")
            if peer:
                rows.append(peer)
    print(f"{args.threads} threads on both sides; median of {args.iters} timed runs, the median "
          f"of {args.rounds} alternating rounds (W5: best of its repeats, W6: median; see their "
          f"scripts)")
    print_table(rows)


if __name__ == "__main__":
    main()
