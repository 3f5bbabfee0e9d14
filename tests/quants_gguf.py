#!/usr/bin/env python3
"""quants_gguf.py - baton's block types against the gguf Python package.

For every type gguf.quants knows (Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K..Q6_K,
MXFP4, IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S):
  - dequantisation of random bytes and, for the types baton quantises to, of
    baton's own quantiser output is bit-identical to gguf.quants.dequantize
    (an independent numpy implementation of ggml's dequantize_row_*);
  - where gguf.quants can quantise (Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 MXFP4), baton's
    bytes are identical to gguf.quants.quantize's on the same floats.
Usage: quants_gguf.py QUANTS_TOOL  (tests/quants_tool.c).  Exits 1 on any
difference, naming the type, block and element.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

TYPES = {  # baton's name -> gguf's type, whether gguf can quantise it, whether baton can
    "q8_0": (T.Q8_0, True, True), "q4_0": (T.Q4_0, True, True), "q4_1": (T.Q4_1, True, True),
    "q5_0": (T.Q5_0, True, True), "q5_1": (T.Q5_1, True, True),
    "q2_K": (T.Q2_K, False, True), "q3_K": (T.Q3_K, False, True), "q4_K": (T.Q4_K, False, True),
    "q5_K": (T.Q5_K, False, True), "q6_K": (T.Q6_K, False, True),
    "mxfp4": (T.MXFP4, True, True), "iq4_nl": (T.IQ4_NL, False, True), "iq4_xs": (T.IQ4_XS, False, True),
    "iq2_xxs": (T.IQ2_XXS, False, False), "iq2_xs": (T.IQ2_XS, False, False),
    "iq2_s": (T.IQ2_S, False, False), "iq3_xxs": (T.IQ3_XXS, False, False),
    "iq3_s": (T.IQ3_S, False, False), "iq1_s": (T.IQ1_S, False, False),
}


def same_floats(a, b):
    """Bitwise equal, or both NaN."""
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def run(tool, name, mode, seed, nblocks, d):
    subprocess.run([tool, name, mode, str(seed), str(nblocks), d], check=True)
    rd = lambda f, dt: np.fromfile(os.path.join(d, f), dtype=dt)
    x = rd("x.f32", np.float32) if mode == "quantize" else None
    return x, rd("q.bin", np.uint8), rd("y.f32", np.float32)


def main():
    tool = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        for name, (qt, can_quantize, baton_quantizes) in TYPES.items():
            block, tsize = gguf.GGML_QUANT_SIZES[qt]
            for mode in ("dequantize", "quantize") if baton_quantizes else ("dequantize",):
                for seed in (1, 2):
                    nblocks = 512
                    x, q, y = run(tool, name, mode, seed, nblocks, d)
                    assert q.size == nblocks * tsize and y.size == nblocks * block, name
                    with np.errstate(over="ignore"):  # MXFP4's largest exponents reach inf, as in baton
                        ref = gguf.quants.dequantize(q.reshape(1, -1), qt).reshape(-1).astype(np.float32)
                    ok = same_floats(y, ref)
                    if not ok.all():
                        i = int(np.argmin(ok))
                        print(f"FAIL {name} {mode} seed {seed}: dequantisation differs from gguf at block "
                              f"{i // block} element {i % block}: baton {y[i]!r} gguf {ref[i]!r} "
                              f"({int((~ok).sum())} elements differ)")
                        failures += 1
                    if mode == "quantize" and can_quantize:
                        refq = gguf.quants.quantize(x.reshape(1, -1), qt).reshape(-1)
                        okq = refq == q
                        if not okq.all():
                            i = int(np.argmin(okq))
                            print(f"FAIL {name} seed {seed}: quantisation differs from gguf at block "
                                  f"{i // tsize} byte {i % tsize}: baton {q[i]} gguf {refq[i]} "
                                  f"({int((~okq).sum())} bytes differ)")
                            failures += 1
            print(f"{name}: compared with gguf {gguf.__name__} "
                  f"({'dequantize + quantize' if can_quantize else 'dequantize'})")
    if failures:
        print(f"{failures} comparisons failed")
        return 1
    print("all block types match the gguf package")
    return 0


if __name__ == "__main__":
    sys.exit(main())
