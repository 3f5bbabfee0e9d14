#!/usr/bin/env bash
# run_jinja.sh - build the libFuzzer harness for the Jinja interpreter with
# clang and run it.
#
#   bash tests/fuzz/run_jinja.sh OUT_DIR [libFuzzer options...]
#
# The seeds are the chat templates of tests/data/chat_templates/ and every
# input in tests/fuzz/jinja_crashes/; OUT_DIR holds the fuzzer binary, the
# corpus and any crash-* file.  A crash makes the run fail (copy the input
# into tests/fuzz/jinja_crashes/ and fix it: ctest's jinja_fuzz_regress runs
# every file there under ASan).  Exits 77 (skipped) when clang cannot link
# libFuzzer.
#   e.g. short (ctest):  bash tests/fuzz/run_jinja.sh build/fuzz_jinja -max_total_time=60
set -euo pipefail
# shellcheck source=tests/fuzz/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out=$1
shift
fuzz_build "$out" fuzz_jinja "" "$root/src/text/jinja.c" "$here/fuzz_jinja.c"
cp "$root"/tests/data/chat_templates/*.jinja "$out/seeds/"
cp "$here"/jinja_crashes/* "$out/seeds/" 2>/dev/null || true
fuzz_run "$out" fuzz_jinja -dict="$here/jinja.dict" -max_len=16384 "$@"
