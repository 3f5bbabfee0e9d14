#!/usr/bin/env python3
"""serve_client.py - `baton serve` through the official openai package and
plain HTTP (urllib), against a server that tests/serve_test.sh started.

Usage: serve_client.py PORT KEY MODEL RANK0_PID

Checks: completions and chat, streamed and not (chunks in OpenAI's format,
ending with [DONE]); max_tokens; stop strings; usage; a fixed seed gives the
same text; unknown fields ignored, logit_bias, min_tokens and ignore_eos; a greedy request's answer alone equals its answer among 16
concurrent others; a bounded load (16 clients x 4 requests: every request
answered once, each answer equal to the same request alone); a client that
goes away frees its slot; past the queue, 503 with Retry-After; the server's
memory flat after the load.  Prints one line per check; exits 1 on the first
failure."""
import concurrent.futures as cf
import http.client
import json
import os
import sys
import threading
import time

import openai

PORT, KEY, MODEL, PID = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
BASE = f"http://127.0.0.1:{PORT}/v1"
client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def raw(method, path, body=None, headers=None, key=KEY):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def metric(name):
    st, _, data = raw("GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def greedy_completion(prompt, n=12):
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, temperature=0)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


# ---- completions, not streamed ----
models = client.models.list()
check([m.id for m in models.data] == [MODEL], f"/v1/models lists {MODEL}")

text, finish, usage = greedy_completion("The capital of France is", 8)
check(finish in ("length", "stop"), f"completion: finish_reason {finish}")
check(usage.completion_tokens >= 1 and usage.completion_tokens <= 8, f"completion: {usage.completion_tokens} tokens <= max_tokens 8")
check(usage.prompt_tokens >= 5, f"completion: {usage.prompt_tokens} prompt tokens")
check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, "completion: usage adds up")
text2, _, _ = greedy_completion("The capital of France is", 8)
check(text == text2, "greedy: the same text twice")

r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=1, temperature=0)
check(r.usage.completion_tokens == 1 and r.choices[0].finish_reason in ("length", "stop"), "max_tokens 1: one token")
# a longer greedy text, then a stop string taken from inside it
long_text, _, _ = greedy_completion("Once upon a time", 24)
check(len(long_text) > 0, f"a 24-token greedy completion: {long_text!r}")
cut = None
for i in range(2, len(long_text) - 1):
    piece = long_text[i:i + 2]
    if piece.strip() and long_text.find(piece) == i:
        cut = (i, piece)
        break
if cut:
    i, piece = cut
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[piece])
    check(r.choices[0].text == long_text[:i] and r.choices[0].finish_reason == "stop",
          f"stop {piece!r}: the text ends before it ({r.choices[0].text!r})")
else:
    print("note: no stop string could be cut from the greedy text", flush=True)

# echo and token-id prompts
r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0, echo=True)
check(r.choices[0].text.startswith("Hello"), "echo: the prompt comes first")

# ---- seed ----
a = client.completions.create(model=MODEL, prompt="Seeds", max_tokens=10, temperature=1.0, seed=1234)
b = client.completions.create(model=MODEL, prompt="Seeds", max_tokens=10, temperature=1.0, seed=1234)
check(a.choices[0].text == b.choices[0].text, "seed 1234: the same text twice at temperature 1")

# ---- what clients send: unknown fields ignored, logit_bias, min_tokens, ignore_eos ----
import gguf  # noqa: E402  (the test model's vocabulary: its end token and a plain word)
vocab = gguf.GGUFReader(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "vocab",
                                     "ggml-vocab-phi-3.gguf"))
def _field(name):
    f = vocab.fields[name]
    return f
eos = int(_field("tokenizer.ggml.eos_token_id").parts[-1][0])
toks = _field("tokenizer.ggml.tokens")
words = [bytes(toks.parts[i]).decode("utf-8", "replace") for i in toks.data]
the = words.index("\u2581the")
r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0,
                              extra_body={"store": False, "metadata": {"a": "b"}, "frobnicate": 1,
                                          "min_tokens": 0, "ignore_eos": False})
check(r.usage.completion_tokens >= 1, "unknown fields (store, metadata, frobnicate) are ignored")
r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logit_bias={str(the): 100})
check(r.choices[0].text.replace(" ", "") == "the" * 4, f"logit_bias +100 on '\u2581the': {r.choices[0].text!r}")
r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0, logit_bias={str(eos): 100})
check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1 and r.choices[0].text == "",
      f"logit_bias +100 on the end token: it ends at once ({r.choices[0].finish_reason}, {r.usage.completion_tokens})")
r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0, logit_bias={str(eos): 100},
                              extra_body={"min_tokens": 3})
check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 4,
      f"min_tokens 3: no end before 3 tokens ({r.choices[0].finish_reason}, {r.usage.completion_tokens})")
r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0, logit_bias={str(eos): 100},
                              extra_body={"ignore_eos": True})
check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8,
      f"ignore_eos: the end token does not end it ({r.choices[0].finish_reason}, {r.usage.completion_tokens})")
hist = [{"role": "user", "content": "What is the weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "user", "content": "Thanks."}]
c = client.chat.completions.create(model=MODEL, messages=hist, max_tokens=3, temperature=0, logprobs=False,
                                   top_logprobs=0, store=False)
check(c.choices[0].message.role == "assistant",
      "chat: an assistant turn with tool_calls, top_logprobs 0 with logprobs false, store: accepted")

# ---- chat ----
msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
c = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
check(c.object == "chat.completion" and c.choices[0].message.role == "assistant", "chat: an assistant message")
check(c.choices[0].finish_reason in ("length", "stop"), f"chat: finish_reason {c.choices[0].finish_reason}")
chat_text = c.choices[0].message.content

# ---- streams ----
parts, finishes, roles = [], [], []
for ch in client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0, stream=True):
    if ch.object != "chat.completion.chunk":
        check(False, f"chat stream: chunk object {ch.object}")
    d = ch.choices[0].delta
    if d.role:
        roles.append(d.role)
    if d.content:
        parts.append(d.content)
    if ch.choices[0].finish_reason:
        finishes.append(ch.choices[0].finish_reason)
check(roles == ["assistant"], "chat stream: the role once, first")
check("".join(parts) == chat_text, "chat stream: the same text as not streamed")
check(len(finishes) == 1, f"chat stream: one finish_reason ({finishes})")

parts, usage = [], None
for ch in client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                                    stream=True, stream_options={"include_usage": True}):
    if ch.choices:
        parts.append(ch.choices[0].text)
    if ch.usage:
        usage = ch.usage
check("".join(parts) == text, "completion stream: the same text as not streamed")
check(usage is not None and usage.completion_tokens >= 1, "completion stream: the usage chunk")

# the raw event stream ends with [DONE]
st, hdr, data = raw("POST", "/v1/chat/completions", json.dumps(
    {"model": MODEL, "messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True}))
events = [e for e in data.decode().split("\n\n") if e]
check(st == 200 and hdr.get("Content-Type", "").startswith("text/event-stream"), "raw stream: 200 text/event-stream")
check(all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]", "raw stream: data: events, [DONE] last")

# ---- determinism under load: alone == among 16 concurrent ----
prompts = [f"Request number {i} says" for i in range(16)]
alone = {p: greedy_completion(p, 12)[0] for p in prompts[:4]}
with cf.ThreadPoolExecutor(16) as ex:
    futs = {ex.submit(greedy_completion, p, 12): p for p in prompts}
    together = {futs[f]: f.result()[0] for f in cf.as_completed(futs)}
check(all(together[p] == alone[p] for p in alone), "greedy: alone == among 16 concurrent requests")

# ---- bounded load: 16 clients x 4 requests ----
rss0 = rss_kib()
seen = []
lock = threading.Lock()


def worker(w):
    out = []
    for k in range(4):
        p = prompts[(w + k) % len(prompts)]
        t, f, u = greedy_completion(p, 12)
        out.append((w, k, p, t))
    with lock:
        seen.extend(out)


t0 = time.time()
with cf.ThreadPoolExecutor(16) as ex:
    list(ex.map(worker, range(16)))
dt = time.time() - t0
check(len(seen) == 64 and len({(w, k) for w, k, _, _ in seen}) == 64, "load: 64 requests, each answered once")
check(all(t == together[p] for _, _, p, t in seen), "load: every answer equal to the same request's answer alone")
print(f"load: 64 requests in {dt:.2f} s ({64 / dt:.1f} requests/s)", flush=True)
# the same load again: memory must not grow with the number of requests
with cf.ThreadPoolExecutor(16) as ex:
    list(ex.map(worker, range(16)))
rss1 = rss_kib()
with cf.ThreadPoolExecutor(16) as ex:
    list(ex.map(worker, range(16)))
rss2 = rss_kib()
print(f"rank 0 RSS: {rss0} KiB before, {rss1} KiB after 128 requests, {rss2} KiB after 192", flush=True)
if os.environ.get("ASAN_OPTIONS") is not None:
    print("note: a sanitizer build (its quarantine holds freed memory): RSS not bounded", flush=True)
else:
    check(rss2 - rss1 < 4096, "memory flat: under 4 MiB of growth over the last 64 requests")

# ---- a client that goes away frees its slot ----
cancelled0 = metric("baton_requests_cancelled_total")
c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
c.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "Endless", "max_tokens": 200,
                                                      "temperature": 0, "stream": True}),
          headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
resp = c.getresponse()
resp.fp.readline()  # the first event: generation has started
c.close()
resp.close()
deadline = time.time() + 20
while time.time() < deadline and (metric("baton_requests_running") != 0 or
                                  metric("baton_requests_cancelled_total") == cancelled0):
    time.sleep(0.05)
check(metric("baton_requests_cancelled_total") == cancelled0 + 1, "disconnect: the request is cancelled")
check(metric("baton_requests_running") == 0, "disconnect: its slot is free again")

# the same for a request that is not streamed: the client sends it and goes away
import socket
body = json.dumps({"model": MODEL, "prompt": "Endless", "max_tokens": 200, "temperature": 0}).encode()
s = socket.create_connection(("127.0.0.1", PORT))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
          b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
deadline = time.time() + 20
while time.time() < deadline and metric("baton_requests_running") == 0:
    time.sleep(0.01)
s.close()
deadline = time.time() + 20
while time.time() < deadline and (metric("baton_requests_running") != 0 or
                                  metric("baton_requests_cancelled_total") == cancelled0 + 1):
    time.sleep(0.05)
check(metric("baton_requests_cancelled_total") == cancelled0 + 2, "disconnect, not streamed: the request is cancelled")
check(metric("baton_requests_running") == 0, "disconnect, not streamed: its slot is free again")

# ---- past the queue: 503 with Retry-After ----
slots, queue_cap = int(metric("baton_sequence_slots")), None
statuses, retry = [], []


start = threading.Barrier(48)


def long_request(_):
    start.wait()  # all at once: more than the 4 slots + 16 waiting
    st, hdr, data = raw("POST", "/v1/completions", json.dumps(
        {"model": MODEL, "prompt": "Busy", "max_tokens": 120, "temperature": 0}))
    with lock:
        statuses.append(st)
        if st == 503:
            retry.append(hdr.get("Retry-After"))
            err = json.loads(data)["error"]
            assert "busy" in err["message"], err


with cf.ThreadPoolExecutor(48) as ex:
    list(ex.map(long_request, range(48)))
check(set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses,
      f"overload: {statuses.count(200)} answered, {statuses.count(503)} refused with 503")
check(all(r == "1" for r in retry), "overload: every 503 has Retry-After")
check(metric("baton_requests_rejected_total") >= statuses.count(503), "metrics: the refusals are counted")

# ---- metrics ----
check(metric("baton_generated_tokens_total") > 0 and metric("baton_prompt_tokens_total") > 0, "metrics: tokens in and out")
check(metric("baton_kv_cache_cells") > 0 and metric("baton_requests_queued") == 0, "metrics: KV cells, empty queue")
st, _, data = raw("GET", "/metrics")
busy = [float(l.rsplit(" ", 1)[1]) for l in data.decode().splitlines() if l.startswith("baton_rank_busy_fraction{")]
check(len(busy) == 2 and all(0 <= b <= 1 for b in busy) and max(busy) > 0,
      f"metrics: a busy fraction for each of the 2 ranks ({busy})")
print("serve_client: all checks passed", flush=True)
