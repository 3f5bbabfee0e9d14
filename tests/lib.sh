# lib.sh - what the shell tests that count their cases share (sourced by
# cli_test.sh, gguf_cli_test.sh, variants_test.sh, golden_test.sh and
# x86_cpus_test.sh): a scratch folder $tmp, removed when the script exits,
# and ok/bad, which count passes and failures; bad shows the start of
# $tmp/out, where the scripts capture the command under test; and
# logits_summary, a generate run's results.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() {
    passed=$((passed + 1))
    echo "ok: $1"
}
bad() {
    failed=$((failed + 1))
    echo "FAILED: $1"
    [ -f "$tmp/out" ] && sed 's/^/    | /' "$tmp/out" | head -20
}

# logits_summary FILE: what a `generate ... --dump-tensors result_output` run
# printed to FILE that fixes its results: each ubatch's logits (shape and
# hash, in order) and the tokens' digest
logits_summary() {
    grep -o 'result_output .* hash [0-9a-f]*' "$1" | sed 's/ min .* hash / /'
    grep -o 'digest [0-9a-f]*' "$1"
}
