#!/usr/bin/env python3
"""serve_bench.py - load figures of a running `baton serve` (not a test: it
prints, it does not judge).

  python3 tests/serve_bench.py --port 8080 [--key KEY] [--model NAME]
         [--concurrency 1,4,16,64] [--requests 64] [--max-tokens 32]

For each concurrency C, C clients send --requests streamed completions in
all (greedy, a fixed max_tokens, prompts of about 20 tokens), each client
one request after the other over its own connection.  Prints per C:
requests/s, generated tokens/s, latency p50/p99 (whole request) and time to
first token p50/p99 (the first event carrying text), all wall-clock seconds
seen by the clients, and the 503s (past the server's queue; retried after
Retry-After)."""
import argparse
import concurrent.futures as cf
import http.client
import json
import threading
import time


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def one(args, i, stats, lock):
    body = json.dumps({"model": args.model, "prompt": f"Request {i}: the quick brown fox jumps over the lazy dog and",
                       "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if args.key:
        headers["Authorization"] = f"Bearer {args.key}"
    while True:
        c = http.client.HTTPConnection(args.host, args.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=body, headers=headers)
        r = c.getresponse()
        if r.status == 503:
            r.read()
            c.close()
            with lock:
                stats["busy"] += 1
            time.sleep(float(r.getheader("Retry-After", "1")))
            continue
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        ttft, tokens = None, 0
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("text") and ttft is None:
                ttft = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
        lat = time.perf_counter() - t0
        c.close()
        with lock:
            stats["lat"].append(lat)
            stats["ttft"].append(ttft if ttft is not None else lat)
            stats["tokens"] += tokens
        return


def run(args, conc):
    stats = {"lat": [], "ttft": [], "tokens": 0, "busy": 0}
    lock = threading.Lock()
    n = max(args.requests, conc)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(conc) as ex:
        list(ex.map(lambda i: one(args, i, stats, lock), range(n)))
    wall = time.perf_counter() - t0
    return n, wall, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--key", default=None)
    ap.add_argument("--model", default="model.gguf")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    run(args, 1)  # warm-up
    print(f"{'clients':>7} {'requests':>8} {'req/s':>7} {'tok/s':>8} {'lat p50':>8} {'lat p99':>8} "
          f"{'ttft p50':>8} {'ttft p99':>8} {'503s':>5}")
    for conc in [int(x) for x in args.concurrency.split(",")]:
        n, wall, s = run(args, conc)
        print(f"{conc:>7} {n:>8} {n / wall:>7.2f} {s['tokens'] / wall:>8.1f} {pct(s['lat'], 50):>8.3f} "
              f"{pct(s['lat'], 99):>8.3f} {pct(s['ttft'], 50):>8.3f} {pct(s['ttft'], 99):>8.3f} {s['busy']:>5}",
              flush=True)


if __name__ == "__main__":
    main()
