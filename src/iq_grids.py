#!/usr/bin/env python3
"""iq_grids.py - writes src/iq_grids.c, the lattice tables of the IQ weight
types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S) and IQ2's sign table,
from the definitions in the gguf Python package (gguf.quants), which are
ggml's tables (ggml-common.h) in another encoding.

Usage: iq_grids.py > src/iq_grids.c.  ctest iq_grids checks that the
committed file is what this prints.
"""
import sys

import numpy as np
from gguf import quants

# name in C, gguf's class, bytes per grid entry
GRIDS = [
    ("bt_iq2xxs_grid", quants.IQ2_XXS, 8),
    ("bt_iq2xs_grid", quants.IQ2_XS, 8),
    ("bt_iq2s_grid", quants.IQ2_S, 8),
    ("bt_iq3xxs_grid", quants.IQ3_XXS, 4),
    ("bt_iq3s_grid", quants.IQ3_S, 4),
    ("bt_iq1s_grid", quants.IQ1_S, 8),
]


def entry_words(cls, nbytes):
    """Each grid entry as one little-endian word: byte j is element j (an
    int8; IQ1_S's -1 is 0xff)."""
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    assert g.shape[1] == nbytes, cls.__name__
    vals = g.astype(np.int64)
    assert (vals == g).all(), cls.__name__  # the grids hold integers
    words = []
    for row in vals:
        w = 0
        for j, v in enumerate(row):
            w |= (int(v) & 0xFF) << (8 * j)
        words.append(w)
    return words


def main():
    out = sys.stdout
    out.write("/* iq_grids.c - the lattice tables of the IQ weight types and IQ2's sign\n"
              " * table (quants.h), as ggml defines them.  Written by src/iq_grids.py from\n"
              " * the gguf Python package's definitions; do not edit (ctest iq_grids\n"
              " * compares the two). */\n")
    out.write('#include "quants.h"\n\n')
    for name, cls, nbytes in GRIDS:
        words = entry_words(cls, nbytes)
        ctype = "uint64_t" if nbytes == 8 else "uint32_t"
        fmt = "0x%016xull" if nbytes == 8 else "0x%08xu"
        per_line = 4 if nbytes == 8 else 8
        out.write(f"const {ctype} {name}[{len(words)}] = {{\n")
        for i in range(0, len(words), per_line):
            out.write("    " + ", ".join(fmt % w for w in words[i:i + per_line]) + ",\n")
        out.write("};\n\n")
    signs = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8)
    assert len(signs) == 128
    out.write("const uint8_t bt_iq2_signs[128] = {\n")
    for i in range(0, 128, 16):
        out.write("    " + ", ".join("0x%02x" % s for s in signs[i:i + 16]) + ",\n")
    out.write("};\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
