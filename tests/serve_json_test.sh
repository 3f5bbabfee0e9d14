#!/usr/bin/env bash
# serve_json_test.sh BATON - constrained output of `baton serve`: a
# random-weight qwen2 model with the Qwen2 vocabulary and the Qwen2.5 chat
# template (Hermes tool calls), served on 1 and then 2 ranks; the openai
# package's structured-output and tools calls through tests/serve_json.py
# (every answer valid for its schema whatever the weights, the bad inputs a
# 400 each), and the greedy answers the same on both.
set -u
# shellcheck source=tests/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"

python3 -c 'import openai' 2>/dev/null || {
    echo "SKIP: python3 with openai is needed (launch/bootstrap.sh test installs it)"
    exit 77
}
model=$tmp/m.gguf
if ! "$baton" make-model "$model" --vocab "$here/data/vocab/ggml-vocab-qwen2.gguf" --arch qwen2 --layers 2 \
    --embd 64 --heads 4 --heads-kv 2 --head-dim 16 --ff 128 --seed 7 >"$tmp/mm.log" 2>&1; then
    echo "FAIL: make-model"
    cat "$tmp/mm.log"
    exit 1
fi

run() { # RANKS: serve, run serve_json.py, stop; the answers in $tmp/answers.RANKS
    local ranks=$1 log=$tmp/serve.$1
    "$mpirun" -np "$ranks" "$baton" serve -m "$model" --port 0 --threads 1 --parallel 4 --ctx-size 4096 \
        --chat-template "$here/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja" >"$log.out" 2>"$log.err" &
    server=$!
    for _ in $(seq 1 600); do
        if grep -q "listening on" "$log.out" 2>/dev/null || ! kill -0 $server 2>/dev/null; then break; fi
        sleep 0.1
    done
    local line port pid0
    line=$(grep "listening on" "$log.out")
    if [ -z "$line" ]; then
        echo "FAIL: the server did not start on $ranks rank(s):"
        cat "$log.out" "$log.err"
        exit 1
    fi
    port=$(sed -E 's/.*:([0-9]+) \(model.*/\1/' <<<"$line")
    pid0=$(sed -E 's/.*pid ([0-9]+)\).*/\1/' <<<"$line")
    echo "server on $ranks rank(s): $line"
    python3 "$here/serve_json.py" "$port" "$(basename "$model")" "$tmp/answers.$ranks"
    local rc=$?
    kill -TERM "$pid0" 2>/dev/null
    wait $server
    server=""
    if [ $rc -ne 0 ]; then
        echo "FAIL: serve_json.py on $ranks rank(s); the server's log:"
        tail -20 "$log.err"
        exit 1
    fi
}
run 1
run 2
if ! cmp -s "$tmp/answers.1" "$tmp/answers.2"; then
    echo "FAIL: the greedy answers differ between 1 and 2 ranks:"
    cat "$tmp/answers.1"
    echo
    cat "$tmp/answers.2"
    exit 1
fi
echo "ok: the greedy answers are the same on 1 and 2 ranks"
echo "serve_json_test: all passed"
