#!/usr/bin/env bash
# main-job.sh - baton's main job: text generation from a GGUF model as a
# two-rank pipeline on this machine, checked against a one-rank run.
#
#   bash launch/main-job.sh [MODEL.gguf]
#
# Without MODEL, `baton make-model` first writes a small random-weight MoE
# model (Qwen3-MoE's layer, 4 layers, 8 experts, top-2) with a real vocabulary
# (Qwen2's, tests/data/vocab/ggml-vocab-qwen2.gguf from llama.cpp's tests) to
# $BATON_BUILD_DIR/main-job/random-moe.gguf: its text is nonsense, but every
# step a real model takes runs (tokenizer, layers, MoE routing, KV cache,
# sampling, activations between the ranks).  Then `baton generate` runs the
# fixed prompt on one rank and on two (launch/baton-run with
# configs/local-cpu-2.yaml), streams the two-rank text, and checks that both
# runs produced the same tokens (the digest of the ids).  Exit code 1 when
# they differ.
#
# The baton program: $BATON_BIN if set, else build/baton.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BATON_BUILD_DIR:-$root/build}
baton=${BATON_BIN:-$build/baton}
[ -x "$baton" ] || { echo "main-job: $baton not found: build baton first (bash launch/bootstrap.sh run)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

prompt="The old lighthouse keeper climbed the stairs and"
n=48
gen_args=(-p "$prompt" -n "$n" --temp 0.8 --seed 42 -c 512 --ubatch 64)

model=${1:-}
if [ -z "$model" ]; then
    mkdir -p "$build/main-job"
    model=$build/main-job/random-moe.gguf
    echo "== 1. a random-weight MoE model with a real vocabulary (no model given)"
    echo "   $baton make-model $model --vocab tests/data/vocab/ggml-vocab-qwen2.gguf --arch qwen3moe --type q8_0"
    "$baton" make-model "$model" --vocab "$root/tests/data/vocab/ggml-vocab-qwen2.gguf" --arch qwen3moe --type q8_0
    "$baton" gguf "$model" | sed -n '1,4p;/^hyperparameters/,/^$/p' | sed 's/^/   /'
    echo "   Its weights are random: the text below is nonsense by design."
else
    echo "== 1. the model: $model"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo
echo "== 2. one rank (the reference): baton generate -m MODEL -p \"$prompt\" -n $n --temp 0.8 --seed 42"
if ! "$baton" generate -m "$model" "${gen_args[@]}" > "$tmp/one.txt" 2> "$tmp/one.err"; then
    cat "$tmp/one.err" >&2
    exit 1
fi
grep '^tokens:' "$tmp/one.err" | sed 's/^/   /'

echo
echo "== 3. two ranks: launch/baton-run -t configs/local-cpu-2.yaml -- baton generate -m MODEL ..."
echo
printf '%s' "$prompt"
set +e
BATON_BIN="$baton" "$root/launch/baton-run" -t "$root/configs/local-cpu-2.yaml" -- baton generate -m "$model" \
    "${gen_args[@]}" 2> "$tmp/two.err" | tee "$tmp/two.txt"
rc=${PIPESTATUS[0]}
set -e
cat "$tmp/two.err"
[ "$rc" -eq 0 ] || exit "$rc"

one=$(sed -n 's/^tokens: .*digest \([0-9a-f]*\).*/\1/p' "$tmp/one.err")
two=$(sed -n 's/^tokens: .*digest \([0-9a-f]*\).*/\1/p' "$tmp/two.err")
if [ -n "$one" ] && [ "$one" = "$two" ] && cmp -s "$tmp/one.txt" "$tmp/two.txt"; then
    echo "check: the two-rank run generated the same tokens as the one-rank run (digest $one) and the same text"
else
    echo "check: FAILED: the two-rank tokens (digest ${two:-none}) differ from the one-rank run's (${one:-none})" >&2
    exit 1
fi

cat <<EOF

To run a real model (any llama, qwen2, qwen3, qwen2moe, qwen3moe or olmoe GGUF file), one command:
  launch/baton-run -t configs/local-cpu-2.yaml -- baton generate -m MODEL.gguf -p "Why is the sky blue?" --chat -n 128
EOF
