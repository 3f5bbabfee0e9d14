#!/usr/bin/env bash
# bootstrap.sh - set up a fresh Debian machine for baton, build it, and run it.
#
#   bash launch/bootstrap.sh run    install packages, build, run the main job
#                                   (baton demo on two local ranks)
#   bash launch/bootstrap.sh test   install packages, build, run every test (ctest)
#
# Runs as root (or with sudo available).  Installs only Debian packages.
set -euo pipefail

mode=${1:-run}
case "$mode" in
run | test) ;;
*)
    echo "usage: bash launch/bootstrap.sh run|test" >&2
    exit 2
    ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi

packages=(build-essential cmake pkg-config check libyaml-dev libpcre2-dev openmpi-bin libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

build=${BATON_BUILD_DIR:-build}
case "$build" in /*) build_abs=$build ;; *) build_abs=$root/$build ;; esac
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"

if [ "$mode" = run ]; then
    # the main job: the built-in MoE demo as a two-rank pipeline on this machine
    BATON_BIN="$build_abs/baton" exec "$root/launch/baton-run" -t "$root/configs/local-cpu-2.yaml" -- baton demo
else
    cd "$build"
    ctest --output-on-failure
fi
