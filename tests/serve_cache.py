#!/usr/bin/env python3
"""serve_cache.py - `baton serve`'s prefix reuse (cache_prompt, as
llama-server's) through the official openai package, against a server that
tests/serve_test.sh started.

Usage: serve_cache.py PORT KEY MODEL OUT

Checks: a request with a long system prompt, then the same request again:
the second reports the prompt's tokens but the last as cached
(usage.prompt_tokens_details.cached_tokens) and gives the same text and
log-probabilities as a cold run (cache_prompt: false), bitwise as printed;
a request whose prompt diverges from the cached one mid-way reuses only the
shared part and equals its cold run; greedy and seeded; streamed, the usage
chunk carries the cached tokens; /metrics counts them; a cache_prompt that
is not a boolean is a 400.  OUT gets the answers and log-probabilities as
printed, for serve_test.sh to compare between 1 and 2 ranks.  Prints one
line per check; exits 1 on the first failure."""
import json
import sys

import serve_util

PORT, KEY, MODEL, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
client = serve_util.client(PORT, KEY)
check = serve_util.check

SYSTEM = ("You are the archivist of a small library by the sea. Every answer you give names the shelf, "
          "the row and the year the book came in, and says nothing of the weather, the tides or the "
          "gulls. You speak plainly and briefly. ") * 3
QUESTIONS = ["Where is the atlas of the northern islands?", "Where is the atlas of birds of the coast?",
             "Which shelf holds the ledgers of 1911?"]


def raw(method, path, body=None):
    st, _, data = serve_util.request(PORT, method, path, body, KEY)
    return st, data


def messages(question, k=0):
    # the long shared part in the user's turn: some templates (Phi-3's) drop system messages
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Shelf list {k}. {SYSTEM}\n{question}"}]


def ask(question, cache, temperature, seed=None, k=0):
    """The answer as printed: content, and each token's log-probability and top 3; the usage."""
    extra = {} if cache is None else {"cache_prompt": cache}
    r = client.chat.completions.create(
        model=MODEL, max_tokens=12, temperature=temperature, seed=seed, logprobs=True, top_logprobs=3,
        messages=messages(question, k), extra_body=extra)
    c = r.choices[0]
    lp = [(t.token, repr(t.logprob), [(x.token, repr(x.logprob)) for x in t.top_logprobs]) for t in c.logprobs.content]
    return json.dumps([c.message.content, c.finish_reason, lp]), r.usage


def cached(u):
    d = u.prompt_tokens_details
    return None if d is None else d.cached_tokens


def metric(name):
    st, body = raw("GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


out = []
before = metric("baton_prompt_tokens_cached_total")
check(before is not None, "/metrics has baton_prompt_tokens_cached_total")
for k, (temperature, seed) in enumerate(((0.0, None), (0.9, 1234))):
    what = f"temperature {temperature}"
    cold, u0 = ask(QUESTIONS[0], False, temperature, seed, k)
    check(cached(u0) == 0, f"{what}: cache_prompt false: no cached tokens ({cached(u0)})")
    warm, u1 = ask(QUESTIONS[0], None, temperature, seed, k)
    check(cached(u1) == u1.prompt_tokens - 1,
          f"{what}: the same request again: {cached(u1)} of {u1.prompt_tokens} prompt tokens cached (all but the last)")
    check(warm == cold, f"{what}: the cached answer equals the cold one, text and log-probabilities")
    # diverges after the system prompt: only the shared part reused
    cold2, v0 = ask(QUESTIONS[1], False, temperature, seed, k)
    warm2, v1 = ask(QUESTIONS[2], None, temperature, seed, k)
    cold3, v2 = ask(QUESTIONS[2], False, temperature, seed, k)
    check(150 < cached(v1) < v1.prompt_tokens - 1,
          f"{what}: a prompt that diverges mid-way: {cached(v1)} of {v1.prompt_tokens} cached")
    check(warm2 == cold3, f"{what}: the diverging request equals its cold run")
    out += [cold, warm, cold2, warm2]
after = metric("baton_prompt_tokens_cached_total")
check(after is not None and after > before, f"/metrics counts the cached tokens ({before} -> {after})")

# streamed: the usage chunk carries them (the second time)
for _ in range(2):
    stream = client.chat.completions.create(
        model=MODEL, max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=messages(QUESTIONS[0], 7))
    usage = [ch.usage for ch in stream if ch.usage is not None]
check(len(usage) == 1 and cached(usage[0]) == usage[0].prompt_tokens - 1,
      f"a stream's usage chunk reports the cached tokens ({usage[0] if usage else None})")

# completions report them too
body = {"model": MODEL, "prompt": SYSTEM + QUESTIONS[0], "max_tokens": 3, "temperature": 0}
r1 = json.loads(raw("POST", "/v1/completions", json.dumps(body))[1])
r2 = json.loads(raw("POST", "/v1/completions", json.dumps(body))[1])
check(r2["usage"]["prompt_tokens_details"]["cached_tokens"] == r2["usage"]["prompt_tokens"] - 1 and
      r1["choices"][0]["text"] == r2["choices"][0]["text"],
      f"completions: cached tokens in the usage ({r2['usage']}), the same text")

st, body = raw("POST", "/v1/chat/completions", json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "cache_prompt": "yes"}))
check(st == 400 and b"'cache_prompt' must be a boolean, not a string" in body, f"cache_prompt 'yes': {st} {body[:120]}")

with open(OUT, "w") as f:
    f.write("\n".join(out) + "\n")
