#!/usr/bin/env bash
# bootstrap.sh - set up a fresh Debian machine for baton, build it, and run it.
#
#   bash launch/bootstrap.sh run [MODEL.gguf]
#                                   install packages, build, run the main job
#                                   (launch/main-job.sh: baton generate on two
#                                   local ranks, checked against one rank; without
#                                   MODEL on a random-weight MoE model it writes)
#   bash launch/bootstrap.sh test   install packages, build, run every test (ctest); on
#                                   x86-64 also the build of every CPU kernel variant,
#                                   and the aarch64 cross build (NEON variants) with its
#                                   kernel and model tests under qemu-user
#
# Runs as root (or with sudo available).  Installs Debian packages, and for
# the tests the pinned Python packages they compare against (pip).
set -euo pipefail

mode=${1:-run}
model=${2:-}
case "$mode" in
run | test) ;;
*)
    echo "usage: bash launch/bootstrap.sh run [MODEL.gguf] | test" >&2
    exit 2
    ;;
esac

case "$model" in /* | "") ;; *) model=$PWD/$model ;; esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi

# baton serve: libmicrohttpd (HTTP) and jansson (JSON)
packages=(build-essential cmake pkg-config check libyaml-dev libpcre2-dev openmpi-bin libopenmpi-dev libmicrohttpd-dev
    libjansson-dev)
# tests: clang + libFuzzer for the GGUF reader's fuzz (tests/fuzz/run.sh)
# tests/serve_test.sh: curl and the openai Python package as clients
# tests/netns_test.sh: network namespaces, veth pairs and tc (iproute2)
if [ "$mode" = test ]; then packages+=(python3 clang libclang-rt-dev curl iproute2); fi
# tests on x86-64: the aarch64 cross compiler and qemu-user (cmake/aarch64-linux-gnu.cmake)
if [ "$mode" = test ] && [ "$(uname -m)" = x86_64 ]; then
    packages+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

if [ "$mode" = test ]; then
    # tests/quants_gguf.py checks baton's block types against the gguf
    # package's numpy implementation, tests/jinja_test.py the chat templates
    # against jinja2: pinned versions, installed only when the ones present
    # differ
    py_pins=(gguf==0.19.0 numpy==2.4.6 pyyaml==6.0.3 tqdm==4.70.1 requests==2.34.2 openai==3.51.0 jinja2==3.1.6)
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3 python3-pip
    fi
    if ! python3 -c 'import gguf, numpy, importlib.metadata as m; assert m.version("gguf") == "0.19.0" and numpy.__version__ == "2.4.6" and m.version("openai") == "3.51.0" and m.version("jinja2") == "3.1.6"' >/dev/null 2>&1; then
        echo "bootstrap: pip installing ${py_pins[*]}"
        python3 -m pip install -q --break-system-packages "${py_pins[@]}" 2>/dev/null ||
            python3 -m pip install -q "${py_pins[@]}"
    fi
fi

build=${BATON_BUILD_DIR:-build}
case "$build" in /*) build_abs=$build ;; *) build_abs=$root/$build ;; esac
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"

if [ "$mode" = run ]; then
    # the main job: text from a GGUF model (without one, a random-weight MoE
    # model it writes) as a two-rank pipeline, checked against one rank
    # (the runtime on its built-in model: launch/baton-run -t configs/local-cpu-2.yaml -- baton demo)
    BATON_BUILD_DIR="$build_abs" BATON_BIN="$build_abs/baton" exec bash "$root/launch/main-job.sh" ${model:+"$model"}
else
    (cd "$build" && ctest --output-on-failure)
    # x86-64: the portable build too, which holds every CPU kernel variant
    # (backends/cpu/cpu_variant.h): the kernel and model tests under each
    # variant this CPU runs, two ranks on different variants, the recorded
    # logits on every variant, and the binary on narrower x86 CPUs emulated
    # by qemu-user
    if [ "$(uname -m)" = x86_64 ]; then
        cmake -S . -B "$build_abs-variants" -DCMAKE_BUILD_TYPE=Release -DBATON_NATIVE=OFF -DBATON_CUDA=OFF
        cmake --build "$build_abs-variants" -j"$(nproc)"
        (cd "$build_abs-variants" && ctest --output-on-failure -R '_cpu_|^variants_test$|^x86_cpus_test$|^golden_test$')
        # aarch64: libbaton with the NEON variants, its kernel and model
        # tests under qemu-user (correctness only: docs/testing.md)
        cmake -S . -B "$build_abs-arm" -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake"
        cmake --build "$build_abs-arm" -j"$(nproc)"
        (cd "$build_abs-arm" && ctest --output-on-failure -j"$(nproc)")
    fi
fi
