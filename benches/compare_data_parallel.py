#!/usr/bin/env python3
"""Training tokens/s of 1 process against N data-parallel processes on this machine (issue 14).

Runs `xfmr train` on the embedded Spanish-English data, once as one process with every thread
and once as N processes on localhost (each with threads / N), alternately, `--repeats` times.
tokens/s = the target+source tokens of steps after `--skip` (warm-up) over their wall time, read
from rank 0's metrics.jsonl (rank 0 reports the whole step's tokens, summed over the ranks).

    cargo build --release -p xfmr-cli
    python3 benches/compare_data_parallel.py --steps 40 --repeats 2
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tokens_per_s(metrics: Path, skip: int) -> float:
    rows = [json.loads(l) for l in metrics.read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    start = next(r for r in train if r["step"] == skip)
    later = [r for r in train if r["step"] > skip]
    return sum(r["tokens"] for r in later) / (later[-1]["elapsed_s"] - start["elapsed_s"])


def run(binary, out: Path, steps: int, skip: int, nodes: int, threads: int, port: int) -> float:
    common = [binary, "train", "--data", str(ROOT / "crates/xfmr-cli/data/es-en"),
              "--steps", str(steps), "--checkpoint-every", str(steps), "--eval-every", "100000",
              "--average", "1", "--test-sentences", "0"]
    procs = []
    for rank in range(nodes):
        args = common + ["--out", str(out / f"rank{rank}")]
        if nodes > 1:
            args += ["--nodes", str(nodes), "--rank", str(rank),
                     "--coordinator", f"127.0.0.1:{port}", "--data-port", str(port + 1 + rank)]
        env = dict(os.environ, RAYON_NUM_THREADS=str(max(1, threads // nodes)))
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                      stderr=open(out / f"rank{rank}.err", "w")))
    for rank, p in enumerate(procs):
        if p.wait() != 0:
            raise SystemExit(f"rank {rank} failed: see {out / f'rank{rank}.err'}")
    return tokens_per_s(out / "rank0" / "metrics.jsonl", skip)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(ROOT / "target/release/xfmr"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--port", type=int, default=29500)
    a = ap.parse_args()
    one, many = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeats):
            for nodes, into in ((1, one), (a.nodes, many)):
                out = Path(tmp) / f"{nodes}-{i}"
                out.mkdir()
                into.append(run(a.binary, out, a.steps, a.skip, nodes, a.threads, a.port + 10 * i))
                print(f"run {i + 1}: {nodes} process(es): {into[-1]:.0f} tokens/s", flush=True)
    m1, mn = statistics.median(one), statistics.median(many)
    print(f"\n{a.threads} threads, steps {a.skip + 1}..{a.steps}, median of {a.repeats}")
    print(f"| processes | threads each | tokens/s | vs 1 process |\n|---|---|---|---|")
    print(f"| 1 | {a.threads} | {m1:.0f} | 1 |")
    print(f"| {a.nodes} | {max(1, a.threads // a.nodes)} | {mn:.0f} | {mn / m1:.2f}× |")
