#!/usr/bin/env python3
"""Aggregate generation speed of `xfmr serve` under 1, 4 and 8 concurrent streaming clients.

Each client streams one completion of exactly `--tokens` tokens (the end token banned through
`logit_bias`, so every request does the same work) from its own prompt; the figure is all
clients' generated tokens divided by the wall time from the first request to the last token.
Several clients are decoded together (continuous batching), so the aggregate rate should grow
with them. Standard library only.

Every request's user message is new (numbered), so the server's prefix cache can only reuse
what the prompts really share, the chat template's system prompt; `--repeat-prompts` sends the
same eight messages every round (then a cached prompt is fed only its last token).

    xfmr serve --llm smollm2 --port 8080 &
    python benches/serve_load.py --base-url http://127.0.0.1:8080 --clients 1 4 8
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe the water cycle to a child.",
    "List some uses of copper and why.",
    "Why do leaves change colour in autumn?",
    "Tell me about the history of bread.",
    "How does a compass work?",
    "What makes a good cup of tea?",
]


def stream_one(base, model, prompt, tokens, eos, out, i):
    url = urllib.parse.urlparse(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": {str(eos): -100},
    }
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first, completion = None, 0
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if first is None and chunk.get("choices"):
            first = time.perf_counter()
        if chunk.get("usage"):
            completion = chunk["usage"]["completion_tokens"]
    out[i] = (start, first, time.perf_counter(), completion)


SENT = [0]


def prompt(i, repeat):
    text = PROMPTS[i % len(PROMPTS)]
    if repeat:
        return text
    SENT[0] += 1
    return f"Request {SENT[0]}: {text}"


def run(base, model, clients, tokens, eos, repeat=False):
    out = [None] * clients
    threads = [
        threading.Thread(target=stream_one,
                         args=(base, model, prompt(i, repeat), tokens, eos, out, i))
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min(o[0] for o in out)
    end = max(o[2] for o in out)
    generated = sum(o[3] for o in out)
    first = max(o[1] - o[0] for o in out)
    return generated, end - start, first


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--eos-id", type=int, default=2, help="SmolLM2's <|im_end|>")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeat-prompts", action="store_true",
                   help="the same eight user messages every round (not numbered)")
    args = p.parse_args()
    run(args.base_url, args.model, 1, 8, args.eos_id)  # warm-up
    base_rate = None
    print(f"{'clients':>7} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'× one':>6} {'slowest first token':>20}")
    for clients in args.clients:
        best = None
        for _ in range(args.rounds):
            generated, seconds, first = run(args.base_url, args.model, clients, args.tokens,
                                            args.eos_id, args.repeat_prompts)
            rate = generated / seconds
            if best is None or rate > best[2]:
                best = (generated, seconds, rate, first)
        generated, seconds, rate, first = best
        base_rate = base_rate or rate
        print(f"{clients:>7} {generated:>7} {seconds:>8.2f} {rate:>9.1f} {rate / base_rate:>6.2f} {first:>19.2f}s")


if __name__ == "__main__":
    main()
