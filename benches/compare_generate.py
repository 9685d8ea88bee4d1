#!/usr/bin/env python3
"""Text generation with SmolLM2-135M-Instruct: `xfmr generate` (flex, ndarray) vs Hugging Face
transformers `generate` (PyTorch), in one run on one machine: the same GGUF file (transformers
dequantises it to float32, as xfmr does), the same ~100-token prompt, batch 1, greedy, exactly
128 new tokens (the end token is held off on both sides), float32, 2 threads.

Timing, the same definition on both sides: prompt tokens/s = prompt length / time to the first
generated token (the prompt's forward pass and one step); generation tokens/s = (128 − 1) /
time from the first generated token to the last. xfmr prints both on stderr; transformers is
timed by a streamer that records when each token arrives. Model loading is excluded. Each side
runs `--repeats` times after one warm-up; the median counts. The script also checks that both
sides generated the same tokens' text.

    python3 benches/compare_generate.py [--backends flex ndarray] [--repeats 5]

Needs the model (`cargo run -p xfmr-cli -- fetch-model smollm2`) and, for the peer,
`pip install torch transformers gguf accelerate` (a venv).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TOKENS = 128
# About 100 tokens of Genesis 1 (King James Version, public domain).
PROMPT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, "
    "and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the "
    "face of the waters. And God said, Let there be light: and there was light. And God saw the "
    "light, that it was good: and God divided the light from the darkness. And God called the "
    "light Day, and the darkness he called Night. And the evening and the morning were the first "
    "day. And God said,"
)
# The rest of Genesis 1 (King James Version, public domain): `PROMPT` and this, cut to
# `LONG_PROMPT_WORDS` words, is the ~512-token prompt of `compare_llamacpp.py --long-prompt`.
GENESIS_REST = (
    " Let there be a firmament in the midst of the waters, and let it divide the waters from "
    "the waters. And God made the firmament, and divided the waters which were under the "
    "firmament from the waters which were above the firmament: and it was so. And God called the "
    "firmament Heaven. And the evening and the morning were the second day. And God said, Let the "
    "waters under the heaven be gathered together unto one place, and let the dry land appear: and "
    "it was so. And God called the dry land Earth; and the gathering together of the waters called "
    "he Seas: and God saw that it was good. And God said, Let the earth bring forth grass, the herb "
    "yielding seed, and the fruit tree yielding fruit after his kind, whose seed is in itself, upon "
    "the earth: and it was so. And the earth brought forth grass, and herb yielding seed after his "
    "kind, and the tree yielding fruit, whose seed was in itself, after his kind: and God saw that "
    "it was good. And the evening and the morning were the third day. And God said, Let there be "
    "lights in the firmament of the heaven to divide the day from the night; and let them be for "
    "signs, and for seasons, and for days, and years: And let them be for lights in the firmament "
    "of the heaven to give light upon the earth: and it was so. And God made two great lights; the "
    "greater light to rule the day, and the lesser light to rule the night: he made the stars also. "
    "And God set them in the firmament of the heaven to give light upon the earth, And to rule over "
    "the day and over the night, and to divide the light from the darkness: and God saw that it was "
    "good. And the evening and the morning were the fourth day. And God said, Let the waters bring "
    "forth abundantly the moving creature that hath life, and fowl that may fly above the earth in "
    "the open firmament of heaven. And God created great whales, and every living creature that "
    "moveth, which the waters brought forth abundantly, after their kind, and every winged fowl "
    "after his kind: and God saw that it was good. And God blessed them, saying, Be fruitful, and "
    "multiply, and fill the waters in the seas, and let fowl multiply in the earth. And the evening "
    "and the morning were the fifth day. And God said, Let the earth bring forth the living "
    "creature after his kind, cattle, and creeping thing, and beast of the earth after his kind: and "
    "it was so. And God made the beast of the earth after his kind, and cattle after their kind, and "
    "every thing that creepeth upon the earth after his kind: and God saw that it was good. And God "
    "said, Let us make man in our image, after our likeness: and let them have dominion over the "
    "fish of the sea, and over the fowl of the air, and over the cattle, and over all the earth, and "
    "over every creeping thing that creepeth upon the earth."
)
LONG_PROMPT_WORDS = 400


def long_prompt():
    """`PROMPT` continued by the rest of Genesis 1, the first `LONG_PROMPT_WORDS` words."""
    return " ".join((PROMPT + GENESIS_REST).split()[:LONG_PROMPT_WORDS])


def gguf_path():
    out = subprocess.run(
        ["cargo", "run", "--release", "-q", "-p", "xfmr-cli", "--", "fetch-model", "smollm2"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return out.strip().splitlines()[-1]


def xfmr(backend, path, repeats):
    env = dict(os.environ, RAYON_NUM_THREADS="2")
    # The GPU backends are cargo features of the CLI: both, as compare_pytorch.py builds it, so
    # that one backend's build does not replace the other's binary.
    features = ["--features", "wgpu,cuda"] if backend in ("wgpu", "cuda") else []
    runs, text = [], None
    for i in range(repeats + 1):
        run = subprocess.run(
            ["cargo", "run", "--release", "-q", "-p", "xfmr-cli", *features, "--", "generate",
             "--backend", backend, "--model", path, "--max-tokens", str(NEW_TOKENS),
             "--min-tokens", str(NEW_TOKENS), PROMPT],
            cwd=ROOT, check=True, capture_output=True, text=True, env=env,
        )
        m = re.search(r"prompt: (\d+) tokens in [0-9.]+ s \(([0-9.]+) tokens/s\); "
                      r"generated: (\d+) tokens, ([0-9.]+) tokens/s", run.stderr)
        if not m:
            sys.exit(f"unexpected xfmr output:\n{run.stderr}")
        assert int(m.group(3)) == NEW_TOKENS, run.stderr
        if i > 0:  # the first run is the warm-up
            runs.append((int(m.group(1)), float(m.group(2)), float(m.group(4))))
        text = run.stdout.strip()
    return runs, text


def peer(path, repeats, threads, device="cpu"):
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.generation.streamers import BaseStreamer
    except ImportError as e:
        print(f"transformers not importable ({e}): peer skipped", file=sys.stderr)
        return None, None, None
    if device == "cuda" and not torch.cuda.is_available():
        print("torch.cuda.is_available() is False: peer skipped", file=sys.stderr)
        return None, None, None
    torch.set_num_threads(threads)
    directory, name = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    model.eval().to(device)
    ids = tok(PROMPT, return_tensors="pt").input_ids.to(device)

    class Clock(BaseStreamer):
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    runs, text = [], None
    for i in range(repeats + 1):
        clock = Clock()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 do_sample=False, streamer=clock)
        # put() is called with the prompt first, then once per generated token.
        tokens = clock.times[1:]
        assert len(tokens) == NEW_TOKENS, len(tokens)
        if i > 0:
            runs.append((ids.shape[1], ids.shape[1] / (tokens[0] - start),
                         (NEW_TOKENS - 1) / (tokens[-1] - tokens[0])))
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    return runs, text, f"torch {torch.__version__}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["flex", "ndarray"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = gguf_path()
    peer_runs, peer_text, peer_name = peer(path, args.repeats, args.threads)
    rows = []
    if peer_runs:
        rows.append((f"transformers ({peer_name})", peer_runs))
    texts = {}
    for backend in args.backends:
        runs, text = xfmr(backend, path, args.repeats)
        rows.append((f"xfmr {backend}", runs))
        texts[backend] = text
    med = lambda runs, k: statistics.median(r[k] for r in runs)
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF → f32), batch 1, greedy, {NEW_TOKENS} new tokens, "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"{'':34} {'prompt tok':>10} {'prompt tok/s':>13} {'gen tok/s':>10} {'vs torch':>9}")
    base = med(peer_runs, 2) if peer_runs else None
    for name, runs in rows:
        ratio = f"{med(runs, 2) / base:.2f}x" if base else "-"
        print(f"{name:34} {runs[0][0]:>10} {med(runs, 1):>13.1f} {med(runs, 2):>10.1f} {ratio:>9}")
    for backend, text in texts.items():
        same = "same text" if peer_text is None or text == peer_text else "TEXT DIFFERS"
        print(f"xfmr {backend}: {same}")
    if peer_text is not None and any(t != peer_text for t in texts.values()):
        print(f"transformers: {peer_text!r}")
        for backend, text in texts.items():
            print(f"xfmr {backend}: {text!r}")


if __name__ == "__main__":
    main()
