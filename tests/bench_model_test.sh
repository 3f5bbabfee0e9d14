#!/usr/bin/env bash
# bench_model_test.sh BATON MPIEXEC - `baton bench model` as a user meets it:
# llama-bench's table with one row per test (ppN, tgN) and positive t/s, the
# JSON form (one object per test, one sample per repetition), --profile's
# per-op table of the tg steps (nodes and weight bytes checked), a two-rank run
# under mpirun with ubatches in flight, and every bad input with one message
# and its exit code (2 for a usage error, 1 for a bad file).  The model is a
# small random-weight one from `baton make-model`.
set -u
baton=${1:?usage: bench_model_test.sh BATON MPIEXEC}
mpiexec=${2:?usage: bench_model_test.sh BATON MPIEXEC}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; [ -n "${2:-}" ] && echo "$2" | head -8 | sed 's/^/    | /'; }

m=$tmp/m.gguf
if ! "$baton" make-model "$m" --vocab "$root/tests/data/vocab/ggml-vocab-gpt-2.gguf" --arch llama --layers 2 \
    --embd 64 --heads 4 --heads-kv 2 --head-dim 16 --ff 128 --experts 4 --experts-used 2 --ff-exp 64 \
    --type q8_0 > "$tmp/mm.log" 2>&1; then
    bad "make-model" "$(cat "$tmp/mm.log")"
    exit 1
fi

# rows of a table: the t/s column's mean must be a positive number
check_table() { # NAME OUTPUT RANKS TESTS...
    local name=$1 out=$2 ranks=$3
    shift 3
    local hdr
    hdr=$(echo "$out" | head -1 | tr -s ' ')
    if [ "$hdr" != "| model | size | params | backend | ranks | threads | test | t/s |" ]; then
        bad "$name: header" "$out"
        return
    fi
    local n_rows
    n_rows=$(echo "$out" | tail -n +3 | wc -l)
    if [ "$n_rows" -ne $# ]; then
        bad "$name: $n_rows rows, want $#" "$out"
        return
    fi
    local i=3 t
    for t in "$@"; do
        local row
        row=$(echo "$out" | sed -n "${i}p")
        i=$((i + 1))
        # | model | size | params | backend | ranks | threads | test | t/s |
        local f_ranks f_test f_ts
        f_ranks=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $6); print $6}')
        f_test=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $8); print $8}')
        f_ts=$(echo "$row" | awk -F'|' '{print $9}' | awk '{print $1}')
        if [ "$f_ranks" != "$ranks" ] || [ "$f_test" != "$t" ] || ! awk -v x="$f_ts" 'BEGIN { exit !(x + 0 > 0) }'; then
            bad "$name: row $t (ranks '$f_ranks', test '$f_test', t/s '$f_ts')" "$out"
            return
        fi
        case "$row" in *"llama "*" q8_0"*" CPU "*) ;; *) bad "$name: row $t names the model and backend" "$row"; return ;; esac
    done
    ok "$name"
}

out=$(timeout 120 "$baton" bench model -m "$m" -p 32 -n 8 -r 2 -t 1 2>&1)
rc=$?
[ $rc -eq 0 ] && check_table "one rank, pp32 and tg8" "$out" 1 pp32 tg8 || bad "one rank: exit $rc" "$out"

out=$(timeout 120 "$baton" bench model -m "$m" -p 0 -n 4 -r 1 -t 1 2>&1)
rc=$?
[ $rc -eq 0 ] && check_table "-p 0: tg only" "$out" 1 tg4 || bad "-p 0: exit $rc" "$out"

out=$(timeout 120 "$baton" bench model -m "$m" -p 16 -n 4 -r 3 -t 1 --json 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    bad "--json: exit $rc" "$out"
elif [ "$(echo "$out" | wc -l)" -ne 2 ] || ! echo "$out" | head -1 | grep -q '"test": "pp16", "n_prompt": 16, "n_gen": 0' ||
    ! echo "$out" | tail -1 | grep -q '"test": "tg4", "n_prompt": 0, "n_gen": 4' ||
    [ "$(echo "$out" | head -1 | sed 's/.*"samples_ts": \[\([^]]*\)\].*/\1/' | tr ',' '\n' | wc -l)" -ne 3 ]; then
    bad "--json: two objects, three samples each" "$out"
elif command -v python3 > /dev/null && ! echo "$out" | python3 -c 'import json, sys; [json.loads(l) for l in sys.stdin]'; then
    bad "--json: not JSON" "$out"
else
    ok "--json"
fi

# --profile: after the results, rank 0's tg steps per op and type; in JSON
# the 4 timed steps' MUL_MAT_ID rows: 2 layers x 3 products a step, each
# reading its token's 2 experts of 64 x 64 Q8_0 (64 rows of 68 bytes)
out=$(timeout 120 "$baton" bench model -m "$m" -p 0 -n 4 -r 1 -t 2 --profile 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    bad "--profile: exit $rc" "$out"
elif ! echo "$out" | grep -q "^profile of rank 0's tg4 steps: 4 steps, " ||
    ! echo "$out" | grep -q "^| MUL_MAT_ID   | q8_0   |    6.0 |" || ! echo "$out" | grep -q "^| all  "; then
    bad "--profile: the table" "$out"
else
    ok "--profile"
fi
# with -n 0, the pp test's ubatches: 2 timed prompts of 16 tokens in ubatches of 8
out=$(timeout 120 "$baton" bench model -m "$m" -p 16 -n 0 -r 2 --ubatch 8 -t 2 --profile 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    bad "--profile -n 0: exit $rc" "$out"
elif ! echo "$out" | grep -q "^profile of rank 0's pp16 ubatches: 4 ubatches, " ||
    ! echo "$out" | grep -q "^| MUL_MAT_ID   | q8_0   |    6.0 |"; then
    bad "--profile -n 0: the table" "$out"
else
    ok "--profile -n 0"
fi
out=$(timeout 120 "$baton" bench model -m "$m" -p 0 -n 4 -r 1 -t 2 --profile --json 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    bad "--profile --json: exit $rc" "$out"
elif ! echo "$out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
prof = [r["profile"] for r in rows if "profile" in r]
mmid = [p for p in prof if p["op"] == "MUL_MAT_ID" and p["type"] == "q8_0"]
assert len(rows) == 1 + len(prof) and len(mmid) == 1, rows
assert mmid[0]["nodes"] == 6 and abs(mmid[0]["weight_mb"] - 6 * 2 * 64 * 68 / 1e6) < 1e-9, mmid
assert sum(p["compute_ms"] + p["wait_ms"] for p in prof) <= prof[0]["step_ms"] * 1.000001, prof
'; then
    bad "--profile --json: rows" "$out"
else
    ok "--profile --json"
fi

# two ranks, a 32-token prompt as 4 ubatches of 8 in flight, 2 sequences
out=$(timeout 180 "$mpiexec" -np 2 --oversubscribe "$baton" bench model -m "$m" -p 32 -n 4 -r 2 -t 1 --ubatch 8 \
    --seqs 2 2>&1)
rc=$?
[ $rc -eq 0 ] && check_table "two ranks, ubatches in flight" "$out" 2 pp32 tg4 || bad "two ranks: exit $rc" "$out"

# --json on two ranks: each test's wall seconds and every rank's seconds in
# graph compute within them (both ranks computed, neither longer than the wall)
out=$(timeout 180 "$mpiexec" -np 2 --oversubscribe "$baton" bench model -m "$m" -p 32 -n 4 -r 2 -t 1 --ubatch 8 \
    --json 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
    bad "two ranks --json: exit $rc" "$out"
elif ! echo "$out" | python3 -c '
import json, sys
tests = [json.loads(l) for l in sys.stdin]
assert [t["test"] for t in tests] == ["pp32", "tg4"], tests
for t in tests:
    c, w = t["rank_compute_s"], t["wall_s"]
    assert len(c) == 2 and w > 0 and all(0 < x <= w * 1.01 + 1e-3 for x in c), t
'; then
    bad "two ranks --json: wall_s and rank_compute_s" "$out"
else
    ok "two ranks --json: wall_s and rank_compute_s"
fi

# bad input: one message, exit code, nothing else
expect_fail() { # CODE PATTERN NAME -- command...
    local code=$1 pat=$2 name=$3
    shift 4
    local got rc
    got=$(timeout 60 "$@" 2>&1)
    rc=$?
    if [ $rc -ne "$code" ] || ! echo "$got" | grep -q -- "$pat" || [ "$(echo "$got" | wc -l)" -ne 1 ]; then
        bad "$name: exit $rc (want $code), output" "$got"
    else
        ok "$name"
    fi
}
expect_fail 2 "baton bench model: -m FILE: the model is required" "no model" -- "$baton" bench model -p 8
expect_fail 2 "baton bench model: -p 0 and -n 0: nothing to measure" "nothing to measure" -- "$baton" bench model -m "$m" -p 0 -n 0
expect_fail 2 "baton bench model: -r: '0' is not an integer in \[1, 1000\]" "-r 0" -- "$baton" bench model -m "$m" -r 0
expect_fail 2 "baton bench model: --ubatch: 'x' is not an integer" "--ubatch x" -- "$baton" bench model -m "$m" --ubatch x
expect_fail 2 "baton bench model: unknown option '--bogus'" "unknown option" -- "$baton" bench model -m "$m" --bogus
expect_fail 1 "$tmp/none.gguf: cannot open" "missing file" -- "$baton" bench model -m "$tmp/none.gguf"
printf 'not a gguf file at all, just text\n' > "$tmp/text.gguf"
expect_fail 1 "$tmp/text.gguf" "not a GGUF file" -- "$baton" bench model -m "$tmp/text.gguf"

echo "bench_model_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
