#!/usr/bin/env bash
# quants_gguf.sh QUANTS_TOOL - run quants_gguf.py; skipped (77) only where
# python3 is absent.  A python3 without the gguf package is a failure:
# launch/bootstrap.sh installs it.
set -u
if ! command -v python3 >/dev/null 2>&1; then
    echo "quants_gguf: python3 not found: skipped"
    exit 77
fi
exec python3 "$(dirname "$0")/quants_gguf.py" "$1"
