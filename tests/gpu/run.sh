#!/usr/bin/env bash
# tests/gpu/run.sh - every GPU check of baton in one go (about 5 minutes on
# an H200; each step has its own time limit, cut to what is left of 470 s,
# so the whole stays under 8 minutes):
#   1. build with CUDA (and NCCL when found) in build-gpu/
#   2. ctest -L gpu: every op against the CPU (FLASH_ATTN included), events,
#      copies, every node of the llama-family graphs accepted, the
#      scheduler's split example on [CUDA, CPU], NCCL with one rank
#   3. NCCL single-rank on its own (CK_RUN_CASE=nccl)
#   4. the pipeline with a CUDA backend per rank, both ranks on one GPU,
#      transfers staged over MPI through pinned memory: mpiexec -n 2 bitwise
#      equal to -n 1 (an MLP model and a top-k MoE model)
#   5. the pipeline with the NCCL device transport: one rank bitwise equal to
#      the MPI run; two ranks on one GPU end with NCCL's refusal as one clear
#      error on every rank, not a hang (with two GPUs or more: bitwise equal)
#   6. the mul_mat benchmark (decode and prompt shapes) against the peaks
#   7. `baton demo --backend cuda` on one rank and on two ranks sharing the GPU
# and a summary.  Exit status: 0 when every step passed (or was skipped for
# want of a device), 1 otherwise.
#
#   bash tests/gpu/run.sh [build-dir]
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-$ROOT/build-gpu}"
JOBS="$(nproc 2>/dev/null || echo 4)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
       OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
declare -a SUMMARY=()
FAILED=0
T_START=$(date +%s)
DEADLINE=$((T_START + 470)) # the whole script stays under 8 minutes

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

# 1. build
if timeout "$(lim 300)" cmake -S "$ROOT" -B "$BUILD" -DBATON_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$BUILD.configure.log" 2>&1 &&
   timeout "$(lim 300)" cmake --build "$BUILD" -j"$JOBS" --target test_cuda test_cuda_support bench_cuda mpi_cuda_pipeline baton_cli >"$BUILD.build.log" 2>&1; then
    step "build (CUDA sm_90)" PASS "$(grep -o 'NCCL transport ON' "$BUILD.configure.log" || echo 'NCCL off')"
else
    tail -30 "$BUILD.configure.log" "$BUILD.build.log" 2>/dev/null
    step "build (CUDA sm_90)" FAIL "see $BUILD.build.log"
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
fi

# 2. the op suite
(cd "$BUILD" && timeout "$(lim 240)" ctest -L gpu --output-on-failure) >"$BUILD.ctest.log" 2>&1
rc=$?
cat "$BUILD.ctest.log"
if grep -q "Not Run\|\*\*\*Skipped\|Skipped" "$BUILD.ctest.log" && ! grep -q "Failed" "$BUILD.ctest.log"; then
    step "ctest -L gpu (ops vs CPU, sched)" SKIP "no CUDA device"
elif [ $rc -eq 0 ]; then
    step "ctest -L gpu (ops vs CPU, sched)" PASS "$(grep -o '[0-9]*% tests passed.*' "$BUILD.ctest.log")"
else
    step "ctest -L gpu (ops vs CPU, sched)" FAIL "see $BUILD.ctest.log"
fi

# 3. NCCL, one rank sending to itself
if grep -q "NCCL transport ON" "$BUILD.configure.log"; then
    CK_RUN_CASE=nccl timeout "$(lim 120)" "$BUILD/test_cuda" >"$BUILD.nccl.log" 2>&1
    rc=$?
    cat "$BUILD.nccl.log"
    case $rc in
        0) step "NCCL single rank (send to self)" PASS "" ;;
        77) step "NCCL single rank (send to self)" SKIP "no CUDA device" ;;
        *) step "NCCL single rank (send to self)" FAIL "rc $rc" ;;
    esac
else
    step "NCCL single rank (send to self)" SKIP "NCCL not found at configure time"
fi

# 4. the staged two-rank pipeline on one GPU, bitwise equal to one rank
for kind in mlp moe-topk; do
    out1="$BUILD/pipe_${kind}_np1.bin" out2="$BUILD/pipe_${kind}_np2.bin"
    rm -f "$out1" "$out2"
    timeout "$(lim 90)" mpiexec -n 1 --oversubscribe "$BUILD/mpi_cuda_pipeline" "$out1" "$kind" 6 2 >"$BUILD.pipe1.log" 2>&1
    rc1=$?
    timeout "$(lim 90)" mpiexec -n 2 --oversubscribe "$BUILD/mpi_cuda_pipeline" "$out2" "$kind" 6 2 >"$BUILD.pipe2.log" 2>&1
    rc2=$?
    tail -n 3 "$BUILD.pipe1.log" "$BUILD.pipe2.log"
    if [ $rc1 -eq 77 ] || [ $rc2 -eq 77 ]; then
        step "pipeline np2 == np1 ($kind)" SKIP "no CUDA device"
    elif [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
        step "pipeline np2 == np1 ($kind)" FAIL "rc $rc1 / $rc2 (see $BUILD.pipe*.log)"
    elif cmp -s "$out1" "$out2"; then
        step "pipeline np2 == np1 ($kind)" PASS "$(stat -c %s "$out1") bytes of logits, bitwise equal"
    else
        step "pipeline np2 == np1 ($kind)" FAIL "logits differ: $(cmp "$out1" "$out2" | head -1)"
    fi
done

# 5. the NCCL device transport
if grep -q "NCCL transport ON" "$BUILD.configure.log"; then
    ref="$BUILD/pipe_moe-topk_np1.bin" out1="$BUILD/pipe_nccl_np1.bin" out2="$BUILD/pipe_nccl_np2.bin"
    rm -f "$out1" "$out2"
    timeout "$(lim 90)" mpiexec -n 1 "$BUILD/mpi_cuda_pipeline" "$out1" moe-topk 6 2 nccl >"$BUILD.nccl1.log" 2>&1
    rc=$?
    tail -n 3 "$BUILD.nccl1.log"
    if [ $rc -eq 77 ]; then step "pipeline with NCCL, 1 rank" SKIP "no CUDA device"
    elif [ $rc -eq 0 ] && cmp -s "$ref" "$out1"; then step "pipeline with NCCL, 1 rank" PASS "bitwise equal to the MPI run"
    else step "pipeline with NCCL, 1 rank" FAIL "rc $rc (see $BUILD.nccl1.log)"; fi
    n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
    timeout "$(lim 120)" mpiexec -n 2 "$BUILD/mpi_cuda_pipeline" "$out2" moe-topk 6 2 nccl >"$BUILD.nccl2.log" 2>&1
    rc=$?
    tail -n 6 "$BUILD.nccl2.log"
    if [ $rc -eq 77 ]; then step "pipeline with NCCL, 2 ranks" SKIP "no CUDA device"
    elif [ "$n_gpu" -ge 2 ]; then
        if [ $rc -eq 0 ] && cmp -s "$ref" "$out2"; then step "pipeline with NCCL, 2 ranks" PASS "2 GPUs, bitwise equal"
        else step "pipeline with NCCL, 2 ranks" FAIL "rc $rc (see $BUILD.nccl2.log)"; fi
    elif [ $rc -eq 124 ]; then step "pipeline with NCCL, 2 ranks on 1 GPU" FAIL "hung (timeout)"
    elif [ $rc -ne 0 ] && grep -q "NCCL channel" "$BUILD.nccl2.log"; then
        step "pipeline with NCCL, 2 ranks on 1 GPU" PASS "refused with one message: $(grep -m1 -o 'NCCL channel.*' "$BUILD.nccl2.log" | cut -c1-90)"
    else step "pipeline with NCCL, 2 ranks on 1 GPU" FAIL "rc $rc without NCCL's refusal (see $BUILD.nccl2.log)"; fi
else
    step "pipeline with NCCL" SKIP "NCCL not found at configure time"
fi

# 6. the benchmark (figures, not a pass/fail)
timeout "$(lim 150)" "$BUILD/bench_cuda" 20 >"$BUILD.bench.log" 2>&1
rc=$?
cat "$BUILD.bench.log"
case $rc in
    0) step "mul_mat benchmark" PASS "figures in $BUILD.bench.log" ;;
    77) step "mul_mat benchmark" SKIP "no CUDA device" ;;
    *) step "mul_mat benchmark" FAIL "rc $rc" ;;
esac

# 7. the demo on the GPU: one rank, then two ranks sharing it (MPI, pinned staging)
for np in 1 2; do
    timeout "$(lim 120)" mpiexec -n $np "$BUILD/baton" demo --backend cuda -m 16 >"$BUILD.demo$np.log" 2>&1
    rc=$?
    tail -n 4 "$BUILD.demo$np.log"
    if grep -q "sees no CUDA device" "$BUILD.demo$np.log"; then step "demo --backend cuda, $np ranks" SKIP "no CUDA device"
    elif [ $rc -eq 0 ] && grep -q "bitwise" "$BUILD.demo$np.log"; then
        step "demo --backend cuda, $np ranks" PASS "$(grep -m1 -o 'throughput: [0-9.]* tokens/s' "$BUILD.demo$np.log")"
    else step "demo --backend cuda, $np ranks" FAIL "rc $rc (see $BUILD.demo$np.log)"; fi
done

echo
echo "==== summary ($(( $(date +%s) - T_START )) s) ===="
printf '%s\n' "${SUMMARY[@]}"
grep -E "^(decode|prompt)" "$BUILD.bench.log" 2>/dev/null
exit $FAILED
