#!/usr/bin/env bash
# make-mixtral-models.sh - the random-weight Mixtral-shaped models `baton bench
# model` is compared with llama-bench on: llama architecture,
# d_model 2048, 4 layers, 32 / 8 heads, 8 experts of 5632, top-2, llama's
# 32,000-token vocabulary (llama.cpp reads the experts' length from
# feed_forward_length, so both are 5632).  Writes mixtral-F16.gguf and its
# Q8_0, Q4_0 and Q4_K_M quantisations to DIR (default build/bench-models;
# about 5 GiB in all, kept out of git).
#
#   bench/make-mixtral-models.sh [DIR] [BATON]     (BATON: default build/baton)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build/bench-models}
baton=${2:-$here/build/baton}
[ -x "$baton" ] || { echo "make-mixtral-models.sh: $baton is not built" >&2; exit 1; }
mkdir -p "$dir"
f16=$dir/mixtral-F16.gguf
if [ ! -s "$f16" ]; then
    "$baton" make-model "$f16.tmp" --vocab "$here/tests/data/vocab/ggml-vocab-llama-spm.gguf" --arch llama \
        --layers 4 --embd 2048 --heads 32 --heads-kv 8 --head-dim 64 --experts 8 --experts-used 2 \
        --ff 5632 --ff-exp 5632 --ctx 4096 --type f16 --seed 14
    mv "$f16.tmp" "$f16"
fi
for t in Q8_0 Q4_0 Q4_K_M; do
    out=$dir/mixtral-$t.gguf
    [ -s "$out" ] || "$baton" quantize "$f16" "$out" "$t"
done
ls -l "$dir"/mixtral-*.gguf
