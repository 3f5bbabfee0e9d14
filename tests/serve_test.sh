#!/usr/bin/env bash
# serve_test.sh BATON - `baton serve` on two ranks with a tiny random-weight
# llama model that has a real vocabulary (tests/model_ref.py ... vocab), as
# users call it: curl (bad options, bad requests, each with its status and
# message), the openai Python package (tests/serve_client.py: completions,
# chat, streams, stop strings, seed, determinism under load, a bounded load
# test, disconnects, 503 past the queue, memory, logprobs; tests/serve_cache.py:
# prefix reuse; tests/serve_choices.py: n > 1), then SIGTERM (requests in flight finish, every rank stops,
# exit 0), the logprobs, reused prefixes' answers and choices of one rank against
# those of two (the same printed values), and a rank killed
# while serving (the job ends with a message, no hang).
set -u
# shellcheck source=tests/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"

python3 -c 'import gguf, numpy, openai' 2>/dev/null || {
    echo "SKIP: python3 with gguf, numpy and openai is needed (launch/bootstrap.sh test installs them)"
    exit 77
}
command -v curl >/dev/null || {
    echo "SKIP: curl is needed"
    exit 77
}
python3 "$here/model_ref.py" llama f32 "$tmp" vocab "$here/data/vocab/ggml-vocab-phi-3.gguf" || {
    echo "FAIL: could not write the test model"
    exit 1
}
model=$tmp/model.gguf

# ---- bad options: a usage error each, exit 2, before any model is read ----
expect_usage() {
    local want=$1
    shift
    out=$("$baton" serve "$@" 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || ! grep -qF -- "$want" <<<"$out"; then fail "baton serve $*: rc $rc, '$out' (wanted '$want')"; else echo "ok: baton serve $* -> $want"; fi
}
expect_usage "no model: give -m FILE"
expect_usage "--port: '70000' is not an integer in [0, 65535]" -m "$model" --port 70000
expect_usage "--parallel: 'x' is not an integer" -m "$model" --parallel x
expect_usage "--ctx-size 16 over --parallel 16 leaves 1 cells per request" -m "$model" --ctx-size 16 --parallel 16
expect_usage "--ctx-size 32 over --parallel 32 leaves 1 cells per request" -m "$model" -c 32 -np 32
expect_usage "--api-key: the key is empty" -m "$model" --api-key ""
expect_usage "--host: the address is empty" -m "$model" --host ""
expect_usage "unknown option --frob" -m "$model" --frob
expect_usage "--cors: 'https://app.example/' is not an origin: give * or scheme://host[:port]" -m "$model" --cors https://app.example/
expect_usage "--cors: 'app.example' is not an origin" -m "$model" --cors app.example
expect_usage "--cors: '' is not an origin" -m "$model" --cors ""
expect_usage "--pooling: 'cls' is not a pooling: give mean or last" -m "$model" --pooling cls
out=$("$baton" serve -m "$tmp/missing.gguf" --port 0 2>&1)
rc=$?
if [ $rc -ne 1 ] || ! grep -q "missing.gguf" <<<"$out"; then fail "a missing model file: rc $rc, '$out'"; else echo "ok: a missing model file names it"; fi

# ---- the server: two ranks ----
start_server() { # log-name, extra options; sets server, port, pid0 (ranks: $ranks, default 2)
    local log=$tmp/$1
    shift
    "$mpirun" -np "${ranks:-2}" "$baton" serve -m "$model" --port 0 --threads 1 "$@" >"$log.out" 2>"$log.err" &
    server=$!
    listening "$log" ""
    echo "server: $line"
}
key=sekrit-test-key
start_server main --parallel 4 --ctx-size 1024 --api-key "$key" --max-queue 16 --max-body 65536
url=http://127.0.0.1:$port
mid=model.gguf
# the port is taken now; an address that is none
out=$("$baton" serve -m "$model" --port "$port" 2>&1)
rc=$?
# one line, with the OS's reason (before: MHD's own line, then a guess "in use, or not an address of this host")
if [ $rc -ne 1 ] || [ "$out" != "baton serve: cannot listen on 127.0.0.1 port $port: Address already in use" ]; then
    fail "a port in use: rc $rc, '$out'"
else
    echo "ok: a port in use: $out"
fi
out=$("$baton" serve -m "$model" --port 0 --host no.such.host.invalid 2>&1)
rc=$?
if [ $rc -ne 1 ] || ! grep -qF -- "--host no.such.host.invalid:" <<<"$out"; then fail "a bad --host: rc $rc, '$out'"; else echo "ok: a bad --host: $out"; fi

# status and a part of the message (the error object's message, or the body)
expect() {
    local want_status=$1 want_text=$2
    shift 2
    body=$(curl -s -o "$tmp/body" -w '%{http_code}' "$@")
    got=$(cat "$tmp/body")
    if [ "$body" != "$want_status" ] || ! grep -qF -- "$want_text" "$tmp/body"; then
        fail "curl $*: $body '$got' (wanted $want_status '$want_text')"
    else
        echo "ok: $want_status $want_text"
    fi
}
auth=(-H "Authorization: Bearer $key")
json=(-H "Content-Type: application/json")
C=$url/v1/completions
H=$url/v1/chat/completions
expect 200 '"status":"ok"' "$url/health"
expect 200 "\"id\":\"$mid\"" "${auth[@]}" "$url/v1/models"
expect 200 "baton_requests_total" "${auth[@]}" "$url/metrics"
# 401: no key, a wrong key, not Bearer
expect 401 "You didn't provide an API key" "$url/v1/models"
expect 401 "Incorrect API key provided" -H "Authorization: Bearer nope" "$url/v1/models"
expect 401 "Incorrect API key provided" -H "Authorization: Basic $key" "${json[@]}" -d '{}' "$C"
# 404, 405
expect 404 "Unknown request URL: GET /v2/nothing" "${auth[@]}" "$url/v2/nothing"
expect 405 "takes POST, not GET" "${auth[@]}" "$C"
expect 405 "takes GET, not POST" "${auth[@]}" -d '{}' "$url/v1/models"
expect 405 "takes POST, not DELETE" "${auth[@]}" -X DELETE "$H"
# 413: declared and chunked
head -c 70000 /dev/zero | tr '\0' 'a' >"$tmp/big"
expect 413 "this server takes at most 65536" "${auth[@]}" "${json[@]}" --data-binary @"$tmp/big" "$C"
expect 413 "the request body is over 65536 bytes, the most this server takes" "${auth[@]}" "${json[@]}" -H "Transfer-Encoding: chunked" --data-binary @"$tmp/big" "$C"
# a 50 MB chunked body (no Content-Length): the 413 as soon as the limit is passed, not a reset
# after the whole body (before: the connection was reset after about 16 times the limit)
head -c 50000000 /dev/zero | tr '\0' 'a' >"$tmp/huge"
expect 413 "the request body is over 65536 bytes" "${auth[@]}" "${json[@]}" -H "Transfer-Encoding: chunked" --data-binary @"$tmp/huge" "$C"
rm -f "$tmp/huge"
# raw HTTP: each case gets one response (one status line) with the JSON error, and the
# chunked body's answer comes before 4 MB of the 50 are sent
if python3 - "$port" "$key" <<'PY'; then echo "ok: raw: a bad Content-Length or a 50 MB chunked body: one 4xx with its message"; else fail "raw: bad Content-Length, chunked body"; fi
import json, select, socket, sys
port, key = int(sys.argv[1]), sys.argv[2]
head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n" % key
def answer(s):
    s.settimeout(10)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    return out.decode("latin1")
def one_json(out, status, text):
    ok = out.count("HTTP/1.") == 1 and out.startswith("HTTP/1.1 %d " % status) and "\r\n\r\n" in out
    if ok:
        body = json.loads(out.split("\r\n\r\n", 1)[1])
        ok = text in body["error"]["message"]
    if not ok:
        print("FAIL: wanted one %d with %r, got %r" % (status, text, out[:600]))
    return ok
good = True
for cl, status, text in [("-5", 400, "the request's Content-Length '-5' is not a byte count"),
                         ("5x", 400, "the request's Content-Length '5x' is not a byte count"),
                         ("99999999999999999999999", 413, "the request body has 99999999999999999999999 bytes: this server takes at most 65536"),
                         ("100000000", 413, "the request body has 100000000 bytes: this server takes at most 65536")]:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall((head + "Content-Length: %s\r\n\r\n" % cl).encode())
    good = one_json(answer(s), status, text) and good
    s.close()
s = socket.create_connection(("127.0.0.1", port))
s.sendall((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
chunk = b"10000\r\n" + b"a" * 65536 + b"\r\n"
sent = 0
while sent < 50000000:
    r, w, _ = select.select([s], [s], [], 10)
    if r or not w:
        break
    try:
        sent += s.send(chunk)
    except OSError:
        break
out = answer(s)
good = one_json(out, 413, "the request body is over 65536 bytes") and good
if sent > 4000000:
    print("FAIL: the 413 came after %d bytes of the body" % sent)
    good = False
sys.exit(0 if good else 1)
PY
# 400s and a 404 from the body
expect 400 "the request body is empty" "${auth[@]}" "${json[@]}" -X POST "$C"
expect 400 "not valid JSON: line 1" "${auth[@]}" "${json[@]}" -d '{"model":' "$C"
expect 400 "must be a JSON object, not an array" "${auth[@]}" "${json[@]}" -d '[]' "$C"
expect 404 "The model 'gpt-4' does not exist" "${auth[@]}" "${json[@]}" -d '{"model":"gpt-4","prompt":"x"}' "$C"
expect 400 "you must provide a 'prompt'" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\"}" "$C"
expect 400 "'prompt' must be a string or an array of token ids, not an integer" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":5}" "$C"
expect 400 "is token id 99999999" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":[1,99999999]}" "$C"
expect 400 "you must provide 'messages'" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\"}" "$H"
expect 400 "'messages' is empty" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"messages\":[]}" "$H"
expect 400 "'messages[0].role' is 'robot'" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}" "$H"
expect 400 "'messages[0].content' is missing" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"messages\":[{\"role\":\"user\"}]}" "$H"
msg='"messages":[{"role":"user","content":"hi"}]'
expect 400 "'max_tokens' is 0" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":0}" "$H"
expect 400 "'max_tokens' is 100000000: it must be between 1 and 16777216" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":100000000}" "$H"
expect 400 "'max_tokens' must be an integer, not a string" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":\"9\"}" "$H"
expect 400 "'temperature' is 5: it must be between 0 and 2" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"temperature\":5}" "$H"
expect 400 "'top_p' is 2" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"top_p\":2}" "$H"
expect 400 "'stream' must be a boolean" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"stream\":1}" "$H"
expect 400 "'stop' has 5 strings: at most 4" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}" "$H"
expect 400 "'n' is 5: this server runs 4 sequences at once (--parallel), one per choice" "${auth[@]}" "${json[@]}" \
    -d "{\"model\":\"$mid\",$msg,\"n\":5}" "$H"
expect 200 '"index":2' "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"n\":3,\"max_tokens\":3}" "$H"
expect 400 "'logit_bias' of token 5 must be a number between -100 and 100" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"logit_bias\":{\"5\":500}}" "$H"
expect 400 "'ignore_eos' must be a boolean" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"ignore_eos\":\"yes\"}" "$H"
expect 400 "'top_logprobs' is 2: it needs 'logprobs': true" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"top_logprobs\":2}" "$H"
expect 400 "'top_logprobs' is 21: it must be between 0 and 20" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"logprobs\":true,\"top_logprobs\":21}" "$H"
expect 400 "'logprobs' must be a boolean, not an integer" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"logprobs\":3}" "$H"
expect 400 "'logprobs' is -1: it must be between 0 and 20" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"x\",\"logprobs\":-1}" "$C"
expect 400 "'logprobs' with 'echo' is not supported" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"x\",\"logprobs\":1,\"echo\":true}" "$C"
# Phi-3's template shows no tool-call format: tools are refused, a JSON answer is not
expect 400 "its chat template (jinja) shows no tool-call format baton knows" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}" "$H"
out=$(curl -s "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":60,\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"b\",\"schema\":{\"enum\":[\"yes\",\"no\"]}}}}" "$H" |
    python3 -c 'import sys, json; r = json.load(sys.stdin)["choices"][0]; print(r["finish_reason"], json.loads(r["message"]["content"]))' 2>&1)
case "$out" in "stop yes" | "stop no") echo "ok: a JSON answer on a llama vocabulary: $out" ;; *) fail "a JSON answer: '$out'" ;; esac
# longer than a request's share of the context (1024 / 4 = 256 tokens)
long=$(python3 -c 'print(" ".join(["word"] * 400))')
expect 400 "maximum context length is 256 tokens per request" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"$long\"}" "$C"
# a max_tokens past the share is taken, as llama-server takes it: the completion
# ends when the share is full (10 prompt tokens: 247 more fit in 256 cells)
got=$(curl -s "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":[1,2,3,4,5,6,7,8,9,10],\"max_tokens\":1024,\"temperature\":1,\"logit_bias\":{\"32000\":-100,\"32007\":-100}}" "$C" |
    python3 -c 'import sys, json; r = json.load(sys.stdin); print(r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"])' 2>&1)
if [ "$got" = "length 247" ]; then echo "ok: max_tokens 1024 past a 256-cell share: 247 tokens, length"; else fail "max_tokens past the share: '$got'"; fi
# a good one with curl, streamed
out=$(curl -sN "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":5,\"temperature\":0,\"stream\":true}" "$H")
if ! grep -q '"object":"chat.completion.chunk"' <<<"$out" || [ "$(tail -n 1 <<<"$out")" != "data: [DONE]" ]; then
    fail "curl stream: '$out'"
else
    echo "ok: curl stream ends with data: [DONE]"
fi
# chat: the model's own template (Phi-3's, the vocabulary's tokenizer.chat_template, run as
# Jinja: it writes bos_token, and no system turn) with its control tokens, as `baton tokenize`
# counts them (the BOS the vocabulary adds stands for the template's)
want=$("$baton" tokenize -m "$model" -p '<|user|>\nSay hi.<|end|>\n<|assistant|>\n' --ids |
    python3 -c 'import sys, json; print(len(json.loads(sys.stdin.read())))')
got=$(curl -s "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},{\"role\":\"user\",\"content\":\"Say hi.\"}],\"max_tokens\":2}" "$H" |
    python3 -c 'import sys, json; print(json.load(sys.stdin)["usage"]["prompt_tokens"])')
if [ -z "$want" ] || [ "$want" != "$got" ]; then fail "chat template: $got prompt tokens, $want expected"; else echo "ok: chat: the model's Phi-3 template, $got prompt tokens"; fi

# ---- llama-server's /tokenize and /detokenize ----
T=$url/tokenize
D=$url/detokenize
text='Hello, world! caf\u00e9 \ud83d\ude00 <|end|> tail'
# the ids are those of `baton tokenize` (without BOS; with add_special, with it)
for special in false true; do
    nobos=--no-bos
    [ $special = true ] && nobos=
    want=$("$baton" tokenize -m "$model" -p 'Hello, world! café 😀 <|end|> tail' --ids $nobos | tr -d ' ')
    got=$(curl -s "${auth[@]}" "${json[@]}" -d "{\"content\":\"$text\",\"add_special\":$special}" "$T" |
        python3 -c 'import sys, json; print(json.dumps(json.load(sys.stdin)["tokens"], separators=(",", ":")))')
    if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "ok: /tokenize add_special $special: $got"; else fail "/tokenize add_special $special: '$got', baton tokenize '$want'"; fi
done
# the round trip: detokenize(tokenize(text)) is the text (one without control tokens: a
# "llama" vocabulary puts a space before the text after one, as llama.cpp does); with_pieces:
# the same ids, each with its text, the emoji's byte tokens (not UTF-8 alone) as arrays of
# their byte values, all joining into the text; a control token's text is its piece
if python3 - "$url" "$key" <<'PY'; then echo "ok: /tokenize -> /detokenize gives the text back; with_pieces: ids, pieces, bytes"; else fail "/tokenize round trip and with_pieces"; fi
import json, sys, urllib.request
url, key = sys.argv[1], sys.argv[2]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)
for text in ["Hello, world! caf\u00e9 \U0001F600 tail", "two  spaces,\ttab\nnew line \u4f60\u597d", "x"]:
    ids = post("/tokenize", {"content": text})["tokens"]
    assert ids and all(isinstance(i, int) for i in ids), ids
    back = post("/detokenize", {"tokens": ids})["content"]
    assert back == text, (back, text)
    pieces = post("/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == ids, (pieces, ids)
    raw = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces)
    assert raw.decode() in (text, " " + text), raw  # a "llama" vocabulary's leading space
assert sum(isinstance(p["piece"], list) for p in post("/tokenize", {"content": "\U0001F600", "with_pieces": True})["tokens"]) == 4
special = post("/tokenize", {"content": "a<|end|>", "with_pieces": True})["tokens"]
assert {"id": 32007, "piece": "<|end|>"} in special, special
assert post("/detokenize", {"tokens": [p["id"] for p in special]})["content"] == "a<|end|>"
# parse_special false: the control token's text is text
assert 32007 not in post("/tokenize", {"content": "a<|end|>", "parse_special": False})["tokens"]
assert post("/detokenize", {"tokens": []}) == {"content": ""}
assert post("/tokenize", {"content": ""}) == {"tokens": []}
PY
expect 400 "you must provide 'content'" "${auth[@]}" "${json[@]}" -d '{"text":"hi"}' "$T"
expect 400 "'content' must be a string, not an integer" "${auth[@]}" "${json[@]}" -d '{"content":5}' "$T"
expect 400 "'with_pieces' must be a boolean, not a string" "${auth[@]}" "${json[@]}" -d '{"content":"a","with_pieces":"yes"}' "$T"
expect 400 "'add_special' must be a boolean, not an integer" "${auth[@]}" "${json[@]}" -d '{"content":"a","add_special":1}' "$T"
expect 400 "the request body is empty" "${auth[@]}" "${json[@]}" -X POST "$T"
expect 400 "you must provide 'tokens'" "${auth[@]}" "${json[@]}" -d '{"content":"a"}' "$D"
expect 400 "'tokens' must be an array of token ids, not a string" "${auth[@]}" "${json[@]}" -d '{"tokens":"1 2"}' "$D"
expect 400 "'tokens[1]' must be a token id (an integer), not a string" "${auth[@]}" "${json[@]}" -d '{"tokens":[1,"2"]}' "$D"
expect 400 "'tokens[2]' is token id 32064: the vocabulary has ids 0 to 32063" "${auth[@]}" "${json[@]}" -d '{"tokens":[1,2,32064]}' "$D"
expect 400 "'tokens[0]' is token id -1" "${auth[@]}" "${json[@]}" -d '{"tokens":[-1]}' "$D"
expect 401 "You didn't provide an API key" "${json[@]}" -d '{"content":"a"}' "$T"
expect 405 "/detokenize takes POST, not GET" "${auth[@]}" "$D"

# ---- POST /v1/embeddings: mean pooling of the hidden states after the output norm ----
E=$url/v1/embeddings
expect 400 "you must provide 'input'" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\"}" "$E"
expect 400 "'input' is empty" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":[]}" "$E"
expect 400 "'input' is empty" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":\"\"}" "$E"
expect 400 "'input[1]' is empty" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":[\"a\",\"\"]}" "$E"
expect 400 "'input' must be a string, an array of strings, token ids or arrays of token ids, not an integer" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":5}" "$E"
expect 400 "'input[1]' must be a string or an array of token ids, not an integer" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":[\"a\",5]}" "$E"
expect 400 "'input[0][1]' is token id 99999999" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":[[1,99999999]]}" "$E"
expect 400 "'encoding_format' is 'int8': give float or base64" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":\"a\",\"encoding_format\":\"int8\"}" "$E"
expect 400 "'dimensions' is not supported by this server" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":\"a\",\"dimensions\":8}" "$E"
expect 400 "'input[0]' has 401 tokens: the maximum context length is 256 tokens per request" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":[\"$long\"]}" "$E"
expect 404 "The model 'gpt-4' does not exist" "${auth[@]}" "${json[@]}" -d '{"model":"gpt-4","input":"a"}' "$E"
expect 401 "You didn't provide an API key" "${json[@]}" -d "{\"model\":\"$mid\",\"input\":\"a\"}" "$E"
expect 405 "/v1/embeddings takes POST, not GET" "${auth[@]}" "$E"
if ! python3 "$here/serve_embeddings.py" "$port" "$key" "$mid" "$model" mean "$tmp/emb2"; then fail "serve_embeddings.py"; fi

# ---- GET /v1/models/{id}: the object /v1/models lists; another id a 404 ----
expect 200 "{\"id\":\"$mid\",\"object\":\"model\"" "${auth[@]}" "$url/v1/models/$mid"
got=$(curl -s "${auth[@]}" "$url/v1/models/$mid")
listed=$(curl -s "${auth[@]}" "$url/v1/models" | python3 -c 'import sys, json; print(json.dumps(json.load(sys.stdin)["data"][0], separators=(",", ":")))')
if [ "$got" = "$listed" ]; then echo "ok: /v1/models/$mid is the listed object"; else fail "/v1/models/$mid: '$got', listed '$listed'"; fi
expect 404 "The model 'gpt-4' does not exist" "${auth[@]}" "$url/v1/models/gpt-4"
expect 404 '"code":"model_not_found"' "${auth[@]}" "$url/v1/models/gpt-4"
expect 401 "You didn't provide an API key" "$url/v1/models/$mid"

# ---- HEAD on the GET routes: the GET's status and headers, no body ----
head_check() { # status path [curl options]
    local want=$1 path=$2
    shift 2
    got=$(curl -s -I -o "$tmp/head" -w '%{http_code} %{size_download}' "$@" "$url$path")
    get_len=$(curl -s -o /dev/null -w '%{size_download}' "$@" "$url$path")
    if [ "$got" = "$want 0" ] && grep -qi "^content-type: " "$tmp/head" && grep -qi "^content-length: $get_len" "$tmp/head"; then
        echo "ok: HEAD $path: $want, headers (Content-Length $get_len as the GET's), no body"
    else
        fail "HEAD $path: '$got' (GET: $get_len bytes): $(cat "$tmp/head")"
    fi
}
head_check 200 /health
head_check 200 /v1/models "${auth[@]}"
head_check 200 "/v1/models/$mid" "${auth[@]}"
head_check 404 /v1/models/gpt-4 "${auth[@]}"
head_check 401 /v1/models
got=$(curl -s -I "${auth[@]}" "$C" | tr -d '\r' | grep -E "^HTTP|^Allow:" | tr '\n' ' ')
[ "$got" = "HTTP/1.1 405 Method Not Allowed Allow: POST " ] && echo "ok: HEAD on a POST route: 405, Allow: POST" || fail "HEAD $C: '$got'"

# ---- without --cors: no CORS headers, and OPTIONS is a wrong method ----
if curl -s -D - -o /dev/null -H "Origin: https://app.example" "$url/health" | grep -qi "^access-control"; then
    fail "no --cors: a CORS header was sent"
else
    echo "ok: no --cors: no CORS headers"
fi
expect 405 "takes POST, not OPTIONS" -X OPTIONS -H "Origin: https://app.example" -H "Access-Control-Request-Method: POST" "$H"
got=$(curl -s -D - -o /dev/null -X OPTIONS "$url/health" | grep -i "^allow:" | tr -d '\r')
[ "$got" = "Allow: GET, HEAD" ] && echo "ok: 405 with $got" || fail "OPTIONS /health without --cors: '$got'"

# the server is still well after all of that
expect 200 '"status":"ok"' "$url/health"

# ---- the openai package ----
if ! python3 "$here/serve_client.py" "$port" "$key" "$mid" "$pid0" "$tmp/logprobs2"; then fail "serve_client.py"; fi
# ---- prefix reuse (cache_prompt): cached tokens reported, answers bitwise a cold run's ----
if ! python3 "$here/serve_cache.py" "$port" "$key" "$mid" "$tmp/cache2"; then fail "serve_cache.py"; fi
# ---- n > 1 choices: the prompt once, each choice a request with seed + i ----
if ! python3 "$here/serve_choices.py" "$port" "$key" "$mid" "$tmp/choices2"; then fail "serve_choices.py"; fi

# ---- SIGTERM: the requests running and queued finish, new ones get 503, every rank stops, exit 0 ----
curl_pids=()
for i in 1 2 3 4 5 6 7 8; do
    curl -sN "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"Drain $i\",\"max_tokens\":240,\"temperature\":0,\"stream\":true}" "$C" >"$tmp/drain$i" &
    curl_pids+=($!)
done
# SIGTERM only once the server holds all 8 (running or queued): on a loaded machine a curl
# started above may not have connected yet, and a request that arrives during the drain is
# refused by design, which is not what this case tests
for _ in $(seq 1 1000); do
    # finished first: a request that ends in between is then counted once or not at all
    finished=$(grep -l '"finish_reason"' "$tmp"/drain* 2>/dev/null | wc -l)
    inflight=$(curl -s "${auth[@]}" "$url/metrics" | awk '/^baton_requests_(queued|running) /{n+=$2} END{print n+0}')
    if [ $((inflight + finished)) -ge 8 ]; then break; fi
    sleep 0.02
done
kill -TERM "$pid0"
sleep 0.1
code=$(curl -s -o "$tmp/late" -w '%{http_code}' "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"Late\",\"max_tokens\":2}" "$C")
if [ "$code" = 503 ] && grep -q "shutting down" "$tmp/late"; then
    echo "ok: SIGTERM: a new request during the drain gets 503"
elif [ "$code" = 000 ]; then
    echo "note: the drain was over before the late request"
else
    fail "SIGTERM: a request during the drain got $code: $(cat "$tmp/late")"
fi
wait "${curl_pids[@]}"
for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
if kill -0 $server 2>/dev/null; then
    fail "SIGTERM: the job did not end within 30 s"
else
    wait $server
    rc=$?
    server=""
    if [ $rc -ne 0 ]; then fail "SIGTERM: mpirun exited $rc: $(cat "$tmp/main.err")"; else echo "ok: SIGTERM: every rank stopped, exit 0"; fi
fi
cut=0
for i in 1 2 3 4 5 6 7 8; do
    if ! grep -qE '"finish_reason":"(length|stop)"' "$tmp/drain$i" || ! tail -n 2 "$tmp/drain$i" | grep -q "data: \[DONE\]"; then
        fail "SIGTERM: request $i was cut: $(tail -c 300 "$tmp/drain$i")"
        cut=1
    fi
done
if [ $cut = 0 ]; then echo "ok: SIGTERM: all 8 requests (4 running, 4 queued) got to their end and [DONE]"; fi
grep -qE "stopping: finishing [1-9][0-9]* running" "$tmp/main.err" || fail "SIGTERM: no drain message: $(cat "$tmp/main.err")"
grep "stopping: finishing" "$tmp/main.err"

# ---- logprobs on one rank: the same printed values as on two (and --cors) ----
ranks=1 start_server one --parallel 4 --ctx-size 1024 --api-key "$key" --cors https://app.example
if ! python3 "$here/serve_client.py" "$port" "$key" "$mid" "$pid0" "$tmp/logprobs1" logprobs; then
    fail "serve_client.py logprobs on one rank"
elif [ ! -s "$tmp/logprobs2" ] || ! cmp -s "$tmp/logprobs1" "$tmp/logprobs2"; then
    fail "logprobs: 1 rank and 2 ranks differ: $(diff "$tmp/logprobs1" "$tmp/logprobs2" 2>&1 | head -c 600)"
else
    echo "ok: logprobs: the same printed values on 1 rank and on 2"
fi
# prefix reuse on one rank: the same answers as on two
if ! python3 "$here/serve_cache.py" "$port" "$key" "$mid" "$tmp/cache1"; then
    fail "serve_cache.py on one rank"
elif [ ! -s "$tmp/cache2" ] || ! cmp -s "$tmp/cache1" "$tmp/cache2"; then
    fail "prefix reuse: 1 rank and 2 ranks differ: $(diff "$tmp/cache1" "$tmp/cache2" 2>&1 | head -c 600)"
else
    echo "ok: prefix reuse: the same answers and log-probabilities on 1 rank and on 2"
fi
# n > 1 choices on one rank: the same answers as on two
if ! python3 "$here/serve_choices.py" "$port" "$key" "$mid" "$tmp/choices1"; then
    fail "serve_choices.py on one rank"
elif [ ! -s "$tmp/choices2" ] || ! cmp -s "$tmp/choices1" "$tmp/choices2"; then
    fail "n > 1: 1 rank and 2 ranks differ: $(diff "$tmp/choices1" "$tmp/choices2" 2>&1 | head -c 600)"
else
    echo "ok: n > 1: the same choices on 1 rank and on 2"
fi
# embeddings: the same printed vectors on 1 rank as on 2
if ! python3 "$here/serve_embeddings.py" "$port" "$key" "$mid" "$model" mean "$tmp/emb1"; then
    fail "serve_embeddings.py on one rank"
elif [ ! -s "$tmp/emb2" ] || ! cmp -s "$tmp/emb1" "$tmp/emb2"; then
    fail "embeddings: 1 rank and 2 ranks differ"
else
    echo "ok: embeddings: the same printed vectors on 1 rank and on 2"
fi
# --cors: the origin on every answer (an error, a stream, a 401 too); a preflight needs no key
cors_check() { # what, then curl's arguments
    local what=$1
    shift
    got=$(curl -s -N -D - -o /dev/null "$@" | grep -i "^access-control-allow-origin:" | tr -d '\r')
    if [ "$got" = "Access-Control-Allow-Origin: https://app.example" ]; then echo "ok: --cors: $what: $got"; else fail "--cors: $what: '$got'"; fi
}
url=http://127.0.0.1:$port
cors_check "GET /health" "$url/health"
cors_check "401 without the key" -H "Origin: https://app.example" "$url/v1/models"
cors_check "POST /tokenize" "${auth[@]}" "${json[@]}" -d '{"content":"hi"}' "$url/tokenize"
cors_check "a 400" "${auth[@]}" "${json[@]}" -d '{"content":1}' "$url/tokenize"
cors_check "a stream" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"a\",\"max_tokens\":2,\"stream\":true}" "$url/v1/completions"
cors_check "HEAD /v1/models" -I "${auth[@]}" "$url/v1/models"
# a browser's preflight of an authorized POST: 204 without the key, then the POST itself still needs it
code=$(curl -s -D "$tmp/pre" -o "$tmp/pre.body" -w '%{http_code}' -X OPTIONS -H "Origin: https://app.example" \
    -H "Access-Control-Request-Method: POST" -H "Access-Control-Request-Headers: authorization, content-type" \
    "$url/v1/chat/completions")
tr -d '\r' <"$tmp/pre" >"$tmp/pre.h"
if [ "$code" = 204 ] && [ ! -s "$tmp/pre.body" ] &&
    grep -qx "Access-Control-Allow-Origin: https://app.example" "$tmp/pre.h" &&
    grep -qx "Access-Control-Allow-Methods: GET, POST, OPTIONS" "$tmp/pre.h" &&
    grep -qx "Access-Control-Allow-Headers: Authorization, Content-Type" "$tmp/pre.h" &&
    grep -qx "Access-Control-Max-Age: 86400" "$tmp/pre.h"; then
    echo "ok: --cors: OPTIONS preflight without the key: 204 with Allow-Origin, -Methods, -Headers, Max-Age"
else
    fail "--cors: preflight: $code: $(cat "$tmp/pre.h" "$tmp/pre.body")"
fi
expect 401 "You didn't provide an API key" -H "Origin: https://app.example" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":1}" "$url/v1/chat/completions"
expect 200 '"object":"chat.completion"' -H "Origin: https://app.example" "${auth[@]}" "${json[@]}" -d "{\"model\":\"$mid\",$msg,\"max_tokens\":1}" "$url/v1/chat/completions"
expect 404 "Unknown request URL: OPTIONS /v2/nothing" -X OPTIONS "$url/v2/nothing"
kill -TERM "$pid0"
for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
wait $server
rc=$?
server=""
[ $rc -eq 0 ] || fail "one rank: the server's job exited $rc: $(cat "$tmp/one.err")"

# ---- --pooling last: the last token's hidden state ----
ranks=1 start_server last --parallel 4 --ctx-size 1024 --pooling last
if python3 "$here/serve_embeddings.py" "$port" none "$mid" "$model" last "$tmp/embl"; then
    echo "ok: --pooling last"
else
    fail "--pooling last"
fi
kill -TERM "$pid0"
for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
wait $server
server=""

# ---- prefix reuse with sliding-window layers: gemma3 (window 4) at ubatch 16 keeps a ring of 32 cells ----
# ---- per sequence; a reused prefix gives a cold run's answers, on 1 rank and on 2 alike ----
mkdir -p "$tmp/g" &&
    python3 "$here/model_ref.py" gemma3 f32 "$tmp/g" vocab "$here/data/vocab/ggml-vocab-phi-3.gguf" >/dev/null ||
    fail "could not write the gemma3 test model"
for n in 1 2; do
    model=$tmp/g/model.gguf ranks=$n start_server "gemma$n" --parallel 4 --ctx-size 1024 --ubatch 16 --api-key "$key"
    if ! python3 "$here/serve_cache.py" "$port" "$key" "$mid" "$tmp/gcache$n"; then
        fail "serve_cache.py: gemma3, $n ranks"
    fi
    kill -TERM "$pid0"
    for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
done
if [ ! -s "$tmp/gcache1" ] || ! cmp -s "$tmp/gcache1" "$tmp/gcache2"; then
    fail "prefix reuse with a ring: 1 rank and 2 ranks differ"
else
    echo "ok: prefix reuse with a sliding window's ring: the same answers on 1 rank and on 2"
fi

# ---- a model whose logits hold NaN (a damaged file): that request is a 500 naming it, ----
# ---- the server goes on (before: 200 with tokens sampled from NaN) ----
cp "$model" "$tmp/nan.gguf"
python3 - "$tmp/nan.gguf" <<'EOF'
import sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1], "r+")
next(t for t in r.tensors if t.name == "output_norm.weight").data[...] = np.nan
r.data.flush()
EOF
model_good=$model
model=$tmp/nan.gguf
start_server nan --parallel 2 --ctx-size 256
model=$model_good
for stream in false true; do
    code=$(curl -s -o "$tmp/nan.body" -w '%{http_code}' -H 'Content-Type: application/json' \
        -d "{\"model\":\"nan.gguf\",\"prompt\":\"hi\",\"max_tokens\":3,\"stream\":$stream}" \
        "http://127.0.0.1:$port/v1/completions")
    want=500
    [ $stream = true ] && want=200 # the stream has begun: its error comes as an event
    if [ "$code" = $want ] && grep -q "the model's logits hold NaN" "$tmp/nan.body"; then
        echo "ok: NaN logits (stream $stream): $code, the error named"
    else
        fail "NaN logits (stream $stream): $code: $(head -c 300 "$tmp/nan.body")"
    fi
done
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
[ "$code" = 200 ] && echo "ok: NaN logits: the server goes on" || fail "NaN logits: /health then gave $code"
kill -TERM "$pid0"
for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
wait $server
rc=$?
server=""
[ $rc -eq 0 ] || fail "NaN logits: the server's job exited $rc: $(cat "$tmp/nan.err")"

# ---- connection limits: idle connections cannot lock others out ----
# 300 idle connections from one address (127.0.0.1) hold at most --max-client-connections;
# another address is served at once; past a limit, 2 spare connections answer /health only
# (idle, they close after a second) and other routes get a 429 or 503
# naming the limit; --timeout closes an idle connection (before: 300 idle connections made
# /health time out for every client; the idle timeout was fixed at 120 s)
ranks=1 start_server limits --parallel 2 --ctx-size 256 --max-connections 8 --max-client-connections 4 --timeout 6
if python3 - "$port" "$mid" <<'PY'; then echo "ok: connection limits: per client, spare /health slots, --timeout"; else fail "connection limits"; fi
import json, socket, sys, time
port, mid = int(sys.argv[1]), sys.argv[2]
def conn(src):
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s
def ask(src, path, body=None, tries=1):
    """one request on a new connection from src: (status, message or body), or (0, why)"""
    for t in range(tries):
        try:
            s = conn(src)
            s.settimeout(10)
            req = ("%s %s HTTP/1.1\r\nHost: x\r\n" % ("POST" if body else "GET", path))
            if body:
                req += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
            s.sendall((req + "\r\n" + (body or "")).encode())
            out = b""
            while True:
                d = s.recv(65536)
                if not d:
                    break
                out += d
                if b"\r\n\r\n" in out:
                    head, rest = out.split(b"\r\n\r\n", 1)
                    n = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                    if n and len(rest) >= n[0]:
                        break
            s.close()
            if out:
                head, rest = out.split(b"\r\n\r\n", 1)
                status = int(head.split()[1])
                try:
                    return status, json.loads(rest)["error"]["message"]
                except Exception:
                    return status, rest.decode()
            why = "closed unanswered"
        except OSError as e:
            why = str(e)
        time.sleep(0.5)
    return 0, why
good = True
def want(got, status, text, what):
    global good
    if got[0] != status or text not in got[1]:
        print("FAIL: %s: %r (wanted %d %r)" % (what, got, status, text))
        good = False
    else:
        print("ok: %s: %d %s" % (what, got[0], got[1][:120]))
t0 = time.time()
flood = []
for _ in range(300):
    try:
        flood.append(conn("127.0.0.1"))
    except OSError:
        pass
time.sleep(0.3)
# the flood holds 4 + 2 spare; another address is served at once, the flood's own /health
# once its idle spare connections have timed out
want(ask("127.0.0.2", "/health"), 200, '"status":"ok"', "300 idle from 127.0.0.1: /health from 127.0.0.2")
want(ask("127.0.0.2", "/v1/completions", json.dumps({"model": mid, "prompt": "hi", "max_tokens": 2})), 200,
     '"text_completion"', "300 idle from 127.0.0.1: a completion from 127.0.0.2")
time.sleep(1.5)
want(ask("127.0.0.1", "/health", tries=6), 200, '"status":"ok"', "300 idle from 127.0.0.1: its own /health on a spare slot")
want(ask("127.0.0.1", "/v1/models", tries=6), 429,
     "127.0.0.1 has 4 connections open, the most one client may have (--max-client-connections 4): only /health "
     "is answered on another", "300 idle from 127.0.0.1: /v1/models on a spare slot")
# the server's limit: 4 more idle from 127.0.0.3 fill the 8; a fifth address gets /health only.
# First the spare connection of the last ask must be gone (the server closes it after it answers,
# at the latest idle after a second): still open, it would make one of the 4 a spare one, closed
# after a second (seen on a loaded machine).  Not much longer: the flood's own 4 time out 6 s
# after t0, and the 503 below needs them open.
time.sleep(1.0)
t1 = time.time()
more = [conn("127.0.0.3") for _ in range(4)]
time.sleep(0.3)
want(ask("127.0.0.5", "/health", tries=6), 200, '"status":"ok"', "8 connections open: /health on a spare slot")
want(ask("127.0.0.5", "/v1/models", tries=6), 503,
     "the server has 8 connections open, the most it takes (--max-connections 8): only /health is answered on "
     "another", "8 connections open: /v1/models on a spare slot")
if time.time() - t0 > 5:
    print("note: the checks took %.1f s: the flood's connections may have timed out before" % (time.time() - t0))
# --timeout 6: the idle connections are closed (recv gives b"") after 6 s, not before
def n_closed(socks):
    n = 0
    for s in socks:
        s.settimeout(0.2)
        try:
            n += s.recv(1) == b""
        except OSError:
            pass
    return n
if time.time() - t1 < 4 and n_closed(more) != 0:
    print("FAIL: --timeout 6: idle connections closed before 6 s")
    good = False
time.sleep(max(0, t1 + 8 - time.time()))
closed = n_closed(flood[:4] + more)
if closed != 8:
    print("FAIL: --timeout 6: %d of the 8 idle connections closed after 8 s" % closed)
    good = False
for s in flood + more:
    s.close()
want(ask("127.0.0.1", "/health"), 200, '"status":"ok"', "after the flood: /health")
sys.exit(0 if good else 1)
PY
expect_usage "--timeout: '0' is not an integer in [1, 86400]" -m "$model" --timeout 0
expect_usage "--max-client-connections: 'x' is not an integer" -m "$model" --max-client-connections x
kill -TERM "$pid0"
for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
wait $server
server=""

# ---- a rank killed while serving: the job ends with a message ----
start_server killed --parallel 2 --ctx-size 256 --max-connections 3
# connections are bounded: with 3 open and the 2 spare ones idle, a 6th waits until a spare one
# is closed (1 s idle), then its /health is answered and closed; then all is well again
if python3 - "$port" <<'PY'; then echo "ok: --max-connections 3: a 6th connection's /health waits for a spare slot"; else fail "--max-connections"; fi
import socket, sys, time
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
time.sleep(0.3)
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(10)
t0 = time.time()
try:
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = s.recv(1000)
except OSError:
    data = b""
ok = data.startswith(b"HTTP/1.1 200") and b"Connection: close" in data and 0.3 < time.time() - t0 < 5
print("6th connection: %.1f s: %r" % (time.time() - t0, data[:60]))
sys.exit(0 if ok else 1)
PY
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
if [ "$code" != 200 ]; then fail "after the connection limit: /health $code"; fi
pid1=$(pgrep -P "$server" | grep -vx "$pid0" | head -n 1)
# the ranks are mpirun's children (or grandchildren through its daemon)
if [ -z "$pid1" ]; then
    for p in $(pgrep -P "$server"); do pid1=$(pgrep -P "$p" | grep -vx "$pid0" | head -n 1); done
fi
if [ -z "$pid1" ]; then
    fail "could not find rank 1's process"
    kill -9 $server
else
    curl -s "${json[@]}" -d "{\"model\":\"$mid\",\"prompt\":\"Killed\",\"max_tokens\":100}" "$C" >"$tmp/killed.body" &
    sleep 0.3
    kill -9 "$pid1"
    for _ in $(seq 1 300); do if ! kill -0 $server 2>/dev/null; then break; fi; sleep 0.1; done
    if kill -0 $server 2>/dev/null; then
        fail "rank 1 killed: the job still runs after 30 s"
        kill -9 $server
    else
        wait $server
        rc=$?
        if [ $rc -eq 0 ]; then fail "rank 1 killed: exit 0"; else echo "ok: rank 1 killed: the job ended (exit $rc)"; fi
        if grep -qiE "signal|exit|abort" "$tmp/killed.err"; then
            echo "ok: rank 1 killed: a message says so"
        else
            fail "rank 1 killed: no message: $(cat "$tmp/killed.err")"
        fi
    fi
fi
server=""
wait

# nothing went wrong inside the servers (a sanitizer build reports there)
if grep -l "AddressSanitizer\|runtime error\|BT_ASSERT" "$tmp"/*.err; then fail "the servers' logs report errors: $(grep -h -A5 "AddressSanitizer\|runtime error\|BT_ASSERT" "$tmp"/*.err | head -n 40)"; fi

if [ $fails -ne 0 ]; then
    echo "serve_test: $fails failure(s)"
    exit 1
fi
echo "serve_test: all passed"
