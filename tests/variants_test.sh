#!/usr/bin/env bash
# variants_test.sh BATON - a build of several CPU kernel variants
# (backends/cpu/cpu_variant.h) gives the same bits on each: the demo on two
# ranks whose kernels differ (BATON_CPU per rank: plain C and AVX2, AVX2 and
# the widest this CPU runs, AVX-512 without VNNI and AVX2 with AVX-VNNI
# beside them) must equal its
# one-rank run bitwise, for every
# weight type the demo has; and `baton version` names the variant forced.
# Skipped (77) where the CPU runs no AVX2 (nothing to mix).
set -u
baton=${1:?usage: variants_test.sh BATON}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_base_warn_component_unused=0
unset BATON_TOPOLOGY BATON_CPU
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # $tmp, ok, bad

if ! BATON_CPU=avx2 "$baton" version 2>/dev/null | grep -q "^cpu kernels: avx2 "; then
    echo "skipped: this build or CPU has no AVX2 variant"
    exit 77
fi
widest=$("$baton" version | sed -n 's/^cpu kernels: \([a-z0-9]*\) .*/\1/p')
# AVX-512 without VNNI, on a CPU that runs AVX-512 at all
pairs=("c avx2" "avx2 $widest")
variants=(c avx2 "$widest")
if BATON_CPU=avx512f "$baton" version 2>/dev/null | grep -q "^cpu kernels: avx512f "; then
    pairs+=("avx512f $widest" "avx2 avx512f")
    variants+=(avx512f)
fi
# AVX2 with AVX-VNNI's dots beside AVX2's
if BATON_CPU=avx2vnni "$baton" version 2>/dev/null | grep -q "^cpu kernels: avx2vnni "; then
    pairs+=("avx2 avx2vnni")
    variants+=(avx2vnni)
fi

for v in "${variants[@]}"; do
    if BATON_CPU=$v "$baton" version >"$tmp/out" 2>&1 && grep -q "^cpu kernels: $v " "$tmp/out"; then
        ok "BATON_CPU=$v: baton version names it"
    else
        bad "BATON_CPU=$v: baton version names another variant"
    fi
done

small=(--layers 4 --embd 256 --heads 4 --heads-kv 2 --head-dim 16 --ff 256 --ff-exp 64 --n-vocab 128 --tokens 16 --micro-batches 6)
for pair in "${pairs[@]}"; do
    set -- $pair
    for type in f32 f16 bf16 q8_0 q4_0 q5_0; do
        name="demo --type $type, rank 0 on $1, rank 1 on $2"
        timeout 300 mpirun -np 1 -x BATON_CPU="$1" "$baton" demo "${small[@]}" --type "$type" : \
            -np 1 -x BATON_CPU="$2" "$baton" demo "${small[@]}" --type "$type" >"$tmp/out" 2>&1
        rc=$?
        if [ "$rc" -eq 0 ] && grep -q "output equals a one-rank run .*bitwise" "$tmp/out"; then
            ok "$name"
        else
            bad "$name: exit $rc"
        fi
    done
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
