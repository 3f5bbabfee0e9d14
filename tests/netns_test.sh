#!/usr/bin/env bash
# netns_test.sh - baton across "hosts" that are network namespaces on this
# machine (launch/netns.sh): the demo over two hosts through launch/baton-run
# --agent gives the one-rank result bitwise, its ranks run on two hostnames and
# their messages cross the veth cable; and nothing is left behind (namespaces,
# processes).  Exit 77 (ctest: skipped) where namespaces cannot be made.
#
#   bash tests/netns_test.sh PATH/TO/baton
set -uo pipefail
baton=${1:?usage: netns_test.sh PATH/TO/baton}
baton=$(cd "$(dirname "$baton")" && pwd)/$(basename "$baton")
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
small=(--layers 4 --d-model 64 --heads 4 --d-ff 128 --vocab 128 --tokens 16 -m 6)
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
