#!/usr/bin/env bash
# llama.sh - the yardstick, built from nothing: llama.cpp as the llama-cpp-python source package
# vendors it (pip download, no binary), configured for this machine and built with the tools the
# comparison scripts run (llama-bench, test-backend-ops, llama-quantize); then the Mixtral-shaped
# models both engines are timed on (bench/make-mixtral-models.sh).  Prints the line to export.
#
#   bench/llama.sh [DIR]     (default build/llama; about 15 minutes on 2 cores, once)
#
# Then, e.g.:  eval "$(bench/llama.sh)"; bench/tg-rounds.sh 5
# A second run finds what the first built and only prints the line.  LLAMA_CPP_PYTHON pins the
# package's version (default 0.3.36); BATON (default build/baton) writes the models.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/build/llama}
case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac
ver=${LLAMA_CPP_PYTHON:-0.3.36}
baton=${BATON:-$here/build/baton}
bin=$dir/src/vendor/llama.cpp/build/bin
log() { echo "bench/llama.sh: $*" >&2; }
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/test-backend-ops" ]; then
    command -v cmake >/dev/null && command -v c++ >/dev/null || {
        log "cmake and a C++ compiler are needed (bash launch/bootstrap.sh test installs them)"
        exit 1
    }
    mkdir -p "$dir"
    if [ ! -d "$dir/src/vendor/llama.cpp" ]; then
        log "downloading llama-cpp-python $ver (source) into $dir"
        python3 -m pip download -q --no-deps --no-binary :all: -d "$dir" "llama-cpp-python==$ver"
        rm -rf "$dir/src.tmp" && mkdir -p "$dir/src.tmp"
        tarball=$(ls "$dir"/llama[-_]cpp[-_]python-"$ver".tar.gz 2>/dev/null | head -n 1)
        [ -n "$tarball" ] || { log "pip left no llama-cpp-python-$ver source archive in $dir"; exit 1; }
        tar -xzf "$tarball" -C "$dir/src.tmp" --strip-components 1
        mv "$dir/src.tmp" "$dir/src"
    fi
    log "building llama.cpp (llama-bench, test-backend-ops, llama-quantize) in $dir/src/vendor/llama.cpp/build"
    cmake -S "$dir/src/vendor/llama.cpp" -B "$dir/src/vendor/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        >"$dir/cmake.log" 2>&1 || { log "cmake failed: $dir/cmake.log"; exit 1; }
    cmake --build "$dir/src/vendor/llama.cpp/build" -j"$(nproc)" --target llama-bench test-backend-ops llama-quantize \
        >"$dir/build.log" 2>&1 || { log "the build failed: $dir/build.log"; exit 1; }
fi
models=${MODELS:-$here/build/bench-models}
if [ -x "$baton" ] && [ ! -s "$models/mixtral-Q4_K_M.gguf" ]; then
    log "writing the Mixtral-shaped models into $models"
    bash "$here/bench/make-mixtral-models.sh" "$models" "$baton" >&2
fi
# A CPU may list AMX that its virtual machine cannot run: ggml's AMX buffers then die of SIGILL
# at the first tile load.  Without AMX, llama.cpp is built again for the same CPU's other
# instructions (its repacking kept), so that it runs as a user of this machine would run it.
if [ -s "$models/mixtral-Q8_0.gguf" ] && grep -qw amx_int8 /proc/cpuinfo &&
    ! "$bin/llama-bench" -m "$models/mixtral-Q8_0.gguf" -p 32 -n 0 -r 1 -t 1 >/dev/null 2>&1; then
    log "llama.cpp's AMX path fails on this CPU: building it again without AMX"
    flags=(-DGGML_NATIVE=OFF)
    has() { grep -qw "$1" /proc/cpuinfo; }
    has avx && flags+=(-DGGML_AVX=ON)
    has avx2 && flags+=(-DGGML_AVX2=ON)
    has fma && flags+=(-DGGML_FMA=ON)
    has f16c && flags+=(-DGGML_F16C=ON)
    has avx_vnni && flags+=(-DGGML_AVX_VNNI=ON)
    has avx512f && flags+=(-DGGML_AVX512=ON)
    has avx512_vbmi && flags+=(-DGGML_AVX512_VBMI=ON)
    has avx512_vnni && flags+=(-DGGML_AVX512_VNNI=ON)
    has avx512_bf16 && flags+=(-DGGML_AVX512_BF16=ON)
    cmake -S "$dir/src/vendor/llama.cpp" -B "$dir/src/vendor/llama.cpp/build" "${flags[@]}" >>"$dir/cmake.log" 2>&1 &&
        cmake --build "$dir/src/vendor/llama.cpp/build" -j"$(nproc)" --target llama-bench test-backend-ops \
            llama-quantize >>"$dir/build.log" 2>&1 || { log "the build without AMX failed: $dir/build.log"; exit 1; }
    "$bin/llama-bench" -m "$models/mixtral-Q8_0.gguf" -p 32 -n 0 -r 1 -t 1 >/dev/null 2>&1 ||
        { log "llama-bench still fails on $models/mixtral-Q8_0.gguf"; exit 1; }
fi
echo "export LLAMA_BIN=$bin MODELS=$models"
