#!/usr/bin/env python3
"""model_ref.py - tiny random-weight llama-family models as GGUF files, and
their logits from an independent numpy reference.

The reference is written from the architectures' published definitions
(Meta's LLaMA with interleaved rotary pairs, Mixtral's top-k MoE, Qwen2's
q/k/v biases and rotate-half rotary, Qwen3's per-head q/k RMSNorm, Qwen2-MoE's
sigmoid-gated shared expert, OLMoE's whole-vector q/k RMSNorm, Gemma 3's
scaled embedding, pre- and post-norms, GELU-gated MLP, sliding-window layers
with their own rotary base beside global layers, DeepSeek-V2/V3's multi-head
latent attention computed as Hugging Face's modeling_deepseek does it, from
the whole kv_b_proj the file's attn_k_b and attn_v_b were split from, with
leading dense layers, sigmoid or softmax routing, a selection bias and
ungated shared experts; OpenAI's gpt-oss with its
attention sinks, YaRN rotary, alternating sliding and full layers, biases
everywhere, router softmax over the top k and clamped SwiGLU; GLM-4.5's
rotary over half of each head, q/k/v biases, per-head q/k norms, sigmoid
routing with a selection bias, a shared expert, a leading dense layer and a
next-token-prediction layer in the file that is not run; MiniMax-M2's RMSNorm
over the whole q and k projections, rotary over half of each head, every
layer a sigmoid-routed MoE with a selection bias, renormalised), reads the
GGUF back with the gguf package (dequantising Q8_0 with gguf.quants) and
computes in float64; nothing here comes from baton.

Usage: model_ref.py ARCH TYPE DIR [BREAK]
  ARCH  llama llama-moe qwen2 qwen3 qwen2moe qwen3moe olmoe gemma3 deepseek2
        (V3's form: q_lora_rank, sigmoid gating with exp_probs_b, renormalised,
        scaled) deepseek2-lite (V2-Lite's: q without a rank, softmax) gpt-oss
        glm4moe minimax-m2
  TYPE  f32, q8_0, mxfp4, iq4_nl, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs,
        iq3_s or iq1_s (the matrices whose rows are whole blocks of TYPE; the
        rest, norms and biases stay f32).  Q8_0 and MXFP4 through
        gguf.quants.quantize; the types it cannot quantise to get random
        blocks whose scale gives the f32 matrix's RMS.  For the 256-element
        types the model is 256 wide (embedding, feed-forward).  gpt-oss
        keeps every matrix but the experts' f32 with mxfp4, as its files do.
  BREAK none, missing (drop blk.1.attn_k.weight; deepseek2: attn_k_b),
        shape (blk.0.ffn_up has a wrong shape; deepseek2-lite, whose layer 0
        is dense too: also blk.1.attn_v_b), arch (general.architecture
        "gpt9"), long (as none with a prompt of 80 tokens: a sliding window's
        ring wraps); gemma3 only: slideall (as none with a window pattern
        longer than the model: every layer slides); deepseek2 only: legacy
        (the older attn_kv_b, no key_length_mla), groups (4 experts in 3 groups), geometry (key_length
        one more than kv_lora_rank + rope), yarn (no yarn_log_multiplier);
        gpt-oss only: sinks (without blk.0.attn_sinks.weight), nowindow (without
        its attention.sliding_window); glm4moe only: probsb (without
        blk.1.exp_probs_b.bias), nextn (nextn_predict_layers = block_count),
        mrope (rope.dimension_sections, GLM-4.5V's); minimax-m2 only: probsb
        (without blk.1.exp_probs_b.bias), gating (no expert_gating_func),
        ffwidth (feed_forward_length not the experts' width), tied (no
        output.weight), shared (expert_shared_count 1)
Writes DIR/model.gguf and DIR/ref.bin: int32 n_tokens, int32 n_vocab,
int32 tokens[n_tokens], float32 logits[n_tokens][n_vocab] (every position of
one sequence, positions 0..n-1).

       model_ref.py ARCH TYPE DIR vocab VOCAB.gguf
Writes DIR/model.gguf with the vocabulary (every tokenizer.* key) of
VOCAB.gguf, n_vocab its token count; no ref.bin.

       model_ref.py ARCH TYPE DIR greedy IDS N
Greedy decoding of DIR/model.gguf from the prompt IDS (comma-separated token
ids): prints one JSON object {"tokens": [N ids], "margin": [the gap between
the largest and the second largest logit at each step, over the largest
absolute logit]}.  Each step recomputes the whole sequence (no cache).
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV = 100, 64, 2, 4, 2
N_FF, N_EXPERT, N_USED, N_FF_EXP, N_FF_SH = 96, 4, 2, 32, 64
WTYPES = {"f32": QT.F32, "q8_0": QT.Q8_0, "mxfp4": QT.MXFP4, "iq4_nl": QT.IQ4_NL, "iq4_xs": QT.IQ4_XS,
          "iq2_xxs": QT.IQ2_XXS, "iq2_xs": QT.IQ2_XS, "iq2_s": QT.IQ2_S, "iq3_xxs": QT.IQ3_XXS,
          "iq3_s": QT.IQ3_S, "iq1_s": QT.IQ1_S}
EPS, ROPE_BASE, N_TOK = 1e-5, 10000.0, 12

SPEC = {  # gguf arch, rope (norm / neox), moe, renorm top-k, shared, qk norm (head / full / None), biases, head_dim
    "llama": ("llama", "norm", False, False, False, None, False, 16),
    "llama-moe": ("llama", "norm", True, True, False, None, False, 16),
    "qwen2": ("qwen2", "neox", False, False, False, None, True, 16),
    "qwen3": ("qwen3", "neox", False, False, False, "head", False, 32),
    "qwen2moe": ("qwen2moe", "neox", True, False, True, None, True, 16),
    "qwen3moe": ("qwen3moe", "neox", True, True, False, "head", False, 32),
    "olmoe": ("olmoe", "neox", True, False, False, "full", False, 16),
    "gemma3": ("gemma3", "neox", False, False, False, "head", False, 32),
    "deepseek2": ("deepseek2", "norm", True, True, True, None, False, 0),
    "deepseek2-lite": ("deepseek2", "norm", True, False, True, None, False, 0),
    "gpt-oss": ("gpt-oss", "neox", True, False, False, None, True, 32),
    "glm4moe": ("glm4moe", "neox", True, True, True, "head", True, 32),
    "minimax-m2": ("minimax-m2", "neox", True, True, False, "full", False, 32),
}
# DeepSeek: kv_lora_rank, q_lora_rank (0: lite), qk_nope_head_dim,
# qk_rope_head_dim, v_head_dim; layer 0 dense, layer 1 MoE with one shared
# expert; V3's routing: sigmoid, selection bias, renormalised, times 2.5
D_KV_RANK, D_Q_RANK, D_NOPE, D_ROPE, D_V, D_DENSE, D_SHARED, D_SCALE = 64, 64, 32, 32, 32, 1, 1, 2.5
# YaRN as both ship it (factor 40, 4096 positions there): here factor 4 over
# 32 positions, so that the ramp falls inside the 16 pairs; mscale_all_dim 1
# (V3) and 0.707 (V2-Lite), written as yarn_log_multiplier = 0.1 * it
# 4 experts; V3's: in 2 groups of 2, the experts chosen in the 1 group whose
# two best selection scores add up highest
D_EXPERT, D_GROUPS, D_GROUPS_USED = 4, 2, 1
D_YARN_FACTOR, D_YARN_ORIG, D_MSCALE = 4.0, 32, {"deepseek2": 1.0, "deepseek2-lite": 0.707}
# Gemma 3: a window of 4 tokens that the 12-token prompt crosses; layer il is
# global when il % pattern == pattern - 1 (Gemma 3's every 6th layer; here
# every 2nd, so both kinds are in 2 layers).  Global layers use the file's
# rotary base with its linear scaling, sliding ones base 10000 unscaled.
G_SWA, G_PATTERN, G_ROPE_GLOBAL, G_ROPE_LOCAL, G_ROPE_SCALE = 4, 2, 1e6, 10000.0, 2.0
# BREAK slideall: a pattern longer than the model, so that every layer slides
g_pattern = G_PATTERN
# gpt-oss: the even layers slide over 4 tokens (the file does not say the
# pattern: llama.cpp's default 2, gpt-oss's layer_types), every layer rotates
# with YaRN at gpt-oss's base, factor and original context; swiglu_oai's
# alpha and limit
O_SWA, O_ROPE_BASE, O_YARN_FACTOR, O_YARN_ORIG, O_CTX = 4, 150000.0, 32.0, 4096, 131072
O_ALPHA, O_LIMIT = 1.702, 7.0
# GLM-4.5: heads of 32 rotated over their first half (partial_rotary_factor
# 0.5), rotary base 1e6; layer 0 dense, layer 1 MoE with one shared expert;
# sigmoid routing with the selection bias, renormalised, times 2.5; one
# next-token-prediction layer after the two (block_count 3), never run
M_ROT, M_ROPE_BASE, M_DENSE, M_SHARED, M_SCALE, M_NEXTN = 16, 1e6, 1, 1, 2.5, 1
# MiniMax-M2: heads of 32 rotated over their first half (rotary_dim 64 of
# head_dim 128 there), its rotary base 5e6; every layer MoE
X_ROT, X_ROPE_BASE = 16, 5e6


def copy_vocab(w, vocab):
    """every tokenizer.* key of the GGUF file vocab into w; the token count"""
    r = gguf.GGUFReader(vocab)
    n = 0
    for k, f in r.fields.items():
        if not k.startswith("tokenizer."):
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        w.add_key_value(k, f.contents(), f.types[0], sub)
        if k == "tokenizer.ggml.tokens":
            n = len(f.contents())
    return n


def encode(tname, a, qt):
    """a (rows of whole blocks) as qt's bytes"""
    if qt in (QT.Q8_0, QT.MXFP4):
        return gguf.quants.quantize(a, qt)
    # random blocks (every one of these types has its fp16 d first), d set so
    # that the dequantised matrix has a's RMS
    blk, ts = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(sum(map(ord, tname)) * 104729)
    raw = rng.integers(0, 256, size=(a.size // blk, ts), dtype=np.uint8)
    raw[:, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
    unit = gguf.quants.dequantize(raw.reshape(-1), qt).astype(np.float64)
    d = np.float16(np.sqrt(np.mean(a.astype(np.float64) ** 2) / np.mean(unit ** 2)))
    raw[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return raw.reshape(a.shape[:-1] + (a.shape[-1] // blk * ts,))


def write(name, wtype, path, brk, vocab=None):
    global N_VOCAB
    arch, rope, moe, _, shared, qkn, bias, hd = SPEC[name]
    rng = np.random.default_rng(sum(map(ord, name)) * 7919)
    w = gguf.GGUFWriter(path, "gpt9" if brk == "arch" else arch)
    if vocab:
        N_VOCAB = copy_vocab(w, vocab)
    if arch == "deepseek2":
        return write_deepseek(name, wtype, w, rng, brk)
    if arch == "glm4moe":
        return write_glm(wtype, w, rng, brk)
    if arch == "minimax-m2":
        return write_minimax(wtype, w, rng, brk)
    w.add_uint32(f"{arch}.block_count", N_LAYER)
    w.add_uint32(f"{arch}.embedding_length", N_EMBD)
    w.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    w.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    if hd != N_EMBD // N_HEAD:
        w.add_uint32(f"{arch}.attention.key_length", hd)
        w.add_uint32(f"{arch}.attention.value_length", hd)
    w.add_uint32(f"{arch}.rope.dimension_count", hd)
    gemma, oss = arch == "gemma3", arch == "gpt-oss"
    w.add_float32(f"{arch}.rope.freq_base", G_ROPE_GLOBAL if gemma else O_ROPE_BASE if oss else ROPE_BASE)
    if oss:  # gpt-oss's converter: the window, YaRN with its original context
        w.add_uint32(f"{arch}.context_length", O_CTX)
        if brk != "nowindow":
            w.add_uint32(f"{arch}.attention.sliding_window", O_SWA)
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", O_YARN_FACTOR)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", O_YARN_ORIG)
    if gemma:  # llama.cpp's gemma3 loader wants the context length
        w.add_uint32(f"{arch}.context_length", 4096)
        w.add_uint32(f"{arch}.attention.sliding_window", G_SWA)
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", g_pattern)
        w.add_string(f"{arch}.rope.scaling.type", "linear")
        w.add_float32(f"{arch}.rope.scaling.factor", G_ROPE_SCALE)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{arch}.feed_forward_length", N_FF)
    if moe:
        w.add_uint32(f"{arch}.expert_count", N_EXPERT)
        w.add_uint32(f"{arch}.expert_used_count", N_USED)
        w.add_uint32(f"{arch}.expert_feed_forward_length", N_FF_EXP)
        if shared:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", N_FF_SH)

    mat, vec = makers(rng)

    put = put_fn(w, wtype, brk, oss)

    q_dim, kv_dim = N_HEAD * hd, N_HEAD_KV * hd
    put_globals(put, rng, mat, vec, name not in ("qwen3", "gemma3"))  # their files tie the output to token_embd
    for il in range(N_LAYER):
        b = f"blk.{il}."
        put(b + "attn_norm.weight", vec(N_EMBD), False)
        put_attn(put, mat, b, q_dim, kv_dim)
        if bias:
            put(b + "attn_q.bias", vec(q_dim, 0.0, 0.5), False)
            put(b + "attn_k.bias", vec(kv_dim, 0.0, 0.5), False)
            put(b + "attn_v.bias", vec(kv_dim, 0.0, 0.5), False)
        if qkn == "head":
            put(b + "attn_q_norm.weight", vec(hd), False)
            put(b + "attn_k_norm.weight", vec(hd), False)
        elif qkn == "full":
            put(b + "attn_q_norm.weight", vec(q_dim), False)
            put(b + "attn_k_norm.weight", vec(kv_dim), False)
        if gemma:  # the converter has added Gemma's 1 to every norm weight
            put(b + "post_attention_norm.weight", vec(N_EMBD), False)
            put(b + "post_ffw_norm.weight", vec(N_EMBD), False)
        if oss:
            put(b + "attn_output.bias", vec(N_EMBD, 0.0, 0.5), False)
            put(b + "attn_sinks.weight", vec(N_HEAD, 1.0, 2.0), False)
            put(b + "post_attention_norm.weight", vec(N_EMBD), False)
            put(b + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD) * 4, False)
            put(b + "ffn_gate_inp.bias", vec(N_EXPERT, 0.0, 1.0), False)
            put_experts(put, mat, b, N_EXPERT)
            # biases of 6 around 0: gate and up values past the clamp's 7
            put(b + "ffn_gate_exps.bias", (rng.uniform(-6, 6, size=(N_EXPERT, N_FF_EXP))).astype(np.float32), False)
            put(b + "ffn_up_exps.bias", (rng.uniform(-6, 6, size=(N_EXPERT, N_FF_EXP))).astype(np.float32), False)
            put(b + "ffn_down_exps.bias", (rng.uniform(-0.5, 0.5, size=(N_EXPERT, N_EMBD))).astype(np.float32), False)
            continue
        put(b + "ffn_norm.weight", vec(N_EMBD), False)
        if not moe:
            put(b + "ffn_gate.weight", mat(N_FF, N_EMBD))
            put(b + "ffn_up.weight", mat(N_FF, N_EMBD))
            put(b + "ffn_down.weight", mat(N_EMBD, N_FF))
            continue
        put(b + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD) * 4, False)
        put_experts(put, mat, b, N_EXPERT)
        if shared:
            put(b + "ffn_gate_inp_shexp.weight", mat(N_EMBD), False)
            put(b + "ffn_gate_shexp.weight", mat(N_FF_SH, N_EMBD))
            put(b + "ffn_up_shexp.weight", mat(N_FF_SH, N_EMBD))
            put(b + "ffn_down_shexp.weight", mat(N_EMBD, N_FF_SH))
    finish(w)


def makers(rng):
    """mat(*shape): a random matrix in numpy's shape (.., out, in), GGUF's ne
    reversed, scaled by 1.7 / sqrt(in); vec(n): n values around a value"""
    def mat(*shape):
        return (rng.uniform(-1, 1, size=shape) * (1.7 / np.sqrt(shape[-1]))).astype(np.float32)

    def vec(n, around=1.0, spread=0.25):
        return (around + rng.uniform(-spread, spread, size=n)).astype(np.float32)
    return mat, vec


def put_globals(put, rng, mat, vec, output):
    """token_embd, output_norm and (unless tied) output"""
    put("token_embd.weight", rng.uniform(-1, 1, size=(N_VOCAB, N_EMBD)).astype(np.float32))
    put("output_norm.weight", vec(N_EMBD), False)
    if output:
        put("output.weight", mat(N_VOCAB, N_EMBD))


def put_attn(put, mat, b, q_dim, kv_dim):
    """a layer's q, k, v and output matrices"""
    put(b + "attn_q.weight", mat(q_dim, N_EMBD))
    put(b + "attn_k.weight", mat(kv_dim, N_EMBD))
    put(b + "attn_v.weight", mat(kv_dim, N_EMBD))
    put(b + "attn_output.weight", mat(N_EMBD, q_dim))


def put_experts(put, mat, b, n_expert):
    """a layer's routed experts, stacked: gate, up [E, ff, d], down [E, d, ff]"""
    put(b + "ffn_gate_exps.weight", mat(n_expert, N_FF_EXP, N_EMBD))
    put(b + "ffn_up_exps.weight", mat(n_expert, N_FF_EXP, N_EMBD))
    put(b + "ffn_down_exps.weight", mat(n_expert, N_EMBD, N_FF_EXP))


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def put_fn(w, wtype, brk, oss=False):
    """put(name, array, quant): the tensor as wtype where its rows are whole
    blocks (and quant), else f32 (gpt-oss with mxfp4: only the experts); the
    BREAK variants applied"""
    def put(tname, a, quant=True):
        if brk == "missing" and tname in ("blk.1.attn_k.weight", "blk.1.attn_k_b.weight"):
            return
        if brk == "sinks" and tname == "blk.0.attn_sinks.weight":
            return
        if brk == "shape" and tname == "blk.0.ffn_up.weight":
            a = a[:-32]
        if brk == "shape" and tname == "blk.1.attn_v_b.weight":
            a = a[:, :-16]
        if brk == "shape" and tname == "blk.0.ffn_up_exps.weight":
            a = a[:, :-16]
        qt = WTYPES[wtype]
        if oss and qt == QT.MXFP4 and "_exps" not in tname:
            quant = False
        if quant and qt != QT.F32 and a.ndim >= 2 and a.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0] == 0:
            w.add_tensor(tname, encode(tname, a, qt), raw_dtype=qt)
        else:
            w.add_tensor(tname, a)
    return put


def write_deepseek(name, wtype, w, rng, brk):
    """DeepSeek-V2/V3 as today's converter writes it (conversion/deepseek.py):
    MQA cache geometry in key_length / value_length, kv_b_proj split into
    attn_k_b (transposed) and attn_v_b"""
    lite, a = name == "deepseek2-lite", "deepseek2"
    hk = D_NOPE + D_ROPE
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.feed_forward_length", N_FF)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", 1)
    w.add_float32(f"{a}.rope.freq_base", ROPE_BASE)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{a}.leading_dense_block_count", D_DENSE)
    w.add_uint32(f"{a}.vocab_size", N_VOCAB)
    if not lite:
        w.add_uint32(f"{a}.attention.q_lora_rank", D_Q_RANK)
    w.add_uint32(f"{a}.attention.kv_lora_rank", D_KV_RANK)
    w.add_uint32(f"{a}.attention.key_length", D_KV_RANK + D_ROPE + (1 if brk == "geometry" else 0))
    w.add_uint32(f"{a}.attention.value_length", D_KV_RANK)
    if brk != "legacy":
        w.add_uint32(f"{a}.attention.key_length_mla", hk)
        w.add_uint32(f"{a}.attention.value_length_mla", D_V)
    if not lite:
        w.add_uint32(f"{a}.expert_group_count", 3 if brk == "groups" else D_GROUPS)
        w.add_uint32(f"{a}.expert_group_used_count", D_GROUPS_USED)
    w.add_uint32(f"{a}.expert_feed_forward_length", N_FF_EXP)
    w.add_uint32(f"{a}.expert_count", D_EXPERT)
    w.add_uint32(f"{a}.expert_shared_count", D_SHARED)
    w.add_float32(f"{a}.expert_weights_scale", 1.0 if lite else D_SCALE)
    if not lite:  # V2's files have no gating key (softmax)
        w.add_bool(f"{a}.expert_weights_norm", True)
        w.add_uint32(f"{a}.expert_gating_func", 2)
    w.add_uint32(f"{a}.expert_used_count", N_USED)
    w.add_uint32(f"{a}.rope.dimension_count", D_ROPE)
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", D_YARN_FACTOR)
    w.add_uint32(f"{a}.rope.scaling.original_context_length", D_YARN_ORIG)
    if brk != "yarn":
        w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * D_MSCALE[name])
    put = put_fn(w, wtype, brk)

    mat, vec = makers(rng)

    put_globals(put, rng, mat, vec, True)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        put(b + "attn_norm.weight", vec(N_EMBD), False)
        if lite:
            put(b + "attn_q.weight", mat(N_HEAD * hk, N_EMBD))
        else:
            put(b + "attn_q_a.weight", mat(D_Q_RANK, N_EMBD))
            put(b + "attn_q_a_norm.weight", vec(D_Q_RANK), False)
            put(b + "attn_q_b.weight", mat(N_HEAD * hk, D_Q_RANK))
        put(b + "attn_kv_a_mqa.weight", mat(D_KV_RANK + D_ROPE, N_EMBD))
        put(b + "attn_kv_a_norm.weight", vec(D_KV_RANK), False)
        # kv_b_proj [H * (nope + v), R] split as the converter does
        kv_b = mat(N_HEAD * (D_NOPE + D_V), D_KV_RANK).reshape(N_HEAD, D_NOPE + D_V, D_KV_RANK)
        if brk == "legacy":
            put(b + "attn_kv_b.weight", kv_b.reshape(-1, D_KV_RANK))
        put(b + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :D_NOPE, :].transpose(0, 2, 1)))
        put(b + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, D_NOPE:, :]))
        put(b + "attn_output.weight", mat(N_EMBD, N_HEAD * D_V))
        put(b + "ffn_norm.weight", vec(N_EMBD), False)
        if il < D_DENSE:
            put(b + "ffn_gate.weight", mat(N_FF, N_EMBD))
            put(b + "ffn_up.weight", mat(N_FF, N_EMBD))
            put(b + "ffn_down.weight", mat(N_EMBD, N_FF))
            continue
        put(b + "ffn_gate_inp.weight", mat(D_EXPERT, N_EMBD) * 4, False)
        if not lite:
            put(b + "exp_probs_b.bias", vec(D_EXPERT, 0.0, 0.5), False)
        put_experts(put, mat, b, D_EXPERT)
        fs = N_FF_EXP * D_SHARED
        put(b + "ffn_gate_shexp.weight", mat(fs, N_EMBD))
        put(b + "ffn_up_shexp.weight", mat(fs, N_EMBD))
        put(b + "ffn_down_shexp.weight", mat(N_EMBD, fs))
    finish(w)


def write_glm(wtype, w, rng, brk):
    """GLM-4.5 as its converter writes it (conversion/glm.py's Glm4MoeModel):
    block_count with the prediction layers, whose tensors (a whole MoE layer
    and nextn.*) come after the model's; q/k/v biases, per-head q/k norms
    (the 355B's use_qk_norm), post_attention_norm before the FFN"""
    a, hd = "glm4moe", SPEC["glm4moe"][7]
    n_all = N_LAYER + M_NEXTN
    w.add_uint32(f"{a}.block_count", n_all)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.feed_forward_length", N_FF)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{a}.attention.key_length", hd)
    w.add_uint32(f"{a}.attention.value_length", hd)
    w.add_uint32(f"{a}.rope.dimension_count", M_ROT)
    w.add_float32(f"{a}.rope.freq_base", M_ROPE_BASE)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{a}.expert_count", N_EXPERT)
    w.add_uint32(f"{a}.expert_used_count", N_USED)
    w.add_uint32(f"{a}.expert_feed_forward_length", N_FF_EXP)
    w.add_uint32(f"{a}.expert_shared_count", M_SHARED)
    w.add_uint32(f"{a}.leading_dense_block_count", M_DENSE)
    w.add_uint32(f"{a}.expert_gating_func", 2)
    w.add_float32(f"{a}.expert_weights_scale", M_SCALE)
    w.add_bool(f"{a}.expert_weights_norm", True)
    w.add_uint32(f"{a}.nextn_predict_layers", n_all if brk == "nextn" else M_NEXTN)
    if brk == "mrope":  # GLM-4.5V's sections of the multimodal rope
        w.add_array(f"{a}.rope.dimension_sections", [8, 4, 4, 0])
    put = put_fn(w, wtype, brk)

    mat, vec = makers(rng)

    q_dim, kv_dim = N_HEAD * hd, N_HEAD_KV * hd
    put_globals(put, rng, mat, vec, True)
    for il in range(n_all):
        b = f"blk.{il}."
        put(b + "attn_norm.weight", vec(N_EMBD), False)
        put_attn(put, mat, b, q_dim, kv_dim)
        put(b + "attn_q.bias", vec(q_dim, 0.0, 0.5), False)
        put(b + "attn_k.bias", vec(kv_dim, 0.0, 0.5), False)
        put(b + "attn_v.bias", vec(kv_dim, 0.0, 0.5), False)
        put(b + "attn_q_norm.weight", vec(hd), False)
        put(b + "attn_k_norm.weight", vec(hd), False)
        put(b + "post_attention_norm.weight", vec(N_EMBD), False)
        if il < M_DENSE:
            put(b + "ffn_gate.weight", mat(N_FF, N_EMBD))
            put(b + "ffn_up.weight", mat(N_FF, N_EMBD))
            put(b + "ffn_down.weight", mat(N_EMBD, N_FF))
            continue
        put(b + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD) * 4, False)
        if not (brk == "probsb" and il == 1):
            put(b + "exp_probs_b.bias", vec(N_EXPERT, 0.0, 0.5), False)
        put_experts(put, mat, b, N_EXPERT)
        fs = N_FF_EXP * M_SHARED
        put(b + "ffn_gate_shexp.weight", mat(fs, N_EMBD))
        put(b + "ffn_up_shexp.weight", mat(fs, N_EMBD))
        put(b + "ffn_down_shexp.weight", mat(N_EMBD, fs))
        if il >= N_LAYER:  # the prediction layer's own
            put(b + "nextn.eh_proj.weight", mat(N_EMBD, 2 * N_EMBD))
            put(b + "nextn.enorm.weight", vec(N_EMBD), False)
            put(b + "nextn.hnorm.weight", vec(N_EMBD), False)
            put(b + "nextn.shared_head_norm.weight", vec(N_EMBD), False)
    finish(w)


def write_minimax(wtype, w, rng, brk):
    """MiniMax-M2 as its converter writes it (conversion/minimax.py's
    MiniMaxM2Model over TextModel's keys): intermediate_size as both
    feed_forward_length and expert_feed_forward_length, rotary_dim as
    rope.dimension_count, head_dim as key/value length, scoring_func sigmoid
    as expert_gating_func 2; the experts stacked; q_norm/k_norm over the whole
    projections; post_attention_layernorm as ffn_norm;
    e_score_correction_bias as exp_probs_b; lm_head untied"""
    a, hd = "minimax-m2", SPEC["minimax-m2"][7]
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.feed_forward_length", N_FF if brk == "ffwidth" else N_FF_EXP)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_float32(f"{a}.rope.freq_base", X_ROPE_BASE)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", EPS)
    w.add_uint32(f"{a}.expert_count", N_EXPERT)
    w.add_uint32(f"{a}.expert_used_count", N_USED)
    if brk != "gating":
        w.add_uint32(f"{a}.expert_gating_func", 2)
    if brk == "shared":
        w.add_uint32(f"{a}.expert_shared_count", 1)
    w.add_uint32(f"{a}.attention.key_length", hd)
    w.add_uint32(f"{a}.attention.value_length", hd)
    w.add_uint32(f"{a}.expert_feed_forward_length", N_FF_EXP)
    w.add_uint32(f"{a}.rope.dimension_count", X_ROT)
    put = put_fn(w, wtype, brk)

    mat, vec = makers(rng)

    q_dim, kv_dim = N_HEAD * hd, N_HEAD_KV * hd
    put_globals(put, rng, mat, vec, brk != "tied")
    for il in range(N_LAYER):
        b = f"blk.{il}."
        put(b + "attn_norm.weight", vec(N_EMBD), False)
        put_attn(put, mat, b, q_dim, kv_dim)
        put(b + "attn_q_norm.weight", vec(q_dim), False)
        put(b + "attn_k_norm.weight", vec(kv_dim), False)
        put(b + "ffn_norm.weight", vec(N_EMBD), False)
        put(b + "ffn_gate_inp.weight", mat(N_EXPERT, N_EMBD) * 4, False)
        if not (brk == "probsb" and il == 1):
            put(b + "exp_probs_b.bias", vec(N_EXPERT, 0.0, 0.5), False)
        put_experts(put, mat, b, N_EXPERT)
    finish(w)


# ---- the reference ----------------------------------------------------------

def load(path):
    r = gguf.GGUFReader(path)
    t = {}
    for x in r.tensors:
        shape = tuple(int(n) for n in reversed(x.shape.tolist()))  # numpy order
        if x.tensor_type == QT.F32:
            a = np.asarray(x.data, dtype=np.float32).reshape(shape)
        else:
            a = gguf.quants.dequantize(np.asarray(x.data), x.tensor_type).reshape(shape)
        t[x.name] = a.astype(np.float64)
    return t


def rms(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def rope(x, pos, mode, base=ROPE_BASE, scale=1.0):
    """x [T, heads, hd]; rotate pairs by (pos / scale) * base^(-2i/hd)."""
    d = x.shape[2]
    return rope_inv(x, pos, mode, base ** (-np.arange(0, d, 2, dtype=np.float64) / d) / scale)


def yarn_inv_freq(d, base, factor, orig, beta_fast=32.0, beta_slow=1.0):
    """modeling_deepseek's DeepseekV2YarnRotaryEmbedding: each pair's
    frequency between extrapolated (base^(-2i/d)) and interpolated (that over
    factor) by a linear ramp over the correction range"""
    def corr(rot):
        return d * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(base))
    lo, hi = max(np.floor(corr(beta_fast)), 0), min(np.ceil(corr(beta_slow)), d - 1)
    hi = hi + 0.001 if hi == lo else hi
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
    extra = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    return extra / factor * ramp + extra * (1 - ramp)


def rope_inv(x, pos, mode, inv):
    """x [T, heads, hd]; rotate pair i by pos * inv[i]."""
    T, _, d = x.shape
    ang = pos[:, None].astype(np.float64) * inv[None, :]  # [T, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    if mode == "norm":  # Meta LLaMA: complex pairs (x[2i], x[2i+1])
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    else:  # rotate_half: pairs (x[i], x[i + d/2])
        a, b = x[..., : d // 2], x[..., d // 2:]
        out[..., : d // 2], out[..., d // 2:] = a * c - b * s, a * s + b * c
    return out


def rope_yarn(x, pos, base, factor, orig, beta_fast=32.0, beta_slow=1.0):
    """x [T, heads, hd], rotate_half pairs; YaRN (Peng et al. 2023, "YaRN:
    Efficient Context Window Extension"): per pair i the frequency mixes the
    interpolated base^(-2i/d) / factor and the extrapolated base^(-2i/d) by a
    ramp between the dims whose wavelength makes beta_fast and beta_slow turns
    over the original context (floored and ceiled, as the paper's code and
    transformers' default; gpt-oss's config says truncate: false, which
    llama.cpp does not follow either), cos and sin times 0.1 ln(factor) + 1."""
    T, _, d = x.shape
    pos_freq = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    extra, inter = 1.0 / pos_freq, 1.0 / (factor * pos_freq)

    def corr_dim(n_rot):
        return d * np.log(orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))
    low, high = max(np.floor(corr_dim(beta_fast)), 0), min(np.ceil(corr_dim(beta_slow)), d - 1)
    ramp = np.clip((np.arange(d // 2) - low) / max(high - low, 0.001), 0, 1)
    inv = inter * ramp + extra * (1 - ramp)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    m = 0.1 * np.log(factor) + 1.0
    c, s = (np.cos(ang) * m)[:, None, :], (np.sin(ang) * m)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def swiglu_oai(g, u):
    """gpt-oss's MLP activation (its reference model.py): the gate clamped
    above at 7, the linear part to [-7, 7], g * sigmoid(1.702 g) * (u + 1)"""
    g, u = np.minimum(g, O_LIMIT), np.clip(u, -O_LIMIT, O_LIMIT)
    return g / (1 + np.exp(-O_ALPHA * g)) * (u + 1)


def gpt_oss_layer(t, il, x, pos):
    """one gpt-oss block (its reference model.py): attention with sinks over
    the causal or sliding window, then the MoE with biased router and experts"""
    b, T, hd, group = f"blk.{il}.", len(pos), SPEC["gpt-oss"][7], N_HEAD // N_HEAD_KV
    seen = np.tril(np.ones((T, T), dtype=bool))
    if il % 2 == 0:  # sliding_attention on the even layers
        seen &= pos[:, None] - pos[None, :] < O_SWA
    h = rms(x, t[b + "attn_norm.weight"])
    q, k, v = (h @ t[b + f"attn_{n}.weight"].T + t[b + f"attn_{n}.bias"] for n in "qkv")
    q, k, v = q.reshape(T, N_HEAD, hd), k.reshape(T, N_HEAD_KV, hd), v.reshape(T, N_HEAD_KV, hd)
    q, k = (rope_yarn(a, pos, O_ROPE_BASE, O_YARN_FACTOR, O_YARN_ORIG) for a in (q, k))
    att = np.zeros((T, N_HEAD, hd))
    for hh in range(N_HEAD):
        s = np.where(seen, q[:, hh] @ k[:, hh // group].T / np.sqrt(hd), -np.inf)
        sink = t[b + "attn_sinks.weight"][hh]  # one more logit in the softmax, no value
        mx = np.maximum(s.max(axis=1, keepdims=True), sink)
        p = np.exp(s - mx)
        p /= p.sum(axis=1, keepdims=True) + np.exp(sink - mx)
        att[:, hh] = p @ v[:, hh // group]
    x = x + att.reshape(T, N_HEAD * hd) @ t[b + "attn_output.weight"].T + t[b + "attn_output.bias"]
    h = rms(x, t[b + "post_attention_norm.weight"])
    logits = h @ t[b + "ffn_gate_inp.weight"].T + t[b + "ffn_gate_inp.bias"]  # [T, E]
    f = np.zeros_like(h)
    for i in range(T):
        sel = np.argsort(-logits[i], kind="stable")[:N_USED]
        we = np.exp(logits[i, sel] - logits[i, sel].max())
        we /= we.sum()
        for e, wk in zip(sel, we):
            g = t[b + "ffn_gate_exps.weight"][e] @ h[i] + t[b + "ffn_gate_exps.bias"][e]
            u = t[b + "ffn_up_exps.weight"][e] @ h[i] + t[b + "ffn_up_exps.bias"][e]
            f[i] += wk * (t[b + "ffn_down_exps.weight"][e] @ swiglu_oai(g, u) + t[b + "ffn_down_exps.bias"][e])
    return x + f


def silu(x):
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward_deepseek(name, t, tokens, hidden=False):
    """DeepSeek-V2/V3 as modeling_deepseek.py computes it: per head the query
    [q_nope, q_pe], the key [k_nope, k_pe] and value decompressed from the
    normed latent by kv_b_proj (rebuilt from attn_k_b and attn_v_b), q_pe and
    the shared k_pe rotated (interleaved pairs) at YaRN's frequencies, scale
    mscale^2/sqrt(nope + rope);
    the MoE gate's scores sigmoid (V3) or softmax (V2), top-k by score plus
    e_score_correction_bias (V3: within the best groups by the sum of their
    two best such scores), weights from the unbiased scores, normalised
    (V3), times routed_scaling_factor, plus the shared experts"""
    lite = name == "deepseek2-lite"
    T = len(tokens)
    pos = np.arange(T)
    hk = D_NOPE + D_ROPE
    x = t["token_embd.weight"][tokens]
    causal = np.tril(np.ones((T, T), dtype=bool))
    mscale = 0.1 * D_MSCALE[name] * np.log(D_YARN_FACTOR) + 1.0
    scale = hk ** -0.5 * mscale * mscale  # softmax_scale
    for il in range(N_LAYER):
        b = f"blk.{il}."
        h = rms(x, t[b + "attn_norm.weight"])
        if lite:
            q = h @ t[b + "attn_q.weight"].T
        else:
            q = rms(h @ t[b + "attn_q_a.weight"].T, t[b + "attn_q_a_norm.weight"]) @ t[b + "attn_q_b.weight"].T
        q = q.reshape(T, N_HEAD, hk)
        ckv = h @ t[b + "attn_kv_a_mqa.weight"].T  # [T, R + r]
        c, k_pe = rms(ckv[:, :D_KV_RANK], t[b + "attn_kv_a_norm.weight"]), ckv[:, D_KV_RANK:]
        kv_b = np.concatenate([t[b + "attn_k_b.weight"].transpose(0, 2, 1), t[b + "attn_v_b.weight"]], axis=1)
        kv = np.einsum("hor,tr->tho", kv_b, c)  # [T, H, nope + v]
        k_nope, v = kv[..., :D_NOPE], kv[..., D_NOPE:]
        inv = yarn_inv_freq(D_ROPE, ROPE_BASE, D_YARN_FACTOR, D_YARN_ORIG)  # cos, sin times 1: mscale = all_dim
        q_pe = rope_inv(q[..., D_NOPE:], pos, "norm", inv)
        k_pe = rope_inv(k_pe[:, None, :], pos, "norm", inv)[:, 0]
        att = np.zeros((T, N_HEAD, D_V))
        for hh in range(N_HEAD):
            qh = np.concatenate([q[:, hh, :D_NOPE], q_pe[:, hh]], axis=1)
            kh = np.concatenate([k_nope[:, hh], k_pe], axis=1)
            s = np.where(causal, qh @ kh.T * scale, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att[:, hh] = p @ v[:, hh]
        x = x + att.reshape(T, N_HEAD * D_V) @ t[b + "attn_output.weight"].T
        h = rms(x, t[b + "ffn_norm.weight"])
        if il < D_DENSE:
            x = x + (silu(h @ t[b + "ffn_gate.weight"].T) * (h @ t[b + "ffn_up.weight"].T)) @ t[b + "ffn_down.weight"].T
            continue
        logits = h @ t[b + "ffn_gate_inp.weight"].T  # [T, E]
        if lite:
            sc = np.exp(logits - logits.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
        else:
            sc = 1 / (1 + np.exp(-logits))
        choose = sc + t.get(b + "exp_probs_b.bias", 0.0)
        f = (silu(h @ t[b + "ffn_gate_shexp.weight"].T) * (h @ t[b + "ffn_up_shexp.weight"].T)) @ t[
            b + "ffn_down_shexp.weight"].T
        if not lite:  # V3's MoEGate: the groups' top-2 sums, the other groups' experts masked
            grp = choose.reshape(T, D_GROUPS, -1)
            gsc = np.sort(grp, axis=2)[:, :, -2:].sum(axis=2)  # [T, groups]
            keep = np.zeros_like(gsc, dtype=bool)
            np.put_along_axis(keep, np.argsort(-gsc, axis=1, kind="stable")[:, :D_GROUPS_USED], True, axis=1)
            choose = np.where(np.repeat(keep, D_EXPERT // D_GROUPS, axis=1), choose, -np.inf)
        for i in range(T):
            sel = np.argsort(-choose[i], kind="stable")[:N_USED]
            wsel = sc[i, sel] / (1.0 if lite else sc[i, sel].sum()) * (1.0 if lite else D_SCALE)
            for e, we in zip(sel, wsel):
                g = silu(t[b + "ffn_gate_exps.weight"][e] @ h[i]) * (t[b + "ffn_up_exps.weight"][e] @ h[i])
                f[i] += we * (t[b + "ffn_down_exps.weight"][e] @ g)
        x = x + f
    x = rms(x, t["output_norm.weight"])
    return x if hidden else x @ t["output.weight"].T


def partial_rope(x, pos, n_rot, base):
    """x [T, heads, hd]: the first n_rot of each head rotated (rotate_half
    pairs, inv_freq base^(-2i/n_rot)), the rest passed through"""
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    return np.concatenate([rope_inv(x[..., :n_rot], pos, "neox", inv), x[..., n_rot:]], axis=-1)


def causal_attention(q, k, v):
    """q [T, H, hd], k and v [T, Hk, hd]: each head's causal softmax
    attention, scale hd^-0.5, its kv head shared by H / Hk query heads:
    [T, H * hd]"""
    T, H, hd = q.shape
    group = H // k.shape[1]
    causal = np.tril(np.ones((T, T), dtype=bool))
    att = np.zeros((T, H, hd))
    for hh in range(H):
        s = np.where(causal, q[:, hh] @ k[:, hh // group].T / np.sqrt(hd), -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        att[:, hh] = (p / p.sum(axis=1, keepdims=True)) @ v[:, hh // group]
    return att.reshape(T, H * hd)


def forward_glm(t, tokens, hidden=False):
    """GLM-4.5 as transformers' modeling_glm4_moe computes it: q, k, v with
    biases, q and k RMS-normed per head, rotate_half rotary on the first
    rotary_dim = head_dim * partial_rotary_factor of each head (inv_freq
    base^(-2i/rotary_dim)), the rest passed through, scale head_dim^-0.5;
    post_attention_layernorm before the MLP; the first first_k_dense_replace
    layers a SwiGLU MLP, the others Glm4MoeMoE: scores sigmoid(router), the
    top-k of scores + e_score_correction_bias (n_group 1), weights the
    unbiased scores renormalised (norm_topk_prob) times
    routed_scaling_factor, plus the ungated shared experts.  The layers
    past num_hidden_layers (the MTP layers) are not run"""
    T = len(tokens)
    pos = np.arange(T)
    hd = SPEC["glm4moe"][7]
    x = t["token_embd.weight"][tokens]
    for il in range(N_LAYER):
        b = f"blk.{il}."
        h = rms(x, t[b + "attn_norm.weight"])
        q, k, v = (h @ t[b + f"attn_{n}.weight"].T + t[b + f"attn_{n}.bias"] for n in "qkv")
        q, k, v = q.reshape(T, N_HEAD, hd), k.reshape(T, N_HEAD_KV, hd), v.reshape(T, N_HEAD_KV, hd)
        q, k = rms(q, t[b + "attn_q_norm.weight"]), rms(k, t[b + "attn_k_norm.weight"])
        q, k = partial_rope(q, pos, M_ROT, M_ROPE_BASE), partial_rope(k, pos, M_ROT, M_ROPE_BASE)
        x = x + causal_attention(q, k, v) @ t[b + "attn_output.weight"].T
        h = rms(x, t[b + "post_attention_norm.weight"])
        if il < M_DENSE:
            f = silu(h @ t[b + "ffn_gate.weight"].T) * (h @ t[b + "ffn_up.weight"].T)
            x = x + f @ t[b + "ffn_down.weight"].T
            continue
        sc = 1 / (1 + np.exp(-(h @ t[b + "ffn_gate_inp.weight"].T)))  # [T, E]
        choose = sc + t[b + "exp_probs_b.bias"]
        f = (silu(h @ t[b + "ffn_gate_shexp.weight"].T) * (h @ t[b + "ffn_up_shexp.weight"].T)) @ t[
            b + "ffn_down_shexp.weight"].T
        for i in range(T):
            sel = np.argsort(-choose[i], kind="stable")[:N_USED]
            wsel = sc[i, sel] / sc[i, sel].sum() * M_SCALE
            for e, we in zip(sel, wsel):
                g = silu(t[b + "ffn_gate_exps.weight"][e] @ h[i]) * (t[b + "ffn_up_exps.weight"][e] @ h[i])
                f[i] += we * (t[b + "ffn_down_exps.weight"][e] @ g)
        x = x + f
    x = rms(x, t["output_norm.weight"])
    return x if hidden else x @ t["output.weight"].T


def forward_minimax(t, tokens, hidden=False):
    """MiniMax-M2 as transformers' modeling_minimax_m2 computes it: q, k, v
    without biases; q_norm and k_norm (use_qk_norm, qk_norm_type per_layer)
    RMS-normalise the whole q projection [H * head_dim] and the whole k
    projection [Hk * head_dim] before they are cut into heads; the rotary
    embedding turns the first rotary_dim of each head (rotate_half, inv_freq
    base^(-2i/rotary_dim)) and passes the rest; scale head_dim^-0.5; the
    post_attention_layernorm before MiniMaxM2SparseMoeBlock, in every layer:
    routing weights sigmoid(gate(h)) in float, the top-k of those plus
    e_score_correction_bias, the chosen unbiased weights divided by their sum;
    each expert w2(silu(w1 h) * w3 h); no shared expert; lm_head its own"""
    T, hd = len(tokens), SPEC["minimax-m2"][7]
    pos, x = np.arange(T), t["token_embd.weight"][tokens]
    for il in range(N_LAYER):
        b = f"blk.{il}."
        h = rms(x, t[b + "attn_norm.weight"])
        q = rms(h @ t[b + "attn_q.weight"].T, t[b + "attn_q_norm.weight"]).reshape(T, N_HEAD, hd)
        k = rms(h @ t[b + "attn_k.weight"].T, t[b + "attn_k_norm.weight"]).reshape(T, N_HEAD_KV, hd)
        v = (h @ t[b + "attn_v.weight"].T).reshape(T, N_HEAD_KV, hd)
        q, k = partial_rope(q, pos, X_ROT, X_ROPE_BASE), partial_rope(k, pos, X_ROT, X_ROPE_BASE)
        x = x + causal_attention(q, k, v) @ t[b + "attn_output.weight"].T
        h = rms(x, t[b + "ffn_norm.weight"])
        rw = 1 / (1 + np.exp(-(h @ t[b + "ffn_gate_inp.weight"].T)))  # [T, E]
        top = np.argsort(-(rw + t[b + "exp_probs_b.bias"]), axis=1, kind="stable")[:, :N_USED]
        f = np.zeros_like(h)
        for i in range(T):
            wk = rw[i, top[i]] / rw[i, top[i]].sum()
            for e, we in zip(top[i], wk):
                g = t[b + "ffn_gate_exps.weight"][e] @ h[i]
                f[i] += we * (t[b + "ffn_down_exps.weight"][e] @ (silu(g) * (t[b + "ffn_up_exps.weight"][e] @ h[i])))
        x = x + f
    x = rms(x, t["output_norm.weight"])
    return x if hidden else x @ t["output.weight"].T


def forward(name, t, tokens, hidden=False):
    """the logits [T, V], or with hidden the states after the output norm [T, d]"""
    arch, rope_mode, moe, renorm, shared, qkn, _, hd = SPEC[name]
    if arch == "deepseek2":
        return forward_deepseek(name, t, tokens, hidden)
    if arch == "glm4moe":
        return forward_glm(t, tokens, hidden)
    if arch == "minimax-m2":
        return forward_minimax(t, tokens, hidden)
    T = len(tokens)
    pos = np.arange(T)
    gemma = arch == "gemma3"
    x = t["token_embd.weight"][tokens]  # [T, d]
    if gemma:
        x = x * np.sqrt(N_EMBD)
    group = N_HEAD // N_HEAD_KV
    causal = np.tril(np.ones((T, T), dtype=bool))
    # sliding window: token i sees j when 0 <= i - j < window
    window = causal & (pos[:, None] - pos[None, :] < G_SWA)
    for il in range(N_LAYER):
        if arch == "gpt-oss":
            x = gpt_oss_layer(t, il, x, pos)
            continue
        b = f"blk.{il}."
        local = gemma and il % g_pattern != g_pattern - 1
        base, scale = (G_ROPE_LOCAL, 1.0) if local else (G_ROPE_GLOBAL, G_ROPE_SCALE) if gemma else (ROPE_BASE, 1.0)
        seen = window if local else causal
        h = rms(x, t[b + "attn_norm.weight"])
        q, k, v = (h @ t[b + f"attn_{n}.weight"].T + t.get(b + f"attn_{n}.bias", 0.0) for n in "qkv")
        if qkn == "full":
            q, k = rms(q, t[b + "attn_q_norm.weight"]), rms(k, t[b + "attn_k_norm.weight"])
        q, k, v = q.reshape(T, N_HEAD, hd), k.reshape(T, N_HEAD_KV, hd), v.reshape(T, N_HEAD_KV, hd)
        if qkn == "head":
            q, k = rms(q, t[b + "attn_q_norm.weight"]), rms(k, t[b + "attn_k_norm.weight"])
        q, k = rope(q, pos, rope_mode, base, scale), rope(k, pos, rope_mode, base, scale)
        att = np.zeros((T, N_HEAD, hd))
        for hh in range(N_HEAD):
            kh, vh = k[:, hh // group], v[:, hh // group]
            s = q[:, hh] @ kh.T / np.sqrt(hd)  # Gemma 3: query_pre_attn_scalar = head_dim
            s = np.where(seen, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att[:, hh] = p @ vh
        o = att.reshape(T, N_HEAD * hd) @ t[b + "attn_output.weight"].T
        x = x + (rms(o, t[b + "post_attention_norm.weight"]) if gemma else o)
        h = rms(x, t[b + "ffn_norm.weight"])
        if gemma:
            f = (gelu_tanh(h @ t[b + "ffn_gate.weight"].T) * (h @ t[b + "ffn_up.weight"].T)) @ t[b + "ffn_down.weight"].T
            x = x + rms(f, t[b + "post_ffw_norm.weight"])
            continue
        if not moe:
            f = (silu(h @ t[b + "ffn_gate.weight"].T) * (h @ t[b + "ffn_up.weight"].T)) @ t[b + "ffn_down.weight"].T
        else:
            logits = h @ t[b + "ffn_gate_inp.weight"].T  # [T, E]
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            f = np.zeros_like(h)
            for i in range(T):
                sel = np.argsort(-p[i], kind="stable")[:N_USED]
                wsel = p[i, sel] / (p[i, sel].sum() if renorm else 1.0)
                for e, we in zip(sel, wsel):
                    g = silu(t[b + "ffn_gate_exps.weight"][e] @ h[i]) * (t[b + "ffn_up_exps.weight"][e] @ h[i])
                    f[i] += we * (t[b + "ffn_down_exps.weight"][e] @ g)
            if shared:
                sh = (silu(h @ t[b + "ffn_gate_shexp.weight"].T) * (h @ t[b + "ffn_up_shexp.weight"].T)) @ t[
                    b + "ffn_down_shexp.weight"].T
                gate = 1 / (1 + np.exp(-(h @ t[b + "ffn_gate_inp_shexp.weight"])))  # [T]
                f = f + sh * gate[:, None]
        x = x + f
    x = rms(x, t["output_norm.weight"])
    if hidden:
        return x
    out = t.get("output.weight", t["token_embd.weight"])
    return x @ out.T  # [T, V]


def greedy(name, path, ids, n):
    """n tokens by argmax from the prompt ids, the whole sequence recomputed
    at each step; the top-2 gap of each step relative to the largest |logit|"""
    t = load(path)
    seq, out, margin = list(ids), [], []
    for _ in range(n):
        row = forward(name, t, np.array(seq))[-1]
        top = np.argsort(-row, kind="stable")[:2]
        out.append(int(top[0]))
        margin.append(float((row[top[0]] - row[top[1]]) / np.abs(row).max()))
        seq.append(int(top[0]))
    return out, margin


def main():
    global N_VOCAB, N_EMBD, N_FF, g_pattern
    name, wtype, d = sys.argv[1], sys.argv[2], sys.argv[3]
    brk = sys.argv[4] if len(sys.argv) > 4 else "none"
    if name not in SPEC or wtype not in WTYPES:
        sys.exit(f"model_ref.py: unknown architecture or type: {name} {wtype}")
    if gguf.GGML_QUANT_SIZES[WTYPES[wtype]][0] == 256:
        N_EMBD, N_FF = 256, 256
    path = os.path.join(d, "model.gguf")
    if brk == "vocab":
        write(name, wtype, path, "none", sys.argv[5])
        return
    if brk == "embd":  # the embedding of the ids: mean or last pooling, unit length (llama-server's)
        import json
        x = forward(name, load(path), np.array([int(v) for v in sys.argv[5].split(",")]), hidden=True)
        e = x.mean(axis=0) if sys.argv[6] == "mean" else x[-1]
        print(json.dumps((e / np.linalg.norm(e)).tolist()))
        return
    if brk == "greedy":
        import json
        out, margin = greedy(name, path, [int(x) for x in sys.argv[5].split(",")], int(sys.argv[6]))
        print(json.dumps({"tokens": out, "margin": margin}))
        return
    if brk == "slideall":
        g_pattern = N_LAYER + 1
    write(name, wtype, path, "none" if brk in ("long", "slideall") else brk)
    if brk not in ("none", "long", "slideall"):
        return
    n_tok = 80 if brk == "long" else N_TOK
    tokens = np.random.default_rng(5).integers(0, N_VOCAB, size=n_tok)
    logits = forward(name, load(path), tokens)
    with open(os.path.join(d, "ref.bin"), "wb") as f:
        np.array([n_tok, N_VOCAB], dtype=np.int32).tofile(f)
        tokens.astype(np.int32).tofile(f)
        logits.astype(np.float32).tofile(f)


if __name__ == "__main__":
    main()
