#!/usr/bin/env bash
# llama-logits.sh - llama.cpp's logits for token ids (bench/llama-logits.c), built against the
# yardstick on first use.
#
#   LLAMA_BIN=... bench/llama-logits.sh MODEL.gguf IDS OUT.bin [whole|single] [THREADS] [f16|f32]
#
# LLAMA_BIN is llama.cpp's build/bin (bench/llama.sh builds it and prints the line); the tool is
# built beside it.  OUT.bin has tests/model_ref.py's ref.bin layout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
LB=${LLAMA_BIN:?set LLAMA_BIN to the build/bin of llama.cpp (bench/llama.sh builds it and prints the line)}
src=$(cd "$LB/../.." && pwd)
[ -f "$src/include/llama.h" ] || { echo "bench/llama-logits.sh: no include/llama.h in $src" >&2; exit 1; }
[ -f "$LB/libllama.so" ] || { echo "bench/llama-logits.sh: $LB/libllama.so is missing" >&2; exit 1; }
tool=$LB/llama-logits
if [ ! -x "$tool" ] || [ "$here/llama-logits.c" -nt "$tool" ]; then
    cc -O2 -o "$tool" "$here/llama-logits.c" -I"$src/include" -I"$src/ggml/include" -L"$LB" -lllama \
        -Wl,-rpath,"$LB"
fi
exec "$tool" "$@"
