#!/usr/bin/env python3
"""function_length_test.py SOURCE_DIR - no function of baton's code (src/, backends/,
transport/) is longer than 150 lines, from the line that opens its body to the one that
closes it.  A definition is found as the code is written here: its body opens with a '{' that
ends a line at the outer level and closes with a '}' alone at the start of a line.  Prints each
function over the limit; exits 1 if there is one.  It first checks itself on a small text."""
import os
import re
import sys

LIMIT = 150


def functions(text):
    """(name, first line, length in lines) of each function definition in C text."""
    out = []
    lines = text.split("\n")
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if (line[:1].isalpha() or line[:1] == "_") and not line.startswith(("typedef", "struct", "enum", "union",
                                                                             "static const", "const")) \
                or line.startswith(("static const", "const")) and "(" in line:
            # the signature may run over several lines up to the '{' that ends one
            j = i
            while j < n and not lines[j].rstrip().endswith("{") and not lines[j].rstrip().endswith(";") and j - i < 8:
                j += 1
            if j < n and lines[j].rstrip().endswith("{") and "(" in " ".join(lines[i:j + 1]) \
                    and "=" not in " ".join(lines[i:j + 1]).split("(")[0]:
                names = [w for w in re.findall(r"(\w+)\s*\(", " ".join(lines[i:j + 1])) if not w.startswith("__")]
                k = j + 1
                while k < n and not lines[k].startswith("}"):
                    k += 1
                out.append((names[0] if names else "?", i + 1, k - j + 1))
                i = k + 1
                continue
        i += 1
    return out


def check_self():
    body = "\n".join(["    x++;"] * (LIMIT - 2))  # with its braces: LIMIT lines
    text = f"static int ok(int x) {{\n{body}\n}}\n\nint too_long(int x,\n             int y) {{\n{body}\n    y++;\n}}\n"
    got = [(f, line, length) for f, line, length in functions(text) if length > LIMIT]
    if got != [("too_long", LIMIT + 2, LIMIT + 1)]:
        print(f"FAILED: the check itself found {got} in its own text")
        sys.exit(1)


def main():
    check_self()
    root = sys.argv[1]
    bad = 0
    for top in ("src", "backends", "transport"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".cu")):
                    continue
                path = os.path.join(d, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for name, line, length in functions(fh.read()):
                        if length > LIMIT:
                            print(f"{os.path.relpath(path, root)}:{line}: {name} is {length} lines (at most {LIMIT})")
                            bad += 1
    if bad:
        print(f"function_length_test: {bad} function(s) over {LIMIT} lines")
        sys.exit(1)
    print(f"function_length_test: no function over {LIMIT} lines")


if __name__ == "__main__":
    main()
