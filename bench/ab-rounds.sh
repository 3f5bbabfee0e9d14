#!/bin/bash
# ab-rounds.sh - two baton binaries side by side: `bench model` pp and tg on the same files, ranks and
# threads, in alternating rounds (the order swapped every round, so that neither always runs first);
# then per file and test the median t/s of each, their ratio (B / A) and the rounds B was ahead.  For
# a change meant to leave speed alone (or to raise it): this machine's memory bandwidth swings 10-50%
# from one minute to the next, so only medians of alternating rounds say anything.
# usage: bench/ab-rounds.sh ROUNDS BASELINE [FILE...]   (from the repository root)
#   BASELINE: the other baton binary (A); B: BATON (default build/baton)
#   default files: $MODELS/mixtral-{F16,Q8_0,Q4_0,Q4_K_M}.gguf (MODELS default build/bench-models,
#   written by bench/make-mixtral-models.sh)
#   NP ranks (default 1, under mpirun), THREADS per rank (default: 2 / NP), PP (default 512),
#   TG (default 64), REPS (default 2)
set -u
R=${1:?usage: bench/ab-rounds.sh ROUNDS BASELINE [FILE...]}; A=${2:?usage: bench/ab-rounds.sh ROUNDS BASELINE [FILE...]}
shift 2
case "$R" in '' | *[!0-9]* | 0) echo "bench/ab-rounds.sh: ROUNDS must be a positive number, not '$R'" >&2; exit 2 ;; esac
NP=${NP:-1}; T=${THREADS:-$((2 / NP > 0 ? 2 / NP : 1))}; PP=${PP:-512}; TG=${TG:-64}; REPS=${REPS:-2}
B=${BATON:-build/baton}; M=${MODELS:-build/bench-models}
[ $# -gt 0 ] || set -- "$M"/mixtral-F16.gguf "$M"/mixtral-Q8_0.gguf "$M"/mixtral-Q4_0.gguf "$M"/mixtral-Q4_K_M.gguf
for x in "$A" "$B"; do [ -x "$x" ] || { echo "bench/ab-rounds.sh: $x is not an executable" >&2; exit 1; }; done
for f in "$@"; do [ -r "$f" ] || { echo "bench/ab-rounds.sh: cannot read $f (bench/make-mixtral-models.sh writes them)" >&2; exit 1; }; done
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
# "ppN X tgN Y": the t/s of a llama-bench-style table's rows
run() {
  local pre=(); [ "$NP" -gt 1 ] && pre=(mpirun -np "$NP" --oversubscribe --mca pml ob1)
  "${pre[@]}" "$1" bench model -m "$2" -p "$PP" -n "$TG" -r "$REPS" -t "$T" 2>/dev/null |
    awk -F'|' '/\| *(pp|tg)[0-9]+ *\|/ { gsub(/ /, "", $(NF-2)); split($(NF-1), v, " "); printf "%s %s ", $(NF-2), v[1] }'
}
echo "pp$PP tg$TG, $NP rank(s) x $T thread(s), $REPS reps a run, $R rounds; A $A, B $B; $(uptime)"
for r in $(seq 1 "$R"); do
  for f in "$@"; do
    if [ $((r % 2)) = 1 ]; then a=$(run "$A" "$f"); b=$(run "$B" "$f"); else b=$(run "$B" "$f"); a=$(run "$A" "$f"); fi
    [ -n "$a" ] && [ -n "$b" ] || { echo "bench/ab-rounds.sh: round $r, $(basename "$f"): a run printed no rows" >&2; exit 1; }
    echo "round $r $(basename "$f" .gguf): A $a B $b"
    echo "$(basename "$f" .gguf) A $a" >> "$OUT"; echo "$(basename "$f" .gguf) B $b" >> "$OUT"
  done
done
echo "summary (median t/s over $R rounds; the median of the rounds' ratios B / A; rounds B ahead):"
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for f in "$@"; do
  n=$(basename "$f" .gguf)
  for col in 4 6; do
    test=$(awk -v n="$n" -v c="$col" '$1 == n { print $(c - 1); exit }' "$OUT")
    col_of() { awk -v n="$n" -v c="$col" -v s="$1" '$1 == n && $2 == s { print $c }' "$OUT"; }
    ma=$(col_of A | med); mb=$(col_of B | med)
    ratios=$(paste <(col_of A) <(col_of B))
    mr=$(echo "$ratios" | awk '{ print $2 / $1 }' | med)
    ahead=$(echo "$ratios" | awk '$2 > $1 { k++ } END { print k + 0 }')
    printf "%-18s %-6s A %8.2f  B %8.2f  ratio %.3f  B ahead %d/%d\n" "$n" "$test" "$ma" "$mb" "$mr" "$ahead" "$R"
  done
done
