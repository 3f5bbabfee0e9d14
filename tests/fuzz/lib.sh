# lib.sh - sourced by the run*.sh scripts of tests/fuzz/: building a
# libFuzzer harness with clang, and running it.  here and root are the
# sourcing script's folder and the repository.
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/../.." && pwd)
clang=${CLANG:-clang}

# fuzz_build OUT NAME LIBS SOURCE...: OUT/NAME from the sources (with ASan,
# UBSan and libFuzzer) and OUT/corpus, OUT/seeds made; exits 77 (skipped)
# when clang cannot link libFuzzer.  LIBS: extra -l flags, space-separated
fuzz_build() {
    local out=$1 name=$2 libs=$3
    shift 3
    mkdir -p "$out/corpus" "$out/seeds"
    # shellcheck disable=SC2086 # LIBS is a list of flags
    if ! command -v "$clang" >/dev/null 2>&1 ||
        ! "$clang" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root/include" \
            -I"$root/src" "$@" $libs -lm -o "$out/$name" 2>"$out/build.log"; then
        echo "fuzz: clang with libFuzzer not available, skipped (see $out/build.log)"
        exit 77
    fi
}

# fuzz_run OUT NAME OPTION...: the fuzzer over OUT/corpus and OUT/seeds, in
# OUT; libFuzzer writes crash-*/leak-*/timeout-* there and exits non-zero on any
# (1: libFuzzer's own code for a crash is 77, which ctest reads as skipped)
fuzz_run() {
    local out=$1 name=$2
    shift 2
    cd "$out"
    exec "./$name" -artifact_prefix="$out/" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 -error_exitcode=1 \
        "$@" corpus seeds
}
