#!/bin/bash
# install_test.sh SOURCE BUILD - `cmake --install` into a fresh prefix, then
# the example under examples/ built against that prefix only, once with
# find_package(baton) and once with pkg-config, and run.  Neither build sees
# the source tree, MPI or libyaml.
set -u
src=${1:?usage: install_test.sh SOURCE BUILD}
build=${2:?usage: install_test.sh SOURCE BUILD [CFLAGS]}
# a sanitizer build installs a sanitized library: its users compile with the same flags
cflags=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAILED: $1"; [ -f "$tmp/log" ] && sed 's/^/    | /' "$tmp/log" | tail -20; fail=1; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/log" 2>&1 || { bad "cmake --install"; exit 1; }
for f in lib/libbaton.so include/baton/baton.h include/baton/tensor.h include/baton/cpu.h include/baton/sched.h \
         lib/pkgconfig/baton.pc lib/cmake/baton/batonConfig.cmake lib/cmake/baton/batonTargets.cmake; do
    [ -f "$tmp/prefix/$f" ] || bad "installed: $f is missing"
done
# a library is installed with its headers or not at all: only the core has public headers
# (libbaton.so; the static archive is the tree's own, with every internal symbol)
for f in libbaton.a libbaton_topology.a libbaton_mpi.a libbaton_text.a libbaton_run.a libbaton_serve.a; do
    [ -e "$tmp/prefix/lib/$f" ] && bad "installed: lib/$f, which has no public headers"
done
# the example is copied out of the tree: nothing else of the tree is reachable
mkdir -p "$tmp/ex" && cp "$src/examples/matmul.c" "$src/examples/CMakeLists.txt" "$tmp/ex/"

if cmake -S "$tmp/ex" -B "$tmp/ex/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_FLAGS="$cflags" >"$tmp/log" 2>&1 &&
   cmake --build "$tmp/ex/build" >>"$tmp/log" 2>&1 && LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/ex/build/matmul" >"$tmp/log" 2>&1 &&
   grep -q "ok$" "$tmp/log"; then
    echo "ok: find_package(baton): $(cat "$tmp/log")"
else
    bad "the example with find_package(baton)"
fi

if cc $cflags -o "$tmp/ex/matmul_pc" "$tmp/ex/matmul.c" \
      $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs baton) >"$tmp/log" 2>&1 &&
   LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/ex/matmul_pc" >"$tmp/log" 2>&1 && grep -q "ok$" "$tmp/log"; then
    echo "ok: pkg-config baton: $(cat "$tmp/log")"
else
    bad "the example with pkg-config"
fi
# the handles are opaque: what a backend, buffer or buffer
# type holds is in backend-impl.h, which is not installed, so a user program
# cannot reach a vtable
[ -f "$tmp/prefix/include/baton/backend-impl.h" ] && bad "installed: backend-impl.h is internal"
printf '#include <baton/baton.h>\nint main(void) { return (int)sizeof(struct bt_backend); }\n' >"$tmp/ex/opaque.c"
if cc $cflags -c -I"$tmp/prefix/include" -o "$tmp/ex/opaque.o" "$tmp/ex/opaque.c" >"$tmp/log" 2>&1; then
    bad "a program built against the installed headers sees the layout of struct bt_backend"
elif grep -q "incomplete type\|invalid application of .sizeof." "$tmp/log"; then
    echo "ok: the installed headers keep struct bt_backend opaque"
else
    bad "the opaque-handle check did not compile for another reason"
fi
# the core needs neither MPI nor libyaml
if nm -D -u "$tmp/prefix/lib/libbaton.so" 2>/dev/null | grep -qE " (MPI_|yaml_)"; then
    bad "libbaton.so refers to MPI or libyaml"
else
    echo "ok: libbaton.so needs neither MPI nor libyaml"
fi
# it exports the functions the installed headers mark BT_API, and nothing else
nm -D --defined-only "$tmp/prefix/lib/libbaton.so" | awk '{print $3}' | sort >"$tmp/exported"
# (each declaration starts a line with BT_API and names its function before the first parenthesis)
grep -hoE '^BT_API [^(;]*\(' "$tmp/prefix/include/baton/"*.h | sed -E 's/[[:space:]]*\($//; s/.*[ *]//' |
    sort -u >"$tmp/declared"
if [ -s "$tmp/declared" ] && cmp -s "$tmp/exported" "$tmp/declared"; then
    echo "ok: libbaton.so exports the $(wc -l <"$tmp/declared") BT_API functions of the headers, nothing else"
else
    comm -3 "$tmp/declared" "$tmp/exported" | head -20 >"$tmp/log"
    bad "libbaton.so's exports differ from the headers' BT_API functions (left: declared only; right: exported only)"
fi
exit $fail
