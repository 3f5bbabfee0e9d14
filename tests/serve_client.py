#!/usr/bin/env python3
"""serve_client.py - `baton serve` through the official openai package and
plain HTTP (urllib), against a server that tests/serve_test.sh started.

Usage: serve_client.py PORT KEY MODEL RANK0_PID [LOGPROBS_OUT [logprobs]]

Checks: completions and chat, streamed and not (chunks in OpenAI's format,
ending with [DONE]); max_tokens; stop strings; usage; a fixed seed gives the
same text; unknown fields ignored, logit_bias, min_tokens and ignore_eos;
logprobs (chat's logprobs/top_logprobs, completions' logprobs N, streamed and
not: the greedy token is the first of its list with the same value, values
<= 0, lists sorted, the same printed values alone and among concurrent
requests; LOGPROBS_OUT gets them as printed, for serve_test.sh to compare
between 1 and 2 ranks; with "logprobs" only these checks run); a greedy
request's answer alone equals its answer among 16 concurrent others; a
bounded load (16 clients x 4 requests: every request
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
import serve_util

PORT, KEY, MODEL, PID = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
LOGPROBS_OUT = sys.argv[5] if len(sys.argv) > 5 else None
ONLY_LOGPROBS = len(sys.argv) > 6 and sys.argv[6] == "logprobs"
BASE = f"http://127.0.0.1:{PORT}/v1"
client = serve_util.client(PORT, KEY)
check = serve_util.check


def rss_kib():
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def raw(method, path, body=None, headers=None, key=KEY):
    return serve_util.request(PORT, method, path, body, key, headers)


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

# ---- logprobs: the model's log-softmax, the same bits whatever runs beside ----
LP_MSGS = [{"role": "user", "content": "Name three colours."}]


def check_entries(entries, what):
    """chat's content entries of a greedy request: the token is the first of its top list, with the same
    value; every value <= 0; each top list sorted, most likely first, 3 long"""
    check(len(entries) > 0, f"{what}: {len(entries)} tokens with logprobs")
    for i, e in enumerate(entries):
        tops = [t.logprob for t in e.top_logprobs]
        ok = (len(tops) == 3 and tops == sorted(tops, reverse=True) and all(x <= 0 for x in tops) and e.logprob <= 0
              and e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
              and bytes(e.bytes) == bytes(e.top_logprobs[0].bytes))
        if not ok:
            check(False, f"{what}: token {i}: {e}")
    print(f"ok: {what}: greedy token first in each top_logprobs, same value, sorted, <= 0", flush=True)


c = client.chat.completions.create(model=MODEL, messages=LP_MSGS, max_tokens=8, temperature=0, logprobs=True,
                                   top_logprobs=3)
lp_entries = c.choices[0].logprobs.content
check_entries(lp_entries, "chat logprobs")
# every token sampled has an entry, but the end-of-generation token that ended it
want = c.usage.completion_tokens - (1 if c.choices[0].finish_reason == "stop" else 0)
check(len(lp_entries) == want, f"chat logprobs: {len(lp_entries)} entries for {c.usage.completion_tokens} tokens "
                               f"({c.choices[0].finish_reason})")
shown = b"".join(bytes(e.bytes) for e in lp_entries)
try:
    shown_text = shown.decode("utf-8")
except UnicodeDecodeError:
    shown_text = None
if shown_text is not None:
    check(shown_text == c.choices[0].message.content,
          f"chat logprobs: the tokens' bytes spell the content {shown_text!r}")
else:
    print(f"note: chat logprobs: the tokens' bytes are not UTF-8 ({shown!r}): not compared with the content",
          flush=True)
nolp = client.chat.completions.create(model=MODEL, messages=LP_MSGS, max_tokens=8, temperature=0)
check(nolp.choices[0].logprobs is None and nolp.choices[0].message.content == c.choices[0].message.content,
      "chat without logprobs: logprobs null, the same text")
streamed, stext = [], []
for ch in client.chat.completions.create(model=MODEL, messages=LP_MSGS, max_tokens=8, temperature=0, logprobs=True,
                                         top_logprobs=3, stream=True):
    if ch.choices and ch.choices[0].logprobs is not None:
        streamed.extend(ch.choices[0].logprobs.content or [])
    if ch.choices and ch.choices[0].delta.content:
        stext.append(ch.choices[0].delta.content)
check_entries(streamed, "chat logprobs streamed")
check([(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in streamed] ==
      [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in lp_entries]
      and "".join(stext) == c.choices[0].message.content,
      "chat logprobs streamed: the chunks' entries are those of the answer not streamed")
r = client.completions.create(model=MODEL, prompt="The colour of the sky is", max_tokens=8, temperature=0, logprobs=2)
L = r.choices[0].logprobs
n = len(L.tokens)
check(n > 0 and len(L.token_logprobs) == n and len(L.top_logprobs) == n and len(L.text_offset) == n,
      f"completion logprobs 2: {n} tokens, token_logprobs, top_logprobs, text_offset")
ok = True
for i in range(n):
    vals = list(L.top_logprobs[i].values())
    ok = ok and 1 <= len(vals) <= 2 and vals == sorted(vals, reverse=True) and all(v <= 0 for v in vals)
    ok = ok and L.token_logprobs[i] <= 0 and L.token_logprobs[i] == vals[0]
    ok = ok and L.top_logprobs[i].get(L.tokens[i]) == vals[0]
check(ok, "completion logprobs 2: greedy token first with the same value, sorted, <= 0" +
      ("" if ok else f" ({L.top_logprobs})"))
check(L.text_offset == sorted(L.text_offset) and L.text_offset[0] == 0,
      f"completion logprobs: text_offset {L.text_offset}")
parts, slp = [], []
for ch in client.completions.create(model=MODEL, prompt="The colour of the sky is", max_tokens=8, temperature=0,
                                    logprobs=2, stream=True):
    if ch.choices and ch.choices[0].logprobs is not None:
        slp.append(ch.choices[0].logprobs)
check(sum((x.tokens for x in slp), []) == L.tokens and sum((x.token_logprobs for x in slp), []) == L.token_logprobs
      and sum((x.text_offset for x in slp), []) == L.text_offset,
      "completion logprobs streamed: the chunks' tokens, values and offsets are those of the answer not streamed")

# the values as printed (JSON floats as text), alone and among 8 concurrent requests
LP_BODIES = [
    ("/v1/chat/completions", {"model": MODEL, "messages": LP_MSGS, "max_tokens": 8, "temperature": 0,
                              "logprobs": True, "top_logprobs": 3}),
    ("/v1/completions", {"model": MODEL, "prompt": "The colour of the sky is", "max_tokens": 8, "temperature": 0,
                         "logprobs": 2}),
    ("/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.8,
                         "seed": 7, "logprobs": 5}),
]


def printed_logprobs(path, body):
    st, _, data = raw("POST", path, json.dumps(body))
    if st != 200:
        check(False, f"logprobs request: {st} {data[:300]!r}")
    return json.dumps(json.loads(data, parse_float=str)["choices"][0]["logprobs"])


alone_lp = [printed_logprobs(p, b) for p, b in LP_BODIES]
with cf.ThreadPoolExecutor(8) as ex:
    others = [ex.submit(printed_logprobs, "/v1/completions",
                        {"model": MODEL, "prompt": f"Other request {i}", "max_tokens": 10, "temperature": 0,
                         "logprobs": 1}) for i in range(5)]
    mine = [ex.submit(printed_logprobs, p, b) for p, b in LP_BODIES]
    together_lp = [f.result() for f in mine]
    [f.result() for f in others]
check(together_lp == alone_lp, "logprobs: the same printed values alone and among 8 concurrent requests")
if LOGPROBS_OUT:
    with open(LOGPROBS_OUT, "w") as f:
        f.write("\n".join(alone_lp) + "\n")
if ONLY_LOGPROBS:
    print("serve_client: logprobs checks passed", flush=True)
    sys.exit(0)

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
                              logprobs=1)
check(r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1 and r.choices[0].logprobs.tokens == [],
      f"logprobs: the end token that ends the answer is not listed ({r.choices[0].logprobs})")
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
