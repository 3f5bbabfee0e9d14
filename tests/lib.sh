# lib.sh - what the shell tests that count their cases share (sourced by
# cli_test.sh and gguf_cli_test.sh): a scratch folder $tmp, removed when the
# script exits, and ok/bad, which count passes and failures; bad shows the
# start of $tmp/out, where the scripts capture the command under test.
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
