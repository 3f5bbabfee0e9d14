#!/usr/bin/env bash
# golden_test.sh BATON VOCAB [--write] - the logits of small random-weight
# models, in every weight type baton writes, on every CPU kernel variant
# this CPU runs (BATON_CPU), against hashes recorded in
# tests/data/golden_logits.txt.  Every variant gives the plain C order's bits,
# so the hashes are the same on any x86-64 or aarch64 machine: a file recorded
# on a CPU with AVX-512 is checked by one with AVX2 alone and the other way
# round, which keeps ranks on different CPUs (and builds of different days)
# giving one job's bits.  A change meant to change the results rewrites the
# file with --write and says so in its commit.
# A case: make-model (fixed seed) or make-model then quantize, then
# `generate --temp 0 --dump-tensors result_output`: the hash of every
# ubatch's logits and the digest of the tokens, hashed together.
set -u
baton=${1:?usage: golden_test.sh BATON VOCAB [--write]}
vocab=${2:?usage: golden_test.sh BATON VOCAB [--write]}
write=${3:-}
golden=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/data/golden_logits.txt
unset BATON_TOPOLOGY BATON_CPU
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # $tmp, ok, bad

# the variants of this binary this CPU runs ("cpu kernels: avx2 (built: c avx2 avx512 (not on this CPU))")
read -ra variants <<<"$("$baton" version | sed -n 's/^cpu kernels: [a-z0-9]* (built: \(.*\))$/\1/p' |
    sed 's/ [a-z0-9]* (not on this CPU)//g; s/^[a-z0-9]* (not on this CPU) *//')"
[ ${#variants[@]} -gt 0 ] || variants=("$("$baton" version | sed -n 's/^cpu kernels: \([a-z0-9]*\).*/\1/p')")

# 256 wide, so that the K-quants and IQ4_XS apply to every matrix (no fallback type)
small=(--layers 2 --embd 256 --heads 8 --heads-kv 2 --head-dim 32 --ff 256 --ff-exp 256 --seed 7)
# case|make-model arguments|quantize type (or -)
cases="qwen3moe-f32|--type f32|-
qwen3moe-f16|--type f16|-
qwen3moe-bf16|--type bf16|-
qwen3moe-q8_0|--type q8_0|-
qwen3moe-q4_0|--type q4_0|-
qwen3moe-q4_1|--type q4_1|-
qwen3moe-q5_0|--type q5_0|-
qwen3moe-q5_1|--type q5_1|-
qwen3moe-q4_k_m|--type f32|Q4_K_M
qwen3moe-q5_k_m|--type f32|Q5_K_M
qwen3moe-q6_k|--type f32|Q6_K
qwen3moe-iq4_nl|--type f32|IQ4_NL
qwen3moe-iq4_xs|--type f32|IQ4_XS
llama-dense-q8_0|--arch llama --experts 0 --type q8_0|-
deepseek2-f32|--arch deepseek2 --type f32|-
gpt-oss-mxfp4|--arch gpt-oss --type f32|MXFP4_MOE
gemma3-f16|--arch gemma3 --type f16 --swa-pattern 2|-
gemma3-all-sliding-f32|--arch gemma3 --type f32|-"

run_case() { # VARIANT THREADS generate's options: the case's hash, or nothing
    BATON_CPU=$1 timeout 300 "$baton" "${@:3}" -t "$2" >"$tmp/gen" 2>&1 || { cp "$tmp/gen" "$tmp/out"; return 1; }
    logits_summary "$tmp/gen" >"$tmp/sum"
    grep -q digest "$tmp/sum" || { cp "$tmp/gen" "$tmp/out"; return 1; }
    sha256sum <"$tmp/sum" | cut -c1-16
}

: >"$tmp/got"
while IFS='|' read -r name mk qt; do
    read -ra mkargs <<<"$mk"
    f=$tmp/$name.gguf
    if ! timeout 120 "$baton" make-model "$tmp/$name-src.gguf" --vocab "$vocab" "${small[@]}" "${mkargs[@]}" \
        >"$tmp/out" 2>&1; then
        bad "$name: make-model"
        continue
    fi
    if [ "$qt" = - ]; then
        mv "$tmp/$name-src.gguf" "$f"
    elif ! timeout 120 "$baton" quantize "$tmp/$name-src.gguf" "$f" "$qt" >"$tmp/out" 2>&1; then
        bad "$name: quantize $qt"
        continue
    fi
    gen=(generate -m "$f" -p "The quick brown fox jumps" -n 5 --temp 0 --dump-tensors result_output)
    first=
    # every variant at 1 thread, the widest at 2 as well
    runs=()
    for v in "${variants[@]}"; do runs+=("$v 1"); done
    runs+=("${variants[-1]} 2")
    for run in "${runs[@]}"; do
        read -r var thr <<<"$run"
        h=$(run_case "$var" "$thr" "${gen[@]}")
        if [ -z "$h" ]; then
            bad "$name on $var, $thr threads: generate failed"
            continue
        fi
        [ -n "$first" ] || first=$h
        if [ "$h" != "$first" ]; then
            : >"$tmp/out"
            bad "$name on $var, $thr threads: $h, where ${variants[0]} at 1 thread gave $first"
        fi
    done
    [ -n "$first" ] && echo "$name $first" >>"$tmp/got"
done <<<"$cases"

if [ "$write" = --write ]; then
    { echo "# golden_test.sh: each case's logits and tokens (hashed), the same on every machine and variant"
      echo "# rewritten by: bash tests/golden_test.sh BATON tests/data/vocab/ggml-vocab-llama-spm.gguf --write"
      cat "$tmp/got"; } >"$golden.tmp" && mv "$golden.tmp" "$golden"
    echo "wrote $golden ($(wc -l <"$tmp/got") cases; variants ${variants[*]})"
else
    while read -r name h; do
        want=$(awk -v n="$name" '$1 == n { print $2 }' "$golden" 2>/dev/null)
        if [ -z "$want" ]; then
            : >"$tmp/out"
            bad "$name: no recorded hash in $golden"
        elif [ "$h" = "$want" ]; then
            ok "$name: ${variants[*]} (and ${variants[-1]} at 2 threads) give the recorded $want"
        else
            : >"$tmp/out"
            bad "$name: $h, the recorded hash is $want"
        fi
    done <"$tmp/got"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
