#!/usr/bin/env python3
"""Text generation with SmolLM2-135M-Instruct: `xfmr generate --backend flex` vs llama.cpp
(through the `llama-cpp-python` package), in one run on one machine: the same GGUF file (Q4_1
by default; any `--model`, a Q4_K one made with llama.cpp's quantiser among them), the same
~100-token prompt (`--long-prompt`: ~512 tokens of the same text further on), batch 1, greedy,
exactly 128 new tokens (the end token is held off on both sides), 2 threads; speed and peak
memory. llama.cpp runs with n_batch 512 and n_ctx 512 (1024 for the long prompt).

Timing, the same definition on both sides: prompt tokens/s = prompt length / time to the first
generated token (the prompt's forward pass in one batch and one greedy step); generation
tokens/s = (128 − 1) / time from the first generated token to the last. xfmr prints both on
stderr; the llama.cpp side is timed around `Llama.eval` (the prompt as one batch, then one
token a step) and an argmax over the last position's logits with the end token's set to −inf.
Model loading is excluded from the rates (its time is shown apart).

Memory: peak resident set size (RSS) of each side's own process, from `os.wait4` on it (Linux's
`ru_maxrss`). Every round runs each side in a fresh process: xfmr as the release binary itself
(not under cargo), llama.cpp as this script in a hidden `--child llamacpp` mode, so its figure
includes the Python interpreter, numpy and llama-cpp-python (the child reports its RSS before
loading the model too, shown apart). llama.cpp maps the GGUF file (`use_mmap`, its default):
the file's pages it touched count in its RSS as they count in xfmr's, which reads the whole
file. A child's `ru_maxrss` starts at its parent's at the fork, so this script keeps the parent
small (it never imports numpy or llama_cpp itself). llama.cpp runs with its own defaults
otherwise (its quantised matrix kernels, f16 key/value cache).

Rounds alternate, xfmr then llama.cpp, `--rounds` times after one warm-up round of each that is
not counted; the medians count. The script checks that both sides generated the same text
(a difference is a warning: quantised activations round differently on the two sides) and
prints the machine, versions, date and command line, to paste into docs/benchmarks.md.

Run it on an otherwise idle machine. llama.cpp's threads (OpenMP) wait for each other after
every operation, so with 2 threads on 2 cores one other busy process (a build) wrecks its
speed: on the 2-core development machine beside a rustc, 2 threads gave 13 prompt and 1.3 to 9
generation tokens/s where 1 thread gave 130 and 50. The load average is printed with the figures.

    python3 benches/compare_llamacpp.py [--rounds 5] [--weights quantized|f32] [--long-prompt]
        [--model FILE.gguf] [--xfmr-bin target/release/xfmr] [--threads 2]

Without `--xfmr-bin` it builds `cargo build --release -p xfmr-cli` first. Needs the model
(`xfmr fetch-model smollm2`, which the script runs unless `--model` is given) and, for the peer,
`pip install llama-cpp-python`: PyPI has only its source, and pip compiles llama.cpp (CMake and
a C++ compiler; about 10 minutes on two cores). It builds for the machine it is on.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The same prompt and length as the transformers comparison (this script's directory is on
# sys.path when it runs, the child included).
from compare_generate import NEW_TOKENS, PROMPT, long_prompt  # noqa: E402

XFMR_LINE = re.compile(r"prompt: (\d+) tokens in [0-9.]+ s \(([0-9.]+) tokens/s\); "
                       r"generated: (\d+) tokens, ([0-9.]+) tokens/s")
XFMR_LOAD = re.compile(r"loaded in ([0-9.]+) s")


def child_llamacpp(path, threads, prompt, no_extra_bufts=False):
    """The llama.cpp side of one round, in its own process: prints one JSON line."""
    import resource

    import numpy as np
    import llama_cpp

    if no_extra_bufts:
        # llama.cpp's extra weight buffers (AMX, and the repacked layouts of Q4_0/Q4_K/IQ4_NL)
        # off: `Llama` does not expose the field, so its default parameters are patched.
        default_params = llama_cpp.llama_cpp.llama_model_default_params

        def params():
            p = default_params()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_cpp.llama_model_default_params = params

    rss_base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    # n_ctx: the prompt (≤ 512 tokens, one batch) and the new tokens (512 as before for the
    # short prompt).
    n_ctx = 512 if len(prompt) < 1000 else 1024
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, use_mmap=True, verbose=False)
    load = time.perf_counter() - start
    ids = llm.tokenize(prompt.encode(), add_bos=True)  # BOS as the file says
    assert len(ids) + NEW_TOKENS <= llm.n_ctx() and len(ids) <= 512, len(ids)
    eos, n_vocab = llm.token_eos(), llm.n_vocab()

    def greedy():
        # The last position's logits (the only ones computed), end token held off.
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()
        logits[eos] = -np.inf
        return int(logits.argmax())

    tokens, times = [], []
    start = time.perf_counter()
    llm.eval(ids)  # one batch: n_batch >= prompt length
    tokens.append(greedy())
    times.append(time.perf_counter())
    while len(tokens) < NEW_TOKENS:
        llm.eval([tokens[-1]])
        tokens.append(greedy())
        times.append(time.perf_counter())
    assert len(tokens) == NEW_TOKENS and eos not in tokens
    # Byte length of the text of each prefix of the tokens, to compare with xfmr's text.
    ends = [len(llm.detokenize(tokens[:k + 1])) for k in range(len(tokens))]
    print(json.dumps({
        "prompt_tokens": len(ids),
        "prompt_tps": len(ids) / (times[0] - start),
        "gen_tps": (NEW_TOKENS - 1) / (times[-1] - times[0]),
        "load_s": load,
        "text": llm.detokenize(tokens).decode("utf-8", errors="replace"),
        "ends": ends,
        "rss_base_kib": rss_base,
        "rss_self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }), flush=True)


def run_measured(cmd, env=None):
    """Runs `cmd` to the end; returns (exit code, stdout, stderr, peak RSS in KiB) of that
    process alone (`os.wait4`, not RUSAGE_CHILDREN, which would mix processes)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode("utf-8", errors="replace"),
                err.read().decode("utf-8", errors="replace"), usage.ru_maxrss)


def build_xfmr():
    print("building: cargo build --release -p xfmr-cli", file=sys.stderr, flush=True)
    run = subprocess.run(
        ["cargo", "build", "--release", "-p", "xfmr-cli", "--message-format=json-render-diagnostics"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    if run.returncode != 0:
        sys.exit(f"cargo build --release -p xfmr-cli failed ({run.returncode})")
    for line in run.stdout.splitlines():
        msg = json.loads(line) if line.startswith("{") else {}
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") \
                and msg["target"]["name"] == "xfmr":
            return msg["executable"]
    sys.exit("cargo build did not report the xfmr executable")


def gguf_path(xfmr_bin):
    out = subprocess.run([xfmr_bin, "fetch-model", "smollm2"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def xfmr_round(xfmr_bin, path, weights, threads, prompt):
    cmd = [xfmr_bin, "generate", "--backend", "flex", "--model", path,
           "--max-tokens", str(NEW_TOKENS), "--min-tokens", str(NEW_TOKENS),
           "--weights", weights, prompt]
    code, out, err, rss = run_measured(cmd, dict(os.environ, RAYON_NUM_THREADS=str(threads)))
    if code != 0:
        if "--weights" in err:
            sys.exit(f"{xfmr_bin} does not take `--weights {weights}` (a binary from before the "
                     f"flag, or a value it does not know): build one that does, or pass "
                     f"--xfmr-bin PATH.\n{err.strip()}")
        sys.exit(f"xfmr failed ({code}):\n{err}")
    m = XFMR_LINE.search(err)
    if not m:
        sys.exit(f"unexpected xfmr output:\n{err}")
    if int(m.group(3)) != NEW_TOKENS:
        sys.exit(f"xfmr generated {m.group(3)} tokens, not {NEW_TOKENS}:\n{err}")
    load = XFMR_LOAD.search(err)
    text = out[:-1] if out.endswith("\n") else out  # the newline printed after the stream
    return {"prompt_tokens": int(m.group(1)), "prompt_tps": float(m.group(2)),
            "gen_tps": float(m.group(4)), "load_s": float(load.group(1)) if load else None,
            "rss_kib": rss, "text": text}


def llamacpp_round(path, threads, long, no_extra_bufts=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "llamacpp", "--model", path,
           "--threads", str(threads)] + (["--long-prompt"] if long else []) \
        + (["--no-extra-bufts"] if no_extra_bufts else [])
    code, out, err, rss = run_measured(cmd)
    if code != 0:
        if "No module named 'llama_cpp'" in err:
            sys.exit(f"llama_cpp is not importable by {sys.executable}: "
                     f"`pip install llama-cpp-python` (compiles llama.cpp, ~10 min)")
        sys.exit(f"the llama.cpp child failed ({code}):\n{err}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"unexpected output of the llama.cpp child:\n{out}\n{err}")
    result = json.loads(lines[-1])
    result["rss_kib"] = rss
    return result


def cpu_model():
    """The CPU's model name, family and model numbers and vector extensions: a virtual
    machine's name alone ("AMD EPYC") does not tell Zen 3 (AVX2) from Zen 4 (AVX-512)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return platform.processor() or "unknown CPU"
    flags = set(fields.get("flags", "").split())
    names = [("avx512f", "AVX-512"), ("avx512_vnni", "VNNI"), ("avx512_bf16", "AVX512-BF16"),
             ("amx_tile", "AMX")]
    isa = [label for flag, label in names if flag in flags]
    if not isa:
        isa = ["AVX2, no AVX-512" if "avx2" in flags else "no AVX2"]
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    return (f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}; "
            f"{', '.join(isa)})")


def git_head():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + (" (uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def agreeing_tokens(xfmr_text, peer):
    """How many of llama.cpp's first tokens xfmr's text starts with."""
    a, b = xfmr_text.encode(), peer["text"].encode()
    k = 0
    for end in peer["ends"]:
        if a[:end] != b[:end] or len(a) < end:
            break
        k += 1
    return k


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds (plus a warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", help="the GGUF file (default: `xfmr fetch-model smollm2`)")
    parser.add_argument("--xfmr-bin", help="an xfmr binary (default: build the release one)")
    parser.add_argument("--weights", default="quantized", choices=["quantized", "f32"],
                        help="passed to `xfmr generate --weights`")
    parser.add_argument("--long-prompt", action="store_true",
                        help="the ~512-token prompt (Genesis 1 further) instead of ~100 tokens")
    parser.add_argument("--no-extra-bufts", action="store_true",
                        help="llama.cpp without its extra weight buffers (AMX, repacking): its "
                             "AMX kernels crashed on an Intel Xeon VM (SIGSEGV in "
                             "ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36, 2026-12-03)")
    parser.add_argument("--child", choices=["llamacpp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "llamacpp":
        if not args.model:
            sys.exit("--child llamacpp needs --model")
        child_llamacpp(args.model, args.threads, long_prompt() if args.long_prompt else PROMPT,
                       args.no_extra_bufts)
        return

    xfmr_bin = args.xfmr_bin or build_xfmr()
    path = args.model or gguf_path(xfmr_bin)
    began = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()[0]
    xs, ls = [], []
    for i in range(args.rounds + 1):
        label = "warm-up" if i == 0 else f"round {i}/{args.rounds}"
        x = xfmr_round(xfmr_bin, path, args.weights, args.threads,
                       long_prompt() if args.long_prompt else PROMPT)
        l = llamacpp_round(path, args.threads, args.long_prompt, args.no_extra_bufts)
        print(f"{label}: xfmr {x['prompt_tps']:.1f} / {x['gen_tps']:.1f} tokens/s, "
              f"{x['rss_kib'] / 1024:.1f} MiB; llama.cpp {l['prompt_tps']:.1f} / "
              f"{l['gen_tps']:.1f} tokens/s, {l['rss_kib'] / 1024:.1f} MiB",
              file=sys.stderr, flush=True)
        if i > 0:
            xs.append(x)
            ls.append(l)
    ended = datetime.datetime.now(datetime.timezone.utc)

    med = lambda runs, k: statistics.median(r[k] for r in runs)
    peer = ls[-1]
    xfmr_version = subprocess.run([xfmr_bin, "--version"], capture_output=True,
                                  text=True).stdout.strip() or "xfmr"
    print(f"Machine: {cpu_model()}, {os.cpu_count()} logical CPUs; {args.threads} threads a side "
          f"(RAYON_NUM_THREADS; n_threads, n_threads_batch); load average {load_before:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after (other work skews both sides)")
    print(f"Date: {began:%Y-%m-%d %H:%M}–{ended:%H:%M} UTC. Command: "
          f"`{shlex.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])}`")
    shown_bin = os.path.abspath(xfmr_bin)
    if shown_bin.startswith(ROOT + os.sep):
        shown_bin = os.path.relpath(shown_bin, ROOT)
    print(f"Versions: {xfmr_version} (git {git_head()}, `{shown_bin}`); "
          f"llama-cpp-python {peer['version']}; Python {platform.python_version()}; "
          f"{platform.system()} {platform.release()}")
    print(f"llama.cpp system info: {peer['system_info']}")
    print(f"Model: {path}")
    print()
    print(f"SmolLM2-135M-Instruct {os.path.basename(path)}, prompt {xs[0]['prompt_tokens']} tokens (xfmr) / "
          f"{peer['prompt_tokens']} (llama.cpp), batch 1, greedy, {NEW_TOKENS} new tokens, "
          f"median of {args.rounds} alternating rounds after one warm-up each")
    print()
    print("| implementation | prompt tokens/s | generation tokens/s | peak RSS (MiB) | load (s) |")
    print("|---|---|---|---|---|")
    rows = [(f"`xfmr generate --backend flex --weights {args.weights}`", xs),
            (f"llama.cpp (llama-cpp-python {peer['version']})", ls)]
    for name, runs in rows:
        loads = [r["load_s"] for r in runs if r["load_s"] is not None]
        load = f"{statistics.median(loads):.2f}" if loads else "-"
        print(f"| {name} | {med(runs, 'prompt_tps'):.1f} | {med(runs, 'gen_tps'):.1f} | "
              f"{med(runs, 'rss_kib') / 1024:.1f} | {load} |")
    print(f"| xfmr / llama.cpp | {med(xs, 'prompt_tps') / med(ls, 'prompt_tps'):.2f}× | "
          f"{med(xs, 'gen_tps') / med(ls, 'gen_tps'):.2f}× | "
          f"{med(xs, 'rss_kib') / med(ls, 'rss_kib'):.2f}× (lower is better) | |")
    print()
    print(f"llama.cpp child's RSS before loading the model (Python, numpy, llama_cpp): "
          f"{med(ls, 'rss_base_kib') / 1024:.1f} MiB (median); its own ru_maxrss at the end "
          f"{med(ls, 'rss_self_kib') / 1024:.1f} MiB")
    for name, key in (("prompt tokens/s", "prompt_tps"), ("generation tokens/s", "gen_tps")):
        print(f"rounds, {name}: xfmr {[round(r[key], 1) for r in xs]}, "
              f"llama.cpp {[round(r[key], 1) for r in ls]}")
    if xs[0]["prompt_tokens"] != peer["prompt_tokens"]:
        print(f"WARNING: prompt lengths differ: xfmr {xs[0]['prompt_tokens']}, "
              f"llama.cpp {peer['prompt_tokens']} tokens")
    text = xs[-1]["text"]
    k = agreeing_tokens(text, peer)
    if k == NEW_TOKENS and text == peer["text"]:
        print(f"Text: the same on both sides ({NEW_TOKENS} tokens).")
    else:
        print(f"WARNING: the texts differ; they agree on the first {k} of {NEW_TOKENS} tokens "
              f"(quantised activations round differently on the two sides).")
    print(f"xfmr:      {text[:200]!r}")
    print(f"llama.cpp: {peer['text'][:200]!r}")


if __name__ == "__main__":
    main()
