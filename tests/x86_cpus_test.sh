#!/usr/bin/env bash
# x86_cpus_test.sh BATON VOCAB - the portable x86-64 binary (BATON_NATIVE=OFF,
# every CPU kernel variant in it) on CPUs narrower than this one, emulated by
# qemu-user: an x86-64-v2 CPU (Nehalem: SSE4.2, no AVX) and an AVX2-only one
# (Haswell: AVX2, FMA, F16C; no AVX-512, no AVX-VNNI).  On each, without
# BATON_CPU, the binary must start (no SIGILL), pick the variant that CPU
# runs (c, avx2) from CPUID, generate the same tokens with the same logits
# bit for bit as this CPU's widest variant, and take part as rank 1 of a
# two-rank job whose rank 0 runs natively, the per-rank table naming rank
# 1's variant; and `--json` names each rank's backend.  Correctness only:
# emulated speed says nothing.
# Skipped (77) without qemu-x86_64 or where the binary holds no AVX2 variant.
set -u
baton=${1:?usage: x86_cpus_test.sh BATON VOCAB}
vocab=${2:?usage: x86_cpus_test.sh BATON VOCAB}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
# qemu-user has no process_vm_readv: shared-memory transfers without single-copy
export OMPI_MCA_btl_vader_single_copy_mechanism=none
unset BATON_TOPOLOGY BATON_CPU
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # $tmp, ok, bad

qemu=$(command -v qemu-x86_64 || true)
if [ -z "$qemu" ] || [ "$(uname -m)" != x86_64 ]; then
    echo "skipped: no qemu-x86_64 on an x86-64 host"
    exit 77
fi
if ! "$baton" version 2>/dev/null | grep -q "^cpu kernels: .*(built: .*avx2"; then
    echo "skipped: this binary holds no AVX2 variant (BATON_NATIVE=ON or BATON_CPU_VARIANTS=OFF)"
    exit 77
fi

if ! timeout 120 "$baton" make-model "$tmp/m.gguf" --vocab "$vocab" --type q8_0 --layers 3 >"$tmp/out" 2>&1; then
    bad "make-model"
    echo "$passed passed, $failed failed"
    exit 1
fi
gen=(generate -m "$tmp/m.gguf" -p "The quick brown fox" -n 6 --temp 0 --dump-tensors result_output)
if timeout 300 "$baton" "${gen[@]}" >"$tmp/native" 2>&1 && logits_summary "$tmp/native" >"$tmp/want" &&
    grep -q digest "$tmp/want"; then
    ok "native run ($("$baton" version | sed -n 's/^cpu kernels: \([a-z0-9]*\) .*/\1/p'))"
else
    cp "$tmp/native" "$tmp/out"
    bad "native run"
fi

# --json names each rank's variant too (here both ranks on this CPU, forced)
timeout 300 mpirun -np 1 -x BATON_CPU=c "$baton" "${gen[@]}" --json : -np 1 -x BATON_CPU=avx2 "$baton" "${gen[@]}" \
    --json >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 0 ] && python3 -c '
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
b = [r["backend"] for r in d["per_rank"]]
assert b[0].startswith("CPU(c)@") and b[1].startswith("CPU(avx2)@"), b' "$tmp/out"; then
    ok "two ranks forced to c and avx2: --json names each rank's backend"
else
    bad "two ranks forced to c and avx2: exit $rc, or --json's per_rank backends wrong"
fi

for pair in "Nehalem c" "Haswell avx2"; do
    set -- $pair
    cpu=$1 want=$2
    if timeout 120 "$qemu" -cpu "$cpu" "$baton" version >"$tmp/out" 2>&1 && grep -q "^cpu kernels: $want " "$tmp/out"; then
        ok "$cpu: baton version runs and picks $want"
    else
        bad "$cpu: baton version does not pick $want"
    fi
    timeout 600 "$qemu" -cpu "$cpu" "$baton" "${gen[@]}" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && logits_summary "$tmp/out" | cmp -s - "$tmp/want"; then
        ok "$cpu: generate gives this CPU's logits and tokens bitwise"
    else
        bad "$cpu: generate: exit $rc, or logits or tokens differ"
    fi
    timeout 600 mpirun -np 1 "$baton" "${gen[@]}" : -np 1 "$qemu" -cpu "$cpu" "$baton" "${gen[@]}" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && logits_summary "$tmp/out" | cmp -s - "$tmp/want" &&
        grep -Eq "^ +1 .* CPU\($want\)@" "$tmp/out"; then
        ok "$cpu: rank 1 there, rank 0 here: one rank's logits and tokens, the table names CPU($want)"
    else
        bad "$cpu: two ranks: exit $rc, or logits, tokens or the table's backend differ"
    fi
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
