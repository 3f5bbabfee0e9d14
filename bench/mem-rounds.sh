#!/bin/bash
# The memory-bound kernel rows (decode m=4096 n=1 k=14336, and MUL_MAT_ID at 1 token: 128 experts,
# 8 used, m=768, k=2048) against llama.cpp, in alternating rounds: llama.cpp's test-backend-ops,
# then `bench ops --shapes decode,moe1` of each baton binary given, per round.
# usage: bench/mem-rounds.sh THREADS ROUNDS BATON_BINARY...   (THREADS 1 or 2)
#   TYPES (default bf16,f32,q8_0): the weight types (MUL_MAT_ID rows for f32, f16, q8_0, q4_0 only:
#   test-backend-ops' MUL_MAT_ID perf rows)
#   1 thread: GFLOP per CPU-second on both sides (llama.cpp's ggml_time_us preloaded to return the
#             process's CPU time; baton's GF/cpu-s column): fairer on a shared machine;
#   2 threads: wall-clock GFLOP/s (run it on a quiet machine).
# Keep a copy of the old binary (cp build/baton /tmp/baton-old) to compare old and new.
# test-backend-ops prints a figure of six characters right after its colour code, with no space
# ("[1;34m109.18 GFLOPS"): the pattern below takes a space or that 'm' before the figure.
set -u
T=${1:?usage: bench/mem-rounds.sh THREADS ROUNDS BATON_BINARY...}; R=${2:?rounds}; shift 2
[ "$T" = 1 ] || [ "$T" = 2 ] || { echo "bench/mem-rounds.sh: THREADS must be 1 or 2" >&2; exit 2; }
[ $# -ge 1 ] || { echo "bench/mem-rounds.sh: give at least one baton binary" >&2; exit 2; }
TYPES=${TYPES:-bf16,f32,q8_0}
ALT=$(echo "$TYPES" | tr "," "|")
NAME=bench/mem-rounds.sh
# shellcheck source=bench/llama-shims.sh
source "$(dirname "${BASH_SOURCE[0]}")/llama-shims.sh" # $L, $PRE
for r in $(seq 1 "$R"); do
  printf 'round %d: llama.cpp' "$r"
  { LD_PRELOAD="$PRE" "$L" perf -b CPU -o MUL_MAT -p "type_a=($ALT),type_b=f32,m=4096,n=1,k=14336,bs=\\[1,1\\]" 2>&1
    LD_PRELOAD="$PRE" "$L" perf -b CPU -o MUL_MAT_ID -p "type_a=($ALT),type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=1,k=2048" 2>&1; } |
    grep -E '^ *MUL_MAT' | sed -E 's/^ *(MUL_MAT(_ID)?)\(type_a=([a-z0-9_A-Z]+).*[ m]([0-9.]+) GFLOPS.*/\1 \3 \4/; s/MUL_MAT_ID/id1/; s/MUL_MAT/dec/' |
    awk '{printf " %s-%s %s", $1, $2, $3}'
  for b in "$@"; do
    printf ' | %s' "$b"
    "$b" bench ops --threads "$T" --types "$TYPES" --shapes decode,moe1 --quick --reps 20 2>&1 |
      grep -E '^mul_mat' | awk -v c1="$([ "$T" = 1 ] && echo 1 || echo 0)" \
        '{printf " %s-%s %s", ($1 == "mul_mat" ? "dec" : "id1"), $2, (c1 ? $NF : $(NF - 4))}'
  done
  echo
done
