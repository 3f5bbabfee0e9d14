#!/usr/bin/env python3
"""serve_embeddings.py - POST /v1/embeddings of `baton serve`, through the
official openai package and plain HTTP, against a server that
tests/serve_test.sh started.

Usage: serve_embeddings.py PORT KEY MODEL MODEL_FILE POOLING OUT

Checks: the OpenAI shape (list of embedding objects, index, usage); one
string, an array of strings, token ids and arrays of token ids; float and
base64 (the openai package's default) give the same numbers; each vector has
the model's width and unit length; it matches the numpy reference
(tests/model_ref.py embd: the hidden states after the output norm, POOLING
mean or last); a text's vector is the same bits alone, in an array with
others, and among concurrent completions and embeddings.  OUT gets the
vectors as printed, for serve_test.sh to compare between 1 and 2 ranks."""
import base64
import concurrent.futures as cf
import json
import math
import os
import struct
import subprocess
import sys

import serve_util

PORT, KEY, MODEL, MODEL_FILE, POOLING, OUT = sys.argv[1:7]
PORT = int(PORT)
HERE = os.path.dirname(os.path.abspath(__file__))
client = serve_util.client(PORT, KEY)
check = serve_util.check
TEXTS = ["Hello, world!", "The colour of the sky is", "x", "two  spaces,\ttab\nnew line \u4f60\u597d"]


def raw(path, body):
    st, _, data = serve_util.request(PORT, "POST", path, body, KEY)
    return st, data


def printed(body):
    """the embeddings as the server printed them (JSON floats as text)"""
    st, data = raw("/v1/embeddings", body)
    if st != 200:
        check(False, f"/v1/embeddings {body}: {st} {data[:300]!r}")
    return [d["embedding"] for d in json.loads(data, parse_float=str)["data"]]


st, data = raw("/v1/embeddings", {"model": MODEL, "input": TEXTS, "encoding_format": "float"})
r = json.loads(data)
check(st == 200 and r["object"] == "list" and r["model"] == MODEL and len(r["data"]) == len(TEXTS)
      and [d["index"] for d in r["data"]] == list(range(len(TEXTS)))
      and all(d["object"] == "embedding" for d in r["data"]), "the OpenAI shape: a list of embedding objects")
ids = [json.loads(raw("/tokenize", {"content": t, "add_special": True})[1])["tokens"] for t in TEXTS]
n_tok = sum(len(i) for i in ids)
check(r["usage"] == {"prompt_tokens": n_tok, "total_tokens": n_tok},
      f"usage: {n_tok} prompt tokens (the texts tokenized with BOS, as llama-server)")
vecs = [d["embedding"] for d in r["data"]]
width = len(vecs[0])
check(all(len(v) == width for v in vecs) and all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5 for v in vecs),
      f"{len(vecs)} vectors of {width} floats, each of unit length")
# the numpy reference: the hidden states after the output norm, pooled, unit length (F16 cache: close, not equal)
for t, i, v in zip(TEXTS, ids, vecs):
    ref = json.loads(subprocess.check_output([sys.executable, os.path.join(HERE, "model_ref.py"), "llama", "f32",
                                              os.path.dirname(MODEL_FILE), "embd", ",".join(map(str, i)), POOLING]))
    err = max(abs(a - b) for a, b in zip(v, ref))
    check(len(ref) == width and err < 2e-3, f"{POOLING} pooling of {t!r}: the numpy reference within {err:.1e}")
# the openai package: base64 by default, float when asked; the same numbers
e64 = client.embeddings.create(model=MODEL, input=TEXTS)
ef = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
def f32(v):
    """as float32: JSON's 9 digits read back as the float32 they print"""
    return list(struct.unpack(f"<{len(v)}f", struct.pack(f"<{len(v)}f", *v)))


check([f32(d.embedding) for d in e64.data] == [f32(v) for v in vecs]
      and [f32(d.embedding) for d in ef.data] == [f32(v) for v in vecs] and e64.usage.prompt_tokens == n_tok,
      "openai client: base64 (its default) and float give the same float32 vectors")
st, data = raw("/v1/embeddings", {"model": MODEL, "input": TEXTS[0], "encoding_format": "base64"})
b = base64.b64decode(json.loads(data)["data"][0]["embedding"])
check(list(struct.unpack(f"<{width}f", b)) == f32(vecs[0]), "base64: the little-endian float32 bytes of the vector")
# inputs: one string, token ids, arrays of token ids: the same vectors
alone = [printed({"model": MODEL, "input": t})[0] for t in TEXTS]
together = printed({"model": MODEL, "input": TEXTS})
by_ids = printed({"model": MODEL, "input": ids})
one_ids = printed({"model": MODEL, "input": ids[1]})[0]
check(alone == together == by_ids and one_ids == alone[1],
      "the same bits alone, in an array, as token ids and as arrays of token ids")
# among concurrent completions and embeddings
with cf.ThreadPoolExecutor(8) as ex:
    others = [ex.submit(raw, "/v1/completions", {"model": MODEL, "prompt": f"Other {k}", "max_tokens": 12,
                                                  "temperature": 0}) for k in range(4)]
    others += [ex.submit(raw, "/v1/embeddings", {"model": MODEL, "input": [f"Another text {k}"] * 3})
               for k in range(3)]
    mine = [ex.submit(printed, {"model": MODEL, "input": t}) for t in TEXTS]
    busy = [f.result()[0] for f in mine]
    check(all(f.result()[0] == 200 for f in others), "the concurrent requests answered")
check(busy == alone, "the same bits among concurrent completions and embeddings")
with open(OUT, "w") as f:
    f.write(json.dumps(alone) + "\n")
print("serve_embeddings: all checks passed", flush=True)
