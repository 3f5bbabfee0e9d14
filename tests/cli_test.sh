#!/usr/bin/env bash
# cli_test.sh BATON - the baton program as a user meets it: the demo over 1-4
# ranks, its checks, its trace and JSON, `baton plan` for every config, and
# every bad input (flags, values, topology files, rank counts, graphs that
# differ between ranks) ending in one clear message and the right exit code.
set -u
baton=${1:?usage: cli_test.sh BATON}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
unset BATON_TOPOLOGY
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() {
    passed=$((passed + 1))
    echo "ok: $1"
}
bad() {
    failed=$((failed + 1))
    echo "FAILED: $1"
    [ -f "$tmp/out" ] && sed 's/^/    | /' "$tmp/out" | head -20
}

# expect CODE GREP NAME -- command...: exit code and a line matching GREP
expect() {
    local code=$1 pattern=$2 name=$3
    shift 4
    timeout 120 "$@" >"$tmp/out" 2>&1
    local rc=$?
    if [ "$rc" -ne "$code" ]; then
        bad "$name: exit $rc, want $code"
    elif [ -n "$pattern" ] && ! grep -qE -- "$pattern" "$tmp/out"; then
        bad "$name: no line matching /$pattern/"
    else
        ok "$name"
    fi
}

small=(--layers 4 --d-model 64 --heads 4 --d-ff 128 --vocab 128 --tokens 16 -m 6)

# ---- runs ----
for np in 1 2 3 4; do
    expect 0 "output equals a one-rank run \(6 micro-batches, bitwise\)" "demo on $np ranks" -- \
        mpirun -np "$np" "$baton" demo "${small[@]}"
done
for ffn in mlp moe-dense moe-topk moe-shared; do
    expect 0 "bitwise" "demo --ffn $ffn on 2 ranks" -- mpirun -np 2 "$baton" demo "${small[@]}" --ffn "$ffn" -c 4
done
for type in f16 bf16 q8_0 q4_0; do
    expect 0 "bitwise" "demo --type $type on 2 ranks" -- mpirun -np 2 "$baton" demo "${small[@]}" --type "$type"
done
expect 0 "layers" "demo --partition 1,3" -- mpirun -np 2 "$baton" demo "${small[@]}" --partition 1,3 -v
expect 0 "bitwise" "demo through the launcher (local-cpu-2)" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$root/configs/local-cpu-2.yaml" -- baton demo "${small[@]}"

# JSON statistics parse and carry every rank
expect 0 "" "demo --json" -- mpirun -np 2 "$baton" demo "${small[@]}" --json
if python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); assert len(d["per_rank"])==2 and d["check"].startswith("output equals")' "$tmp/out" 2>/dev/null; then
    ok "demo --json is valid JSON with 2 ranks"
else
    bad "demo --json is valid JSON with 2 ranks"
fi

# the trace: valid JSON, a compute event per split and micro-batch, sends and waits
expect 0 "trace written" "demo --trace" -- mpirun -np 2 "$baton" demo "${small[@]}" --trace "$tmp/t.json"
if python3 - "$tmp/t.json" <<'EOF' 2>/dev/null; then
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in ev if e.get("ph") == "X"]
comp = [e for e in x if e["cat"] == "compute"]
assert {e["pid"] for e in comp} == {0, 1}
assert len(comp) == 2 * 6, len(comp)
assert any(e["cat"] == "send" for e in x) and any(e["cat"] == "wait" for e in x)
assert all(e["dur"] >= 0 for e in x)
EOF
    ok "trace has compute, send and wait events of both ranks"
else
    bad "trace has compute, send and wait events of both ranks"
fi
expect 1 "cannot write the trace" "trace into a missing directory" -- \
    mpirun -np 2 "$baton" demo "${small[@]}" --trace "$tmp/no/such/dir/t.json"
[ ! -e "$tmp/no/such/dir/t.json" ] && ok "no half-written trace" || bad "no half-written trace"

# progress on long steps: off in a pipe, on when asked (the launcher asks on a terminal)
expect 0 "" "no progress display in a pipe" -- mpirun -np 2 "$baton" demo "${small[@]}"
grep -q "planning and creating weights" "$tmp/out" && bad "no progress display in a pipe: it printed one" || ok "progress display stays off in a pipe"
expect 0 "planning and creating weights +100%" "progress display with BATON_PROGRESS=1" -- \
    mpirun -np 2 -x BATON_PROGRESS=1 "$baton" demo "${small[@]}"

# ---- plans ----
for cfg in local-cpu-1 local-cpu-2 local-cpu-4 one-node-8gpu two-nodes-16gpu; do
    expect 0 "rank 0 " "plan for $cfg" -- "$baton" plan -t "$root/configs/$cfg.yaml" --layers 32
done
# GPU-to-GPU edges that ask for nccl are counted as device-to-device
# transfers; a CPU-only topology has none
expect 0 "transfers per micro-batch \([0-9]+ device to device\)" "plan shows the NCCL edges" -- \
    "$baton" plan -t "$root/configs/one-node-8gpu.yaml"
"$baton" plan -t "$root/configs/local-cpu-2.yaml" >"$tmp/out" 2>&1
grep -q "device to device" "$tmp/out" && bad "plan for CPU ranks shows device-to-device transfers" ||
    ok "plan for CPU ranks has no device-to-device transfers"

# ---- bad inputs ----
expect 2 "unknown option --frobnicate" "demo: unknown flag" -- "$baton" demo --frobnicate
expect 2 "--layers: 'abc' is not an integer" "demo: bad value" -- "$baton" demo --layers abc
expect 2 "--micro-batches: '0'" "demo: zero micro-batches" -- "$baton" demo -m 0
expect 2 "--copies: '99'" "demo: too many copies" -- "$baton" demo -c 99
expect 2 "--type: 'q5_k'" "demo: unknown type" -- "$baton" demo --type q5_k
expect 2 "--norm-topk: '2' is not an integer in \\[0, 1\\]" "demo: bad --norm-topk" -- "$baton" demo --norm-topk 2
expect 2 "--ffn: 'moe'" "demo: unknown ffn" -- "$baton" demo --ffn moe
expect 2 "top_k" "demo: top-k above experts" -- "$baton" demo --experts 4 --top-k 5
expect 2 "needs a value" "demo: missing value" -- "$baton" demo --layers
expect 2 "--backend: 'gpu' is not cpu or cuda" "demo: unknown backend" -- "$baton" demo --backend gpu
expect 2 "the topology names each rank's backend" "demo: --backend with a topology" -- \
    "$baton" demo --backend cpu -t "$root/configs/local-cpu-2.yaml"
expect 0 "bitwise" "demo --backend cpu" -- mpirun -np 2 "$baton" demo "${small[@]}" --backend cpu
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    expect 1 "rank [01]: (this process sees no CUDA device|this build of baton has no CUDA backend)" \
        "demo --backend cuda without a GPU" -- mpirun -np 2 "$baton" demo "${small[@]}" --backend cuda
fi
expect 2 "unexpected argument 'extra'" "demo: stray argument" -- "$baton" demo extra
expect 2 "unknown command 'dmeo'" "unknown command" -- "$baton" dmeo
expect 2 "missing -t" "plan without topology" -- "$baton" plan
expect 2 "more than 2 counts" "demo: partition of the wrong length" -- mpirun -np 2 "$baton" demo "${small[@]}" --partition 1,1,2
expect 1 "add up to 5" "demo: partition that does not add up" -- mpirun -np 2 "$baton" demo "${small[@]}" --partition 2,3
expect 1 "No such file" "demo: missing topology" -- "$baton" demo -t "$tmp/none.yaml"
printf 'hosts:\n  - name: localhost\n    slots: 2\nranks:\n  - {rank: 0, host: localhost, backend: cpu, thread: 1}\n' >"$tmp/bad.yaml"
expect 1 "bad.yaml:5:[0-9]+: .*thread" "demo: topology with an unknown key" -- "$baton" demo -t "$tmp/bad.yaml"
expect 1 "2 ranks|world" "demo: topology for 2 ranks started on 3" -- \
    mpirun -np 3 "$baton" demo "${small[@]}" -t "$root/configs/local-cpu-2.yaml"
# ranks that build different models: one message on every rank, exit 1, quickly
start=$(date +%s)
expect 1 "rank 1 built a different graph" "graphs differ between ranks" -- \
    mpirun -np 1 "$baton" demo "${small[@]}" : -np 1 "$baton" demo "${small[@]}" --d-ff 256
[ $(($(date +%s) - start)) -lt 60 ] && ok "mismatch stops within a minute" || bad "mismatch stops within a minute"

# a rank that dies in the middle of a run: the job ends, non-zero, no hang
start=$(date +%s)
timeout 120 mpirun -np 2 bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then "$0" demo -m 100000 --no-check & p=$!; sleep 3; kill -9 $p; wait $p; exit 9; else exec "$0" demo -m 100000 --no-check; fi' "$baton" >"$tmp/out" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ $(($(date +%s) - start)) -lt 60 ]; then
    ok "a rank killed mid-run ends the job (exit $rc)"
else
    bad "a rank killed mid-run ends the job (exit $rc)"
fi

# the kernel benchmark's own flags
expect 0 "usage" "bench ops --help" -- "$baton" bench ops --help
expect 2 "" "bench ops with a bad flag" -- "$baton" bench ops --frobnicate
expect 2 "2 ranks" "bench transport on 1 rank" -- mpirun -np 1 "$baton" bench transport
expect 2 "--device: 'nccl' is not none or ordered" "bench pipeline: bad --device" -- \
    "$baton" bench pipeline --device nccl
expect 0 "activations over the ordered transport" "bench pipeline over the ordered transport" -- \
    mpirun -np 2 "$baton" bench pipeline --device ordered -m 1,2 --layers 2 --d-model 64 --heads 4 --d-ff 128 \
    --vocab 64 --tokens 8

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
