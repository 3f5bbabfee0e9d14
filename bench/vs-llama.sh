#!/bin/bash
# baton against llama.cpp on the same files and cores: llama-bench and baton bench model
# (pp512, tg128, 2 threads) per file, then test-backend-ops and baton bench ops.
# usage: bench/vs-llama.sh OUTDIR (from the repository root, build/ built); run it on a quiet machine
set -u
OUT=${1:?usage: bench/vs-llama.sh OUTDIR}; mkdir -p "$OUT"
M=${MODELS:-build/bench-models}; L=${LLAMA_BIN:?set LLAMA_BIN to the build/bin of llama.cpp (bench/llama.sh builds it and prints the line)}
for f in F16 Q8_0 Q4_0 Q4_K_M; do [ -f "$M/mixtral-$f.gguf" ] || { echo "bench/vs-llama.sh: $M/mixtral-$f.gguf is missing (make it with bench/make-mixtral-models.sh $M)" >&2; exit 1; }; done
[ -x "$L/llama-bench" ] || { echo "bench/vs-llama.sh: $L/llama-bench is missing (set LLAMA_BIN to llama.cpp's build/bin)" >&2; exit 1; }
uptime | tee "$OUT"/uptime-start.txt
for f in F16 Q8_0 Q4_0 Q4_K_M; do
  "$L"/llama-bench -m "$M/mixtral-$f.gguf" -p 512 -n 128 -t 2 -r 3 2>/dev/null | tee -a "$OUT"/llama-bench.txt
  build/baton bench model -m "$M/mixtral-$f.gguf" -p 512 -n 128 -t 2 -r 3 2>&1 | tee -a "$OUT"/baton-model.txt
done
[ -f /tmp/nprocs.so ] || { printf 'int get_nprocs(void){return 4;}\n' > /tmp/nprocs.c && cc -shared -fPIC -o /tmp/nprocs.so /tmp/nprocs.c; }
B="$L"/test-backend-ops
# test-backend-ops uses hardware_concurrency()/2 threads: report 4 CPUs to get 2
LD_PRELOAD=/tmp/nprocs.so "$B" perf -b CPU -o MUL_MAT \
  -p 'type_a=(f32|f16|bf16|q8_0|q4_0|q4_K|q6_K),type_b=f32,m=4096,n=(1|512),k=14336,bs=\[1,1\]' 2>&1 | grep -E "MUL_MAT|threads" | tee "$OUT"/llama-ops.txt
LD_PRELOAD=/tmp/nprocs.so "$B" perf -b CPU -o MUL_MAT_ID \
  -p 'type_a=(f32|f16|q8_0|q4_0),type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=(1|32|512),k=2048' 2>&1 | grep -E "MUL_MAT" | tee -a "$OUT"/llama-ops.txt
build/baton bench ops --threads 2 --types f32,f16,bf16,q8_0,q4_0,q4_K,q6_K 2>&1 | tee "$OUT"/baton-ops.txt
uptime | tee "$OUT"/uptime-end.txt
