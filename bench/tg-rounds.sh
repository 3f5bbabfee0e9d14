#!/bin/bash
# One-rank generation against llama.cpp in alternating rounds: llama-bench and `baton bench model`
# on the same file and threads, tg N (-r REPS each), the order swapped every round so that neither
# side always runs first; then per file the ratio of each round (baton / llama.cpp), their median
# and geometric mean, and how many rounds baton was ahead.  On this kind of machine a decode step
# of both engines runs at the memory bandwidth, which swings 10-50% from one minute to the next:
# a single pair of runs decides nothing, the median of many rounds does.
# usage: bench/tg-rounds.sh ROUNDS [FILE...]   (from the repository root, build/ built)
#   default files: $MODELS/mixtral-{F16,Q8_0,Q4_0,Q4_K_M}.gguf (bench/make-mixtral-models.sh)
#   THREADS (default 2), N (default 64), REPS (default 2), BATON (default build/baton),
#   LLAMA_BIN (llama.cpp's build/bin, required); P=512: the prompt row pp512 instead of tgN
set -u
R=${1:?usage: bench/tg-rounds.sh ROUNDS [FILE...]}; shift
case "$R" in '' | *[!0-9]* | 0) echo "bench/tg-rounds.sh: ROUNDS must be a positive number, not '$R'" >&2; exit 2 ;; esac
T=${THREADS:-2}; N=${N:-64}; REPS=${REPS:-2}; B=${BATON:-build/baton}; P=${P:-0}
case "$P" in '' | *[!0-9]*) echo "bench/tg-rounds.sh: P must be a number of prompt tokens, not '$P'" >&2; exit 2 ;; esac
if [ "$P" != 0 ]; then ROW=pp$P; PN="-p $P -n 0"; else ROW=tg$N; PN="-p 0 -n $N"; fi
LB=${LLAMA_BIN:?set LLAMA_BIN to the build/bin of llama.cpp (bench/llama.sh builds it and prints the line)}/llama-bench
M=${MODELS:-build/bench-models}
[ $# -gt 0 ] || set -- "$M"/mixtral-F16.gguf "$M"/mixtral-Q8_0.gguf "$M"/mixtral-Q4_0.gguf "$M"/mixtral-Q4_K_M.gguf
[ -x "$LB" ] || { echo "bench/tg-rounds.sh: $LB is missing (set LLAMA_BIN to llama.cpp's build/bin)" >&2; exit 1; }
[ -x "$B" ] || { echo "bench/tg-rounds.sh: $B is missing (build first, or set BATON)" >&2; exit 1; }
for f in "$@"; do [ -r "$f" ] || { echo "bench/tg-rounds.sh: cannot read $f" >&2; exit 1; }; done
OUT=$(mktemp); trap 'rm -f "$OUT"' EXIT
# the t/s of the ROW row of a llama-bench-style table
tps() { "$@" 2>/dev/null | grep -E "\| *$ROW *\|" | awk -F'|' '{print $(NF-1)}' | awk '{print $1}'; }
# shellcheck disable=SC2086
run_llama() { tps "$LB" -m "$1" $PN -r "$REPS" -t "$T"; }
# shellcheck disable=SC2086
run_baton() { tps "$B" bench model -m "$1" $PN -r "$REPS" -t "$T"; }
echo "$ROW, $T threads, $REPS reps a run, $R rounds; $(uptime)"
for r in $(seq 1 "$R"); do
  for f in "$@"; do
    if [ $((r % 2)) = 1 ]; then a=$(run_llama "$f"); b=$(run_baton "$f"); else b=$(run_baton "$f"); a=$(run_llama "$f"); fi
    [ -n "$a" ] && [ -n "$b" ] || { echo "bench/tg-rounds.sh: round $r, $(basename "$f"): a run gave no $ROW row" >&2; exit 1; }
    echo "round $r $(basename "$f" .gguf): llama.cpp $a baton $b ratio $(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", b / a}')"
    echo "$(basename "$f" .gguf) $a $b" >> "$OUT"
  done
done
echo "summary (baton / llama.cpp $ROW t/s):"
for f in "$@"; do
  n=$(basename "$f" .gguf)
  awk -v n="$n" '$1 == n { r[++k] = $3 / $2; g += log($3 / $2); if ($3 > $2) w++ }
    END { for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
          med = k % 2 ? r[(k + 1) / 2] : (r[k / 2] + r[k / 2 + 1]) / 2
          printf "%-16s median %.3f  geomean %.3f  min %.3f  max %.3f  ahead in %d of %d rounds\n", n, med, exp(g / k), r[1], r[k], w, k }' "$OUT"
done
