#!/usr/bin/env bash
# tests/gpu/run.sh - every GPU check of baton in one go (each step has its
# own time limit, cut to what is left of $BATON_GPU_SECONDS, default 470 s,
# so the whole stays inside it):
#   1. build with CUDA (and NCCL when found) in build-gpu/, or take the
#      binaries already built in $BATON_GPU_PREBUILT (a folder holding
#      test_cuda, bench_cuda, mpi_cuda_pipeline and baton; logs then go to
#      $BATON_GPU_LOGS, default that folder)
#   2. the op suite (test_cuda): every op against the CPU (FLASH_ATTN
#      included), events, copies, every node of the llama-family graphs
#      accepted, the scheduler's split example on [CUDA, CPU]; and
#      test_cuda_support when built here (it needs python3's gguf package)
#   3. NCCL single-rank on its own (CK_RUN_CASE=nccl)
#   4. the pipeline with a CUDA backend per rank, both ranks on one GPU,
#      transfers staged over MPI through pinned memory: mpiexec -n 2 bitwise
#      equal to -n 1 (an MLP model and a top-k MoE model)
#   5. the pipeline with the NCCL device transport: one rank bitwise equal to
#      the MPI run; two ranks on one GPU end with NCCL's refusal as one clear
#      error on every rank, not a hang (with two GPUs or more: bitwise equal)
#   6. `baton demo --backend cuda` on one rank and on two ranks sharing the GPU
#   7. GGUF models on the GPU: a small random-weight model of every
#      architecture (baton make-model), greedy text on the CPU and on CUDA
#      (reported side by side), and CUDA on two ranks equal to one rank;
#      `baton serve --backend cuda` on two ranks: 4 requests at once, each
#      equal to generate's text
#   8. the mul_mat benchmark (decode and prompt shapes) against the peaks
#   9. `baton bench model --backend cuda` on a Mixtral-shaped model (2 layers,
#      F16 and Q8_0) on one rank and on two sharing the GPU
# and a summary.  Exit status: 0 when every step passed (or was skipped for
# want of a device), 1 otherwise.
#
#   bash tests/gpu/run.sh [build-dir]
set -u
ROOT="${BATON_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="$(nproc 2>/dev/null || echo 4)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
       OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
declare -a SUMMARY=()
FAILED=0
T_START=$(date +%s)
DEADLINE=$((T_START + ${BATON_GPU_SECONDS:-470}))

# lim N: a step's time limit, N seconds or what is left before the deadline
lim() {
    local left=$((DEADLINE - $(date +%s)))
    [ "$left" -lt 1 ] && left=1
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

step() { # name, status (PASS / FAIL / SKIP), detail
    SUMMARY+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")")
    [ "$2" = FAIL ] && FAILED=1
    echo "== $1: $2 $3"
}

echo "== GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"

# 1. build, or the binaries built elsewhere
if [ -n "${BATON_GPU_PREBUILT:-}" ]; then
    BUILD="$BATON_GPU_PREBUILT"
    BIN="$BATON_GPU_PREBUILT"
    missing=""
    for b in test_cuda bench_cuda mpi_cuda_pipeline baton; do
        [ -x "$BIN/$b" ] || missing="$missing $b"
    done
    if [ -n "$missing" ]; then
        step "prebuilt binaries" FAIL "missing in $BIN:$missing"
        printf '%s\n' "${SUMMARY[@]}"
        exit 1
    fi
    NCCL_ON=0
    grep -q ncclCommInitRank "$BIN/mpi_cuda_pipeline" && NCCL_ON=1
    step "prebuilt binaries" PASS "$BIN ($([ $NCCL_ON = 1 ] && echo 'NCCL transport ON' || echo 'NCCL off'))"
elif timeout "$(lim 300)" cmake -S "$ROOT" -B "$BUILD" -DBATON_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$BUILD.configure.log" 2>&1 &&
   timeout "$(lim 300)" cmake --build "$BUILD" -j"$JOBS" --target test_cuda test_cuda_support bench_cuda mpi_cuda_pipeline baton_cli >"$BUILD.build.log" 2>&1; then
    BIN="$BUILD"
    NCCL_ON=0
    grep -q "NCCL transport ON" "$BUILD.configure.log" && NCCL_ON=1
    step "build (CUDA sm_90)" PASS "$([ $NCCL_ON = 1 ] && echo 'NCCL transport ON' || echo 'NCCL off')"
else
    tail -30 "$BUILD.configure.log" "$BUILD.build.log" 2>/dev/null
    step "build (CUDA sm_90)" FAIL "see $BUILD.build.log"
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
fi
LOG="${BATON_GPU_LOGS:-$BUILD}"
mkdir -p "$LOG"
MPIEXEC=(mpiexec --oversubscribe)
VOCAB="$ROOT/tests/data/vocab/ggml-vocab-llama-spm.gguf"

# 2. the op suite (in this process: CUDA contexts do not survive fork)
timeout "$(lim 200)" "$BIN/test_cuda" >"$LOG/ops.log" 2>&1
rc=$?
tail -n 25 "$LOG/ops.log"
case $rc in
    0) step "test_cuda (ops vs CPU, sched)" PASS "$(grep -o '[0-9]*%: Checks: [0-9]*.*' "$LOG/ops.log" | head -1)" ;;
    77) step "test_cuda (ops vs CPU, sched)" SKIP "no CUDA device" ;;
    *) step "test_cuda (ops vs CPU, sched)" FAIL "rc $rc (see $LOG/ops.log)" ;;
esac
if [ $rc -ge 128 ] && command -v cuda-gdb >/dev/null 2>&1; then # a crash: where
    timeout "$(lim 90)" cuda-gdb -q -batch -ex run -ex bt --args "$BIN/test_cuda" >"$LOG/ops-bt.log" 2>&1
    grep -A20 "signal" "$LOG/ops-bt.log" | head -n 30
fi
if [ -z "${BATON_GPU_PREBUILT:-}" ]; then
    timeout "$(lim 120)" "$BIN/test_cuda_support" >"$LOG/support.log" 2>&1
    rc=$?
    tail -n 3 "$LOG/support.log"
    if [ $rc -eq 0 ]; then step "test_cuda_support (model graphs)" PASS ""
    else step "test_cuda_support (model graphs)" FAIL "rc $rc (see $LOG/support.log)"; fi
fi

# 3. NCCL, one rank sending to itself
if [ $NCCL_ON = 1 ]; then
    CK_RUN_CASE=nccl timeout "$(lim 120)" "$BIN/test_cuda" >"$LOG/nccl.log" 2>&1
    rc=$?
    tail -n 5 "$LOG/nccl.log"
    case $rc in
        0) step "NCCL single rank (send to self)" PASS "" ;;
        77) step "NCCL single rank (send to self)" SKIP "no CUDA device" ;;
        *) step "NCCL single rank (send to self)" FAIL "rc $rc" ;;
    esac
else
    step "NCCL single rank (send to self)" SKIP "NCCL not built"
fi

# 4. the staged two-rank pipeline on one GPU, bitwise equal to one rank
for kind in mlp moe-topk; do
    out1="$LOG/pipe_${kind}_np1.bin" out2="$LOG/pipe_${kind}_np2.bin"
    rm -f "$out1" "$out2"
    timeout "$(lim 90)" "${MPIEXEC[@]}" -n 1 "$BIN/mpi_cuda_pipeline" "$out1" "$kind" 6 2 >"$LOG/pipe1.log" 2>&1
    rc1=$?
    timeout "$(lim 90)" "${MPIEXEC[@]}" -n 2 "$BIN/mpi_cuda_pipeline" "$out2" "$kind" 6 2 >"$LOG/pipe2.log" 2>&1
    rc2=$?
    tail -n 3 "$LOG/pipe1.log" "$LOG/pipe2.log"
    if [ $rc1 -eq 77 ] || [ $rc2 -eq 77 ]; then
        step "pipeline np2 == np1 ($kind)" SKIP "no CUDA device"
    elif [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
        step "pipeline np2 == np1 ($kind)" FAIL "rc $rc1 / $rc2 (see $LOG/pipe*.log)"
    elif cmp -s "$out1" "$out2"; then
        step "pipeline np2 == np1 ($kind)" PASS "$(stat -c %s "$out1") bytes of logits, bitwise equal"
    else
        step "pipeline np2 == np1 ($kind)" FAIL "logits differ: $(cmp "$out1" "$out2" | head -1)"
    fi
done

# 5. the NCCL device transport
if [ $NCCL_ON = 1 ]; then
    ref="$LOG/pipe_moe-topk_np1.bin" out1="$LOG/pipe_nccl_np1.bin" out2="$LOG/pipe_nccl_np2.bin"
    rm -f "$out1" "$out2"
    timeout "$(lim 90)" "${MPIEXEC[@]}" -n 1 "$BIN/mpi_cuda_pipeline" "$out1" moe-topk 6 2 nccl >"$LOG/nccl1.log" 2>&1
    rc=$?
    tail -n 3 "$LOG/nccl1.log"
    if [ $rc -eq 77 ]; then step "pipeline with NCCL, 1 rank" SKIP "no CUDA device"
    elif [ $rc -eq 0 ] && cmp -s "$ref" "$out1"; then step "pipeline with NCCL, 1 rank" PASS "bitwise equal to the MPI run"
    else step "pipeline with NCCL, 1 rank" FAIL "rc $rc (see $LOG/nccl1.log)"; fi
    n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
    timeout "$(lim 60)" "${MPIEXEC[@]}" -n 2 "$BIN/mpi_cuda_pipeline" "$out2" moe-topk 6 2 nccl >"$LOG/nccl2.log" 2>&1
    rc=$?
    tail -n 6 "$LOG/nccl2.log"
    if [ $rc -eq 77 ]; then step "pipeline with NCCL, 2 ranks" SKIP "no CUDA device"
    elif [ "$n_gpu" -ge 2 ]; then
        if [ $rc -eq 0 ] && cmp -s "$ref" "$out2"; then step "pipeline with NCCL, 2 ranks" PASS "2 GPUs, bitwise equal"
        else step "pipeline with NCCL, 2 ranks" FAIL "rc $rc (see $LOG/nccl2.log)"; fi
    elif [ $rc -eq 124 ]; then step "pipeline with NCCL, 2 ranks on 1 GPU" FAIL "hung (timeout)"
    elif [ $rc -ne 0 ] && grep -q "NCCL channel" "$LOG/nccl2.log"; then
        step "pipeline with NCCL, 2 ranks on 1 GPU" PASS "refused with one message: $(grep -m1 -o 'NCCL channel.*' "$LOG/nccl2.log" | cut -c1-90)"
    else step "pipeline with NCCL, 2 ranks on 1 GPU" FAIL "rc $rc without NCCL's refusal (see $LOG/nccl2.log)"; fi
else
    step "pipeline with NCCL" SKIP "NCCL not built"
fi

# 6. the demo on the GPU: one rank, then two ranks sharing it (MPI, pinned staging)
for np in 1 2; do
    timeout "$(lim 90)" "${MPIEXEC[@]}" -n $np "$BIN/baton" demo --backend cuda --micro-batches 16 >"$LOG/demo$np.log" 2>&1
    rc=$?
    tail -n 4 "$LOG/demo$np.log"
    if grep -q "sees no CUDA device" "$LOG/demo$np.log"; then step "demo --backend cuda, $np ranks" SKIP "no CUDA device"
    elif [ $rc -eq 0 ] && grep -q "bitwise" "$LOG/demo$np.log"; then
        step "demo --backend cuda, $np ranks" PASS "$(grep -m1 -o 'throughput: [0-9.]* tokens/s' "$LOG/demo$np.log")"
    else step "demo --backend cuda, $np ranks" FAIL "rc $rc (see $LOG/demo$np.log)"; fi
done

# 7. GGUF models: every architecture, greedy, on the CPU and on CUDA
# (reported side by side: the GPU's kernels add in another order, so a
# near tie may pick another token), CUDA on 2 ranks against 1 (the same
# kernels in the same order: equal)
gen() { # out-file, ranks, backend, model
    timeout "$(lim 60)" "${MPIEXEC[@]}" -n "$2" "$BIN/baton" generate -m "$4" -p "The capital of France is" -n 24 \
        --temp 0 --backend "$3" -t 2 >"$1" 2>"$1.err"
}
for arch in llama qwen2 qwen3 qwen2moe qwen3moe olmoe gemma3 deepseek2; do
    m="$LOG/tiny-$arch.gguf"
    extra=()
    [ $arch = llama ] && extra=(--experts 4)
    [ $arch = gemma3 ] && extra=(--swa 8 --swa-pattern 2)
    if ! timeout "$(lim 60)" "$BIN/baton" make-model "$m" --vocab "$VOCAB" --arch $arch "${extra[@]}" >"$LOG/make-$arch.log" 2>&1; then
        step "model $arch" FAIL "make-model: $(tail -n 1 "$LOG/make-$arch.log")"
        continue
    fi
    gen "$LOG/gen-$arch-cpu.txt" 1 cpu "$m"; rcc=$?
    gen "$LOG/gen-$arch-cuda1.txt" 1 cuda "$m"; rc1=$?
    gen "$LOG/gen-$arch-cuda2.txt" 2 cuda "$m"; rc2=$?
    if grep -q "no CUDA device" "$LOG/gen-$arch-cuda1.txt.err"; then step "model $arch" SKIP "no CUDA device"
    elif [ $rcc -ne 0 ] || [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
        step "model $arch" FAIL "rc cpu $rcc, cuda $rc1 / $rc2: $(tail -n 1 "$LOG/gen-$arch-cuda1.txt.err" "$LOG/gen-$arch-cuda2.txt.err" | tr '\n' ' ' | cut -c1-160)"
    elif ! cmp -s "$LOG/gen-$arch-cuda1.txt" "$LOG/gen-$arch-cuda2.txt"; then
        step "model $arch" FAIL "CUDA 2 ranks differ from 1 rank"
    elif cmp -s "$LOG/gen-$arch-cpu.txt" "$LOG/gen-$arch-cuda1.txt"; then
        step "model $arch" PASS "CUDA 1 and 2 ranks equal; text equal to the CPU's"
    else
        step "model $arch" PASS "CUDA 1 and 2 ranks equal; text differs from the CPU's after $(cmp "$LOG/gen-$arch-cpu.txt" "$LOG/gen-$arch-cuda1.txt" | grep -o 'byte [0-9]*')"
    fi
    echo "-- $arch cpu:  $(head -c 200 "$LOG/gen-$arch-cpu.txt" | tr '\n' ' ')"
    echo "-- $arch cuda: $(head -c 200 "$LOG/gen-$arch-cuda1.txt" | tr '\n' ' ')"
    grep -h "tokens/s" "$LOG/gen-$arch-cuda1.txt.err" | head -n 2
done

# 7b. the server on CUDA (2 ranks sharing the GPU): 4 requests at once, each
# greedy text equal to `generate`'s on CUDA
m="$LOG/tiny-llama.gguf"
if [ -f "$m" ] && [ -s "$LOG/gen-llama-cuda1.txt" ]; then
    "${MPIEXEC[@]}" -n 2 "$BIN/baton" serve -m "$m" --backend cuda -t 2 --port 0 --parallel 4 >"$LOG/serve.out" 2>"$LOG/serve.err" &
    server=$!
    for _ in $(seq 1 300); do
        grep -q "listening on" "$LOG/serve.out" 2>/dev/null && break
        kill -0 $server 2>/dev/null || break
        sleep 0.1
    done
    line=$(grep "listening on" "$LOG/serve.out")
    if [ -z "$line" ]; then
        step "serve --backend cuda, 4 requests" FAIL "did not start: $(tail -n 2 "$LOG/serve.err" | tr '\n' ' ')"
    else
        port=$(sed -E 's/.*:([0-9]+) \(model.*/\1/' <<<"$line")
        pid0=$(sed -E 's/.*pid ([0-9]+)\).*/\1/' <<<"$line")
        timeout "$(lim 60)" python3 - "$port" "$LOG/gen-llama-cuda1.txt" "$(basename "$m")" >"$LOG/serve.check" 2>&1 <<'PY'
import json, sys, threading, urllib.request
port, ref, model = sys.argv[1], open(sys.argv[2]).read().strip(), sys.argv[3]
out = [None] * 4
def ask(i):
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 24, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    out[i] = json.load(urllib.request.urlopen(req, timeout=50))["choices"][0]["text"].strip()
th = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
[t.start() for t in th]
[t.join() for t in th]
same = all(o == ref for o in out)
print("equal to generate's" if same else f"differ: {out!r} vs {ref!r}")
sys.exit(0 if same else 1)
PY
        rc=$?
        kill -TERM "$pid0" 2>/dev/null
        wait $server 2>/dev/null
        if [ $rc -eq 0 ]; then step "serve --backend cuda, 4 requests" PASS "2 ranks; $(cat "$LOG/serve.check")"
        else step "serve --backend cuda, 4 requests" FAIL "$(tail -c 300 "$LOG/serve.check")"; fi
    fi
fi

# 8. the mul_mat benchmark (figures, not a pass/fail)
timeout "$(lim 90)" "$BIN/bench_cuda" 20 >"$LOG/bench.log" 2>&1
rc=$?
cat "$LOG/bench.log"
case $rc in
    0) step "mul_mat benchmark" PASS "figures in $LOG/bench.log" ;;
    77) step "mul_mat benchmark" SKIP "no CUDA device" ;;
    *) step "mul_mat benchmark" FAIL "rc $rc" ;;
esac

# 9. a Mixtral-shaped model (d 2048, 32/8 heads, 8 experts of 5632, top-2;
# 2 layers), F16 and Q8_0, on the GPU, as llama-bench measures
for type in f16 q8_0; do
    big="$LOG/mixtral2-$type.gguf"
    if ! timeout "$(lim 120)" "$BIN/baton" make-model "$big" --vocab "$VOCAB" --arch llama --layers 2 --embd 2048 \
            --heads 32 --heads-kv 8 --head-dim 64 --ff-exp 5632 --experts 8 --experts-used 2 --type $type \
            >"$LOG/make-big.log" 2>&1; then
        step "bench model --backend cuda, $type" FAIL "make-model: $(tail -n 1 "$LOG/make-big.log")"
        continue
    fi
    for np in 1 2; do
        timeout "$(lim 120)" "${MPIEXEC[@]}" -n $np "$BIN/baton" bench model -m "$big" -p 512 -n 128 -r 3 --backend cuda -t 2 \
            >"$LOG/bench-model-$type-$np.log" 2>&1
        rc=$?
        grep "^|" "$LOG/bench-model-$type-$np.log"
        if grep -q "sees no CUDA device" "$LOG/bench-model-$type-$np.log"; then
            step "bench model --backend cuda, $type, $np ranks" SKIP "no CUDA device"
        elif [ $rc -eq 0 ]; then
            step "bench model --backend cuda, $type, $np ranks" PASS "$(grep -o '[pt][pg][0-9]* *| *[0-9.]* ± [0-9.]*' "$LOG/bench-model-$type-$np.log" | tr -s ' ' | tr '\n' ';')"
        else
            step "bench model --backend cuda, $type, $np ranks" FAIL "rc $rc (see $LOG/bench-model-$type-$np.log)"
        fi
    done
    rm -f "$big"
done

echo
echo "==== summary ($(( $(date +%s) - T_START )) s) ===="
printf '%s\n' "${SUMMARY[@]}"
grep -E "^(decode|prompt)" "$LOG/bench.log" 2>/dev/null
exit $FAILED
