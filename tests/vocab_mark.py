#!/usr/bin/env python3
"""vocab_mark.py IN.gguf OUT.gguf TEXT - IN's vocabulary with its last token
made a control token whose text is TEXT (Mistral's "[TOOL_CALLS]" is one in
Mistral's vocabularies, and not in the vocabularies the tests have): for
serve_json_test's check that a tool-call mark which is a control token is
shown, fires the trigger and is taken by the grammar.  Prints the token's id."""
import sys

import gguf

src, dst, text = sys.argv[1], sys.argv[2], sys.argv[3]
r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents() if "general.architecture" in r.fields else "llama"
w = gguf.GGUFWriter(dst, arch)
last = None
for f in r.fields.values():
    if f.name == "general.architecture" or f.name.startswith("GGUF."):
        continue
    t, v = f.types[0], f.contents()
    if f.name == "tokenizer.ggml.tokens":
        last = len(v) - 1
        v[last] = text
    elif f.name == "tokenizer.ggml.token_type":
        v[-1] = int(gguf.TokenType.CONTROL)
    w.add_key_value(f.name, v, t, sub_type=f.types[-1] if t == gguf.GGUFValueType.ARRAY else None)
for t in r.tensors:
    w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(last)
