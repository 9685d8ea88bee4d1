#!/usr/bin/env python3
"""xfmr's main job against PyTorch with the same recipe, the same minutes and the same machine
(issue 44): `xfmr train` and its PyTorch port, each for the same wall-clock budget, one after
the other in alternating order, 2 threads each, on the same data, printing what each reached.

    cargo build --release -p xfmr-cli
    python3 benches/side_by_side.py --task translation --minutes 10 --rounds 2
    python3 benches/side_by_side.py --task lm --minutes 10
    python3 benches/side_by_side.py --task mlm --minutes 10

The PyTorch side is `benches/torch_translate.py`, `torch_lm.py` or `torch_mlm.py`: the same
model (read from the run's `train-config.json`), the same BPE ids (its `tokenizer.json`), the
same token-count batches in the same order, the same loss, optimiser and schedule (each
script's docstring says what differs). Its run directory is prepared first by a one-step
`xfmr train` into `<out>/prep` (the tokenizer and the configuration; deterministic, so the same
as every xfmr run's), so either side can go first.

Per side and round: optimiser steps, tokens per second (input and predicted tokens, as
`xfmr train`'s metrics count them), validation perplexity at the end of the budget, and the
family's score: test BLEU (greedy, and beam with the length penalty chosen on the validation
split) for translation, masked-token accuracy on the validation split's fixed masks for mlm.
xfmr runs as the README's first command does (`--backend auto`: flex with one replica per
core, 2 on a 2-core machine; `--threads` sets PyTorch's). Every line of each side's output goes to `<out>/<side>-<round>.log`; a summary,
one JSON object per run, to `<out>/results.jsonl` and a table to stdout.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compare_llamacpp import cpu_model  # noqa: E402  (the CPU's name, as every bench reports it)

PEERS = {"translation": "torch_translate.py", "lm": "torch_lm.py", "mlm": "torch_mlm.py"}


def run_logged(cmd, log):
    """Runs `cmd`, its output (stdout and stderr) into `log`; the wall-clock seconds."""
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if code != 0:
        sys.exit(f"{cmd[0]} failed ({code}); see {log}")
    return time.perf_counter() - start


def xfmr_result(task, run_dir, wall):
    """What `xfmr train` reached, from its run directory's metrics and results."""
    records = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid"]
    if not train or not valid:
        sys.exit(f"{run_dir}/metrics.jsonl: no training steps or no validation")
    last = valid[-1]
    result = {
        "side": "xfmr",
        "steps": train[-1]["step"],
        "train_s": round(train[-1]["elapsed_s"], 1),
        "tokens_per_s": round(sum(r["tokens"] for r in train) / train[-1]["elapsed_s"]),
        "valid_ppl": round(last["perplexity"], 3),
        "valid_accuracy": last.get("accuracy"),
        "wall_s": round(wall, 1),
    }
    if task == "translation":
        with open(os.path.join(run_dir, "results.json")) as f:
            scores = json.load(f)
        with open(os.path.join(run_dir, "decoding.json")) as f:
            result["length_penalty"] = json.load(f)["length_penalty"]
        for name in ("greedy", "beam"):
            result[f"test_bleu_{name}"] = round(scores[name]["bleu"], 2)
            result[f"test_chrf_{name}"] = round(scores[name]["chrf"], 2)
    return result


def torch_result(log, wall):
    final = None
    with open(log) as f:
        for line in f:
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("final"):
                    final = record
    if final is None:
        sys.exit(f"{log}: no final line")
    keys = ["steps", "train_s", "tokens_per_s", "valid_ppl", "valid_accuracy",
            "length_penalty", "test_bleu_greedy", "test_bleu_beam", "test_chrf_greedy",
            "test_chrf_beam"]
    result = {"side": "pytorch", **{k: final.get(k) for k in keys if k in final}}
    result["valid_ppl"] = round(result["valid_ppl"], 3)
    result["wall_s"] = round(wall, 1)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=sorted(PEERS), default="translation")
    p.add_argument("--minutes", type=float, default=10.0, help="each side's training budget")
    p.add_argument("--rounds", type=int, default=1,
                   help="pairs of runs; round r runs xfmr first when r is even")
    p.add_argument("--first", choices=["xfmr", "pytorch"], default="xfmr",
                   help="who goes first in round 0")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default=os.path.join(ROOT, "crates/xfmr-cli/data/es-en"))
    p.add_argument("--xfmr", default=os.path.join(ROOT, "target/release/xfmr"))
    p.add_argument("--python", default=sys.executable, help="the Python with torch")
    p.add_argument("--out", default=os.path.join(ROOT, "target/side-by-side"))
    p.add_argument("--test-sentences", type=int,
                   help="translation: score the first N test sentences (default: all)")
    p.add_argument("--xfmr-args", default="", help="more `xfmr train` flags, space-separated")
    p.add_argument("--torch-args", default="",
                   help="more flags of the PyTorch script, space-separated (e.g. --gather)")
    args = p.parse_args()
    # The peer's modules, checked before ten minutes of xfmr's training rather than after.
    modules = ["torch"] + (["sacrebleu"] if args.task == "translation" else [])
    missing = [m for m in modules
               if subprocess.run([args.python, "-c", f"import {m}"],
                                 capture_output=True).returncode != 0]
    if missing:
        sys.exit(f"{args.python} lacks {', '.join(missing)}: "
                 f"{args.python} -m pip install {' '.join(missing)}")
    out = os.path.join(args.out, args.task)
    os.makedirs(out, exist_ok=True)
    extra = args.xfmr_args.split()
    base = [args.xfmr, "train", "--task", args.task, "--data", args.data] + extra
    scored = []
    if args.test_sentences is not None and args.task == "translation":
        scored = ["--test-sentences", str(args.test_sentences)]
    prep = os.path.join(out, "prep")
    if not os.path.exists(os.path.join(prep, "train-config.json")):
        run_logged(base + ["--steps", "1", "--minutes", "0", "--test-sentences", "0",
                           "--out", prep], os.path.join(out, "prep.log"))
    header = {"task": args.task, "minutes": args.minutes, "cpu": cpu_model(),
              "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "xfmr_args": extra, "torch_args": args.torch_args.split()}
    print(json.dumps(header), flush=True)
    results = []
    for r in range(args.rounds):
        sides = ["xfmr", "pytorch"]
        if (args.first == "pytorch") != (r % 2 == 1):
            sides.reverse()
        for side in sides:
            log = os.path.join(out, f"{side}-{r}.log")
            if side == "xfmr":
                run_dir = os.path.join(out, f"xfmr-{r}")
                if os.path.exists(run_dir):
                    sys.exit(f"{run_dir} exists (a run there would resume): remove it")
                wall = run_logged(base + scored + ["--minutes", str(args.minutes), "--out",
                                                   run_dir], log)
                result = xfmr_result(args.task, run_dir, wall)
            else:
                cmd = [args.python, os.path.join(HERE, PEERS[args.task]), "--run", prep,
                       "--data", args.data, "--minutes", str(args.minutes),
                       "--steps", str(10 ** 9), "--threads", str(args.threads), "--device",
                       "cpu"]
                cmd += scored + args.torch_args.split()
                result = torch_result(log, run_logged(cmd, log))
            result.update(round=r, **header)
            results.append(result)
            print(json.dumps(result), flush=True)
            with open(os.path.join(out, "results.jsonl"), "a") as f:
                f.write(json.dumps(result) + "\n")
    columns = ["side", "round", "steps", "tokens_per_s", "valid_ppl", "valid_accuracy",
               "test_bleu_greedy", "test_bleu_beam", "length_penalty"]
    columns = [c for c in columns if any(res.get(c) is not None for res in results)]
    print("\n" + " | ".join(columns))
    for res in results:
        print(" | ".join(str(res.get(c, "")) for c in columns))


if __name__ == "__main__":
    main()
