#!/usr/bin/env bash
# run.sh - build the libFuzzer harness for the GGUF reader with clang and run it.
#
#   bash tests/fuzz/run.sh GGUF_TOOL OUT_DIR [libFuzzer options...]
#
# GGUF_TOOL (tests/gguf_tool.c) writes the seed files with baton's writer;
# OUT_DIR holds the fuzzer binary, the corpus and any crash-* file.  A crash
# makes the run fail (copy the input into tests/fuzz/crashes/ and fix it:
# ctest's gguf_fuzz_regress runs every file there under ASan).  Exits 77
# (skipped) when clang cannot link libFuzzer.
#   e.g. short (ctest):  bash tests/fuzz/run.sh build/gguf_tool build/fuzz -max_total_time=60
#        long:           nice bash tests/fuzz/run.sh build/gguf_tool /tmp/fz -runs=10000000
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tool=$1
out=$2
shift 2
clang=${CLANG:-clang}
mkdir -p "$out/corpus" "$out/seeds"
if ! command -v "$clang" >/dev/null 2>&1 ||
    ! "$clang" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/include" -I"$root/src" \
        "$root/src/gguf.c" "$root/src/tensor.c" "$root/src/quants.c" "$root/src/iq_grids.c" "$here/fuzz_gguf.c" -lm -o "$out/fuzz_gguf" 2>"$out/build.log"; then
    echo "fuzz: clang with libFuzzer not available, skipped (see $out/build.log)"
    exit 77
fi
"$tool" seeds "$out/seeds"
cp "$here"/crashes/* "$out/seeds/" 2>/dev/null || true
cd "$out"
# libFuzzer writes crash-*/leak-*/timeout-* here and exits non-zero on any
exec ./fuzz_gguf -artifact_prefix="$out/" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 "$@" corpus seeds
