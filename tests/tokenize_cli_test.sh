#!/usr/bin/env bash
# tokenize_cli_test.sh BATON - `baton tokenize` as a user meets it: the ids
# on one line as llama.cpp's llama-tokenize --ids prints them (the expected
# lines below are llama-tokenize's output on the same files), the pieces, the
# three ways in (-p, -f, stdin), the flags, and every bad input with its one
# message and exit code (2 for a usage error, 1 for a bad file or text).
set -u
baton=${1:?usage: tokenize_cli_test.sh BATON}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
v=$root/tests/data/vocab
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# expect CODE WANT NAME -- command...: exit code, and stdout+stderr equal to WANT
expect() {
    local code=$1 want=$2 name=$3
    shift 4
    local got rc
    got=$(timeout 60 "$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$code" ]; then
        failed=$((failed + 1))
        echo "FAILED: $name: exit $rc, want $code"
        echo "$got" | head -5 | sed 's/^/    | /'
    elif [ "$got" != "$want" ]; then
        failed=$((failed + 1))
        echo "FAILED: $name"
        echo "    want: $want"
        echo "    got:  $got"
    else
        passed=$((passed + 1))
        echo "ok: $name"
    fi
}

bpe=$v/ggml-vocab-llama-bpe.gguf
spm=$v/ggml-vocab-llama-spm.gguf
qwen=$v/ggml-vocab-qwen2.gguf

# ids, as llama-tokenize -m FILE -p TEXT --ids
expect 0 "[128000, 9906, 1917]" "llama-bpe --ids" -- "$baton" tokenize -m "$bpe" -p "Hello world" --ids
expect 0 "[1, 15043, 3186]" "llama-spm --ids" -- "$baton" tokenize -m "$spm" -p "Hello world" --ids
expect 0 "[151644, 872, 198, 6023, 149955, 151645]" "qwen2: special tokens, escapes, an emoji" -- \
    "$baton" tokenize -m "$qwen" -p '<|im_start|>user\nhi\xf0\x9f\xa6\x99<|im_end|>' --ids
expect 0 "[27, 91, 318, 4906, 91, 29, 872, 198, 6023]" "qwen2 --no-parse-special" -- \
    "$baton" tokenize -m "$qwen" -p '<|im_start|>user\nhi' --ids --no-parse-special
expect 0 "[9906, 1917]" "--no-bos" -- "$baton" tokenize -m "$bpe" -p "Hello world" --ids --no-bos
expect 0 "[128000, 9906, 1734, 14957]" "--no-escape" -- "$baton" tokenize -m "$bpe" -p 'Hello\nworld' --ids --no-escape
# pieces, as llama-tokenize prints them
expect 0 "128000 -> '<|begin_of_text|>'
  9906 -> 'Hello'
  1917 -> ' world'
Total number of tokens: 3" "pieces and --show-count" -- "$baton" tokenize -m "$bpe" -p "Hello world" --show-count
# a piece that is not a whole character is shown as \xHH
expect 0 "     1 -> '<s>'
 29871 -> ' '
   243 -> '\xf0'
   162 -> '\x9f'
   169 -> '\xa6'
   156 -> '\x99'" "byte pieces" -- "$baton" tokenize -m "$spm" -p '\xf0\x9f\xa6\x99'
# -f and stdin read the bytes as they are (no escapes)
printf 'Hello world\n' >"$tmp/t.txt"
expect 0 "[128000, 9906, 1917, 198]" "-f FILE" -- "$baton" tokenize -m "$bpe" -f "$tmp/t.txt" --ids
expect 0 "[128000, 9906, 1917, 198]" "--stdin" -- bash -c "printf 'Hello world\n' | '$baton' tokenize -m '$bpe' --stdin --ids"
# an endless stream is cut at 256 MiB with one message (before: read until memory ran out)
expect 1 "baton tokenize: standard input: more than 256 MiB: baton reads at most that much text" "--stdin from yes" -- \
    bash -c "yes | '$baton' tokenize -m '$bpe' --stdin --ids"
: >"$tmp/empty.txt"
expect 0 "[128000]" "an empty text: the BOS alone" -- "$baton" tokenize -m "$bpe" -f "$tmp/empty.txt" --ids
expect 0 "vocabulary: gpt2 (byte-level BPE), pre-tokenizer qwen2, 151936 tokens
bos: 151643 '<|endoftext|>'
eos: 151643 '<|endoftext|>'
eot: 151645 '<|im_end|>'
chat template: chatml" "--info" -- "$baton" tokenize -m "$qwen" --info

# bad input: one message, the right exit code
printf 'a\xffb' >"$tmp/bad.txt"
expect 1 "baton tokenize: $tmp/bad.txt: invalid UTF-8 at byte 1 (0xff)" "invalid UTF-8 in a file" -- \
    "$baton" tokenize -m "$bpe" -f "$tmp/bad.txt"
expect 1 "baton tokenize: -p: invalid UTF-8 at byte 2 (0xc3)" "invalid UTF-8 from an escape" -- \
    "$baton" tokenize -m "$bpe" -p 'ab\xc3'
expect 1 "baton tokenize: $root/README.md: offset 0: not a GGUF file (magic \"# ba\", expected \"GGUF\")" "not GGUF" -- \
    "$baton" tokenize -m "$root/README.md" -p x
expect 1 "baton tokenize: $tmp/nope.gguf: cannot open: No such file or directory" "no such model" -- \
    "$baton" tokenize -m "$tmp/nope.gguf" -p x
expect 1 "baton tokenize: $tmp/nope.txt: No such file or directory" "no such text file" -- \
    "$baton" tokenize -m "$bpe" -f "$tmp/nope.txt"
expect 2 "baton tokenize: missing -m FILE (try: baton tokenize --help)" "no model" -- "$baton" tokenize -p x
expect 2 "baton tokenize: no text: give -p TEXT, -f FILE or --stdin (try: baton tokenize --help)" "no text" -- \
    "$baton" tokenize -m "$bpe"
expect 2 "baton tokenize: give the text one way: -p, -f or --stdin" "two sources" -- \
    "$baton" tokenize -m "$bpe" -p x -f "$tmp/t.txt"
expect 2 "baton tokenize: unknown option --idz (try: baton tokenize --help)" "unknown flag" -- \
    "$baton" tokenize -m "$bpe" -p x --idz
expect 2 "baton tokenize: -m needs a value (try: baton tokenize --help)" "flag without value" -- "$baton" tokenize -m
expect 2 "baton tokenize: unexpected argument 'extra' (try: baton tokenize --help)" "stray argument" -- \
    "$baton" tokenize -m "$bpe" -p x extra
if "$baton" tokenize --help | grep -q "llama-bpe"; then
    passed=$((passed + 1))
    echo "ok: --help lists the pre-tokenizers"
else
    failed=$((failed + 1))
    echo "FAILED: --help lists the pre-tokenizers"
fi

# one letter repeated is one SentencePiece word with no place to cut it: 8 MiB
# of it within 256 MiB of peak RSS more than a 4-byte text (before: 56 bytes a
# character, about 470 MB more).  Peak RSS, not `ulimit -v`: a build linked
# against CUDA's libraries maps more address space than that before main.
peak() { # peak RSS in KiB of one run of the command, then its last line of output
    python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
lines = r.stdout.decode(errors="replace").splitlines()
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1, lines[-1] if lines else "")' "$@"
}
if ldd "$baton" 2>/dev/null | grep -q libasan; then
    echo "skip: 8 MiB of one letter in 256 MiB (an AddressSanitizer build's shadow memory counts too)"
else
    head -c 8388608 /dev/zero | tr '\0' a >"$tmp/a8m.txt"
    printf aaaa >"$tmp/a4.txt"
    read -r base _ < <(peak "$baton" tokenize -m "$v/ggml-vocab-llama-spm.gguf" -f "$tmp/a4.txt" --show-count)
    read -r big last < <(peak "$baton" tokenize -m "$v/ggml-vocab-llama-spm.gguf" -f "$tmp/a8m.txt" --show-count)
    if [ "$base" -gt 0 ] && [ "$big" -gt 0 ] && [ "$last" = "Total number of tokens: 2097155" ] &&
        [ $((big - base)) -lt 262144 ]; then
        passed=$((passed + 1))
        echo "ok: 8 MiB of one letter: $((big - base)) KiB more peak RSS than 4 letters"
    else
        failed=$((failed + 1))
        echo "FAILED: 8 MiB of one letter: peak RSS $big KiB against $base KiB for 4 letters, last line '$last'"
    fi
fi

echo "tokenize_cli_test: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
