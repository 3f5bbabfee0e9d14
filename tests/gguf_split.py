#!/usr/bin/env python3
"""gguf_split.py IN.gguf OUT.gguf N - IN rewritten by the gguf package's own
writer as a split model of at most N tensors a shard: OUT-00001-of-0000K.gguf
..., with split.no, split.count and split.tensors.count as llama.cpp's
gguf-split writes them (the metadata in the first shard).  A reference for
baton's reader of split files; the tests call it, nothing else does."""
import sys

import gguf

src, dst, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(dst, arch, split_max_tensors=per)
for f in r.fields.values():
    if f.name == "general.architecture" or f.name.startswith("GGUF."):
        continue
    t = f.types[0]
    w.add_key_value(f.name, f.contents(), t, sub_type=f.types[-1] if t == gguf.GGUFValueType.ARRAY else None)
for t in r.tensors:
    w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
