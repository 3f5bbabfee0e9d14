#!/bin/bash
# fail_fast_test.sh - a failed assertion on one rank of the distributed suite
# ends every rank at once with that rank's message, instead of leaving the
# others in a collective until ctest's timeout.  $1: mpiexec, $2: the suite.
set -u
MPIEXEC="$1"
SUITE="$2"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
BATON_TEST_FAIL_FAST=1 CK_RUN_CASE=pipeline timeout 120 "$MPIEXEC" -np 2 --oversubscribe "$SUITE" >"$out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
fail=0
if [ "$rc" -eq 0 ]; then echo "FAILED: exit 0 after a failed assertion"; fail=1; fi
if [ "$rc" -eq 124 ]; then echo "FAILED: the ranks were still waiting after 120 s"; fail=1; fi
if ! grep -q "rank 1: .*deliberate failure on the last rank" "$out"; then
    echo "FAILED: the failing rank's message is missing"; fail=1
fi
if [ "$fail" -ne 0 ]; then sed 's/^/    | /' "$out" | tail -20; exit 1; fi
echo "ok: a failed assertion on rank 1 ended the job in ${took} s (exit $rc)"
