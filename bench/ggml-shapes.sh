#!/bin/bash
# A Mixtral-shaped model's decode products (`baton bench ops --shapes model`) against llama.cpp's
# ggml on the same shapes, cold weights on both sides, in alternating rounds.  test-backend-ops
# runs only its own shapes, so bench/ggml-shapes.c is compiled against llama.cpp's ggml here.
# usage: bench/ggml-shapes.sh THREADS ROUNDS [TYPES]   (from the repository root, build/ built)
#   TYPES: comma-separated (default f16,q8_0,q4_0); LLAMA_SRC (llama.cpp's source, default
#   required) and LLAMA_BIN (its build/bin with libggml*.so, required)
# Each line: op, type, shape, then llama.cpp's and baton's weight GB/s and baton / llama.cpp.
set -u
NAME=bench/ggml-shapes.sh
T=${1:?usage: $NAME THREADS ROUNDS [TYPES]}; R=${2:?rounds}; TYPES=${3:-f16,q8_0,q4_0}
case "$T$R" in *[!0-9]*) echo "$NAME: THREADS and ROUNDS must be numbers" >&2; exit 2 ;; esac
SRC=${LLAMA_SRC:?set LLAMA_SRC to a source tree of llama.cpp}; LB=${LLAMA_BIN:?set LLAMA_BIN to the build/bin of llama.cpp (bench/llama.sh builds it and prints the line)}
[ -f "$SRC/ggml/include/ggml.h" ] || { echo "$NAME: $SRC/ggml/include/ggml.h is missing (set LLAMA_SRC)" >&2; exit 1; }
[ -f "$LB/libggml-cpu.so" ] || { echo "$NAME: $LB/libggml-cpu.so is missing (set LLAMA_BIN)" >&2; exit 1; }
[ -x build/baton ] || { echo "$NAME: build/baton is missing (build first)" >&2; exit 1; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cc -O2 -I"$SRC/ggml/include" -o "$W/ggml-shapes" "$(dirname "${BASH_SOURCE[0]}")/ggml-shapes.c" \
  -L"$LB" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$LB" -lm || exit 1
echo "threads $T, weight GB/s (cold), llama.cpp / baton; $(uptime)"
for r in $(seq 1 "$R"); do
  for ty in ${TYPES//,/ }; do
    "$W/ggml-shapes" "$T" "$ty" 10 > "$W/l.txt" || exit 1
    build/baton bench ops --threads "$T" --types "$ty" --shapes model --reps 10 2>/dev/null | grep -E '^mul_mat' > "$W/b.txt"
    # the rows come in the same order on both sides
    paste -d'|' "$W/l.txt" "$W/b.txt" | awk -F'|' -v r="$r" '{
      split($1, l, " +"); split($2, b, " +"); gl = l[length(l) - 1]; gb = b[length(b) - 3]
      shape = $1; sub(/ +[0-9]+ +[0-9.]+ ms.*/, "", shape)
      printf "round %d  %-36s %7.2f %7.2f  %.3f\n", r, shape, gl, gb, gb / gl }'
  done
done
