#!/usr/bin/env python3
"""A/B of two `xfmr` binaries on one training task: the training speed of a change, measured
as the tokens per second between step 50 and the last step of `xfmr train --steps N`, both
binaries in alternating order on the same machine, with the validation perplexity at the end
(the same batches in the same order: a change that alters the arithmetic shows there).

    cp target/release/xfmr /tmp/xfmr-before    # before the change
    cargo build --release -p xfmr-cli          # after it
    python3 benches/ab_train.py --task lm --steps 250 --rounds 2 --base /tmp/xfmr-before

Steps 1-50 are left out: they hold the tokenizer's start and the first allocations. Each run
goes to a fresh directory under --out (removed first). The figures go to docs/training.md
with the machine, the command and the date.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, task, steps, out):
    """Trains with `binary`; (tokens per second over steps 51..steps, last train loss,
    last validation perplexity)."""
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([binary, "train", "--task", task, "--steps", str(steps), "--minutes", "0",
                    "--test-sentences", "0", "--out", out],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=ROOT)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = {r["step"]: r for r in records if r["kind"] == "train"}
    valid = [r for r in records if r["kind"] == "valid"]
    tokens = sum(train[s]["tokens"] for s in range(51, steps + 1))
    seconds = train[steps]["elapsed_s"] - train[50]["elapsed_s"]
    return tokens / seconds, train[steps]["loss"], valid[-1]["perplexity"] if valid else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=["translation", "lm", "mlm"], default="translation")
    p.add_argument("--steps", type=int, default=250, help="steps per run (more than 50)")
    p.add_argument("--rounds", type=int, default=2, help="pairs of runs, alternating order")
    p.add_argument("--base", required=True, help="the binary before the change")
    p.add_argument("--new", default=os.path.join(ROOT, "target/release/xfmr"))
    p.add_argument("--out", default="/tmp/xfmr-ab")
    args = p.parse_args()
    if args.steps <= 50:
        p.error("--steps must be above 50")
    binaries = {"base": args.base, "new": args.new}
    speeds = {name: [] for name in binaries}
    for r in range(args.rounds):
        order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
        for name in order:
            out = os.path.join(args.out, f"{args.task}-{name}")
            speed, loss, ppl = run(binaries[name], args.task, args.steps, out)
            speeds[name].append(speed)
            print(f"{name}: {speed:,.0f} tokens/s over steps 51-{args.steps}, "
                  f"train loss {loss:.4f}, validation perplexity {ppl}", flush=True)
    base, new = (statistics.median(speeds[k]) for k in ("base", "new"))
    print(f"median: base {base:,.0f}, new {new:,.0f} tokens/s; new/base {new / base:.2f}")


if __name__ == "__main__":
    main()
