#!/usr/bin/env bash
# netns_test.sh - baton across "hosts" that are network namespaces on this
# machine (launch/netns.sh): the demo over two hosts through launch/baton-run
# --agent gives the one-rank result bitwise, its ranks run on two hostnames and
# their messages cross the veth cable; failures: a rank that hangs (SIGSTOP)
# and a cable cut in the middle of a run each end the whole job within 30 s
# with a message naming the lost rank, and leave no process behind; and
# nothing is left behind (namespaces, processes).  Exit 77 (ctest: skipped)
# where namespaces cannot be made.
#
#   bash tests/netns_test.sh PATH/TO/baton [REPEAT]
#
# REPEAT (default 2): how many times each failure is tried.
set -uo pipefail
baton=${1:?usage: netns_test.sh PATH/TO/baton}
baton=$(cd "$(dirname "$baton")" && pwd)/$(basename "$baton")
repeat=${2:-2}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
netns=$root/launch/netns.sh
run=$root/launch/baton-run
export BATON_BIN=$baton
unset BATON_TOPOLOGY

if ! why=$("$netns" check 2>&1); then
    echo "SKIP: $why"
    exit 77
fi
command -v mpirun >/dev/null 2>&1 || {
    echo "SKIP: mpirun not found"
    exit 77
}

work=$(mktemp -d "${TMPDIR:-/tmp}/baton-netns-test.XXXXXX")
hosts=$work/hosts
cleanup() {
    "$netns" down "$hosts"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fails=0
pass() { echo "ok   $1"; }
fail() {
    echo "FAIL $1"
    fails=$((fails + 1))
    [ -f "$work/out" ] && sed 's/^/     | /' "$work/out" | tail -20
}

"$netns" up "$hosts" 2 || exit 1
tag=$(cat "$hosts/tag")
topo=$hosts/topology.yaml
on0() { "$netns" exec "$hosts" 0 "$@"; } # mpirun runs on the first host

# bytes host 1 received on its cable
rx1() { ip -n "bt$tag-h1" -s -j link show dev eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'; }

# ---- the ranks run on two hosts ----
on0 timeout 60 "$run" -t "$topo" --agent "$hosts/agent" -- sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname)"' >"$work/out" 2>&1
if grep -qx "rank 0 on bt$tag-h0" "$work/out" && grep -qx "rank 1 on bt$tag-h1" "$work/out"; then
    pass "rank 0 runs on host bt$tag-h0, rank 1 on bt$tag-h1"
else
    fail "rank 0 runs on host bt$tag-h0, rank 1 on bt$tag-h1"
fi

# ---- the demo across two hosts equals one rank, bitwise ----
small=(--layers 4 --embd 64 --heads 4 --heads-kv 2 --head-dim 16 --ff 128 --ff-exp 64 --n-vocab 128 --tokens 16 --micro-batches 6)
before=$(rx1)
on0 timeout 120 "$run" -t "$topo" --agent "$hosts/agent" -- baton demo "${small[@]}" >"$work/out" 2>&1
rc=$?
after=$(rx1)
if [ "$rc" = 0 ] && grep -q "check: output equals a one-rank run (6 micro-batches, bitwise)" "$work/out"; then
    pass "demo across two hosts equals a one-rank run, bitwise"
else
    fail "demo across two hosts equals a one-rank run, bitwise (exit $rc)"
fi
# 6 micro-batches of 16 x 64 f32 activations go to host 1: at least 24 KiB
if [ $((after - before)) -ge 24576 ]; then
    pass "the activations crossed the cable ($((after - before)) bytes into host 1)"
else
    fail "the activations crossed the cable (only $((after - before)) bytes into host 1)"
fi

# ---- failures ----
# A long demo across the two hosts, in the background; a short watchdog.
# Sets $job (baton-run's pid) and waits until rank 1's process runs on host 1.
long_run() {
    BATON_WATCHDOG_S=3 on0 timeout 120 "$run" -t "$topo" --agent "$hosts/agent" -- \
        baton demo "${small[@]}" --micro-batches 1000000 --no-check >"$work/out" 2>&1 &
    job=$!
    local t
    for t in $(seq 600); do # a loaded machine starts slowly
        rank1=$(baton_pid 1)
        # running; then give it time to be past MPI's start (the watchdog
        # watches from there on)
        if [ -n "$rank1" ]; then
            sleep 1.5
            return 0
        fi
        sleep 0.1
    done
    kill "$job" 2>/dev/null
    wait "$job"
    return 1
}
comm=$(basename "$baton" | cut -c1-15) # the ranks' process name
baton_pid() { # host: the baton rank running there
    local p
    for p in $(ip netns pids "bt$tag-h$1" 2>/dev/null); do
        [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$comm" ] && echo "$p"
    done
}
# waits up to 30 s for baton-run; sets $secs and $rc
wait_job() {
    local t0=$SECONDS
    for _ in $(seq 300); do
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
    done
    secs=$((SECONDS - t0))
    if kill -0 "$job" 2>/dev/null; then
        rc=timeout
        kill "$job" 2>/dev/null
    else
        wait "$job"
        rc=$?
    fi
}
leftovers() { # processes still in a host's namespace
    ip netns pids "bt$tag-h0" 2>/dev/null
    ip netns pids "bt$tag-h1" 2>/dev/null
}
no_leftovers_within() { # seconds
    for _ in $(seq $(($1 * 10))); do
        [ -z "$(leftovers)" ] && return 0
        sleep 0.1
    done
    kill "$job" 2>/dev/null
    wait "$job"
    return 1
}

for i in $(seq "$repeat"); do
    # a rank that hangs: the watchdog of rank 0 names rank 1 and stops the job
    if ! long_run; then
        fail "hung rank ($i): the run did not start"
        continue
    fi
    kill -STOP "$rank1"
    wait_job
    kill -CONT "$rank1" 2>/dev/null
    if [ "$rc" != 0 ] && [ "$rc" != timeout ] &&
        grep -q "rank 0 (host bt$tag-h0): watchdog: no sign of life from rank 1 (host bt$tag-h1)" "$work/out" &&
        no_leftovers_within 10; then
        pass "hung rank ($i): the job ended in $secs s (exit $rc), naming rank 1, nothing left"
    else
        fail "hung rank ($i): exit $rc after $secs s; left: $(leftovers | tr '\n' ' ')"
        kill -9 $(leftovers) 2>/dev/null
    fi

    # a cable cut: both sides name the other; every process ends within 30 s
    if ! long_run; then
        fail "cut cable ($i): the run did not start"
        continue
    fi
    "$netns" link "$hosts" 1 down
    t0=$SECONDS
    wait_job
    gone=0
    no_leftovers_within $((30 - (SECONDS - t0))) && gone=1
    total=$((SECONDS - t0))
    "$netns" link "$hosts" 1 up
    if [ "$rc" != 0 ] && [ "$rc" != timeout ] && [ "$gone" = 1 ] &&
        grep -q "watchdog: no sign of life from rank 1 (host bt$tag-h1)" "$work/out"; then
        pass "cut cable ($i): the job ended in $secs s (exit $rc), naming rank 1; every process gone in $total s"
    else
        fail "cut cable ($i): exit $rc after $secs s; left after $total s: $(leftovers | tr '\n' ' ')"
        kill -9 $(leftovers) 2>/dev/null
    fi
done

# ---- cleanup ----
"$netns" down "$hosts"
if ip netns list | grep -q "^bt$tag-"; then
    fail "netns.sh down removes every namespace"
else
    pass "netns.sh down removes every namespace"
fi
if pgrep -f "$hosts" >/dev/null; then
    fail "no process of the run is left"
else
    pass "no process of the run is left"
fi

if [ "$fails" -gt 0 ]; then
    echo "$fails failed"
    exit 1
fi
echo "all passed"
