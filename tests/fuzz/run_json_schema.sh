#!/usr/bin/env bash
# run_json_schema.sh - build the libFuzzer harness for JSON schemas and
# grammars with clang and run it.
#
#   bash tests/fuzz/run_json_schema.sh OUT_DIR [libFuzzer options...]
#
# The seeds are tests/fuzz/schema_seeds/ (a schema, a NUL, a text); OUT_DIR
# holds the fuzzer binary, the corpus and any crash-* file.  A crash makes
# the run fail (copy the input into tests/fuzz/schema_seeds/ and fix it:
# ctest's json_schema_fuzz_regress runs every file there under ASan).  Exits
# 77 (skipped) when clang cannot link libFuzzer.
#   e.g. short (ctest):  bash tests/fuzz/run_json_schema.sh build/fuzz_schema -max_total_time=60
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$1
shift
clang=${CLANG:-clang}
mkdir -p "$out/corpus" "$out/seeds"
if ! command -v "$clang" >/dev/null 2>&1 ||
    ! "$clang" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/include" -I"$root/src" \
        "$root/src/text/grammar.c" "$root/src/text/json_schema.c" "$root/src/text/json_pattern.c" \
        "$root/src/tensor.c" "$root/src/quants.c" \
        "$root/src/iq_grids.c" "$here/fuzz_json_schema.c" -ljansson -lm -o "$out/fuzz_json_schema" \
        2>"$out/build.log"; then
    echo "fuzz: clang with libFuzzer not available, skipped (see $out/build.log)"
    exit 77
fi
cp "$here"/schema_seeds/* "$out/seeds/"
cd "$out"
# libFuzzer writes crash-*/leak-*/timeout-* here and exits non-zero on any
exec ./fuzz_json_schema -artifact_prefix="$out/" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
    -max_len=4096 "$@" corpus seeds
