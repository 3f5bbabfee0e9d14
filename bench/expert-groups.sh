#!/usr/bin/env bash
# expert-groups.sh - one sequence's decode (tgN, `baton bench model`) with the
# routed experts divided between two hosts in one expert group, against a
# two-stage pipeline on the same two hosts and against one process on the
# same cores, for each link class; then each run's time per token, per rank:
# expert compute, other compute, waits (the transfers), bytes.
#
# The hosts are network namespaces of this machine (launch/netns.sh, needs
# root), one rank each, one thread each; the one process runs on host 0 with
# two threads.  On one machine the hosts share its memory bandwidth and its
# cores: the speed-up a group gives on separate machines cannot show; the
# split of the time and the bytes can.  Runs alternate (one, pipeline, group)
# round by round.
#
#   bench/expert-groups.sh [CLASSES]     (default "none 25g"; from none 100g 25g 1g)
#
# Environment: BATON (default build/baton), MODELS (default build/bench-models:
# the Mixtral-shaped Q4_0 file of bench/make-mixtral-models.sh, and a
# DeepSeek-shaped one this script makes there: 64 routed experts of 704, 6 a
# token, a shared expert, Q4_0), N (tokens, default 64), REPS (default 3),
# ROUNDS (default 2).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
baton=${BATON:-$here/build/baton}
models=${MODELS:-$here/build/bench-models}
n=${N:-64}
reps=${REPS:-3}
rounds=${ROUNDS:-2}
classes=${1:-none 25g}
[ -x "$baton" ] || { echo "expert-groups.sh: $baton is not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "expert-groups.sh: network namespaces need root" >&2; exit 1; }
mkdir -p "$models"
[ -s "$models/mixtral-Q4_0.gguf" ] || bash "$here/bench/make-mixtral-models.sh" "$models" "$baton"
ds=$models/deepseek-shaped-Q4_0.gguf
if [ ! -s "$ds" ]; then
    "$baton" make-model "$ds.tmp" --vocab "$here/tests/data/vocab/ggml-vocab-llama-spm.gguf" --arch qwen2moe \
        --layers 4 --embd 2048 --heads 16 --heads-kv 4 --head-dim 128 --experts 64 --experts-used 6 \
        --ff-exp 704 --ff 1408 --ctx 4096 --type q4_0 --seed 32
    mv "$ds.tmp" "$ds"
fi
work=$(mktemp -d)
hosts=$work/hosts
cleanup() {
    "$here/launch/netns.sh" down "$hosts" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"$here/launch/netns.sh" up "$hosts" 2
head=$(sed -n '/^hosts:/,/^ranks:/p' "$hosts/topology.yaml" | sed '$d')
ranks=$(sed -n '/^ranks:/,/^pipeline:/p' "$hosts/topology.yaml" | sed '$d')
printf '%s\n%s\npipeline: {micro_batches: 2, partition: [2, 2]}\nmpi: {pml: ob1}\n' "$head" "$ranks" >"$work/pipe.yaml"
printf '%s\n%s\npipeline: {micro_batches: 2, partition: [4, 0], expert_groups: [[0, 1]]}\nmpi: {pml: ob1}\n' \
    "$head" "$ranks" >"$work/group.yaml"
bench=(bench model -p 0 -n "$n" -r "$reps" --per-rank)
for class in $classes; do
    "$here/launch/netns.sh" shape "$hosts" "$class"
    for f in "$models/mixtral-Q4_0.gguf" "$ds"; do
        for round in $(seq "$rounds"); do
            for how in one pipeline group; do
                echo "== link $class, $(basename "$f"), round $round: $how"
                case $how in
                one) "$here/launch/netns.sh" exec "$hosts" 0 "$baton" "${bench[@]}" -m "$f" -t 2 ;;
                pipeline | group)
                    topo=$work/pipe.yaml
                    [ "$how" = group ] && topo=$work/group.yaml
                    BATON_BIN="$baton" "$here/launch/netns.sh" exec "$hosts" 0 "$here/launch/baton-run" -t "$topo" \
                        --agent "$hosts/agent" -- baton "${bench[@]}" -m "$f"
                    ;;
                esac
            done
        done
    done
done
