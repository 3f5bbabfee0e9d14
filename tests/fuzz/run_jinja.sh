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
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$1
shift
clang=${CLANG:-clang}
mkdir -p "$out/corpus" "$out/seeds"
if ! command -v "$clang" >/dev/null 2>&1 ||
    ! "$clang" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/include" -I"$root/src" \
        "$root/src/text/jinja.c" "$here/fuzz_jinja.c" -lm -o "$out/fuzz_jinja" 2>"$out/build.log"; then
    echo "fuzz: clang with libFuzzer not available, skipped (see $out/build.log)"
    exit 77
fi
cp "$root"/tests/data/chat_templates/*.jinja "$out/seeds/"
cp "$here"/jinja_crashes/* "$out/seeds/" 2>/dev/null || true
cd "$out"
# libFuzzer writes crash-*/leak-*/timeout-* here and exits non-zero on any
exec ./fuzz_jinja -artifact_prefix="$out/" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
    -dict="$here/jinja.dict" -max_len=16384 "$@" corpus seeds
