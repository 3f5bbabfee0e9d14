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
# shellcheck source=tests/fuzz/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
tool=$1
out=$2
shift 2
fuzz_build "$out" fuzz_gguf "" "$root/src/gguf.c" "$root/src/tensor.c" "$root/src/quants.c" "$root/src/iq_grids.c" \
    "$here/fuzz_gguf.c"
"$tool" seeds "$out/seeds"
cp "$here"/crashes/* "$out/seeds/" 2>/dev/null || true
fuzz_run "$out" fuzz_gguf "$@"
