#!/usr/bin/env bash
# layers_test.sh SOURCE_DIR - the core includes nothing of the backends: no file
# under src/ but the program's (src/cli/) includes a header under backends/, by its
# path or by a name that only exists there (the CPU backend's cpu.h, CUDA's
# bt_cuda.h, ...).  The core reaches a backend through backend.h (the interface)
# and backend-reg.h (backends by name); the table that knows each backend is
# backends/registry.c.  Prints each offending line; exits 1 if there is one.  It
# first checks itself on a small tree with one such include of each kind.
set -euo pipefail
src=${1:?usage: layers_test.sh SOURCE_DIR}

# check ROOT: every offending include of ROOT's core, as FILE:LINE: ...
check() {
    local root=$1 bad=0
    declare -A elsewhere=() only=()
    local h
    while IFS= read -r h; do elsewhere[$(basename "$h")]=1; done < <(
        find "$root" -path "$root/backends" -prune -o -path "$root/build*" -prune -o \
            \( -name '*.h' -o -name '*.cuh' \) -type f -print)
    while IFS= read -r h; do
        h=$(basename "$h")
        [ -n "${elsewhere[$h]:-}" ] || only[$h]=1
    done < <(find "$root/backends" \( -name '*.h' -o -name '*.cuh' \) -type f -print 2>/dev/null)
    local f n line inc
    while IFS= read -r f; do
        while IFS=: read -r n line; do
            inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">].*/\1/' <<<"$line")
            # (the CPU backend's public header is installed beside the core's: include/baton/cpu.h)
            if [[ "$inc" == *backends/* ]] || [ -n "${only[$(basename "$inc")]:-}" ] || [ "$inc" = baton/cpu.h ]; then
                echo "${f#"$root"/}:$n: includes \"$inc\", a header of backends/ (the core uses backend.h and backend-reg.h)"
                bad=1
            fi
        done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' "$f" || true)
    done < <(find "$root/src" -path "$root/src/cli" -prune -o \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) \
                 -type f -print | sort)
    return $bad
}

# the check itself: a tree with one include of each kind it must refuse, and
# the program's include it must let through
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/model" "$tmp/src/cli" "$tmp/backends/cpu" "$tmp/include"
touch "$tmp/backends/cpu/cpu.h" "$tmp/backends/cpu/backend.h" "$tmp/src/backend.h"
printf '#include "backend.h"\n#include "cpu.h"\n#include "baton/cpu.h"\n' >"$tmp/src/a.c"
printf '#include <stdio.h>\n  #  include "../../backends/cpu/backend.h"\n' >"$tmp/src/model/b.c"
printf '#include "cpu.h"\n' >"$tmp/src/cli/main.c"
if out=$(check "$tmp"); then
    echo "FAILED: the check let through a tree whose core includes backends' headers"
    exit 1
fi
want='src/a.c:2: includes "cpu.h", a header of backends/ (the core uses backend.h and backend-reg.h)
src/a.c:3: includes "baton/cpu.h", a header of backends/ (the core uses backend.h and backend-reg.h)
src/model/b.c:2: includes "../../backends/cpu/backend.h", a header of backends/ (the core uses backend.h and backend-reg.h)'
if [ "$out" != "$want" ]; then
    printf 'FAILED: the check on its own tree said\n%s\ninstead of\n%s\n' "$out" "$want"
    exit 1
fi

if ! check "$src"; then
    echo "FAILED: the core (src/ but src/cli/) includes headers of backends/"
    exit 1
fi
echo "ok: no file of the core includes a header of backends/"
