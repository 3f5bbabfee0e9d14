#!/bin/bash
# engine_dead_rank_test.sh - a rank of an engine run dies in the middle of it
# (tests/mpi_test_engine.c, case "die"): the job ends within seconds with a
# message naming the rank, instead of leaving rank 0 waiting for logits that
# never come.  $1: mpiexec, $2: the engine suite.
set -u
MPIEXEC="$1"
SUITE="$2"
out=$(mktemp)
# the suite's files (its ranks are killed before it removes them)
export BATON_TEST_TMPDIR
BATON_TEST_TMPDIR=$(mktemp -d)
trap 'rm -f "$out"; rm -rf "$BATON_TEST_TMPDIR"' EXIT
fail=0
for np in 2 3; do
    start=$(date +%s)
    BATON_TEST_ENGINE_DIE=1 CK_RUN_CASE=die timeout 120 "$MPIEXEC" -np $np --oversubscribe --mca pml ob1 "$SUITE" >"$out" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    last=$((np - 1))
    if [ "$rc" -eq 0 ]; then echo "FAILED (np $np): exit 0 after a rank died"; fail=1; fi
    if [ "$rc" -eq 124 ]; then echo "FAILED (np $np): the ranks were still waiting after 120 s"; fail=1; fi
    if grep -q "went on after the last rank died" "$out"; then echo "FAILED (np $np): rank 0 did not notice"; fail=1; fi
    # mpirun's own message, not the test's: "Process name: [[jobid,1],RANK]"
    if ! grep -qE "\[\[[0-9]+,[0-9]+\],$last\]|rank $last with PID" "$out"; then
        echo "FAILED (np $np): no message from mpirun names rank $last"; fail=1
    fi
    if [ "$fail" -ne 0 ]; then sed 's/^/    | /' "$out" | tail -20; exit 1; fi
    echo "ok (np $np): rank $last died, the job ended in ${took} s (exit $rc)"
done
