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
# shellcheck source=tests/fuzz/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out=$1
shift
fuzz_build "$out" fuzz_json_schema -ljansson "$root/src/text/grammar.c" "$root/src/text/json_schema.c" \
    "$root/src/text/json_pattern.c" "$root/src/tensor.c" "$root/src/quants.c" "$root/src/iq_grids.c" \
    "$here/fuzz_json_schema.c"
cp "$here"/schema_seeds/* "$out/seeds/"
fuzz_run "$out" fuzz_json_schema -max_len=4096 "$@"
