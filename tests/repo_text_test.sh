#!/usr/bin/env bash
# repo_text_test.sh SOURCE_DIR - the repository speaks only of the project: no path of the
# machine a file was written on, and no diary of the work (who did what when, work periods,
# tracker numbers), in any tracked file.  Prints each offending line; exits 1 if there is one.
set -euo pipefail
src=${1:?usage: repo_text_test.sh SOURCE_DIR}
cd "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files --cached --others --exclude-standard)
else
    mapfile -t files < <(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||')
fi
self=tests/repo_text_test.sh
# machine paths: home and work folders, a Python version manager's tree
paths='(^|[^A-Za-z0-9_.])/(work|home/[a-z]|root/|Users/|mnt/)|\.pyenv/'
# the diary: role names, work periods, tracker numbers
diary='\b[Ss]ub-?agents?\b|\b[Ss]essions?\b|\bhelper-[0-9]|\b([Tt]he|[Aa]) lead (with|should|asked|said|wants)\b|\b[Ww]ork periods?\b|\b[Ii]ssue [0-9]+'
bad=0
for f in "${files[@]}"; do
    [ "$f" = "$self" ] && continue
    [ -f "$f" ] || continue
    case "$f" in *.gguf | *.bin | *.png) continue ;; esac
    if out=$(grep -n -I -E "$paths|$diary" "$f" 2>/dev/null); then
        while IFS= read -r line; do
            echo "$f:$line"
        done <<<"$out"
        bad=1
    fi
done
if [ "$bad" -ne 0 ]; then
    echo "repo_text_test: the lines above name a machine path or the work's diary" >&2
    exit 1
fi
echo "repo_text_test: ${#files[@]} files, no machine paths or diary"
