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
L=${LLAMA_BIN:-/work/llama/build/bin}/test-backend-ops
[ -x "$L" ] || { echo "bench/prompt-rounds.sh: $L is missing (set LLAMA_BIN to llama.cpp's build/bin)" >&2; exit 1; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
# test-backend-ops runs hardware_concurrency()/2 threads: report 2 * THREADS CPUs
printf 'int get_nprocs(void){return %d;}\n' $((2 * T)) > "$W"/np.c
printf '#include <stdint.h>\n#include <time.h>\nint64_t ggml_time_us(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec*1000000+t.tv_nsec/1000;}\n' > "$W"/cput.c
cc -shared -fPIC -o "$W"/np.so "$W"/np.c && cc -shared -fPIC -o "$W"/cput.so "$W"/cput.c || exit 1
PRE="$W/np.so"; [ "$T" = 1 ] && PRE="$W/np.so $W/cput.so"
echo "threads $T; $([ "$T" = 1 ] && echo 'GFLOP per CPU-second' || echo 'wall-clock GFLOP/s'); $(uptime)"
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
