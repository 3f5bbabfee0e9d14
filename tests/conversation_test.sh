#!/usr/bin/env bash
# conversation_test.sh BATON - `baton generate -cnv`, an interactive chat
# driven through a pipe: one user turn per line of stdin (blank lines
# skipped), each reply streamed to stdout and ended with a newline, the
# conversation's cells kept between turns (stderr reports each turn's cached
# prompt tokens: all of the earlier turns the template renders alike), each
# reply greedy-equal to a cold `baton serve` chat request with the same
# messages (cache_prompt false), the same replies on 2 ranks; bad input (a
# prompt given with -cnv, a line that is not UTF-8, a conversation past the
# context) is one message and a non-zero exit.
set -u
# shellcheck source=tests/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"
python3 -c 'import gguf, numpy' 2>/dev/null || {
    echo "SKIP: python3 with gguf and numpy is needed (launch/bootstrap.sh test installs them)"
    exit 77
}
python3 "$here/model_ref.py" llama f32 "$tmp" vocab "$here/data/vocab/ggml-vocab-phi-3.gguf" >/dev/null || {
    echo "FAIL: could not write the test model"
    exit 1
}
model=$tmp/model.gguf
turns=$'Where is the lighthouse?\n\nWho keeps it in winter?\nAnd the boats in the harbour?\n'

for n in 1 2; do
    printf '%s' "$turns" | "$mpirun" -np $n "$baton" generate -m "$model" -cnv --temp 0 -n 6 --threads 1 \
        >"$tmp/out$n" 2>"$tmp/err$n"
    rc=$?
    if [ $rc -ne 0 ]; then fail "-cnv on $n ranks: rc $rc: $(cat "$tmp/err$n")"; continue; fi
    lines=$(wc -l <"$tmp/out$n")
    if [ "$lines" -ne 3 ]; then fail "-cnv on $n ranks: $lines lines of replies, not 3: $(cat "$tmp/out$n")"; fi
    # turn 1 computes its prompt whole; turns 2 and 3 reuse the conversation's cells
    c1=$(sed -nE 's/.*turn 1: [0-9]+ prompt tokens, ([0-9]+) cached.*/\1/p' "$tmp/err$n")
    c2=$(sed -nE 's/.*turn 2: ([0-9]+) prompt tokens, ([0-9]+) cached.*/\2/p' "$tmp/err$n")
    c3=$(sed -nE 's/.*turn 3: ([0-9]+) prompt tokens, ([0-9]+) cached.*/\2/p' "$tmp/err$n")
    if [ "$c1" != 0 ] || [ -z "$c2" ] || [ "$c2" -lt 10 ] || [ -z "$c3" ] || [ "$c3" -le "$c2" ]; then
        fail "-cnv on $n ranks: cached tokens per turn '$c1' '$c2' '$c3': $(cat "$tmp/err$n")"
    else
        echo "ok: -cnv on $n ranks: 3 replies, the earlier turns' cells reused ($c2, then $c3 tokens)"
    fi
done
if [ -s "$tmp/out1" ] && cmp -s "$tmp/out1" "$tmp/out2"; then echo "ok: -cnv: the same replies on 1 rank and on 2"; else fail "-cnv: 1 and 2 ranks differ"; fi

# each reply: a cold chat request with the same messages gives the same text
"$baton" serve -m "$model" --port 0 --threads 1 --parallel 1 --ctx-size 4096 >"$tmp/serve.out" 2>"$tmp/serve.err" &
server=$!
for _ in $(seq 1 300); do grep -q "listening on" "$tmp/serve.out" 2>/dev/null && break; sleep 0.1; done
port=$(sed -nE 's/.*:([0-9]+) \(model.*/\1/p' "$tmp/serve.out")
if [ -z "$port" ]; then
    fail "the server did not start: $(cat "$tmp/serve.out" "$tmp/serve.err")"
elif python3 - "$port" "$tmp/out1" "$turns" <<'PY'; then echo "ok: -cnv: each reply is a cold chat request's"; else fail "-cnv against serve"; fi
import http.client, json, sys
port, out, turns = int(sys.argv[1]), sys.argv[2], [t for t in sys.argv[3].split("\n") if t]
replies = open(out, encoding="utf-8").read().split("\n")[:3]
msgs = []
for i, (user, reply) in enumerate(zip(turns, replies)):
    msgs.append({"role": "user", "content": user})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "model.gguf", "messages": msgs, "max_tokens": 6, "temperature": 0, "cache_prompt": False}),
        {"Content-Type": "application/json"})
    got = json.loads(c.getresponse().read())["choices"][0]["message"]["content"]
    if got != reply:
        print(f"turn {i + 1}: serve says {got!r}, -cnv {reply!r}")
        sys.exit(1)
    msgs.append({"role": "assistant", "content": reply})
PY
kill "$server" 2>/dev/null
wait "$server" 2>/dev/null
server=""

# bad input: one message each, a non-zero exit
expect_err() { # want-rc want-text stdin args...
    local want_rc=$1 want=$2 input=$3
    shift 3
    out=$(printf '%s' "$input" | "$baton" generate -m "$model" -cnv --temp 0 -n 4 "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
        fail "-cnv $*: rc $rc, '$out' (wanted $want_rc '$want')"
    else
        echo "ok: -cnv $*: $want"
    fi
}
expect_err 2 "-cnv reads the user's turns from stdin: give no -p, -f or --prompts" "Hi"$'\n' -p "Hi"
expect_err 1 "stdin line 2: not valid UTF-8: byte 2" $'Hi\nab\xffc\n'
expect_err 1 "turn 2: the conversation has" "Hello there"$'\n'"$(python3 -c 'print("word " * 300)')"$'\n' --ctx-size 128
# an empty stdin: no turn, no error
out=$(printf '' | "$baton" generate -m "$model" -cnv --temp 0 -n 4 2>&1)
rc=$?
if [ $rc -ne 0 ]; then fail "-cnv with an empty stdin: rc $rc, '$out'"; else echo "ok: -cnv with an empty stdin ends at once"; fi

if [ $fails -ne 0 ]; then
    echo "conversation_test: $fails failed"
    exit 1
fi
echo "conversation_test: all passed"
