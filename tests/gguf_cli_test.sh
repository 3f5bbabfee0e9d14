#!/usr/bin/env bash
# gguf_cli_test.sh BATON GGUF_TOOL - `baton gguf` as a user meets it: the
# summary, --tensors and --json of a file baton's writer made (with types
# baton has no kernels for, which are listed all the same), a damaged file
# (one located message, exit 1), bad flags (exit 2), and llama.cpp's vocabulary
# files (tests/data/vocab, or $BATON_GGUF_MODELS).
set -u
baton=${1:?usage: gguf_cli_test.sh BATON GGUF_TOOL}
tool=${2:?usage: gguf_cli_test.sh BATON GGUF_TOOL}
# shellcheck source=tests/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # $tmp, ok, bad
# expect CODE NAME PATTERN... -- command...: exit code and a line matching each PATTERN
expect() {
    local code=$1 name=$2
    shift 2
    local pats=()
    while [ "$1" != "--" ]; do
        pats+=("$1")
        shift
    done
    shift
    timeout 60 "$@" >"$tmp/out" 2>&1
    local rc=$?
    if [ "$rc" -ne "$code" ]; then
        bad "$name: exit $rc, want $code"
        return
    fi
    for p in "${pats[@]}"; do
        if ! grep -qE -- "$p" "$tmp/out"; then
            bad "$name: no line matching /$p/"
            return
        fi
    done
    ok "$name"
}

f=$tmp/m.gguf
"$tool" write "$f" || { echo "FAILED: gguf_tool write"; exit 1; }

expect 0 "summary" "^$f: GGUF v3, 2.69 KiB, 28 keys, 8 tensors, alignment 64$" "^architecture +llama$" \
    "^size 2752 bytes, header checksum [0-9a-f]{16} \(FNV-1a 64 of the 1408 bytes before the data\)$" \
    "^vocabulary +4 tokens$" "^  Q6_K +1 +420 B$" "^  Q4_K +1 +288 B$" "^  total +8 +1.02 KiB  \(data section at offset 1408\)$" \
    "^  blk.0 +3 +184 B$" "^  blk.1 +2 +456 B$" "^  other +3 +404 B$" \
    '^  t.f32 +float32 +-0.1$' '^  tokenizer.ggml.tokens +array +\[string x 4\] \["<unk>", "", "▁the", "a b"\]$' \
    -- "$baton" gguf "$f"
expect 0 "--tensors" "^ +5  blk.1.ffn_gate.weight +Q6_K +256 x 2 +1920 +420$" "^ +7  ids +I32 +5 +2688 +20$" \
    -- "$baton" gguf --tensors "$f"
if command -v python3 >/dev/null 2>&1; then
    "$baton" gguf --json --tensors "$f" >"$tmp/j" 2>&1
    expect 0 "--json parses and holds the figures" "^ok$" -- python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert j["version"] == 3 and j["alignment"] == 64 and j["vocab_size"] == 4, j
raw = open(sys.argv[2], "rb").read()[:1408]
h = 1469598103934665603
for x in raw:
    h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
assert j["header_checksum"] == "%016x" % h and j["size"] == 2752, j
assert j["architecture"] == "llama" and j["tensor_count"] == 8 and j["tensor_bytes"] == 1044
assert j["metadata"]["t.u64"] == 18000000000000000000 and j["metadata"]["a.i32"] == [-1, 2, -3, 2147483647]
assert j["metadata"]["tokenizer.ggml.tokens"] == {"array": "string", "length": 4}
assert [l["bytes"] for l in j["layers"]] == [184, 456] and j["other"]["bytes"] == 404
t = j["tensors"][5]
assert t == {"name": "blk.1.ffn_gate.weight", "type": "Q6_K", "shape": [256, 2], "offset": 1920, "bytes": 420}, t
print("ok")' "$tmp/j" "$f"
fi

# a damaged copy: the last tensor's data cut short
head -c 2700 "$f" >"$tmp/cut.gguf"
expect 1 "truncated file" "^$tmp/cut.gguf: offset 1372: tensor \"ids\": data \[1280, 1300\) of the data section runs past the end of the file \(the data section holds 1292 bytes\)$" \
    -- "$baton" gguf "$tmp/cut.gguf"
expect 1 "missing file" "^$tmp/none.gguf: cannot open: No such file or directory$" -- "$baton" gguf "$tmp/none.gguf"
printf 'GGUF\1\0\0\0' >"$tmp/v1.gguf"
expect 1 "version 1" "offset 4: GGUF version 1 is not supported" -- "$baton" gguf "$tmp/v1.gguf"
expect 2 "no file" "^baton gguf: missing FILE \(try: baton gguf --help\)$" -- "$baton" gguf
expect 2 "bad flag" "^baton gguf: unknown option --frob \(try: baton gguf --help\)$" -- "$baton" gguf --frob "$f"
expect 2 "two files" "^baton gguf: unexpected argument 'x' \(try: baton gguf --help\)$" -- "$baton" gguf "$f" x
expect 0 "--help" "^usage: baton gguf FILE" -- "$baton" gguf --help
expect 0 "baton help lists gguf" "^  gguf FILE" -- "$baton" help

models=${BATON_GGUF_MODELS:-$(cd "$(dirname "$0")" && pwd)/data/vocab}
n=0
for v in "$models"/ggml-vocab-*.gguf; do
    [ -f "$v" ] || continue
    n=$((n + 1))
    expect 0 "$(basename "$v")" "^vocabulary +[0-9]+ tokens$" -- "$baton" gguf "$v"
done
[ "$n" -eq 0 ] && echo "note: no llama.cpp vocabulary files in $models"

echo "gguf_cli_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
