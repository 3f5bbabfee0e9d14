#!/bin/bash
# The F32/F16 prompt GEMM (m 4096, n 512, k 14336) against llama.cpp, in alternating rounds:
# llama.cpp's test-backend-ops, then `bench ops` of each baton binary given, per round.
# usage: bench/prompt-rounds.sh THREADS ROUNDS BATON_BINARY...   (THREADS 1 or 2)
#   1 thread: GFLOP per CPU-second on both sides (llama.cpp's ggml_time_us preloaded to return the
#             process's CPU time; baton's GF/cpu-s column): fair on a shared machine;
#   2 threads: wall-clock GFLOP/s (run it on a quiet machine).
# Keep a copy of the old binary (cp build/baton /tmp/baton-old) to compare old and new.
set -u
T=${1:?usage: bench/prompt-rounds.sh THREADS ROUNDS BATON_BINARY...}; R=${2:?rounds}; shift 2
[ "$T" = 1 ] || [ "$T" = 2 ] || { echo "bench/prompt-rounds.sh: THREADS must be 1 or 2" >&2; exit 2; }
[ $# -ge 1 ] || { echo "bench/prompt-rounds.sh: give at least one baton binary" >&2; exit 2; }
NAME=bench/prompt-rounds.sh
# shellcheck source=bench/llama-shims.sh
source "$(dirname "${BASH_SOURCE[0]}")/llama-shims.sh" # $L, $PRE
for r in $(seq 1 "$R"); do
  printf 'round %d: llama.cpp' "$r"
  LD_PRELOAD="$PRE" "$L" perf -b CPU -o MUL_MAT -p 'type_a=(f32|f16),type_b=f32,m=4096,n=512,k=14336,bs=\[1,1\]' 2>&1 |
    grep -oE 'type_a=f(16|32)|[0-9.]+ GFLOPS' | sed 's/type_a=/ /; s/ GFLOPS//' | tr '\n' ' '
  for b in "$@"; do
    printf '| %s ' "$b"
    "$b" bench ops --threads "$T" --types f32,f16 --reps 3 2>&1 | grep -E '^mul_mat .*n=512 k=14336' |
      awk -v col="$([ "$T" = 1 ] && echo 12 || echo 8)" '{printf "%s %s ", $2, $col}'
  done
  echo
done
