#!/usr/bin/env python3
"""quantize_test.py BATON - `baton quantize` end to end, read back with the gguf package.

A 16-layer llama-shaped model (F16, F32 and BF16 weights) is written with
gguf.GGUFWriter; each TYPE's output must have llama.cpp's tensor types (the
layers getting Q6_K are the ones llama-quantize picks for this model), the
metadata of the input plus general.file_type, values close to the input,
the same bytes for any thread count, and for Q8_0 / Q4_0 / MXFP4 the bytes
of gguf.quants.quantize.  The 1-3-bit IQ types are refused (they need an
importance matrix).  Bad inputs: each a non-zero exit, one message naming
what is wrong, and no OUT (nor temporary file) left behind.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

N_LAYER, D, FF, VOCAB = 16, 256, 512, 300
MORE_BITS = {0, 1, 4, 7, 10, 13, 14, 15}  # llama-quantize's Q6_K layers for 16 layers
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def make_model(path, nan_in=None, quantized_tensor=False):
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(N_LAYER)
    w.add_embedding_length(D)
    w.add_head_count(4)
    w.add_string("test.note", "kept as it is")
    w.add_array("test.list", [1, 2, 3])
    tensors = {}

    def add(name, shape, dt=np.float16):
        a = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if name == nan_in:
            a[1, 37] = np.nan
        if dt == "bf16":
            w.add_tensor(name, gguf.quants.quantize(a, Q.BF16), raw_dtype=Q.BF16)
            a = gguf.quants.dequantize(gguf.quants.quantize(a, Q.BF16), Q.BF16)
        elif dt == "q8_0":
            w.add_tensor(name, gguf.quants.quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(name, a.astype(dt))
            a = a.astype(dt).astype(np.float32)
        tensors[name] = a

    add("token_embd.weight", (VOCAB, D))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (D,), np.float32)
        add(p + "attn_q.weight", (D, D), "bf16" if i == 2 else np.float16)
        add(p + "attn_k.weight", (D // 2, D))
        add(p + "attn_v.weight", (D // 2, D), "q8_0" if quantized_tensor and i == 3 else np.float16)
        add(p + "attn_output.weight", (D, D))
        add(p + "ffn_gate.weight", (FF, D))
        add(p + "ffn_up.weight", (FF, D))
        add(p + "ffn_down.weight", (D, FF), np.float32)
    add("blk.0.ffn_gate_exps.weight", (4, 64, D))  # experts: MXFP4 in MXFP4_MOE
    add("extra.weight", (4, 96))  # rows of 96: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0
    add("odd.weight", (4, 40))    # rows of 40: F16
    add("output_norm.weight", (D,), np.float32)
    add("output.weight", (VOCAB, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


BASE = {"Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q6_K": Q.Q6_K, "Q4_K_M": Q.Q4_K, "Q5_K_M": Q.Q5_K,
        "IQ4_NL": Q.IQ4_NL, "IQ4_XS": Q.IQ4_XS, "MXFP4_MOE": Q.MXFP4}
FILE_TYPE = {"Q8_0": 7, "Q4_0": 2, "Q6_K": 18, "Q4_K_M": 15, "Q5_K_M": 17, "IQ4_NL": 25, "IQ4_XS": 30,
             "MXFP4_MOE": 38}


def expected_type(name, typ):
    base = BASE[typ]
    if name.endswith("norm.weight"):
        return None  # copied
    if typ == "MXFP4_MOE":  # experts MXFP4, the rest Q8_0 (rows of 40: F16)
        return Q.MXFP4 if "_exps" in name else Q.F16 if name == "odd.weight" else Q.Q8_0
    if name == "output.weight":
        return Q.Q8_0 if base == Q.Q8_0 else Q.Q6_K
    if name == "odd.weight":
        return Q.F16 if base in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else base if 40 % 32 == 0 else Q.F16
    if name == "extra.weight":
        return {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}.get(base, base)
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if typ in ("Q4_K_M", "Q5_K_M") and (name.endswith("attn_v.weight") or name.endswith("ffn_down.weight")):
        return Q.Q6_K if layer in MORE_BITS else base
    if typ in ("IQ4_NL", "IQ4_XS") and name.endswith("ffn_down.weight") and layer < N_LAYER // 8:
        return Q.Q5_K  # llama-quantize without an importance matrix
    return base


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def nmse(x, y):
    return float(np.sum((x - y) ** 2) / max(np.sum(x * x), 1e-30))


MAX_NMSE = {Q.Q8_0: 1e-4, Q.Q4_0: 2e-2, Q.Q4_K: 1e-2, Q.Q5_K: 3e-3, Q.Q6_K: 1e-3, Q.Q5_0: 5e-3, Q.Q5_1: 3e-3,
            Q.F16: 1e-6, Q.IQ4_NL: 1e-2, Q.IQ4_XS: 1e-2, Q.MXFP4: 2.5e-2}


def main():
    baton = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "in.gguf")
        orig = make_model(src)
        src_reader = gguf.GGUFReader(src)
        for typ in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "IQ4_NL", "IQ4_XS", "MXFP4_MOE"):
            out = os.path.join(d, f"out_{typ}.gguf")
            r = run(baton, "quantize", "-t", "2", src, out, typ)
            check(r.returncode == 0, f"{typ}: exit {r.returncode}: {r.stderr[-500:]}")
            if r.returncode:
                continue
            check(f"[{len(orig)}/{len(orig)}]" in r.stderr, f"{typ}: no progress line for the last tensor")
            rd = gguf.GGUFReader(out)
            ft = rd.fields["general.file_type"].contents()
            check(ft == FILE_TYPE[typ], f"{typ}: file_type {ft}")
            for k in ("test.note", "test.list", "llama.block_count", "general.architecture"):
                check(rd.fields[k].contents() == src_reader.fields[k].contents(), f"{typ}: key {k} not copied")
            for t in rd.tensors:
                want = expected_type(t.name, typ)
                src_t = next(s for s in src_reader.tensors if s.name == t.name)
                if want is None:
                    check(t.tensor_type == src_t.tensor_type and bytes(t.data) == bytes(src_t.data),
                          f"{typ}: {t.name} not copied as it is")
                    continue
                check(t.tensor_type == want, f"{typ}: {t.name} is {t.tensor_type.name}, llama.cpp gives {want.name}")
                x = orig[t.name]
                y = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(x.shape)
                e = nmse(x, y)
                check(e <= MAX_NMSE[t.tensor_type], f"{typ}: {t.name} NMSE {e:.2e} > {MAX_NMSE[t.tensor_type]:.0e}")
                if t.tensor_type in (Q.Q8_0, Q.Q4_0, Q.MXFP4):
                    ref = gguf.quants.quantize(x, t.tensor_type)
                    check(np.array_equal(np.asarray(t.data).reshape(-1), ref.reshape(-1)),
                          f"{typ}: {t.name} bytes differ from gguf.quants.quantize")
            print(f"{typ}: {len(rd.tensors)} tensors checked")
        # thread count does not change the bytes
        out1 = os.path.join(d, "t1.gguf")
        r = run(baton, "quantize", "--threads", "1", src, out1, "Q4_K_M")
        check(r.returncode == 0, f"-t 1: exit {r.returncode}")
        with open(out1, "rb") as f1, open(os.path.join(d, "out_Q4_K_M.gguf"), "rb") as f2:
            check(f1.read() == f2.read(), "Q4_K_M with 1 thread and with 2 threads differ")
        # --dry-run prints the plan and writes nothing
        dry = os.path.join(d, "dry.gguf")
        r = run(baton, "quantize", "--dry-run", src, dry, "Q4_K_M")
        check(r.returncode == 0 and not os.path.exists(dry), "--dry-run wrote a file or failed")
        check("blk.4.attn_v.weight" in r.stdout and "-> Q6_K" in r.stdout, "--dry-run: no plan printed")

        # bad inputs
        def bad(args, rc, needle, out=None):
            r = run(baton, "quantize", *args)
            msg = r.stderr.strip()
            check(r.returncode == rc, f"{args}: exit {r.returncode}, want {rc} ({msg[-300:]})")
            check(needle in msg, f"{args}: message {msg[-300:]!r} lacks {needle!r}")
            if out:
                left = [f for f in os.listdir(os.path.dirname(out)) if f.startswith(os.path.basename(out))]
                check(not left, f"{args}: left {left} behind")

        out = os.path.join(d, "bad.gguf")
        bad([os.path.join(d, "missing.gguf"), out, "Q4_K_M"], 1, "missing.gguf", out)
        bad([src, out, "Q3_K_XL"], 2, "unknown TYPE 'Q3_K_XL'", out)
        for typ in ("IQ2_XXS", "iq3_s", "IQ1_S"):
            bad([src, out, typ], 2, f"TYPE {typ.upper()} needs an importance matrix (llama.cpp's imatrix)", out)
        bad([src, out], 2, "IN, OUT and TYPE are required", out)
        bad(["-t", "0", src, out, "Q8_0"], 2, "threads must be 1 to 64", out)
        bad(["--frobnicate", src, out, "Q8_0"], 2, "unknown option '--frobnicate'", out)
        bad([src, os.path.join(d, "no", "such", "dir.gguf"), "Q8_0"], 1,
            "no/such/dir.gguf: cannot write there: No such file or directory")
        # OUT a directory or empty: refused before any tensor is quantised
        # (before: every tensor, then "cannot rename ... into place")
        bad([src, d, "Q8_0"], 1, f"{d}: is a directory")
        r = run(baton, "quantize", src, d, "Q8_0")
        check("->" not in r.stdout, "quantize onto a directory: tensors were quantised before the refusal")
        bad([src, "", "Q8_0"], 2, "OUT: the file name is empty")
        bad(["", out, "Q8_0"], 2, "IN: the file name is empty", out)
        nan_src = os.path.join(d, "nan.gguf")
        make_model(nan_src, nan_in="blk.5.ffn_up.weight")
        bad([nan_src, out, "Q4_K_M"], 1, 'tensor "blk.5.ffn_up.weight": row 1, element 37 is not a finite number', out)
        q_src = os.path.join(d, "q.gguf")
        make_model(q_src, quantized_tensor=True)
        bad([q_src, out, "Q4_K_M"], 1, 'tensor "blk.3.attn_v.weight" is Q8_0: only F32, F16 and BF16', out)
        trunc = os.path.join(d, "trunc.gguf")
        with open(src, "rb") as f, open(trunc, "wb") as g:
            g.write(f.read()[: 100000])
        bad([trunc, out, "Q8_0"], 1, "trunc.gguf", out)
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("baton quantize: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
