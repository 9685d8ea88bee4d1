#!/usr/bin/env python3
"""A burst of concurrent large chat requests against a running `xfmr serve`, and the server's
memory before, during and after it (issue 43's fault 1: memory amplified by concurrent large
prompts and never returned).

    target/release/xfmr serve --llm smollm2 --port 8080 &
    python3 benches/hostile_burst.py --url http://127.0.0.1:8080 --pid $! [--clients 48] [--mib 1]

Each client POSTs one chat message of about `--mib` MiB of English words to
/v1/chat/completions (far over the model's context: every request should get a 400 quickly).
The server's VmRSS is sampled from /proc/PID/status every 10 ms: idle (before), peak (during),
and 2 s after the last reply. Standard library only.
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--mib", type=float, default=0.99)
    ap.add_argument("--after", type=float, default=2.0, help="seconds to wait after the burst")
    args = ap.parse_args()
    url = urllib.parse.urlparse(args.url)
    words = "the quick brown fox jumps over the lazy dog and then some more words follow "
    text = (words * int(args.mib * (1 << 20) / len(words) + 1))[: int(args.mib * (1 << 20))]
    body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 8}).encode()

    idle = rss_kib(args.pid)
    peak = [idle]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(args.pid))
            time.sleep(0.01)

    statuses = []
    lock = threading.Lock()

    def client():
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
        try:
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Content-Type": "application/json"})
            status = conn.getresponse().status
        except OSError as e:
            status = f"error: {e}"
        with lock:
            statuses.append(status)
        conn.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.time()
    clients = [threading.Thread(target=client) for _ in range(args.clients)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    elapsed = time.time() - start
    time.sleep(args.after)
    done.set()
    sampler.join()
    after = rss_kib(args.pid)
    statuses = [str(s) for s in statuses]
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    print(f"{args.clients} clients x {len(body) / (1 << 20):.2f} MiB in {elapsed:.2f} s; statuses {counts}")
    print(f"RSS idle {idle / 1024:.1f} MiB, peak {peak[0] / 1024:.1f} MiB ({peak[0] / idle:.2f}x), "
          f"{args.after:.0f} s after {after / 1024:.1f} MiB ({after / idle:.2f}x)")


if __name__ == "__main__":
    main()
