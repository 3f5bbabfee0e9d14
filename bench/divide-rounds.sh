#!/bin/bash
# divide-rounds.sh - one model on two ranks of this machine, four ways, against one process on the
# same cores, in alternating rounds: `bench model` pp and tg as
#   one       one process, 2 threads
#   pipeline  2 ranks x 1 thread, a two-stage pipeline (partition: auto)
#   experts   2 ranks x 1 thread, one expert group (rank 0 runs the layers, the routed experts divided)
#   all       2 ranks x 1 thread, one expert group that divides every dense product's rows as well
#             (pipeline.divide: all)
#   balanced  as all, the ranks' experts overlapping by OVERLAP (pipeline.expert_overlap): the first
#             rank balances each layer's routed pairs between the ranks per ubatch
#   tokens    as balanced, the dense products divided by a prompt's tokens instead of rows (each rank
#             holds the dense weights whole; pipeline.divide: tokens)
# then per file, layout and test the median t/s and its ratio to `one`.  Both ranks share this
# machine's cores and memory bandwidth: what separate hosts would add (a second host's bandwidth)
# cannot show here; what a layout costs in transfers and in work left undivided can.
# usage: bench/divide-rounds.sh ROUNDS [FILE...]   (from the repository root)
#   default files: $MODELS/mixtral-Q4_0.gguf (MODELS default build/bench-models)
#   LAYOUTS (default "one pipeline experts all"), PP (default 512), TG (default 64), REPS (default 2),
#   UBATCH (default: bench model's), BATON (default build/baton), OVERLAP (default 4)
#   BASELINE: a second binary (an older build, copied away first); a layout named LAYOUT@base runs
#   LAYOUT with it, in the same rounds: LAYOUTS="one balanced balanced@base" BASELINE=/tmp/baton-old
set -u
R=${1:?usage: bench/divide-rounds.sh ROUNDS [FILE...]}
shift
case "$R" in '' | *[!0-9]* | 0) echo "bench/divide-rounds.sh: ROUNDS must be a positive number, not '$R'" >&2; exit 2 ;; esac
PP=${PP:-512}; TG=${TG:-64}; REPS=${REPS:-2}; B=${BATON:-build/baton}; M=${MODELS:-build/bench-models}
LAYOUTS=${LAYOUTS:-one pipeline experts all}
[ $# -gt 0 ] || set -- "$M"/mixtral-Q4_0.gguf
[ -x "$B" ] || { echo "bench/divide-rounds.sh: $B is not an executable" >&2; exit 1; }
B=$(cd "$(dirname "$B")" && pwd)/$(basename "$B") # launch/baton-run runs this one too (BATON_BIN)
BASE=
case " $LAYOUTS " in *@base\ *)
    BASE=${BASELINE:-}
    [ -n "$BASE" ] || {
        echo "bench/divide-rounds.sh: a layout LAYOUT@base needs BASELINE, a second binary" >&2
        exit 2
    }
    [ -x "$BASE" ] || { echo "bench/divide-rounds.sh: $BASE is not an executable" >&2; exit 1; }
    BASE=$(cd "$(dirname "$BASE")" && pwd)/$(basename "$BASE") ;;
esac
for f in "$@"; do [ -r "$f" ] || { echo "bench/divide-rounds.sh: cannot read $f" >&2; exit 1; }; done
here=$(cd "$(dirname "$0")/.." && pwd)
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
topo() { # topo NAME PIPELINE-LINES
  printf 'hosts:\n  - {name: localhost, slots: 2}\nranks:\n  - {rank: 0, host: localhost, backend: cpu, threads: 1}\n  - {rank: 1, host: localhost, backend: cpu, threads: 1}\npipeline:\n  micro_batches: 2\n%bmpi:\n  pml: ob1\n' "$2" >"$work/$1.yaml"
}
topo pipeline '  partition: auto\n'
topo experts '  partition: auto\n  expert_groups: [[0, 1]]\n'
topo all '  partition: auto\n  expert_groups: [[0, 1]]\n  divide: all\n'
topo balanced "  partition: auto\n  expert_groups: [[0, 1]]\n  divide: all\n  expert_overlap: ${OVERLAP:-4}\n"
topo tokens "  partition: auto\n  expert_groups: [[0, 1]]\n  divide: tokens\n  expert_overlap: ${OVERLAP:-4}\n"
ub=(); [ -n "${UBATCH:-}" ] && ub=(--ubatch "$UBATCH")
# "ppN X tgN Y": the t/s of a llama-bench-style table's rows
run() { # run LAYOUT FILE
  local b=$B l=$1
  case "$l" in *@base) b=$BASE l=${l%@base} ;; esac
  local cmd=("$b" bench model -m "$2" -p "$PP" -n "$TG" -r "$REPS" "${ub[@]}")
  if [ "$l" = one ]; then "${cmd[@]}" -t 2; else BATON_BIN="$b" "$here/launch/baton-run" -t "$work/$l.yaml" -- "${cmd[@]}"; fi 2>/dev/null |
    awk -F'|' '/\| *(pp|tg)[0-9]+ *\|/ { gsub(/ /, "", $(NF-2)); split($(NF-1), v, " "); printf "%s %s ", $(NF-2), v[1] }'
}
OUT=$work/rows
echo "pp$PP tg$TG, $REPS reps a run, $R rounds, layouts: $LAYOUTS; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $(uptime)"
for r in $(seq 1 "$R"); do
  set -- "$@"
  order=$LAYOUTS; [ $((r % 2)) = 0 ] && order=$(echo "$LAYOUTS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for f in "$@"; do
    for l in $order; do
      x=$(run "$l" "$f")
      [ -n "$x" ] || { echo "bench/divide-rounds.sh: round $r, $(basename "$f"), $l: the run printed no rows" >&2; exit 1; }
      echo "round $r $(basename "$f" .gguf) $l: $x"
      echo "$(basename "$f" .gguf) $l $x" >>"$OUT"
    done
  done
done
echo "summary (median t/s over $R rounds; ratio to one process, 2 threads):"
python3 - "$OUT" <<'EOF'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    w = line.split()
    for i in range(2, len(w) - 1, 2):
        rows[(w[0], w[i], w[1])].append(float(w[i + 1]))
for (f, test, lay), v in sorted(rows.items()):
    one = rows.get((f, test, "one"))
    ratio = statistics.median(v) / statistics.median(one) if one else float("nan")
    print(f"  {f} {test} {lay}: {statistics.median(v):.1f} t/s ({' '.join(f'{x:.1f}' for x in v)}), {ratio:.2f} of one")
for (f, test, lay), v in sorted(rows.items()):
    base = rows.get((f, test, lay + "@base"))
    if base and len(base) == len(v):
        r = [a / b for a, b in zip(v, base)]
        print(f"  {f} {test} {lay} / {lay}@base, round by round: {' '.join(f'{x:.3f}' for x in r)} "
              f"(median {statistics.median(r):.3f}, ahead in {sum(x > 1 for x in r)} of {len(r)})")
EOF
