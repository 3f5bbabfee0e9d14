#!/bin/bash
# Every row of `baton bench ops` that llama.cpp's test-backend-ops also times, both tools back to
# back per row group, in rounds: per round and group (decode, prompt n 512, MUL_MAT_ID at 1, 32
# and 512 tokens) test-backend-ops and `bench ops` on the same shapes and types, the order swapped
# every round so that neither side always runs first.  Then one table: per row the median GFLOP/s
# of each side over the rounds, their ratio (baton / llama.cpp) and the rounds baton was ahead.
# test-backend-ops times an op on one copy of its weights, read again every call: a decode row's
# matrix (m 4096 k 14336: 19 MB in Q2_K to 235 MB in F32) stays in a last-level cache that holds it (a 260 MB Xeon's; partly a
# 32 MB Zen 4 CCD's), so baton's decode rows run `bench ops --cached` (one copy too) unless
# STREAM=1 (baton's rows from memory, its default; not comparable where the cache holds the
# matrix).  Rows read at the memory's or the cache's bandwidth, which swings 10-50% from one
# minute to the next: a pair run seconds apart, many rounds, and medians compare them; a single
# pass does not.
# usage: bench/ops-rounds.sh ROUNDS   (from the repository root, build/ built; a quiet machine)
#   THREADS (default 2: wall-clock GFLOP/s; 1: GFLOP per CPU-second on both sides), BATON
#   (default build/baton), BATON_FLAGS (extra `bench ops` flags, e.g. --repacked), LLAMA_BIN
#   (llama.cpp's build/bin, required), STREAM=1 (baton's decode rows from memory), TYPES (default
#   f32,f16,bf16,q8_0,q4_0,q4_K,q6_K; MUL_MAT_ID rows for those among f32,f16,q8_0,q4_0,q4_K,q6_K,
#   iq2_xs,iq4_xs: the types test-backend-ops times at that shape), ROWGROUPS
#   (default "dec pp id1 id32 id512": the row groups to run)
set -u
NAME=bench/ops-rounds.sh
R=${1:?usage: bench/ops-rounds.sh ROUNDS}
case "$R" in '' | *[!0-9]* | 0) echo "$NAME: ROUNDS must be a positive number, not '$R'" >&2; exit 2 ;; esac
T=${THREADS:-2}
[ "$T" = 1 ] || [ "$T" = 2 ] || { echo "$NAME: THREADS must be 1 or 2" >&2; exit 2; }
B=${BATON:-build/baton}
[ -x "$B" ] || { echo "$NAME: $B is missing (build first, or set BATON)" >&2; exit 1; }
TYPES=${TYPES:-f32,f16,bf16,q8_0,q4_0,q4_K,q6_K}
ROWGROUPS=${ROWGROUPS:-dec pp id1 id32 id512}
for g in $ROWGROUPS; do
  case "$g" in dec | pp | id1 | id32 | id512) ;; *) echo "$NAME: ROWGROUPS: unknown group '$g' (dec, pp, id1, id32, id512)" >&2; exit 2 ;; esac
done
IDTYPES=$(echo "$TYPES" | tr ',' '\n' | grep -xE 'f32|f16|q8_0|q4_0|q4_K|q6_K|iq2_xs|iq4_xs' | paste -sd,)
# shellcheck source=bench/llama-shims.sh
source "$(dirname "${BASH_SOURCE[0]}")/llama-shims.sh" # $L, $PRE, $W (removed at exit)
alt() { echo "$1" | tr ',' '|'; }
# "row type GFLOPS" lines of test-backend-ops: rows dec, pp (MUL_MAT n 1, 512), id1, id32, id512
# (a six-character figure follows its colour code with no space: a space or that 'm' before it)
llama_rows() {
  LD_PRELOAD="$PRE" "$L" perf -b CPU "$@" 2>&1 | grep -E '^ *MUL_MAT' |
    sed -E 's/^ *(MUL_MAT(_ID)?)\(type_a=([a-z0-9_A-Z]+).*,n=([0-9]+),.*[ m]([0-9.]+) GFLOPS.*/\1 \4 \3 \5/' |
    awk '{ r = ($1 == "MUL_MAT") ? ($2 == 1 ? "dec" : "pp") : "id" $2; print r, $3, $4 }'
}
# the same from `bench ops` (GFLOP/s at 2 threads, GF/cpu-s at 1)
baton_rows() {
  # shellcheck disable=SC2086
  "$B" bench ops --threads "$T" --quick --reps "${REPS:-9}" ${BATON_FLAGS:-} "$@" 2>&1 | grep -E '^mul_mat' |
    awk -v c1="$([ "$T" = 1 ] && echo 1 || echo 0)" '{
      r = "dec"; for (i = 3; i <= NF; i++) { if ($i == "n=512") r = "pp"; if ($i ~ /^tok=/) r = "id" substr($i, 5) }
      print r, $2, (c1 ? $NF : $(NF - 4)) }'
}
group() { # group r side: that group's rows of one side
  case "$1" in
    dec | pp)
      local n=1; [ "$1" = pp ] && n=512
      if [ "$3" = llama ]; then
        llama_rows -o MUL_MAT -p "type_a=($(alt "$TYPES")),type_b=f32,m=4096,n=$n,k=14336,bs=\\[1,1\\]"
      else
        if [ "$1" = dec ]; then
          # shellcheck disable=SC2046
          baton_rows --types "$TYPES" --shapes decode $([ "${STREAM:-0}" = 1 ] || echo --cached)
        else
          baton_rows --types "$TYPES" --shapes prompt
        fi
      fi ;;
    id*)
      [ -n "$IDTYPES" ] || return 0
      if [ "$3" = llama ]; then
        llama_rows -o MUL_MAT_ID -p "type_a=($(alt "$IDTYPES")),type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=${1#id},k=2048"
      else
        baton_rows --types "$IDTYPES" --shapes "moe${1#id}"
      fi ;;
  esac | awk -v r="$2" -v s="$3" '{ print r, s, $1 "-" $2, $3 }'
}
echo "$R rounds, types $TYPES; $B bench ops ${BATON_FLAGS:-}"
for r in $(seq 1 "$R"); do
  for g in $ROWGROUPS; do
    if [ $((r % 2)) = 1 ]; then group "$g" "$r" llama; group "$g" "$r" baton
    else group "$g" "$r" baton; group "$g" "$r" llama; fi
  done | tee -a "$W/rows"
done
echo
echo "row          llama.cpp      baton  baton/llama  rounds ahead   (median GFLOP/s of $R rounds)"
awk '
  { v[$3, $2, $1] = $4; if (!($3 in rows)) ord[++nr] = $3; rows[$3] = 1; rounds[$1] = 1 }
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    for (o = 1; o <= nr; o++) {
        row = ord[o]
        nl = nb = k = w = 0; delete L; delete Bv
        for (r in rounds) {
          if (!(((row, "llama", r) in v) && ((row, "baton", r) in v))) continue
          L[++nl] = v[row, "llama", r]; Bv[++nb] = v[row, "baton", r]; k++
          if (v[row, "baton", r] > v[row, "llama", r]) w++
        }
        if (!k) { printf "%-12s %s\n", row, "(one side gave no figure)"; continue }
        ml = median(L, nl); mb = median(Bv, nb)
        printf "%-12s %9.1f  %9.1f  %11.2f  %6d of %d\n", row, ml, mb, mb / ml, w, k
      }
  }' "$W/rows"
