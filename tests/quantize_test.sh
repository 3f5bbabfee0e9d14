#!/usr/bin/env bash
# quantize_test.sh BATON - run quantize_test.py; skipped (77) only where
# python3 is absent.  A python3 without the gguf package is a failure:
# launch/bootstrap.sh installs it.
set -u
if ! command -v python3 >/dev/null 2>&1; then
    echo "quantize_test: python3 not found: skipped"
    exit 77
fi
exec python3 "$(dirname "$0")/quantize_test.py" "$1"
