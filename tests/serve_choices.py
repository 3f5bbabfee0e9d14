#!/usr/bin/env python3
"""serve_choices.py - `baton serve` with n > 1 choices, through the official
openai package and plain HTTP, against a server that tests/serve_test.sh
started (4 sequence slots).

Usage: serve_choices.py PORT KEY MODEL OUT

Checks: chat with n=3 (seeded, logprobs): three choices at indices 0, 1, 2,
choice i's text and log-probabilities bitwise those of a request of one
choice with seed + i, the prompt counted once in the usage and the choices'
tokens added up; the same streamed (chunks carry each choice's index, every
choice ends with its finish_reason, then the usage); completions with n=2,
echo, streamed and not; n=4 (every slot) while nothing else runs; n=5 is a
400.  OUT gets the answers as printed, for serve_test.sh to compare between
1 and 2 ranks.  Prints one line per check; exits 1 on the first failure."""
import json
import sys

import openai
import serve_util

PORT, KEY, MODEL, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
client = serve_util.client(PORT, KEY)
check = serve_util.check
MESSAGES = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper and a lost whale."}]


def raw(path, body):
    st, _, data = serve_util.request(PORT, "POST", path, body, KEY)
    return st, data


def printed(c):
    lp = [(t.token, repr(t.logprob), [(x.token, repr(x.logprob)) for x in t.top_logprobs]) for t in c.logprobs.content]
    return json.dumps([c.message.content, c.finish_reason, lp])


def chat(n, seed, **kw):
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0.9, seed=seed,
                                          logprobs=True, top_logprobs=2, n=n, **kw)


out = []
single = [chat(1, 40 + i) for i in range(3)]
r = chat(3, 40)
check([c.index for c in r.choices] == [0, 1, 2], f"n=3: choices at indices {[c.index for c in r.choices]}")
for i in range(3):
    check(printed(r.choices[i]) == printed(single[i].choices[0]),
          f"n=3: choice {i} equals a request of one choice with seed {40 + i}, text and log-probabilities")
check(len({r.choices[i].message.content for i in range(3)}) > 1, "n=3: the seeds give different answers")
check(r.usage.prompt_tokens == single[0].usage.prompt_tokens and
      r.usage.completion_tokens == sum(s.usage.completion_tokens for s in single),
      f"n=3: the usage counts the prompt once and every choice's tokens ({r.usage})")
rc = chat(3, 40, extra_body={"cache_prompt": False})
check([printed(c) for c in rc.choices] == [printed(c) for c in r.choices] and
      rc.usage.prompt_tokens_details.cached_tokens == 0,
      "n=3 with cache_prompt false: the prompt computed whole, the same choices")
out += [printed(c) for c in r.choices]

# streamed: each choice's text under its index, a finish_reason each, then the usage
text, finish, usage = {}, {}, []
for ch in client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0.9, seed=40,
                                         n=3, stream=True, stream_options={"include_usage": True}):
    if ch.usage is not None:
        usage.append(ch.usage)
    for c in ch.choices:
        text[c.index] = text.get(c.index, "") + (c.delta.content or "")
        if c.finish_reason:
            check(c.index not in finish, f"stream n=3: one finish_reason for choice {c.index}")
            finish[c.index] = c.finish_reason
check(sorted(text) == [0, 1, 2] and all(text[i] == r.choices[i].message.content for i in range(3)),
      "stream n=3: each choice's text equals the answer's")
check(all(finish.get(i) == r.choices[i].finish_reason for i in range(3)), f"stream n=3: finish reasons {finish}")
check(len(usage) == 1 and usage[0].completion_tokens == r.usage.completion_tokens,
      f"stream n=3: one usage chunk ({usage})")

# completions, n=2 with echo: each choice's text starts with the prompt
body = {"model": MODEL, "prompt": "The lighthouse", "max_tokens": 6, "temperature": 0.9, "seed": 7, "n": 2,
        "echo": True}
st, data = raw("/v1/completions", body)
c2 = json.loads(data)
check(st == 200 and [c["index"] for c in c2["choices"]] == [0, 1] and
      all(c["text"].startswith("The lighthouse") for c in c2["choices"]), f"completions n=2 with echo: {st}")
for i in range(2):
    one = json.loads(raw("/v1/completions", dict(body, n=1, seed=7 + i))[1])
    check(one["choices"][0]["text"] == c2["choices"][i]["text"],
          f"completions n=2: choice {i} equals one choice with seed {7 + i}")
st, data = raw("/v1/completions", dict(body, stream=True))
parts = {}
for line in data.decode().splitlines():
    if line.startswith("data: {"):
        for c in json.loads(line[6:])["choices"]:
            parts[c["index"]] = parts.get(c["index"], "") + c["text"]
check(st == 200 and [parts.get(i) for i in range(2)] == [c["text"] for c in c2["choices"]],
      "completions n=2 streamed: the same texts, echo first")
out += [c["text"] for c in c2["choices"]]

# every slot, then more than the slots
r4 = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, n=4)
check(len(r4.choices) == 4 and len({c.message.content for c in r4.choices}) == 1,
      "n=4 greedy: four choices, one answer")
try:
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, n=5)
    check(False, "n=5: accepted")
except openai.BadRequestError as e:
    check("'n' is 5: this server runs 4 sequences at once" in str(e), f"n=5: 400 {e}")

with open(OUT, "w") as f:
    f.write("\n".join(out) + "\n")
