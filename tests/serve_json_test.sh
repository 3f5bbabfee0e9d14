#!/usr/bin/env bash
# serve_json_test.sh BATON - constrained output of `baton serve`: a
# random-weight qwen2 model with the Qwen2 vocabulary and the Qwen2.5 chat
# template (Hermes tool calls), served on 1 and then 2 ranks; the openai
# package's structured-output and tools calls through tests/serve_json.py
# (every answer valid for its schema whatever the weights, the bad inputs a
# 400 each), and the greedy answers the same on both.  Then the other
# tool-call formats on 1 rank, the tools checks only: Llama 3 (a llama model
# with the Llama 3 vocabulary and tests/data/chat/llama3_tools.jinja), and
# Mistral's three (the qwen2 model with the Mistral-Nemo, Ministral 3 and
# Mistral-Small-3.2 templates), and Mistral-Nemo's once more with a
# vocabulary whose [TOOL_CALLS] is a control token, as in Mistral's own.
set -u
# shellcheck source=tests/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"

python3 -c 'import openai' 2>/dev/null || {
    echo "SKIP: python3 with openai is needed (launch/bootstrap.sh test installs it)"
    exit 77
}
make_model() { # FILE VOCAB ARCH: a random-weight model (VOCAB: a name in tests/data/vocab, or a file)
    local vocab=$2
    [ -f "$vocab" ] || vocab=$here/data/vocab/ggml-vocab-$2.gguf
    if ! "$baton" make-model "$1" --vocab "$vocab" --arch "$3" --layers 2 \
        --embd 64 --heads 4 --heads-kv 2 --head-dim 16 --ff 128 --seed 7 >"$tmp/mm.log" 2>&1; then
        echo "FAIL: make-model $2"
        cat "$tmp/mm.log"
        exit 1
    fi
}
model=$tmp/m.gguf
make_model "$model" qwen2 qwen2

# RANKS [MODEL TEMPLATE FORMAT CTX MARK_ID]: serve, run serve_json.py, stop; the answers in
# $tmp/answers.RANKS.FORMAT
run() {
    local ranks=$1 m=${2:-$model} template=${3:-$here/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja}
    local format=${4:-hermes} ctx=${5:-4096} mark=${6:-}
    local log=$tmp/serve.$1.$format
    "$mpirun" -np "$ranks" "$baton" serve -m "$m" --port 0 --threads 1 --parallel 4 --ctx-size "$ctx" \
        --chat-template "$template" >"$log.out" 2>"$log.err" &
    server=$!
    listening "$log" " on $ranks rank(s)"
    echo "server on $ranks rank(s) ($format): $line"
    python3 "$here/serve_json.py" "$port" "$(basename "$m")" "$tmp/answers.$ranks.$format" "$format" ${mark:+"$mark"}
    local rc=$?
    kill -TERM "$pid0" 2>/dev/null
    wait $server
    server=""
    if [ $rc -ne 0 ]; then
        echo "FAIL: serve_json.py ($format) on $ranks rank(s); the server's log:"
        tail -20 "$log.err"
        exit 1
    fi
}
run 1
run 2
if ! cmp -s "$tmp/answers.1.hermes" "$tmp/answers.2.hermes"; then
    echo "FAIL: the greedy answers differ between 1 and 2 ranks:"
    cat "$tmp/answers.1.hermes"
    echo
    cat "$tmp/answers.2.hermes"
    exit 1
fi
echo "ok: the greedy answers are the same on 1 and 2 ranks"
make_model "$tmp/l.gguf" llama-bpe llama
run 1 "$tmp/l.gguf" "$here/data/chat/llama3_tools.jinja" llama3
run 1 "$model" "$here/data/chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja" mistral
# Mistral's mark a control token of the vocabulary, as in Mistral's own (tests/vocab_mark.py)
if mark=$(python3 "$here/vocab_mark.py" "$here/data/vocab/ggml-vocab-qwen2.gguf" "$tmp/vm.gguf" "[TOOL_CALLS]" 2>"$tmp/vm.log"); then
    make_model "$tmp/mm.gguf" "$tmp/vm.gguf" qwen2
    run 1 "$tmp/mm.gguf" "$here/data/chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja" mistral 4096 "$mark"
else
    echo "skipped: a vocabulary with [TOOL_CALLS] as a control token (python3 with gguf): $(tail -1 "$tmp/vm.log")"
fi
# (Ministral 3's and Mistral-Small-3.2's system prompts are long: 4096 tokens a request)
run 1 "$model" "$here/data/chat_templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja" mistral-args 16384
run 1 "$model" "$here/data/chat_templates/Mistral-Small-3.2-24B-Instruct-2506.jinja" mistral-call-id 16384
echo "serve_json_test: all passed"
