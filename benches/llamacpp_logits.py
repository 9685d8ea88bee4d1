#!/usr/bin/env python3
"""How far llama.cpp's last-position logits are from transformers' float32 ones on the SmolLM2
fixture prompts: the yardstick for the tolerance of xfmr's quantised path
(`crates/xfmr-llm/tests/llm/smollm2_quantized.rs`, TOL = 2 nats).

For each prompt k of `fixtures/smollm2/reference.safetensors` (or `$XFMR_FIXTURES_DIR`), the
fixture's ids `ids.k` are evaluated by llama.cpp on the same GGUF file (Q4_1; llama.cpp quantises
activations to 8 bits per block of 32, as xfmr's quantised path does) and its logits after the
last prompt token compared with the fixture's `logits_last.k` (transformers, float32,
dequantised weights): max and mean |Δ|, the fixture's top-two margin, whether the argmax agrees.

    pip install llama-cpp-python numpy   # builds llama.cpp from source, ~10 min on 2 cores
    python3 benches/llamacpp_logits.py [--model FILE.gguf]
"""
import argparse
import json
import os
import struct

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(
        os.environ.get("XFMR_CACHE_DIR", os.path.join(ROOT, "target", "xfmr-cache")),
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = parser.parse_args()
    fixtures = os.environ.get("XFMR_FIXTURES_DIR") or os.path.join(ROOT, "fixtures")
    raw = open(os.path.join(fixtures, "smollm2", "reference.safetensors"), "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n

    def tensor(name):
        meta = header[name]
        start, end = meta["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[meta["dtype"]]
        return np.frombuffer(raw[base + start:base + end], dtype=dtype).reshape(meta["shape"])

    llm = Llama(args.model, n_ctx=2048, n_threads=2, logits_all=True, verbose=False)
    k = 0
    while f"ids.{k}" in header:
        ids = tensor(f"ids.{k}").tolist()
        llm.reset()
        llm.eval(ids)
        got = np.array(llm.scores[len(ids) - 1])
        want = tensor(f"logits_last.{k}")
        diff = np.abs(got - want)
        top = np.sort(want)
        print(f"prompt {k}: {len(ids)} tokens; llama.cpp vs transformers max |Δ| {diff.max():.4f}, "
              f"mean {diff.mean():.4f}; transformers' top-two margin {top[-1] - top[-2]:.3f}; "
              f"argmax equal: {bool(got.argmax() == want.argmax())}")
        k += 1


if __name__ == "__main__":
    main()
