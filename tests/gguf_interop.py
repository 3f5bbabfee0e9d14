#!/usr/bin/env python3
"""gguf_interop.py TOOL - baton's GGUF reader and writer against the `gguf`
Python package (llama.cpp's own gguf-py).

1. The gguf package writes a file (gguf.GGUFWriter) with every metadata value
   type (scalars, strings, arrays of each, arrays of strings, nested arrays)
   and a tensor of every type it knows; baton's reader (TOOL dump) must give
   back exactly what was written: the canonical lines are built here from the
   values this script wrote, not from a reader.
2. baton's writer makes a file (TOOL write); gguf.GGUFReader and baton's reader
   must read it back identically (the same canonical lines).

Exit 0 when both match, 1 on any difference (printed), 77 (skipped) when the
gguf package cannot be imported.  launch/bootstrap.sh installs it (pinned).
"""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGUFValueType as VT
    from gguf import GGMLQuantizationType as QT
except ImportError as e:  # pragma: no cover
    print(f"gguf_interop: skipped: {e}")
    sys.exit(77)

NAMES = {VT.UINT8: "uint8", VT.INT8: "int8", VT.UINT16: "uint16", VT.INT16: "int16",
         VT.UINT32: "uint32", VT.INT32: "int32", VT.FLOAT32: "float32", VT.BOOL: "bool",
         VT.STRING: "string", VT.ARRAY: "array", VT.UINT64: "uint64", VT.INT64: "int64",
         VT.FLOAT64: "float64"}


def fnv(b: bytes) -> int:
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def enc(vt, v, sub=None) -> str:
    """canonical form of a value as gguf_tool prints it"""
    if vt == VT.FLOAT32:
        return "%08x" % struct.unpack("<I", struct.pack("<f", v))[0]
    if vt == VT.FLOAT64:
        return "%016x" % struct.unpack("<Q", struct.pack("<d", v))[0]
    if vt == VT.BOOL:
        return "1" if v else "0"
    if vt == VT.STRING:
        return "s:" + (v.encode("utf-8") if isinstance(v, str) else bytes(v)).hex()
    if vt == VT.ARRAY:
        et = sub if sub is not None else (VT.UINT8 if isinstance(v, bytes) else VT.get_type(v[0]))
        return "[%s:%d:%s]" % (NAMES[et], len(v), ",".join(enc(et, x) for x in v))
    return str(int(v))


def run_dump(tool, path):
    r = subprocess.run([tool, "dump", path], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"gguf_interop: {tool} dump {path} failed ({r.returncode}): {r.stderr}")
        sys.exit(1)
    return r.stdout.splitlines()


def compare(what, got, want) -> bool:
    if got == want:
        print(f"gguf_interop: {what}: {len(want)} lines identical")
        return True
    print(f"gguf_interop: {what}: MISMATCH")
    for i in range(max(len(got), len(want))):
        g = got[i] if i < len(got) else "<none>"
        w = want[i] if i < len(want) else "<none>"
        if g != w:
            print(f"  line {i}:\n    baton: {g[:300]}\n    want:  {w[:300]}")
    return False


def python_writes(tool, d) -> bool:
    path = os.path.join(d, "py.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    meta = [
        ("t.u8", VT.UINT8, 255, None), ("t.i8", VT.INT8, -128, None),
        ("t.u16", VT.UINT16, 65535, None), ("t.i16", VT.INT16, -32768, None),
        ("t.u32", VT.UINT32, 4294967295, None), ("t.i32", VT.INT32, -2147483648, None),
        ("t.u64", VT.UINT64, 2**64 - 1, None), ("t.i64", VT.INT64, -2**63, None),
        ("t.f32", VT.FLOAT32, float(np.float32(0.1)), None), ("t.f64", VT.FLOAT64, -1.0e-300, None),
        ("t.bool", VT.BOOL, True, None), ("t.bool0", VT.BOOL, False, None),
        ("t.str", VT.STRING, "h\u00e9llo \u2581w\u00f6rld \U0001F600", None), ("t.str0", VT.STRING, "", None),
        ("a.u8", VT.ARRAY, [0, 7, 255], VT.UINT8), ("a.i8", VT.ARRAY, [-1, 2], VT.INT8),
        ("a.u16", VT.ARRAY, [1, 65535], VT.UINT16), ("a.i16", VT.ARRAY, [-300, 300], VT.INT16),
        ("a.u32", VT.ARRAY, [3, 4000000000], VT.UINT32), ("a.i32", VT.ARRAY, [-5, 6, 7], VT.INT32),
        ("a.u64", VT.ARRAY, [2**63 + 5], VT.UINT64), ("a.i64", VT.ARRAY, [-2**40, 2**40], VT.INT64),
        ("a.f32", VT.ARRAY, [float(np.float32(x)) for x in (0.5, -3.25, 1e-20)], VT.FLOAT32),
        ("a.f64", VT.ARRAY, [2.0**-1074, -0.0], VT.FLOAT64), ("a.bool", VT.ARRAY, [True, False, True], VT.BOOL),
        ("tokenizer.ggml.tokens", VT.ARRAY, ["<unk>", "\u2581the", "", "a\tb"], VT.STRING),
        ("a.bytes", VT.ARRAY, b"\x00\x01\xfe", None),
        ("a.nested_i32", VT.ARRAY, [[1, 2], [3]], None),
        ("a.nested_str", VT.ARRAY, [["x"], ["y", "zz"]], None),
        ("a.nested3", VT.ARRAY, [[[1.5]], [[2.5, 3.5]]], None),
    ]
    for key, vt, val, sub in meta:
        w.add_key_value(key, val, vt, sub_type=sub)

    rng = np.random.default_rng(13)
    want_tensors = []
    plain = {QT.F32: np.float32, QT.F16: np.float16, QT.F64: np.float64, QT.I8: np.int8,
             QT.I16: np.int16, QT.I32: np.int32, QT.I64: np.int64}
    for qt, (blck, tsize) in gguf.GGML_QUANT_SIZES.items():
        name = f"t.{qt.name.lower()}"
        ne0, ne1 = 2 * blck, 3
        if qt in plain:
            arr = rng.standard_normal((ne1, ne0)).astype(plain[qt]) if plain[qt] in (np.float32, np.float16, np.float64) \
                else rng.integers(-100, 100, (ne1, ne0)).astype(plain[qt])
            w.add_tensor(name, arr)
        else:
            arr = rng.integers(0, 256, (ne1, 2 * tsize), dtype=np.uint8)
            w.add_tensor(name, arr, raw_dtype=qt)
        want_tensors.append((name, int(qt), [ne0, ne1], arr.tobytes()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # offsets are where the gguf package put the data (checked below: each
    # one holds exactly the bytes written)
    r = gguf.GGUFReader(path)
    offs = {t.name: int(t.data_offset) for t in r.tensors}
    raw = open(path, "rb").read()
    want = ["version 3", "alignment 64", "kv general.architecture string " + enc(VT.STRING, "llama"),
            "kv general.alignment uint32 64"]
    want += ["kv %s %s %s" % (k, NAMES[vt], enc(vt, v, sub)) for k, vt, v, sub in meta]
    for name, qt, ne, data in want_tensors:
        o = offs[name]
        assert raw[o:o + len(data)] == data, name
        want.append("tensor %s %d 2 %d,%d %d %d %016x" % (name, qt, ne[0], ne[1], o, len(data), fnv(data)))
    got = run_dump(tool, path)
    return compare("file written by gguf.GGUFWriter, read by baton", sorted(got), sorted(want))


def reader_lines(path):
    """the canonical lines from gguf.GGUFReader alone"""
    r = gguf.GGUFReader(path)
    out = []
    version = int(r.fields["GGUF.version"].parts[-1][0])
    out.append(f"version {version}")
    out.append(f"alignment {r.alignment}")
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        vt = f.types[0]
        if vt == VT.ARRAY:
            et = f.types[1]
            if et == VT.STRING:
                vals = [bytes(f.parts[i]) for i in f.data]
            else:
                vals = [f.parts[i][0].item() for i in f.data]
            s = "[%s:%d:%s]" % (NAMES[et], len(vals), ",".join(enc(et, v) for v in vals))
        elif vt == VT.STRING:
            s = enc(vt, bytes(f.parts[f.data[0]]))
        else:
            s = enc(vt, f.parts[f.data[0]][0].item())
        out.append(f"kv {name} {NAMES[vt]} {s}")
    for t in r.tensors:
        b = np.asarray(t.data).tobytes()
        shape = ",".join(str(int(x)) for x in t.shape)
        out.append("tensor %s %d %d %s %d %d %016x" % (t.name, int(t.tensor_type), len(t.shape), shape,
                                                       int(t.data_offset), int(t.n_bytes), fnv(b)))
    return out


def baton_writes(tool, d) -> bool:
    path = os.path.join(d, "bt.gguf")
    r = subprocess.run([tool, "write", path], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"gguf_interop: {tool} write failed: {r.stderr}")
        return False
    return compare("file written by baton, read by gguf.GGUFReader and by baton", run_dump(tool, path),
                   reader_lines(path))


def main():
    if len(sys.argv) != 2:
        print("usage: gguf_interop.py GGUF_TOOL", file=sys.stderr)
        return 2
    tool = sys.argv[1]
    print(f"gguf_interop: gguf {getattr(gguf, '__version__', '?')}, numpy {np.__version__}")
    with tempfile.TemporaryDirectory() as d:
        ok = python_writes(tool, d)
        ok = baton_writes(tool, d) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
