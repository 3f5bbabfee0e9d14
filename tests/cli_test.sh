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
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # $tmp, ok, bad

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

small=(--layers 4 --embd 64 --heads 4 --heads-kv 2 --head-dim 16 --ff 128 --ff-exp 64 --n-vocab 128 --tokens 16 --micro-batches 6)

# ---- runs ----
for np in 1 2 3 4; do
    expect 0 "output equals a one-rank run \(6 micro-batches, bitwise\)" "demo on $np ranks" -- \
        mpirun -np "$np" "$baton" demo "${small[@]}"
done
# every architecture, and the seed's three MoE variants: top-k renormalised
# (qwen3moe, llama with experts), shared expert beside the routed ones
# (qwen2moe), dense (every expert used); gemma3 with a window of 4 that the
# 16 tokens cross, every 2nd layer global; deepseek2 (latent attention, a
# dense first layer); glm4moe (the rope over half a head, q/k/v biases,
# sigmoid routing with a selection bias, a shared expert, a dense first layer);
# minimax-m2 (whole-q/k norms, the rope over half a head, every layer MoE with
# sigmoid routing and a selection bias, no shared expert, an output of its own)
for arch in llama qwen2 qwen3 qwen2moe qwen3moe olmoe gemma3 deepseek2 glm4moe minimax-m2; do
    expect 0 "bitwise" "demo --arch $arch on 2 ranks" -- mpirun -np 2 "$baton" demo "${small[@]}" --arch "$arch" --copies 4 \
        --swa 4 --swa-pattern 2
done
expect 0 "8 experts, 8 used.*|bitwise" "demo: a dense MoE on 2 ranks" -- \
    mpirun -np 2 "$baton" demo "${small[@]}" --arch qwen3moe --experts 8 --experts-used 8
grep -q "8 experts, 8 used" "$tmp/out" && grep -q bitwise "$tmp/out" && ok "demo: the dense MoE says so, bitwise" ||
    bad "demo: the dense MoE: $(head -c 300 "$tmp/out")"
for type in f16 bf16 q8_0 q4_0; do
    expect 0 "bitwise" "demo --type $type on 2 ranks" -- mpirun -np 2 "$baton" demo "${small[@]}" --type "$type"
done
# the watchdog (transport/mpi.c): heartbeats keep a short limit quiet while rank 0
# checks the result long after rank 1 is done (it said goodbye); a bad limit is refused
expect 0 "bitwise" "demo with a 0.5 s watchdog" -- env BATON_WATCHDOG_S=0.5 mpirun -np 2 -x BATON_WATCHDOG_S \
    "$baton" demo "${small[@]}" --embd 256 --micro-batches 24
expect 1 "^baton demo: BATON_WATCHDOG_S='abc': want seconds from 0 \(off\) to 86400$" "a bad BATON_WATCHDOG_S" -- \
    env BATON_WATCHDOG_S=abc mpirun -np 2 -x BATON_WATCHDOG_S "$baton" demo "${small[@]}"
# the transport returns the message (nothing printed there); the program prints it once, on rank 0
n_wd=$(grep -c "BATON_WATCHDOG_S='abc'" "$tmp/out")
if [ "$n_wd" -eq 1 ]; then ok "a bad BATON_WATCHDOG_S: said once"; else bad "a bad BATON_WATCHDOG_S: said $n_wd times, want once"; fi
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
# an unwritable trace is found before the run, with the OS's reason
start=$(date +%s)
expect 2 "^baton demo: --trace $tmp/no/such/dir/t.json: cannot write there: No such file or directory\$" \
    "trace into a missing directory" -- \
    mpirun -np 2 "$baton" demo "${small[@]}" --micro-batches 100000 --no-check --trace "$tmp/no/such/dir/t.json"
[ $(($(date +%s) - start)) -lt 30 ] && ok "unwritable trace found at start" || bad "unwritable trace found at start"
[ ! -e "$tmp/no/such/dir/t.json" ] && ok "no half-written trace" || bad "no half-written trace"
expect 2 "^baton demo: --trace $tmp: is a directory\$" "trace onto a directory" -- "$baton" demo --trace "$tmp"
# so is an unwritable --dump-plan (before: found after planning, then MPI_ABORT's banner)
expect 2 "^baton demo: --dump-plan $tmp: is a directory\$" "dump-plan onto a directory, 2 ranks" -- \
    mpirun -np 2 "$baton" demo "${small[@]}" --dump-plan "$tmp"
grep -q "MPI_ABORT" "$tmp/out" && bad "dump-plan onto a directory: MPI_ABORT" || ok "dump-plan onto a directory: no MPI_ABORT"
expect 2 "^baton demo: --dump-plan $tmp/no/dir/x.plan: cannot write there: No such file or directory\$" \
    "dump-plan into a missing directory" -- "$baton" demo "${small[@]}" --dump-plan "$tmp/no/dir/x.plan"
# make-model's OUT: checked before the model is made (before: made, then 'cannot rename ... into place')
vocab2="$root/tests/data/vocab/ggml-vocab-gpt-2.gguf"
expect 1 "^baton make-model: $tmp: is a directory\$" "make-model onto a directory" -- "$baton" make-model "$tmp" --vocab "$vocab2"
expect 2 "^baton make-model: OUT.gguf: the file name is empty" "make-model ''" -- "$baton" make-model '' --vocab "$vocab2"
expect 1 "^baton make-model: $tmp/no/dir/m.gguf: cannot write there: No such file or directory\$" \
    "make-model into a missing directory" -- "$baton" make-model "$tmp/no/dir/m.gguf" --vocab "$vocab2"
[ -z "$(find "$tmp" -maxdepth 1 -name '*.tmp.*')" ] && ok "make-model: nothing left beside OUT" || bad "make-model: nothing left beside OUT"
# stdout on a full disk: one message and exit 1 (before: exit 0, the listing or completion lost)
if [ -w /dev/full ]; then
    "$baton" make-model "$tmp/full.gguf" --vocab "$vocab2" --arch llama --experts 0 --layers 1 --embd 32 --heads 1 \
        --heads-kv 1 --ff 32 >/dev/null
    # full_disk PATTERN LABEL [LAUNCHER...]: for each "NAME|ARGS" line on stdin,
    # LAUNCHER baton ARGS (no launcher, or mpirun) with its stdout on /dev/full
    # exits 1 with one line matching PATTERN
    full_disk() {
        local pattern=$1 label=$2 name args argv rc n
        shift 2
        while IFS='|' read -r name args; do
            read -ra argv <<<"$args"
            "$@" "$baton" "${argv[@]}" </dev/null >/dev/full 2>"$tmp/out"
            rc=$?
            n=$(grep -c "$pattern" "$tmp/out")
            if [ $rc -eq 1 ] && [ "$n" = 1 ]; then ok "$label$name > /dev/full: exit 1, one message"
            else bad "$label$name > /dev/full: exit $rc, $n messages"; fi
        done
    }
    full_disk "writing the output: No space left on device" "" <<EOF2
generate (streamed)|generate -m $tmp/full.gguf -p hi -n 3 --temp 0
generate --json|generate -m $tmp/full.gguf -p hi -n 3 --temp 0 --json
tokenize|tokenize -m $tmp/full.gguf -p hello
gguf|gguf $tmp/full.gguf
gguf --json|gguf $tmp/full.gguf --json
plan|plan --topology $root/configs/local-cpu-2.yaml
demo|demo ${small[*]}
quantize --dry-run|quantize --dry-run $tmp/full.gguf $tmp/q.gguf Q8_0
version|version
EOF2
    # under mpirun: Open MPI drops its own write errors (before: exit 0, the
    # output lost); rank 0 writes straight to mpirun's stdout (common.c)
    full_disk "^baton [a-z]*: writing the output: No space left on device" "mpirun -np 2 " timeout 120 mpirun -np 2 <<EOF2
generate (streamed)|generate -m $tmp/full.gguf -p hi -n 3 --temp 0
generate --json|generate -m $tmp/full.gguf -p hi -n 3 --temp 0 --json
demo|demo ${small[*]}
EOF2
    # a file opened with `>` on a full disk (a 16 KiB tmpfs, filled): rank 0 writes
    # through mpirun's own open file (pidfd_getfd); needs root's mount, else skipped
    mkdir -p "$tmp/mnt"
    if mount -t tmpfs -o size=16k tmpfs "$tmp/mnt" 2>/dev/null; then
        head -c 65536 /dev/zero >"$tmp/mnt/fill" 2>/dev/null
        timeout 120 mpirun -np 2 "$baton" generate -m "$tmp/full.gguf" -p hi -n 3 --temp 0 </dev/null \
            >"$tmp/mnt/out" 2>"$tmp/out"
        rc=$?
        umount "$tmp/mnt"
        n=$(grep -c "^baton generate: writing the output: No space left on device" "$tmp/out")
        if [ $rc -eq 1 ] && [ "$n" = 1 ]; then ok "mpirun -np 2 generate > FILE on a full disk: exit 1, one message"
        else bad "mpirun -np 2 generate > FILE on a full disk: exit $rc, $n messages"; fi
    else
        echo "skip: mpirun -np 2 generate > FILE on a full disk (no tmpfs mount here)"
    fi
    # through a pipe and appended to a file, the output is whole and the same as one process's
    "$baton" generate -m "$tmp/full.gguf" -p hi -n 3 --temp 0 >"$tmp/one" 2>/dev/null
    timeout 120 mpirun -np 2 "$baton" generate -m "$tmp/full.gguf" -p hi -n 3 --temp 0 2>/dev/null | cat >"$tmp/two"
    : >"$tmp/two.app"
    timeout 120 mpirun -np 2 "$baton" generate -m "$tmp/full.gguf" -p hi -n 3 --temp 0 2>/dev/null >>"$tmp/two.app"
    timeout 120 mpirun -np 2 "$baton" generate -m "$tmp/full.gguf" -p hi -n 3 --temp 0 2>/dev/null >"$tmp/two.file"
    if cmp -s "$tmp/one" "$tmp/two" && cmp -s "$tmp/one" "$tmp/two.app" && cmp -s "$tmp/one" "$tmp/two.file"; then
        ok "mpirun -np 2 generate | cat, >> FILE, > FILE: the one-process output"
    else bad "mpirun -np 2 generate | cat, >> FILE, > FILE: differs from the one-process output"; fi
fi
# a context past the model's trained one (context_length 64): one warning naming
# both numbers and the flag, and the run goes on (before: nothing said)
"$baton" make-model "$tmp/c64.gguf" --vocab "$vocab2" --arch llama --experts 0 --layers 1 --embd 32 --heads 1 \
    --heads-kv 1 --ff 32 --ctx 64 >/dev/null
cw="warning: --ctx-size 256 / --parallel 2 gives each sequence 128 positions, more than the 64 the model was trained on \(llama.context_length\)"
expect 0 "^baton generate: $cw" "generate: --ctx-size past the trained context" -- \
    "$baton" generate -m "$tmp/c64.gguf" -p hi -n 2 --temp 0 -c 256 --parallel 2
expect 0 "^baton generate: warning: --ctx-size 128 gives each sequence 128 positions" \
    "generate: --ctx-size past the trained context, one sequence" -- "$baton" generate -m "$tmp/c64.gguf" -p hi -n 2 -c 128
"$baton" generate -m "$tmp/c64.gguf" -p hi -n 2 -c 128 --parallel 2 >/dev/null 2>"$tmp/out"
if grep -q warning "$tmp/out"; then bad "generate: --ctx-size within the trained context: a warning"; else ok "generate: --ctx-size within the trained context: no warning"; fi
"$baton" serve -m "$tmp/c64.gguf" --port 0 --threads 1 --ctx-size 256 --parallel 2 >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
for _ in $(seq 1 300); do grep -q "listening on" "$tmp/serve.out" 2>/dev/null && break; kill -0 $spid 2>/dev/null || break; sleep 0.1; done
kill -TERM $spid 2>/dev/null
wait $spid
if grep -qE "^baton serve: $cw" "$tmp/serve.err"; then ok "serve: --ctx-size past the trained context: one warning"
else bad "serve: --ctx-size past the trained context: $(cat "$tmp/serve.err")"; fi
# a model whose logits hold NaN (output_norm.weight all NaN: a damaged file): generate stops
# with one message naming it and exit 1, on 1 and 2 ranks (before: exit 0, tokens sampled from NaN)
"$baton" make-model "$tmp/nan.gguf" --vocab "$vocab2" --arch llama --experts 0 --layers 2 --embd 32 --heads 1 \
    --heads-kv 1 --ff 32 >/dev/null
python3 - "$tmp/nan.gguf" <<'EOF2'
import sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1], "r+")
t = next(t for t in r.tensors if t.name == "output_norm.weight")
t.data[...] = np.nan
r.data.flush()
EOF2
# --prompts from an endless stream: cut at 256 MiB with one message (before: read until memory ran out)
expect 1 "^baton generate: /dev/stdin: more than 256 MiB: baton reads at most that much text\$" "generate --prompts from yes" -- \
    bash -c 'yes hi | "$0" generate -m "$1" --prompts /dev/stdin -n 1' "$baton" "$tmp/nan.gguf"
for np in 1 2; do
    expect 1 "^baton generate: prompt 1: the model's logits hold NaN \(token id [0-9]+, after 0 generated tokens\)" \
        "generate: NaN logits on $np rank(s)" -- mpirun -np $np "$baton" generate -m "$tmp/nan.gguf" -p hi -n 3 --temp 0
done

# progress on long steps: off in a pipe, on when asked (the launcher asks on a terminal)
expect 0 "" "no progress display in a pipe" -- mpirun -np 2 "$baton" demo "${small[@]}"
grep -q "planning and reading weights" "$tmp/out" && bad "no progress display in a pipe: it printed one" || ok "progress display stays off in a pipe"
expect 0 "planning and reading weights" "progress display with BATON_PROGRESS=1" -- \
    mpirun -np 2 -x BATON_PROGRESS=1 "$baton" demo "${small[@]}"

# ---- memory: everything the plan allocates is checked before any is made ----
# (a prompt of 65535 tokens of a model 8192 wide with 64 heads of 128 needs a
# 26 GiB compute buffer, more than a rank's share on the machines this runs
# on; it used to grow past 10 GiB before anything said so)
mib='[0-9]+\.[0-9]'
big=(--arch qwen2 --layers 1 --embd 8192 --heads 64 --heads-kv 64 --head-dim 128 --ff 32 --tokens 65535)
expect 1 "^baton demo: rank 0 \(CPU\): the plan needs $mib MiB \(weights $mib, compute $mib, transfer slots $mib\) but the rank has $mib MiB \(its share of this machine's memory\)\$" \
    "demo: compute buffer larger than the machine" -- mpirun -np 2 "$baton" demo "${big[@]}" --micro-batches 1 --no-check
# a built-in model larger than a rank's share is refused before it is made
expect 1 "^baton demo: the built-in model is $mib MiB, made in memory by every rank: more than the $mib MiB a rank may use here; a smaller model, or --model FILE\$" \
    "demo: a built-in model larger than the machine" -- \
    mpirun -np 2 "$baton" demo --arch qwen2 --layers 500 --embd 16384 --heads 64 --heads-kv 64 --head-dim 256 --micro-batches 1
[ "$(grep -c 'made in memory by every rank' "$tmp/out")" -eq 1 ] && ok "demo: a built-in model too large: said once" ||
    bad "demo: a built-in model too large: said $(grep -c 'made in memory by every rank' "$tmp/out") times"
printf 'hosts:\n  - {name: localhost, slots: 2}\nranks:\n  - {rank: 0, host: localhost, backend: cpu, memory: 100MiB}\n  - {rank: 1, host: localhost, backend: cpu, memory: %s}\n' \
    100MiB >"$tmp/mem100.yaml"
expect 1 "^baton demo: rank 0 \(CPU\): the plan needs $mib MiB \(weights $mib, compute $mib, transfer slots $mib\) but the rank has 100\.0 MiB \(its memory limit\)\$" \
    "demo: compute buffer above the topology's memory" -- \
    mpirun -np 2 "$baton" demo --topology "$tmp/mem100.yaml" --tokens 4096 --micro-batches 1 --no-check
expect 0 "bitwise" "demo: the same topology with fewer tokens fits" -- mpirun -np 2 "$baton" demo --topology "$tmp/mem100.yaml" --micro-batches 2
# a rank too small for any share of the weights is the one named
sed '5s/100MiB/5MiB/' "$tmp/mem100.yaml" >"$tmp/mem5.yaml"
expect 1 "^baton demo: placement: rank 1 \(CPU\) has 5\.0 MiB of memory, less than the $mib MiB of weights its smallest share of 8 layers on 2 ranks needs\$" \
    "demo: the rank whose memory is too small is named" -- mpirun -np 2 "$baton" demo --topology "$tmp/mem5.yaml" --micro-batches 1
expect 1 "^baton plan: the built-in model: rank 1 \(CPUx1@localhost\) has 5\.0 MiB of memory, less than " \
    "plan: the rank whose memory is too small is named" -- "$baton" plan --topology "$tmp/mem5.yaml"

# CUDA ranks place with the topology's memory (the rank's, else the host's
# gpu_memory), as a live run given that file does; without either, baton plan
# cannot know the device's memory and says so (no 80 GiB guess)
printf 'hosts:\n  - {name: g, slots: 4, gpus: 2%s}\nranks:\n  - {rank: 0, host: g, backend: "cuda:0"%s}\n  - {rank: 1, host: g, backend: "cuda:1"}\n' \
    "" "" >"$tmp/gpu-nomem.yaml"
expect 1 "^baton plan: $tmp/gpu-nomem.yaml:4:5: rank 0 \(cuda:0 on g\): the plan needs its device's memory: give the rank a memory: or its host a gpu_memory:" \
    "plan: a CUDA rank without memory is an error" -- "$baton" plan --topology "$tmp/gpu-nomem.yaml"
printf 'hosts:\n  - {name: g, slots: 4, gpus: 2, gpu_memory: 5MiB}\nranks:\n  - {rank: 0, host: g, backend: "cuda:0", memory: 100MiB}\n  - {rank: 1, host: g, backend: "cuda:1"}\n' \
    >"$tmp/gpu-mem.yaml"
expect 1 "^baton plan: the built-in model: rank 1 \(CUDA1@g\) has 5\.0 MiB of memory" \
    "plan: a CUDA rank without memory: takes its host's gpu_memory" -- "$baton" plan --topology "$tmp/gpu-mem.yaml"
expect 1 "host g: gpu_memory: expected a size like 16GiB" "topology: bad gpu_memory" -- \
    "$baton" plan --topology <(sed 's/gpu_memory: 5MiB/gpu_memory: lots/' "$tmp/gpu-mem.yaml")

# ---- plans ----
for cfg in local-cpu-1 local-cpu-2 local-cpu-2-divided local-cpu-4 one-node-8gpu two-nodes-16gpu; do
    expect 0 "rank 0 " "plan for $cfg" -- "$baton" plan --topology "$root/configs/$cfg.yaml" --layers 32
done
# a group that divides every product: the plan says which weights and each rank's share
expect 0 "^    dense products divided by rows: [0-9]+ weights .*; rank 0 holds .*, rank 1 holds " \
    "plan for a group with divide: all shows the dense weights divided" -- \
    "$baton" plan --topology "$root/configs/local-cpu-2-divided.yaml" --layers 32
# (that the live plan is the offline one: generate_test, on every CPU config)
# x between GPU ranks whose edges ask for nccl goes over NCCL; a CPU-only
# topology has none
expect 0 "^  transfer: blk\.0\.out, rank 0 -> rank 1, .* NCCL\$" "plan shows the NCCL edges" -- \
    "$baton" plan --topology "$root/configs/one-node-8gpu.yaml"
"$baton" plan --topology "$root/configs/local-cpu-2.yaml" >"$tmp/out" 2>&1
grep -q "NCCL" "$tmp/out" && bad "plan for CPU ranks shows NCCL transfers" ||
    ok "plan for CPU ranks has no NCCL transfers"
# --dump-plan is written whole or not at all: a write that fails halfway
# (here the file size limit, 1 KiB, of a plan of about 2 KiB) leaves the file
# as it was and no temporary file beside it; a missing directory is named
printf 'an older plan\n' >"$tmp/keep.plan"
expect 1 "^baton plan: $tmp/keep.plan: cannot write the plan: File too large\$" "plan --dump-plan: a write that fails" -- \
    bash -c 'trap "" XFSZ; ulimit -f 1; exec "$0" plan --topology "$1" --dump-plan "$2" >/dev/null' \
    "$baton" "$root/configs/local-cpu-4.yaml" "$tmp/keep.plan"
if [ "$(cat "$tmp/keep.plan")" = "an older plan" ] && [ -z "$(find "$tmp" -name 'keep.plan.tmp*')" ]; then
    ok "plan --dump-plan: a failed write leaves the old file whole, nothing beside it"
else
    bad "plan --dump-plan: a failed write leaves the old file whole, nothing beside it ($(wc -c <"$tmp/keep.plan") bytes; $(ls "$tmp"))"
fi
expect 1 "^baton plan: $tmp/no/dir/x.plan: cannot write the plan: No such file or directory\$" \
    "plan --dump-plan into a missing directory" -- "$baton" plan --topology "$root/configs/local-cpu-2.yaml" --dump-plan "$tmp/no/dir/x.plan"
# a path that is no regular file (the link /dev/stdout, here to a pipe) is written
# through: before, a temporary file went beside it (/dev/stdout.tmp.XXXXXX) and was
# renamed over the link, which root may do (when stdout was a regular file)
"$baton" plan --topology "$root/configs/local-cpu-2.yaml" --dump-plan "$tmp/file.plan" >/dev/null 2>&1
"$baton" plan --topology "$root/configs/local-cpu-2.yaml" --dump-plan /dev/stdout 2>/dev/null | cat >"$tmp/pipe.out"
if [ -s "$tmp/file.plan" ] && ! grep -vxFf "$tmp/pipe.out" "$tmp/file.plan" >/dev/null && [ -L /dev/stdout ]; then
    ok "plan --dump-plan /dev/stdout: every line of the plan comes down the pipe, /dev/stdout stays a link"
else
    bad "plan --dump-plan /dev/stdout: $(head -c 300 "$tmp/pipe.out")"
fi

# the projection on paper (baton plan --project): every cluster file, the
# 64-GPU table, the model options over the file's, and bad cluster files
for cf in "$root"/configs/projection/*.yaml; do
    expect 0 "^   64      8 .*tokens/s|bottleneck: stage|  one group of [0-9]+ " "plan --project $(basename "$cf")" -- "$baton" plan --project "$cf"
done
expect 0 "^   64      8 " "plan --project: the 64-GPU line" -- "$baton" plan --project "$root/configs/projection/eight-nodes-64gpu.yaml"
expect 0 "^model: 96 layers" "plan --project: --layers over the file's" -- \
    "$baton" plan --project "$root/configs/projection/eight-nodes-64gpu.yaml" --layers 96
sed 's/^  latency_us: 5 .*/  latency_us: fast/' "$root/configs/projection/eight-nodes-64gpu.yaml" >"$tmp/c1.yaml"
expect 1 "c1\.yaml:[0-9]+:15: inter_node\.latency_us: expected a number, got 'fast'$" "plan --project: a bad number" -- \
    "$baton" plan --project "$tmp/c1.yaml"
sed 's/^  nodes: 8/  node: 8/' "$root/configs/projection/eight-nodes-64gpu.yaml" >"$tmp/c2.yaml"
expect 1 "c2\.yaml:[0-9]+:3: cluster: unknown key 'node' \(allowed: nodes, devices_per_node, micro_batches\)$" \
    "plan --project: an unknown key" -- "$baton" plan --project "$tmp/c2.yaml"
expect 1 "nope\.yaml: cannot open" "plan --project: no such file" -- "$baton" plan --project "$tmp/nope.yaml"
# the decode section: a pipeline of 4 hosts against one group of 4, one sequence
expect 0 "^    4  one group of 4 +1 " "plan --project: decode, pipeline against expert groups" -- \
    "$baton" plan --project "$root/configs/projection/deepseek-v3-cpu-hosts-ndr.yaml"
sed 's/^  hosts: \[4, 8\]/  hosts: [4, x]/' "$root/configs/projection/deepseek-v3-cpu-hosts-ndr.yaml" >"$tmp/c3.yaml"
expect 1 "c3\.yaml:[0-9]+:[0-9]+: decode\.hosts: expected a number, got 'x'$" "plan --project: a bad decode section" -- \
    "$baton" plan --project "$tmp/c3.yaml"
expect 2 "--project goes without -t" "plan --project with -t" -- \
    "$baton" plan --project "$root/configs/projection/eight-nodes-64gpu.yaml" --topology "$root/configs/local-cpu-2.yaml"

# ---- bad inputs ----
expect 2 "unknown option --frobnicate" "demo: unknown flag" -- "$baton" demo --frobnicate
expect 2 "--layers: 'abc' is not an integer" "demo: bad value" -- "$baton" demo --layers abc
expect 2 "--micro-batches: '0'" "demo: zero micro-batches" -- "$baton" demo --micro-batches 0
expect 2 "--rank-gflops: '-3' is not a positive number" "demo: bad --rank-gflops" -- "$baton" demo --rank-gflops -3
expect 2 "--copies: '99'" "demo: too many copies" -- "$baton" demo --copies 99
# one meaning per short flag (llama.cpp's): -t threads, -m model, -c context; where a subcommand
# has no such option, the message says what it means and what to give instead
expect 2 "^baton demo: -c is --ctx-size in every baton subcommand that has it \(as in llama.cpp\); demo's micro-batches in flight are --copies N \(try: baton demo --help\)\$" \
    "demo: -c names the context, not the copies" -- "$baton" demo -c 4
expect 2 "-t is --threads in every baton subcommand that has it \(as in llama.cpp\); plan reads its ranks from --topology FILE" \
    "plan: -t names the threads, not the topology" -- "$baton" plan -t "$root/configs/local-cpu-2.yaml"
expect 2 "bench pipeline's micro-batches in flight are --copies N" "bench pipeline: -c" -- "$baton" bench pipeline -c 2
expect 2 "^baton demo: --threads: 'x' is not an integer" "demo: -t is --threads" -- "$baton" demo -t x
expect 1 "no/such.gguf" "demo: -m is --model" -- "$baton" demo -m "$tmp/no/such.gguf"
expect 2 "--type: 'q5_k'" "demo: unknown type" -- "$baton" demo --type q5_k
expect 2 "^baton demo: --arch: 'mixtral' is not one of llama, " "demo: unknown architecture" -- "$baton" demo --arch mixtral
expect 2 "^baton demo: --experts-used 5 is more than --experts 4 " "demo: experts used above experts" -- \
    "$baton" demo --experts 4 --experts-used 5
expect 2 "^baton demo: --experts 0: qwen2moe is a MoE architecture" "demo: a MoE architecture without experts" -- \
    "$baton" demo --experts 0
expect 2 "needs a value" "demo: missing value" -- "$baton" demo --layers
expect 2 "--backend: 'gpu' is not cpu or cuda" "demo: unknown backend" -- "$baton" demo --backend gpu
expect 2 "the topology names each rank's backend" "demo: --backend with a topology" -- \
    "$baton" demo --backend cpu --topology "$root/configs/local-cpu-2.yaml"
expect 0 "bitwise" "demo --backend cpu" -- mpirun -np 2 "$baton" demo "${small[@]}" --backend cpu
# --backend with a topology: one line, the same for every subcommand that
# starts ranks, in one process and under mpirun (demo, generate and bench
# model each had their own check and words; serve and demo their own start
# branch): the topology named, and where it came from
topo2="$root/configs/local-cpu-2.yaml"
# subv: the arguments that start subcommand $1's ranks with a model that is never read
sub_argv() {
    case $1 in
    demo) subv=(demo) ;;
    generate) subv=(generate -m x -p hi) ;;
    serve) subv=(serve -m x) ;;
    *) subv=(bench model -m x) ;;
    esac
}
for sub in demo generate "bench model" serve; do
    sub_argv "$sub"
    line="^baton $sub: --backend cpu and the topology $topo2 \\(from \\\$BATON_TOPOLOGY\\): the topology names each rank's backend; give one or the other\$"
    for launch in one mpirun; do
        if [ $launch = one ]; then
            env BATON_TOPOLOGY="$topo2" "$baton" "${subv[@]}" --backend cpu >"$tmp/out" 2>&1
        else
            mpirun -np 2 -x BATON_TOPOLOGY="$topo2" "$baton" "${subv[@]}" --backend cpu >"$tmp/out" 2>&1
        fi
        rc=$?
        n=$(grep -c "names each rank's backend" "$tmp/out") # once, by rank 0
        if [ $rc -eq 2 ] && [ "$n" = 1 ] && grep -qE -- "$line" "$tmp/out"; then
            ok "$sub --backend with \$BATON_TOPOLOGY ($launch)"
        else
            bad "$sub --backend with \$BATON_TOPOLOGY ($launch): exit $rc, $n lines: $(head -c 400 "$tmp/out")"
        fi
    done
done
# a $BATON_TOPOLOGY file that is missing or bad: the message says where its name came from
# (before: "/x/none.yaml: cannot open: ...", and nothing on the command line names that file)
for sub in demo generate "bench model" serve; do
    sub_argv "$sub"
    expect 1 "^$tmp/none.yaml: cannot open: No such file or directory \(from \\\$BATON_TOPOLOGY\)\$" \
        "$sub with a missing \$BATON_TOPOLOGY" -- env BATON_TOPOLOGY="$tmp/none.yaml" "$baton" "${subv[@]}"
done
printf 'hosts: 5\n' >"$tmp/envbad.yaml"
expect 1 "^(baton demo: )?$tmp/envbad.yaml:1:1: .* \(from \\\$BATON_TOPOLOGY\)\$" "demo with a bad \$BATON_TOPOLOGY, 2 ranks" -- \
    mpirun -np 2 -x BATON_TOPOLOGY="$tmp/envbad.yaml" "$baton" demo
# an error every rank agrees on ends the job with its one line: the ranks
# still in their teardown when mpirun sends SIGTERM (rank 0 exited 1) do not
# add "stopped by SIGTERM" (they did in 2 to 5 runs of 10, by timing, so 8 runs)
for i in 1 2 3 4 5 6 7 8; do
    mpirun -np 3 --oversubscribe "$baton" generate -m "$tmp/absent.gguf" -p hi >"$tmp/out" 2>&1
    rc=$?
    if [ $rc -eq 1 ] && [ "$(grep -c '^baton generate:' "$tmp/out")" = 1 ] && ! grep -q "stopped by" "$tmp/out"; then
        ok "agreed error on 3 ranks: one line, no stop line (run $i)"
    else
        bad "agreed error on 3 ranks (run $i): exit $rc: $(grep '^baton' "$tmp/out" | head -c 400)"
    fi
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    expect 1 "rank [01]: (this process sees no CUDA device|this build of baton has no CUDA backend)" \
        "demo --backend cuda without a GPU" -- mpirun -np 2 "$baton" demo "${small[@]}" --backend cuda
    # the same error from every subcommand that starts ranks, with its name once
    "$baton" make-model "$tmp/tiny.gguf" --vocab "$root/tests/data/vocab/ggml-vocab-gpt-2.gguf" --layers 1 >/dev/null
    for sub in demo generate "bench model" serve; do
        case $sub in
        demo) subv=(demo "${small[@]}") ;;
        generate) subv=(generate -m "$tmp/tiny.gguf" -p hi) ;;
        serve) subv=(serve -m "$tmp/tiny.gguf") ;;
        *) subv=(bench model -m "$tmp/tiny.gguf") ;;
        esac
        expect 1 "^baton $sub: --backend cuda: rank 0: (this process sees no CUDA device|this build of baton has no CUDA backend)\$" \
            "$sub --backend cuda without a GPU: one prefix" -- mpirun -np 1 "$baton" "${subv[@]}" --backend cuda
    done
fi
expect 2 "unexpected argument 'extra'" "demo: stray argument" -- "$baton" demo extra
expect 2 "^baton demo: --topology: the file name is empty \(try: baton demo --help\)\$" "demo: --topology ''" -- "$baton" demo --topology ''
expect 2 "^baton demo: --trace: the file name is empty" "demo: --trace ''" -- "$baton" demo --trace ''
# an empty file name is named as such, exit 2 (before: ": cannot open: No such file or directory", exit 1)
while IFS='|' read -r want args; do
    read -ra argv <<<"$args"
    expect 2 "^baton $want: the file name is empty" "$args ''" -- "$baton" "${argv[@]}" ''
done <<EOF2
gguf: FILE|gguf
tokenize: -m|tokenize -p hi -m
tokenize: -f|tokenize -m x -f
make-model: --vocab|make-model x.gguf --vocab
generate: -m|generate -p hi -m
serve: -m|serve -m
bench model: -m|bench model -m
launch-files: --topology|launch-files --out x --topology
generate: --prompts|generate -m x --prompts
plan: --topology|plan --topology
plan: --project|plan --project
plan: --dump-plan|plan --topology x --dump-plan
EOF2
cores=$(getconf _NPROCESSORS_ONLN)
expect 2 "^baton demo: --threads: $((cores + 1)) threads, more than this machine's $cores cores \(try: baton demo --help\)\$" \
    "demo: more threads than cores" -- "$baton" demo --threads $((cores + 1))
expect 2 "^baton demo: --threads: '4097' is not an integer in \[1, 4096\]" "demo: --threads 4097" -- "$baton" demo --threads 4097
expect 2 "^baton bench pipeline: --threads: $((cores + 1)) threads, more than this machine's $cores cores" \
    "bench pipeline: more threads than cores" -- "$baton" bench pipeline --threads $((cores + 1))
expect 2 "^baton bench: --threads: $((cores + 1)) threads, more than this machine's $cores cores\$" \
    "bench ops: more threads than cores" -- "$baton" bench ops --threads 1,$((cores + 1))
expect 2 "^baton demo: --seed: ' -5' is not a non-negative integer" "demo: --seed ' -5' (strtoull would wrap it)" -- \
    "$baton" demo --seed " -5"
# a topology's threads are checked against the cores of the rank's machine
printf 'hosts:\n  - {name: localhost, slots: 2}\nranks:\n  - {rank: 0, host: localhost, backend: cpu, threads: %d}\n' \
    $((cores + 1)) >"$tmp/threads.yaml"
# (every subcommand that starts ranks: only demo did); -t is --threads in
# each subcommand that runs a model (serve's -t was --topology), one parser
for sub in generate "bench model" serve; do
    expect 2 "^baton $sub: --threads: 'x.yaml' is not an integer in \[1, 4096\]" "$sub: -t is --threads" -- \
        "$baton" $sub -m x -t x.yaml
    expect 2 "^baton $sub: --backend: 'gpu' is not cpu or cuda" "$sub: --backend gpu" -- "$baton" $sub -m x --backend gpu
done
for sub in demo generate "bench model" serve; do
    case $sub in
    demo) subv=(demo "${small[@]}") ;;
    generate) subv=(generate -m x -p hi) ;;
    serve) subv=(serve -m x) ;;
    *) subv=(bench model -m x) ;;
    esac
    expect 1 "^baton $sub: $tmp/threads.yaml:4:55: rank 0: threads: $((cores + 1)) threads, more than this machine's $cores cores\$" \
        "$sub: topology threads above the cores" -- mpirun -np 1 "$baton" "${subv[@]}" --topology "$tmp/threads.yaml"
done
# the model options' ranges: --help and the parser say the same limits
"$baton" demo --help >"$tmp/help" 2>&1
for spec in layers:1:512 embd:32:16384 heads:1:256 heads-kv:1:256 head-dim:2:1024 ff:1:65536 experts:0:256 \
    experts-used:1:256 ff-exp:1:65536 n-vocab:2:4194304; do
    opt=${spec%%:*} lo=${spec#*:} lo=${lo%%:*} hi=${spec##*:}
    if grep -qE -- "^  --$opt N .*\[$lo, $hi\] " "$tmp/help"; then ok "--help: --$opt in [$lo, $hi]"; else bad "--help: --$opt in [$lo, $hi]"; fi
    expect 2 "^baton demo: --$opt: '$((hi + 1))' is not an integer in \[$lo, $hi\]" "demo: --$opt $((hi + 1))" -- \
        "$baton" demo --"$opt" $((hi + 1))
done
expect 2 "^baton demo: --tokens: '65537' is not an integer in \[1, 65536\]" "demo: --tokens 65537" -- \
    "$baton" demo --tokens 65537
# the options that must fit each other
expect 2 "^baton demo: --heads 256 is not a multiple of --heads-kv 3 " "demo: heads and KV heads" -- \
    "$baton" demo --heads 256 --heads-kv 3
expect 2 "^baton demo: --head-dim 33: must be even" "demo: an odd head length" -- "$baton" demo --head-dim 33
expect 2 "^baton demo: --type q8_0: --embd, --ff, --ff-exp and --heads x --head-dim must be multiples of 32 " \
    "demo: a block type on a width it does not divide" -- "$baton" demo --type q8_0 --embd 48
expect 2 "unknown command 'dmeo'" "unknown command" -- "$baton" dmeo
expect 2 "^baton version: unexpected argument 'extra'\$" "version with an extra argument" -- "$baton" version extra
# --help on every subcommand (issue: version took it for an argument)
for sub in demo plan "bench ops" "bench model" "bench transport" "bench pipeline" generate make-model tokenize gguf \
    quantize serve launch-files version help bench; do
    read -ra words <<<"$sub"
    expect 0 "^usage: " "$sub --help" -- "$baton" "${words[@]}" --help
done
expect 0 "^usage: baton gguf FILE" "help gguf: the command's own help" -- "$baton" help gguf
expect 2 "^baton: unknown command 'nope'" "help of an unknown command" -- "$baton" help nope
expect 0 "^1 ranks, 1 splits, 0 transfers per ubatch" "plan without a topology: one CPU rank" -- "$baton" plan
# more ranks than the runtime runs: refused at once, before any per-rank work
# (65537 entries fit in the 1 MiB a file may have as aliases of one)
python3 -c '
import sys
with open(sys.argv[1], "w") as f:
    f.write("hosts:\n  - {name: a, slots: 4}\nranks:\n  - &r {rank: 0, host: a, backend: cpu}\n")
    for r in range(65536): f.write("  - *r\n")
' "$tmp/many.yaml"
start=$(date +%s)
expect 1 "^$tmp/many.yaml:4:3: ranks: 65537 ranks, more than the 4096 baton runs \(BT_SCHED_MAX_BACKENDS\)\$" \
    "plan: 65537 ranks" -- "$baton" plan --topology "$tmp/many.yaml"
expect 1 "^$tmp/many.yaml:4:3: ranks: 65537 ranks, more than the 4096 baton runs" "launch-files: 65537 ranks" -- \
    "$baton" launch-files --topology "$tmp/many.yaml" --out "$tmp/many-out"
[ $(($(date +%s) - start)) -lt 30 ] && ok "65537 ranks refused quickly" || bad "65537 ranks refused quickly"
printf 'hosts:\n  - {name: a, slots: 2}\nranks:\n  - {rank: 0, host: a, backend: cpu, memory: 8EiB}\n' >"$tmp/mem.yaml"
sed -i 's/8EiB/9223372036854775808/' "$tmp/mem.yaml"
expect 1 "^$tmp/mem.yaml:4:46: rank 0: memory: '9223372036854775808' is too large \(at most 2\^63-1 bytes\)\$" \
    "plan: memory of 2^63 bytes" -- "$baton" plan --topology "$tmp/mem.yaml"
python3 -c 'import sys; open(sys.argv[1], "w").write("hosts: " + "[" * 1000000 + "\n")' "$tmp/deep.yaml"
start=$(date +%s)
expect 1 "^$tmp/deep.yaml:1:23: lists and mappings nested more than 16 deep \(a topology needs 5\)\$" \
    "plan: a million nested lists" -- "$baton" plan --topology "$tmp/deep.yaml"
[ $(($(date +%s) - start)) -lt 30 ] && ok "deep nesting refused quickly" || bad "deep nesting refused quickly"
expect 2 "more than 2 counts" "demo: partition of the wrong length" -- mpirun -np 2 "$baton" demo "${small[@]}" --partition 1,1,2
expect 1 "add up to 5" "demo: partition that does not add up" -- mpirun -np 2 "$baton" demo "${small[@]}" --partition 2,3
expect 1 "No such file" "demo: missing topology" -- "$baton" demo --topology "$tmp/none.yaml"
printf 'hosts:\n  - name: localhost\n    slots: 2\nranks:\n  - {rank: 0, host: localhost, backend: cpu, thread: 1}\n' >"$tmp/bad.yaml"
expect 1 "bad.yaml:5:[0-9]+: .*thread" "demo: topology with an unknown key" -- "$baton" demo --topology "$tmp/bad.yaml"
expect 1 "2 ranks|world" "demo: topology for 2 ranks started on 3" -- \
    mpirun -np 3 "$baton" demo "${small[@]}" --topology "$root/configs/local-cpu-2.yaml"
# ranks started with different options: one message naming the rank and the
# option, exit 2, before any work (these used to hang, compute something else,
# or use rank 0's value in silence)
start=$(date +%s)
expect 2 "^baton demo: rank 1 was started with --ff 256 but rank 0 with --ff 128; every rank needs the same --ff\$" \
    "models differ between ranks" -- \
    mpirun -np 1 "$baton" demo "${small[@]}" : -np 1 "$baton" demo "${small[@]}" --ff 256
[ $(($(date +%s) - start)) -lt 60 ] && ok "mismatch stops within a minute" || bad "mismatch stops within a minute"
mismatch() { # OPTION-WORDS-ON-RANK-1... -- expected message tail
    local want=$1
    shift
    expect 2 "^baton demo: rank 1 was started $want\$" "rank 1 started with $*" -- \
        mpirun -np 1 "$baton" demo "${small[@]}" : -np 1 "$baton" demo "${small[@]}" "$@"
}
mismatch "with --micro-batches 8 but rank 0 with --micro-batches 6; every rank needs the same --micro-batches" --micro-batches 8
mismatch "with --copies 4 but rank 0 with --copies 2; every rank needs the same --copies" --copies 4
mismatch "with --copies 1 but rank 0 with --copies 2; every rank needs the same --copies" --copies 1
mismatch "with --seed 7 but rank 0 with --seed 42; every rank needs the same --seed" --seed 7
mismatch "with --partition 1,3 but rank 0 without --partition; every rank needs the same --partition" --partition 1,3
mismatch "with --trace but rank 0 without --trace; every rank needs the same --trace" --trace "$tmp/t1.json"
mismatch "with --type f16 but rank 0 with --type f32; every rank needs the same --type" --type f16
mismatch "with --backend cpu but rank 0 without --backend; every rank needs the same --backend" --backend cpu
# --copies 2 on the command line and a topology's micro_batches: 2 agree
expect 0 "bitwise" "same copies from the command line and the topology" -- \
    mpirun -np 1 -x BATON_TOPOLOGY="$root/configs/local-cpu-2.yaml" "$baton" demo "${small[@]}" --copies 2 : \
    -np 1 -x BATON_TOPOLOGY="$root/configs/local-cpu-2.yaml" "$baton" demo "${small[@]}"
# an error only rank 1 finds is printed (by rank 0, naming rank 1)
expect 2 "^baton demo: rank 1: --layers: 'x' is not an integer in \[1, 512\] \(try: baton demo --help\)\$" \
    "bad value on rank 1 only" -- mpirun -np 1 "$baton" demo "${small[@]}" : -np 1 "$baton" demo "${small[@]}" --layers x
expect 2 "^baton demo: rank 1: unknown option --frobnicate \(try: baton demo --help\)\$" "bad flag on rank 1 only" -- \
    mpirun -np 1 "$baton" demo "${small[@]}" : -np 1 "$baton" demo "${small[@]}" --frobnicate
expect 1 "^baton demo: rank 1: $tmp/none.yaml: cannot open: No such file or directory\$" "missing topology on rank 1 only" -- \
    mpirun -np 1 "$baton" demo "${small[@]}" --topology "$root/configs/local-cpu-2.yaml" : \
    -np 1 "$baton" demo "${small[@]}" --topology "$tmp/none.yaml"
# the same bad flag on every rank: one message, not one per rank
expect 2 "" "bad flag on every rank" -- mpirun -np 2 "$baton" demo --frobnicate
[ "$(grep -c "unknown option --frobnicate" "$tmp/out")" = 1 ] && ok "bad flag on every rank: one message" ||
    bad "bad flag on every rank: one message"

# a rank that dies in the middle of a run: the job ends, non-zero, no hang
start=$(date +%s)
timeout 120 mpirun -np 2 bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then "$0" demo --micro-batches 100000 --no-check & p=$!; sleep 3; kill -9 $p; wait $p; exit 9; else exec "$0" demo --micro-batches 100000 --no-check; fi' "$baton" >"$tmp/out" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ $(($(date +%s) - start)) -lt 60 ]; then
    ok "a rank killed mid-run ends the job (exit $rc)"
else
    bad "a rank killed mid-run ends the job (exit $rc)"
fi

# the kernel benchmark's own flags
expect 0 "usage" "bench ops --help" -- "$baton" bench ops --help
expect 0 "^usage: baton bench ops\|model\|transport\|pipeline" "bench --help" -- "$baton" bench --help
expect 2 "^baton bench: unknown benchmark 'nope' \(try: baton bench --help\)\$" "bench: unknown benchmark" -- "$baton" bench nope
expect 2 "" "bench ops with a bad flag" -- "$baton" bench ops --frobnicate
expect 2 "^baton bench: --shapes: 'mixtral' is not a row group \(all decode prompt moe moe1 moe32 moe512 model attn\)\$" \
    "bench ops: bad --shapes" -- "$baton" bench ops --shapes mixtral
expect 2 "^baton bench: --shapes: empty list\$" "bench ops: empty --shapes" -- "$baton" bench ops --shapes ,
# --shapes moe1 runs exactly the 1-token mul_mat_id row of each type and thread count
timeout 120 "$baton" bench ops --threads 1 --types q4_0 --shapes moe1 --quick --reps 1 >"$tmp/out" 2>&1
rc=$?
rows=$(grep -cE '^(mul_mat|flash_attn)' "$tmp/out")
if [ "$rc" -eq 0 ] && [ "$rows" -eq 1 ] && grep -qE '^mul_mat_id +q4_0 +m=768 k=2048 tok=1 E8/128 +1 ' "$tmp/out"; then
    ok "bench ops --shapes moe1: one row"
else
    bad "bench ops --shapes moe1: exit $rc, $rows rows"
fi
# --repacked: the q8_0 row's weights laid out as a CPU rank loads them (shape marked rp) where the
# kernel variant in use has the repacked kernels (every x86 SIMD one: AVX2 and wider; not plain C
# or NEON); f16 is never repacked
timeout 120 "$baton" bench ops --threads 1 --types f16,q8_0 --shapes moe1 --quick --reps 1 --repacked >"$tmp/out" 2>&1
rc=$?
want_rp=0
case "$("$baton" version | sed -n 's/^cpu kernels: \([a-z0-9]*\).*/\1/p')" in
avx2 | avx2vnni | avx512f | avx512 | avx512bf16) want_rp=1 ;;
esac
got_rp=$(grep -cE '^mul_mat_id +q8_0 +m=768 k=2048 tok=1 E8/128 rp +1 ' "$tmp/out")
if [ "$rc" -eq 0 ] && [ "$got_rp" -eq "$want_rp" ] && grep -qE '^mul_mat_id +f16 +m=768 k=2048 tok=1 E8/128 +1 ' "$tmp/out"; then
    ok "bench ops --repacked: q8_0 repacked ($want_rp), f16 plain"
else
    bad "bench ops --repacked: exit $rc, q8_0 marked rp $got_rp (want $want_rp)"
fi
# --cached: the decode row on one copy of the weights (shape marked cached), the prompt row as before
timeout 120 "$baton" bench ops --threads 1 --types q4_0 --shapes decode,prompt --quick --reps 1 --cached >"$tmp/out" 2>&1
rc=$?
if [ "$rc" -eq 0 ] && grep -qE '^mul_mat +q4_0 +m=4096 n=1 k=14336 cached +1 ' "$tmp/out" &&
    grep -qE '^mul_mat +q4_0 +m=4096 n=512 k=14336 +1 ' "$tmp/out"; then
    ok "bench ops --cached: the decode row marked cached"
else
    bad "bench ops --cached: exit $rc"
fi
expect 2 "2 ranks" "bench transport on 1 rank" -- mpirun -np 1 "$baton" bench transport
expect 2 "--device: 'nccl' is not none or ordered" "bench pipeline: bad --device" -- \
    "$baton" bench pipeline --device nccl
expect 0 "x over the ordered transport" "bench pipeline over the ordered transport" -- \
    mpirun -np 2 "$baton" bench pipeline --device ordered --micro-batches 1,2 --layers 2 --embd 64 --heads 4 --heads-kv 4 \
    --head-dim 16 --ff 128 --n-vocab 64 --tokens 8
[ "$(grep -cE '^ +2 +[12] (compute|thread) .* yes ' "$tmp/out")" -eq 4 ] && ok "bench pipeline: the built-in model bitwise" ||
    bad "bench pipeline: the built-in model: not every row bitwise the same"
# a GGUF model's prompts through the runtime (its whole graph split over the
# ranks), next to one process: bitwise the same logits
"$baton" make-model "$tmp/pipe.gguf" --vocab "$vocab2" --layers 2 --embd 64 --heads 4 --heads-kv 2 --ff 128 \
    --experts 4 --experts-used 2 --ff-exp 64 >/dev/null
expect 0 " yes " "bench pipeline --model: the logits equal one process's" -- \
    mpirun -np 2 "$baton" bench pipeline --model "$tmp/pipe.gguf" --micro-batches 1,3 --tokens 5 --progress compute
[ "$(grep -cE '^ +2 +[13] compute .* yes ' "$tmp/out")" -eq 2 ] && ok "bench pipeline --model: every row bitwise" ||
    bad "bench pipeline --model: not every row bitwise the same"
expect 0 "^decode: 40 tokens one at a time after the prompt: .* bitwise yes; [1-9][0-9]* shapes? planned" \
    "bench pipeline --model --decode: the runtime decodes bitwise as one process" -- \
    mpirun -np 2 "$baton" bench pipeline --model "$tmp/pipe.gguf" --micro-batches 1 --tokens 5 --progress compute --decode 40
expect 2 "describe the built-in model; --model's file has its own" "bench pipeline: --model with --layers" -- \
    "$baton" bench pipeline --model "$tmp/pipe.gguf" --layers 4
expect 1 "^baton bench pipeline: $tmp/none.gguf: cannot open: No such file or directory\$" \
    "bench pipeline: a missing --model" -- mpirun -np 2 "$baton" bench pipeline --model "$tmp/none.gguf"
[ "$(grep -c 'cannot open' "$tmp/out")" -eq 1 ] && ok "bench pipeline: a missing --model said once" ||
    bad "bench pipeline: a missing --model said $(grep -c 'cannot open' "$tmp/out") times"

# demo --model: a GGUF model's prompts through the runtime on 1-3 ranks,
# checked against one process; its experts pinned to the last rank of a
# topology (their products run there, or with compute: layer on the layer's
# rank); generate refuses the pins it would not follow
for np in 1 2 3; do
    expect 0 "output equals a one-rank run \(4 micro-batches, bitwise\)" "demo --model on $np ranks" -- \
        mpirun -np "$np" "$baton" demo --model "$tmp/pipe.gguf" --tokens 6 --micro-batches 4 --copies 3
done
for compute in pinned layer; do
    cat >"$tmp/pin-$compute.yaml" <<EOF
hosts:
  - {name: localhost, slots: 2}
ranks:
  - {rank: 0, host: localhost, backend: cpu}
  - {rank: 1, host: localhost, backend: cpu}
pipeline:
  partition: [1, 1]
  pin:
    - {pattern: "blk.*.ffn_*_exps.weight", rank: 1, compute: $compute}
EOF
    expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" "demo --model, experts pinned (compute: $compute)" -- \
        env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/pin-$compute.yaml" -- baton demo --model "$tmp/pipe.gguf" \
        --tokens 7 --micro-batches 5
done
# generate follows the pins too: the same greedy text as one process
"$baton" generate -m "$tmp/pipe.gguf" -p "the pins" -n 12 --temp 0 >"$tmp/gen1.txt" 2>/dev/null
for compute in pinned layer; do
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/pin-$compute.yaml" -- baton generate -m "$tmp/pipe.gguf" \
        -p "the pins" -n 12 --temp 0 >"$tmp/gen2.txt" 2>"$tmp/gen2.err"
    if [ -s "$tmp/gen1.txt" ] && cmp -s "$tmp/gen1.txt" "$tmp/gen2.txt"; then
        ok "generate with the experts pinned (compute: $compute): one process's text"
    else
        bad "generate with the experts pinned (compute: $compute): $(head -c 300 "$tmp/gen2.err")"
    fi
done
# expert groups: rank 0 runs every layer, ranks 0 and 1 divide its experts;
# generate and demo give one process's text and logits, plan shows the map
cat >"$tmp/group.yaml" <<EOF
hosts:
  - {name: localhost, slots: 2}
ranks:
  - {rank: 0, host: localhost, backend: cpu}
  - {rank: 1, host: localhost, backend: cpu}
pipeline:
  partition: [2, 0]
  expert_groups: [[0, 1]]
EOF
env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/group.yaml" -- baton generate -m "$tmp/pipe.gguf" \
    -p "the pins" -n 12 --temp 0 >"$tmp/gen2.txt" 2>"$tmp/gen2.err"
if [ -s "$tmp/gen1.txt" ] && cmp -s "$tmp/gen1.txt" "$tmp/gen2.txt"; then
    ok "generate with an expert group of 2 ranks: one process's text"
else
    bad "generate with an expert group of 2 ranks: $(head -c 300 "$tmp/gen2.err")"
fi
expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" "demo --model, an expert group of 2 ranks" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/group.yaml" -- baton demo --model "$tmp/pipe.gguf" \
    --tokens 7 --micro-batches 5
expect 0 "expert group 0: ranks 0, 1; layers 0-1 on rank 0" "plan -m with an expert group" -- \
    "$baton" plan -m "$tmp/pipe.gguf" --topology "$tmp/group.yaml"
# deepseek2's routed experts (sigmoid, renormalised, scaled, a shared expert beside) divided the same way
"$baton" make-model "$tmp/ds.gguf" --vocab "$vocab2" --arch deepseek2 --layers 2 >/dev/null
expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" "demo: deepseek2, an expert group of 2" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/group.yaml" -- baton demo --model "$tmp/ds.gguf" \
    --tokens 7 --micro-batches 5
# and glm4moe's (the same routing through llm.c's layers, the first layer dense)
"$baton" make-model "$tmp/glm.gguf" --vocab "$vocab2" --arch glm4moe --layers 2 >/dev/null
expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" "demo: glm4moe, an expert group of 2" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/group.yaml" -- baton demo --model "$tmp/glm.gguf" \
    --tokens 7 --micro-batches 5
# and gpt-oss's (each expert's three biases added inside the chain, its clamped SwiGLU; the biases
# held whole by both ranks)
"$baton" make-model "$tmp/oss.gguf" --vocab "$vocab2" --arch gpt-oss --layers 2 >/dev/null
expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" "demo: gpt-oss, an expert group of 2" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/group.yaml" -- baton demo --model "$tmp/oss.gguf" \
    --tokens 7 --micro-batches 5
# and minimax-m2's (every layer MoE, no shared expert)
"$baton" make-model "$tmp/mm2.gguf" --vocab "$vocab2" --arch minimax-m2 --layers 2 >/dev/null
expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" "demo: minimax-m2, an expert group of 2" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/group.yaml" -- baton demo --model "$tmp/mm2.gguf" \
    --tokens 7 --micro-batches 5
# a group that divides every product (divide: all): with micro-batches of 20 tokens the prompt
# attention is divided by heads too (deepseek2's MLA heads one by one, gemma3's sliding layers
# over their own mask); one process's logits
sed 's/^  expert_groups: \[\[0, 1\]\]$/&\n  divide: all/' "$tmp/group.yaml" >"$tmp/divided.yaml"
"$baton" make-model "$tmp/gemma.gguf" --vocab "$vocab2" --arch gemma3 --layers 2 --swa 8 --swa-pattern 2 >/dev/null
for m in ds gemma oss; do
    for want in "output equals a one-rank run \(3 micro-batches, bitwise\)" \
        "attention divided by heads \(runs\): rank 0 [1-9][0-9]*, rank 1 [1-9]"; do
        expect 0 "$want" "demo: $m, a group of 2 that divides every product and the attention heads" -- \
            env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/divided.yaml" -- baton demo \
            --model "$tmp/$m.gguf" --tokens 20 --micro-batches 3
    done
done
# divide: tokens: both ranks hold the dense weights whole; a ubatch of 64 tokens or more has each
# dense product divided by tokens (each rank every row of its columns), a smaller one by rows of
# the whole weight; one process's logits and text, and plan shows the weights whole on both
sed 's/^  expert_groups: \[\[0, 1\]\]$/&\n  divide: tokens/' "$tmp/group.yaml" >"$tmp/tokens.yaml"
for m in ds gemma oss; do
    for n in 100 20; do
        expect 0 "output equals a one-rank run \(3 micro-batches, bitwise\)" \
            "demo: $m, $n tokens, a group of 2 that divides the dense products by tokens" -- \
            env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/tokens.yaml" -- baton demo \
            --model "$tmp/$m.gguf" --tokens "$n" --micro-batches 3
    done
done
want='dense products divided by tokens \(ubatches of fewer than 64 tokens: by rows\): [0-9]+ weights '
want+='\(([0-9.]+) MiB\); rank 0 holds \1 MiB, rank 1 holds \1 MiB'
expect 0 "$want" "plan: divide: tokens, the dense weights whole on both ranks" -- \
    "$baton" plan -m "$tmp/ds.gguf" --topology "$tmp/tokens.yaml"
# ranks that hold experts past their shares (expert_overlap): rank 0 moves the boundaries between
# them by each ubatch's routing; one process's logits, and plan shows the overlapping ranges
sed 's/^  expert_groups: \[\[0, 1\]\]$/&\n  expert_overlap: 1/' "$tmp/group.yaml" >"$tmp/overlap.yaml"
for m in ds oss mm2; do
    expect 0 "output equals a one-rank run \(5 micro-batches, bitwise\)" \
        "demo: $m, an expert group of 2 whose experts overlap by one" -- \
        env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/overlap.yaml" -- baton demo --model "$tmp/$m.gguf" \
        --tokens 7 --micro-batches 5
done
expect 0 "expert_overlap 1: the ranges overlap; per ubatch and layer rank 0 sets the boundaries" \
    "plan: an expert group whose experts overlap" -- "$baton" plan -m "$tmp/oss.gguf" --topology "$tmp/overlap.yaml"
# MLA's per-head products (attn_k_b, attn_v_b) divided by heads in every ubatch, one token too
expect 0 "per-head products divided by heads: 4 weights .*; rank 0 holds .*, rank 1 holds " \
    "plan: deepseek2's per-head products divided by heads" -- \
    "$baton" plan -m "$tmp/ds.gguf" --topology "$tmp/divided.yaml"
expect 0 "output equals a one-rank run \(3 micro-batches, bitwise\)" \
    "demo: ds, one token a micro-batch, its per-head products divided" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/divided.yaml" -- baton demo \
    --model "$tmp/ds.gguf" --tokens 1 --micro-batches 3
# 16 sequences decoded at once: ubatches of 16 tokens whose attention home computes whole (each
# token sees only its own sequence's cells), the prompts' divided (each rank keeps its heads of
# the attention for attn_v_b): one process's text
for i in $(seq 1 16); do echo "prompt $i of sixteen"; done >"$tmp/p16.txt"
"$baton" generate -m "$tmp/ds.gguf" --prompts "$tmp/p16.txt" --parallel 16 -n 6 --temp 0 >"$tmp/p16-1.txt" 2>/dev/null
# (and on the group that divides by tokens: the prompts' 80 tokens by tokens, the decode steps by rows)
for g in divided tokens; do
    what="divides every product"
    [ "$g" = tokens ] && what="divides the dense products by tokens"
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/$g.yaml" -- baton generate -m "$tmp/ds.gguf" \
        --prompts "$tmp/p16.txt" --parallel 16 -n 6 --temp 0 >"$tmp/p16-$g.txt" 2>"$tmp/p16-$g.err"
    if [ -s "$tmp/p16-1.txt" ] && cmp -s "$tmp/p16-1.txt" "$tmp/p16-$g.txt"; then
        ok "generate: ds, 16 sequences at once on a group that $what: one process's text"
    else
        bad "generate: ds, 16 sequences at once on a group that $what: $(head -c 300 "$tmp/p16-$g.err")"
    fi
done
# with --dump-tensors the kept heads come back: q and the attention's result whole, as one process's;
# with divide: tokens (100 tokens) the products' columns in place, and the SwiGLU each rank computes
# of its own tokens (with a callback rank 0 computes gate, up and the SwiGLU whole); every node of
# the layers but the expert chain's inside ones (which no group dumps whole)
for n in 20 100; do
    g=divided
    [ "$n" = 100 ] && g=tokens
    "$baton" demo --model "$tmp/ds.gguf" --tokens "$n" --micro-batches 2 --dump-tensors 'blk.*' 2>&1 |
        grep '^dump:' | sed 's/rank [0-9]* //' | grep -v 'ffn_moe_\(gate\|up\|act\) ' | sort >"$tmp/dsdump1"
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/$g.yaml" -- baton demo --model "$tmp/ds.gguf" \
        --tokens "$n" --micro-batches 2 --dump-tensors 'blk.*' 2>&1 | grep '^dump:' | sed 's/rank [0-9]* //' |
        grep -v 'ffn_moe_\(gate\|up\|act\) ' | sort >"$tmp/dsdump2"
    if grep -q 'q_mla CONCAT' "$tmp/dsdump1" && grep -q 'attn FLASH_ATTN' "$tmp/dsdump1" &&
        grep -q 'ffn_act SWIGLU' "$tmp/dsdump1" && cmp -s "$tmp/dsdump1" "$tmp/dsdump2"; then
        ok "demo --dump-tensors: ds on the $g group, $n tokens, every layer node as one process's"
    else
        bad "demo --dump-tensors: ds on the $g group, $n tokens: $(diff "$tmp/dsdump1" "$tmp/dsdump2" | head -c 300)"
    fi
done
# the trace of such a run, chain by chain (bench/chain-trace.py): every chain's row and the totals
expect 0 "trace written" "demo --trace: ds, a group of 2 that divides every product" -- \
    env BATON_BIN="$baton" "$root/launch/baton-run" -t "$tmp/divided.yaml" -- baton demo \
    --model "$tmp/ds.gguf" --tokens 20 --micro-batches 2 --trace "$tmp/ds-trace.json"
expect 0 "^rank 0's split: [0-9.]+ ms .*transfers free: [0-9.]+; the work shared evenly: [0-9.]+$" \
    "chain-trace.py on a divided group's trace" -- python3 "$root/bench/chain-trace.py" "$tmp/ds-trace.json" 1
expect 1 "no chains of micro-batch 1 \(an expert group's trace\?\)" "chain-trace.py on a pipeline's trace" -- \
    python3 "$root/bench/chain-trace.py" "$tmp/t.json"
# a member of the group that dies, or hangs, mid-run: the job ends, naming it
for how in KILL STOP; do
    start=$(date +%s)
    BATON_TOPOLOGY="$tmp/group.yaml" BATON_WATCHDOG_S=2 timeout 120 mpirun -np 2 -x BATON_TOPOLOGY -x BATON_WATCHDOG_S \
        bash -c 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then "$0" demo --model "$1" --micro-batches 100000 --no-check & p=$!; sleep 3; kill -"$2" $p; wait $p; exit 9; else exec "$0" demo --model "$1" --micro-batches 100000 --no-check; fi' \
        "$baton" "$tmp/pipe.gguf" "$how" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ $(($(date +%s) - start)) -lt 60 ] &&
        grep -qE "rank 1|\[\[[0-9]+,[0-9]+\],1\]" "$tmp/out"; then
        ok "an expert group's member that gets SIG$how mid-run ends the job, named (exit $rc)"
    else
        bad "an expert group's member that gets SIG$how mid-run: exit $rc; $(tail -c 300 "$tmp/out")"
    fi
done
# --dump-tensors on the runtime: each layer's output of every micro-batch,
# printed by the rank that computes it, the same hashes on 1 and 3 ranks
for np in 1 3; do
    mpirun -np "$np" "$baton" demo --model "$tmp/pipe.gguf" --tokens 5 --micro-batches 2 --dump-tensors 'blk.*.out' \
        >/dev/null 2>"$tmp/dump$np.err"
    grep '^dump: ' "$tmp/dump$np.err" | awk '{print $5, $6, $NF}' | sort >"$tmp/dump$np"
done
if [ "$(wc -l <"$tmp/dump1")" -eq 4 ] && cmp -s "$tmp/dump1" "$tmp/dump3" &&
    [ "$(grep -c '^dump: rank [12] ' "$tmp/dump3.err")" -gt 0 ]; then
    ok "demo --model --dump-tensors: every layer's output, the same on 1 and 3 ranks, from the rank computing it"
else
    bad "demo --model --dump-tensors: $(wc -l <"$tmp/dump1") lines on 1 rank; 1 and 3 ranks differ or rank 0 printed all"
fi
expect 0 "^dump: rank 0 .*blk\.3\.out" "demo --dump-tensors on the built-in model" -- \
    "$baton" demo "${small[@]}" --micro-batches 1 --dump-tensors 'blk.3.out'
expect 0 "rank 1 \\(.*\\): layers 1-1, .* weights" "plan -m with a topology's pins" -- \
    "$baton" plan -m "$tmp/pipe.gguf" --topology "$tmp/pin-pinned.yaml"
expect 2 "describe the built-in model; --model's file has its own" "demo: --model with --embd" -- \
    "$baton" demo --model "$tmp/pipe.gguf" --embd 64
expect 1 "^baton demo: $tmp/none.gguf: cannot open" "demo: a missing --model" -- "$baton" demo --model "$tmp/none.gguf"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
