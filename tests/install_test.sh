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
for f in lib/libbaton.a include/baton/baton.h include/baton/tensor.h include/baton/cpu.h \
         lib/pkgconfig/baton.pc lib/cmake/baton/batonConfig.cmake lib/cmake/baton/batonTargets.cmake; do
    [ -f "$tmp/prefix/$f" ] || bad "installed: $f is missing"
done
# a library is installed with its headers or not at all: only the core has public headers
for f in libbaton_topology.a libbaton_mpi.a libbaton_text.a libbaton_run.a libbaton_serve.a; do
    [ -e "$tmp/prefix/lib/$f" ] && bad "installed: lib/$f, which has no public headers"
done
# the example is copied out of the tree: nothing else of the tree is reachable
mkdir -p "$tmp/ex" && cp "$src/examples/matmul.c" "$src/examples/CMakeLists.txt" "$tmp/ex/"

if cmake -S "$tmp/ex" -B "$tmp/ex/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_FLAGS="$cflags" >"$tmp/log" 2>&1 &&
   cmake --build "$tmp/ex/build" >>"$tmp/log" 2>&1 && "$tmp/ex/build/matmul" >"$tmp/log" 2>&1 &&
   grep -q "ok$" "$tmp/log"; then
    echo "ok: find_package(baton): $(cat "$tmp/log")"
else
    bad "the example with find_package(baton)"
fi

if cc $cflags -o "$tmp/ex/matmul_pc" "$tmp/ex/matmul.c" \
      $(PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig" pkg-config --cflags --libs baton) >"$tmp/log" 2>&1 &&
   "$tmp/ex/matmul_pc" >"$tmp/log" 2>&1 && grep -q "ok$" "$tmp/log"; then
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
if nm -u "$tmp/prefix/lib/libbaton.a" 2>/dev/null | grep -qE " (MPI_|yaml_)"; then
    bad "libbaton.a refers to MPI or libyaml"
else
    echo "ok: libbaton.a needs neither MPI nor libyaml"
fi
exit $fail
