#!/usr/bin/env python3
"""generate_test.py BATON MPIEXEC [ref] - `baton generate` as a user meets it.

Without "ref": a random-weight MoE model with a real vocabulary from
`baton make-model`; greedy output the same on 1, 2, 3 and 4 ranks, with
--parallel 1 and 4 (and every prompt of a batch the same as alone); a seed
repeats a sampled run, alone or among others; stop strings and the token
limit; every bad input with its one message and exit code.

With "ref": for every supported architecture, tests/model_ref.py writes a tiny
model with a real vocabulary and decodes greedily in numpy from the published
definitions; `baton generate --temp 0` must give the same tokens (skipped,
exit 77, where the gguf package cannot be imported).  gemma3's and gpt-oss's sliding
layers with a ring that wraps (--ubatch 4, a 50-token prompt): the logits of
every step the same bits on 1 to 4 ranks and 1 or 2 threads.
"""
import json
import os
import subprocess
import sys
import tempfile

BATON, MPIEXEC = sys.argv[1], sys.argv[2]
REF = len(sys.argv) > 3 and sys.argv[3] == "ref"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "data", "vocab")
TMP = tempfile.mkdtemp(prefix="gen_test.")
failed = 0
passed = 0


def run(args, np=1, timeout=300):
    # one rank: a plain process, as a user runs it without mpirun
    cmd = [BATON] + args if np == 1 else [MPIEXEC, "-np", str(np), "--oversubscribe", BATON] + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def check(cond, name, detail=""):
    global failed, passed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAILED: {name}" + (f"\n    {detail}" if detail else ""), flush=True)


def gen_json(args, np=1):
    rc, out, err = run(["generate"] + args + ["--json"], np)
    if rc != 0:
        check(False, f"generate {' '.join(args)} on {np} ranks", f"exit {rc}: {err.strip()[-400:]}")
        return None
    return json.loads(out)


def tokens(js):
    return [c["tokens"] for c in js["completions"]] if js else None


def expect_error(args, code, want, name, np=1):
    rc, out, err = run(args, np)
    check(rc == code and want in err, name, f"exit {rc} (want {code}); stderr: {err.strip()[-300:]!r}; want {want!r}")
    if np == 1:
        lines = [l for l in err.strip().split("\n") if l]
        check(len(lines) == 1, name + ": one line", f"{lines}")


def cli_tests():
    model = os.path.join(TMP, "moe.gguf")
    rc, _, err = run(["make-model", model, "--vocab", os.path.join(VOCAB, "ggml-vocab-gpt-2.gguf"), "--embd", "64",
                      "--head-dim", "16", "--ff", "128", "--ff-exp", "32"])
    check(rc == 0 and os.path.exists(model), "make-model", err)
    if rc:
        return
    rc1, _, _ = run(["make-model", model + "2", "--vocab", os.path.join(VOCAB, "ggml-vocab-gpt-2.gguf"), "--embd",
                     "64", "--head-dim", "16", "--ff", "128", "--ff-exp", "32"])
    check(rc1 == 0 and open(model, "rb").read() == open(model + "2", "rb").read(), "make-model: the same bytes again")

    # greedy: the same tokens on 1..4 ranks
    base = ["-m", model, "-p", "The quick brown fox", "-n", "12", "--temp", "0", "-c", "256", "--ubatch", "16"]
    want = tokens(gen_json(base))
    check(want is not None and len(want[0]) == 12, "greedy: 12 tokens", f"{want}")
    for np in (2, 3, 4):
        got = tokens(gen_json(base, np))
        check(got == want, f"greedy on {np} ranks equals one rank", f"{got} vs {want}")
    # --mmap: the weights used in place in the file, the same tokens
    got = tokens(gen_json(base + ["--mmap"], 2))
    check(got == want, "--mmap on 2 ranks equals one rank (weights copied)", f"{got} vs {want}")

    # a long prompt: on several ranks the batcher cuts it into chunks for the
    # stages (at least 32 tokens each); the same tokens as one rank in one ubatch
    long_p = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)
    lp = ["-m", model, "-p", long_p, "-n", "6", "--temp", "0", "-c", "512", "--ubatch", "256"]
    want_long = tokens(gen_json(lp))
    for np in (2, 3):
        got = tokens(gen_json(lp, np))
        check(want_long is not None and got == want_long, f"a long prompt on {np} ranks equals one rank",
              f"{got} vs {want_long}")

    # --dump-tensors: every matching node from the rank that computes it, once per
    # ubatch; the values' hashes the same on 1..4 ranks (bitwise), and in the
    # graph's order within a ubatch; an empty pattern is a usage error
    def dumps(args, np):
        rc, _, err = run(["generate"] + args, np)
        lines = [l[l.index("dump: "):].split() for l in err.split("\n") if "dump: " in l]
        check(rc == 0, f"--dump-tensors on {np} ranks: exit 0", err[-300:])
        # (ubatch, name) -> (rank, hash)
        return {(int(w[4]), w[5]): (int(w[2]), w[-1]) for w in lines}, len(lines)
    dt = base + ["--dump-tensors", "blk.*.out"]
    d1, n1 = dumps(dt, 1)
    n_layer = 4
    check(n1 == len(d1) and n1 == 12 * n_layer and {k[1] for k in d1} == {f"blk.{i}.out" for i in range(n_layer)},
          "--dump-tensors 'blk.*.out': each layer's output once per ubatch", f"{n1} lines, {sorted(d1)[:6]}")
    for np in (2, 3, 4):
        dn, nn = dumps(dt, np)
        check(nn == n1 and {k: v[1] for k, v in dn.items()} == {k: v[1] for k, v in d1.items()},
              f"--dump-tensors on {np} ranks: the same tensors with the same hashes as one rank", f"{nn} lines")
        ranks = {v[0] for v in dn.values()}
        check(len(ranks) > 1, f"--dump-tensors on {np} ranks: printed by the ranks that compute them", f"{ranks}")
    dr, _ = dumps(base + ["--dump-tensors", "result_output"], 2)
    check(len(dr) == 12 and {v[0] for v in dr.values()} == {1}, "--dump-tensors result_output: the last rank's",
          f"{dr}")
    expect_error(["generate"] + base + ["--dump-tensors", ""], 2, "--dump-tensors: the pattern is empty",
                 "--dump-tensors ''")

    # llama.cpp's spellings: the same run under its flags; -f FILE is the
    # prompt; a flag of llama.cpp's that does not apply is one message; an
    # option's value that looks like one of its flags stays a value
    llama = ["-m", model, "-p", "The quick brown fox", "-n", "12", "--temperature", "0", "-c", "256", "-ub", "16",
             "-s", "3", "-np", "1"]
    got = tokens(gen_json(llama))
    check(got == want, "llama.cpp's -ub, -s, -np, --temperature: the same tokens", f"{got} vs {want}")
    got = tokens(gen_json(llama[:10] + ["-b", "16"]))
    check(got == want, "llama.cpp's -b: the same tokens", f"{got} vs {want}")
    pf = os.path.join(TMP, "prompt.txt")
    with open(pf, "w") as f:
        f.write("The quick brown fox\n")
    got = tokens(gen_json(["-m", model, "-f", pf] + base[4:]))
    check(got == want, "-f FILE: the file's text is the prompt", f"{got} vs {want}")
    expect_error(["generate", "-m", model, "-f", os.path.join(TMP, "none.txt")], 1, "--file " + os.path.join(TMP, "none.txt") + ": No such file", "-f of a missing file")
    expect_error(["generate", "-m", model, "-f", pf, "-p", "x"], 2, "give the prompt one way", "-f with -p")
    expect_error(["generate"] + base + ["-ngl", "99"], 2, "-ngl is llama.cpp's and does not apply", "generate -ngl 99")
    expect_error(["serve", "-m", model, "-cnv"], 2, "-cnv is llama.cpp's and does not apply", "serve -cnv")
    rc, _, err = run(["generate", "-m", model, "-p", "-np", "-n", "2", "--temp", "0"])
    check(rc == 0, "-p -np: a prompt that reads like a flag stays the prompt", err[-300:])

    # baton plan -m: the plan generate runs, for every topology in configs/ (the
    # GPU ones planned from their declared devices): every layer on one rank,
    # in rank order, the embedding on the first stage and the head on the last,
    # x from each stage to the next and the logits to rank 0; on the CPU
    # topologies the live run's plan (generate --dump-plan) is the same plan
    cfgs = sorted(os.path.join(ROOT, "configs", f) for f in os.listdir(os.path.join(ROOT, "configs"))
                  if f.endswith(".yaml"))
    # and two GPUs then a CPU rank: x over NCCL between the GPUs, over MPI to the CPU
    mixed = os.path.join(TMP, "mixed.yaml")
    with open(mixed, "w") as f:
        f.write("hosts:\n  - name: localhost\n    slots: 4\n    gpus: 2\nranks:\n"
                "  - {rank: 0, host: localhost, backend: \"cuda:0\", memory: 8GiB}\n"
                "  - {rank: 1, host: localhost, backend: \"cuda:1\", memory: 8GiB}\n"
                "  - {rank: 2, host: localhost, backend: cpu, threads: 1}\n"
                "pipeline:\n  partition: [2, 1, 1]\ntransport:\n  host: mpi\n  device: nccl\n")
    cfgs.append(mixed)
    pargs = ["-c", "256", "--ubatch", "16"]
    for topo_f in cfgs:
        cfg = os.path.basename(topo_f)
        rc, out, err = run(["plan", "-m", model, "--topology", topo_f, "--json"] + pargs)
        check(rc == 0, f"plan -m on {cfg}", err[-300:])
        if rc:
            continue
        js = json.loads(out)
        stages = [r for r in js["ranks"] if r["layers"][1] > r["layers"][0]]
        cover = [l for r in stages for l in range(*r["layers"])]
        check(cover == list(range(js["n_layer"])), f"plan -m on {cfg}: every layer once, in rank order", f"{stages}")
        gpu = lambda r: r["backend"].startswith("CUDA")  # noqa: E731
        want_x = [(a["rank"], b["rank"], 64 * 16 * 4, "nccl" if gpu(a) and gpu(b) else "mpi")
                  for a, b in zip(stages, stages[1:])]
        got_x = [(x["src"], x["dst"], x["bytes"], x["transport"]) for x in js["transfers"] if not x["output"]]
        check(got_x == want_x and all(x["transport"] == "mpi" for x in js["transfers"] if x["output"]),
              f"plan -m on {cfg}: x between consecutive stages, over NCCL between GPUs", f"{got_x} vs {want_x}")
        if cfg == "mixed.yaml":
            check([t for *_, t in got_x] == ["nccl", "mpi"], "plan -m on two GPUs and a CPU: NCCL, then MPI",
                  f"{got_x}")
        outs = [(x["src"], x["dst"]) for x in js["transfers"] if x["output"]]
        last = stages[-1]["rank"]
        check(outs == ([] if last == 0 else [(last, 0)]), f"plan -m on {cfg}: the logits from the last stage to rank 0",
              f"{outs}")
        # an expert group's members run no layer but hold their shares of its weights
        members = {m for g in js["groups"] for m in g["ranks"][1:]}
        check(all(r["weight_bytes"] > 0 and r["kv_bytes"] > 0 for r in stages) and
              all(r["weight_bytes"] == 0 for r in js["ranks"] if r not in stages and r["rank"] not in members) and
              all(0 < js["ranks"][m]["weight_bytes"] and js["ranks"][m]["kv_bytes"] == 0 for m in members),
              f"plan -m on {cfg}: weights and cache on the stages only (and the groups' shares)", f"{js['ranks']}")
        if cfg.startswith("local-cpu-"):
            np = len(js["ranks"])
            live, planned = os.path.join(TMP, "live.plan"), os.path.join(TMP, "planned.plan")
            rc1, _, e1 = run(["generate", "--topology", topo_f, "-m", model, "-p", "hi", "-n", "2", "--temp", "0",
                              "--dump-plan", live] + pargs, np)
            rc2, _, e2 = run(["plan", "-m", model, "--topology", topo_f, "--dump-plan", planned] + pargs)
            same = rc1 == 0 and rc2 == 0 and open(live).read() == open(planned).read()
            check(same, f"plan -m on {cfg}: the live run's plan", (e1 + e2)[-300:])
            # and each rank's memory as the live run allocates it
            rc3, out3, e3 = run(["generate", "--topology", topo_f, "-m", model, "-p", "hi", "-n", "2", "--temp", "0",
                                 "--json"] + pargs, np)
            live_mem = [(r["weight_bytes"], r["kv_bytes"], r["compute_bytes"]) for r in json.loads(out3)["per_rank"]] \
                if rc3 == 0 else None
            plan_mem = [(int(r["weight_bytes"]), r["kv_bytes"], r["compute_bytes"]) for r in js["ranks"]]
            check(live_mem == plan_mem, f"plan -m on {cfg}: weights, cache and compute memory as the live run's",
                  f"{live_mem} vs {plan_mem} {e3[-200:]}")
    rc, out, _ = run(["plan", "-m", model] + pargs)
    check(rc == 0 and "1 ranks, 1 splits, 0 transfers per ubatch" in out and "layers 0-3" in out,
          "plan -m without a topology: one CPU rank", out[-300:])
    for args, code, msg, name in [
            (["plan", "-m", ""], 2, "--model: the file name is empty", "plan -m ''"),
            (["plan", "-m", os.path.join(TMP, "none.gguf")], 1, "none.gguf", "plan -m of a missing file"),
            (["plan", "-m", model, "--layers", "3"], 2, "goes without --project and the built-in", "plan -m --layers"),
            (["plan", "-m", model, "--partition", "1,1"], 2, "--partition: 1,1 lists more than 1 counts",
             "plan -m --partition for other ranks"),
            (["plan", "-m", model, "-c", "64", "--ubatch", "128"], 2, "--ubatch 128 is more than --ctx-size 64",
             "plan -m --ubatch past the context"),
            (["plan", "-m", model, "--ubatch", "x"], 2, "--ubatch: 'x' is not an integer", "plan -m --ubatch x"),
            (["plan", "--project", os.path.join(ROOT, "configs", "projection", "this-machine.yaml"), "--json"], 2,
             "--project goes without -t, --dump-plan, --partition and --json", "plan --project --json"),
            (["generate"] + base + ["--dump-plan", ""], 2, "--dump-plan: the file name is empty", "generate --dump-plan ''"),
            (["generate"] + base + ["--dump-plan", "/nonexistent/dir/p.txt"], 1, "/nonexistent/dir/p.txt",
             "generate --dump-plan into a missing folder")]:
        expect_error(args, code, msg, name)

    # a split model (the gguf package's writer: PREFIX-0000k-of-0000N.gguf)
    # opened from its first file: the same tokens as the single file, on 1 and
    # 2 ranks; the wrong shard, a missing one and a misnamed one each named
    try:
        import gguf  # noqa: F401
        have_gguf = True
    except ImportError:
        have_gguf = False
        print("note: the gguf package is missing: split files not checked", flush=True)
    if have_gguf:
        sp = os.path.join(TMP, "sp.gguf")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gguf_split.py"), model, sp, "20"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        shards = [os.path.join(TMP, f"sp-{k:05d}-of-00003.gguf") for k in (1, 2, 3)]
        check(p.returncode == 0 and all(os.path.exists(f) for f in shards), "gguf_split.py: three shards",
              p.stderr.decode()[-300:])
        for np in (1, 2):
            got = tokens(gen_json(["-m", shards[0]] + base[2:], np))
            check(got == want, f"a split model on {np} ranks: the single file's tokens", f"{got} vs {want}")
        rc, out, _ = run(["gguf", shards[0]])
        check(rc == 0 and "in 3 files (a split model)" in out, "baton gguf: a split model's three files", out[:300])
        expect_error(["generate", "-m", shards[1], "-p", "x"], 1,
                     f"is shard 2 of 3 of a split model: open the first, {shards[0]}", "generate -m the second shard")
        bad = os.path.join(TMP, "bad")
        os.mkdir(bad)
        for f in shards:
            os.link(f, os.path.join(bad, os.path.basename(f)))
        os.unlink(os.path.join(bad, os.path.basename(shards[2])))
        expect_error(["generate", "-m", os.path.join(bad, os.path.basename(shards[0])), "-p", "x"], 1,
                     "sp-00003-of-00003.gguf: cannot open", "a split model with a shard missing")
        os.link(shards[1], os.path.join(bad, os.path.basename(shards[2])))
        expect_error(["generate", "-m", os.path.join(bad, os.path.basename(shards[0])), "-p", "x"], 1,
                     "sp-00003-of-00003.gguf: not shard 3 of 3", "a split model with shard 2 in place of shard 3")
        renamed = os.path.join(TMP, "first-shard.gguf")
        os.link(shards[0], renamed)
        expect_error(["generate", "-m", renamed, "-p", "x"], 1, "but not named PREFIX-00001-of-00003.gguf",
                     "a split model's first file renamed")

    # the model named by the topology's pipeline section instead of -m
    topo_src = open(os.path.join(ROOT, "configs", "local-cpu-2.yaml")).read()
    topo = os.path.join(TMP, "topo.yaml")
    with open(topo, "w") as f:
        f.write(topo_src.replace("pipeline:\n", "pipeline:\n  model: " + model + "\n", 1))
    got = tokens(gen_json(["--topology", topo] + base[2:], 2))
    check(got == want, "the topology's pipeline.model instead of -m", f"{got} vs {want}")
    rc, _, err = run(["generate", "--topology", os.path.join(ROOT, "configs", "local-cpu-2.yaml"), "-p", "x"], 2)
    check(rc == 1 and "no model file: give one, or the topology's pipeline.model" in err,
          "neither -m nor a model in the topology", err[-300:])

    # the text streamed to stdout is the completion of the JSON output
    rc, out, err = run(["generate"] + base)
    js = gen_json(base)
    check(rc == 0 and js and out == js["completions"][0]["text"] + "\n", "streamed text equals the completion",
          f"{out!r} vs {js and js['completions'][0]['text']!r}")
    check("prompt:" in err and "generation:" in err and "tokens/s" in err and "rank" in err,
          "statistics on stderr", err[-400:])

    # --parallel: each prompt's tokens the same alone, with --parallel 1 and 4, on 1 and 2 ranks
    prompts = ["Hello world", "Once upon a time, in a land far away", "1 2 3 4 5", "import numpy as np",
               "The capital of France is", "a"]
    pf = os.path.join(TMP, "prompts.txt")
    with open(pf, "w") as f:
        f.write("\n".join(prompts) + "\n")
    common = ["-m", model, "--prompts", pf, "-n", "10", "--temp", "0", "-c", "512", "--ubatch", "16"]
    p1 = gen_json(common + ["--parallel", "1"])
    p4 = gen_json(common + ["--parallel", "4"])
    p4r2 = gen_json(common + ["--parallel", "4"], 2)
    check(p1 and [c["prompt"] for c in p1["completions"]] == prompts, "completions in input order")
    check(tokens(p4) == tokens(p1), "--parallel 4 equals --parallel 1", f"{tokens(p4)} vs {tokens(p1)}")
    check(tokens(p4r2) == tokens(p1), "--parallel 4 on 2 ranks equals --parallel 1 on 1")
    for i in (0, 1):
        alone = tokens(gen_json(["-m", model, "-p", prompts[i], "-n", "10", "--temp", "0", "-c", "512"]))
        check(alone and p1 and alone[0] == tokens(p1)[i], f"prompt {i + 1} alone equals it in the batch")
    rc, out, _ = run(["generate"] + common + ["--parallel", "3"])
    check(rc == 0 and out.startswith("[1] Hello world\n[1] => ") and "[6] a\n" in out, "labelled text output",
          out[:200])

    # a seed repeats a sampled run, alone or among others
    samp = ["--temp", "0.9", "--top-k", "50", "--seed", "7", "-n", "10", "-c", "512", "--ubatch", "16"]
    s1 = gen_json(["-m", model, "--prompts", pf, "--parallel", "1"] + samp)
    s4 = gen_json(["-m", model, "--prompts", pf, "--parallel", "4"] + samp, 2)
    check(s1 and tokens(s1) == tokens(s4), "a seed gives the same samples alone and in a batch on 2 ranks")
    s8 = gen_json(["-m", model, "--prompts", pf, "--parallel", "1"] + samp[:4] + ["--seed", "8"] + samp[6:])
    check(s1 and s8 and tokens(s1) != tokens(s8), "another seed, other samples")

    # stop strings end the text before them
    full = gen_json(base)
    text = full["completions"][0]["text"] if full else ""
    if len(text) > 6:
        stop = text[3:6]
        st = gen_json(base + ["--stop", stop])
        c = st["completions"][0] if st else {}
        check(c.get("finish_reason") == "stop" and c.get("text") == text[: text.find(stop)],
              "--stop ends the text before the stop string", f"{c} stop {stop!r}")
    check(full and full["completions"][0]["finish_reason"] == "length", "-n: finish_reason length")

    # bad input: one message, exit code 2 (usage) or 1 (file / text against the model)
    g = ["generate", "-m", model]
    expect_error(g + ["-p", ""], 2, "baton generate: -p: the prompt is empty", "empty prompt")
    expect_error(g + ["-p", "a\\xffb"], 2, "baton generate: -p: the prompt is not valid UTF-8: byte 1",
                 "invalid UTF-8 in the prompt")
    expect_error(g + ["-p", "x", "-n", "0"], 2, "-n 0: the number of tokens to generate must be positive", "-n 0")
    expect_error(g + ["-p", "x", "--temp", "-1"], 2, "--temp -1: the temperature must be 0 (greedy) or positive",
                 "negative temperature")
    expect_error(g + ["-p", "x", "-c", "8", "--parallel", "9"], 2,
                 "--parallel 9 with --ctx-size 8: each sequence needs its own cells of the context; at most --parallel 8",
                 "--parallel larger than the context")
    long_prompt = " ".join(["word"] * 40)
    expect_error(g + ["-p", long_prompt, "-c", "16"], 1,
                 "baton generate: prompt 1 has 40 tokens but the context holds 16 (--ctx-size 16)",
                 "prompt longer than the context")
    expect_error(g + ["--prompts", pf, "-c", "32", "--parallel", "4"], 1,
                 "baton generate: prompt 2 has 10 tokens but each of the 4 sequences holds 8 (--ctx-size 32 / "
                 "--parallel 4): raise --ctx-size or lower --parallel", "prompt longer than a sequence's share")
    notgguf = os.path.join(TMP, "notgguf.bin")
    with open(notgguf, "wb") as f:
        f.write(b"this is not a model file at all, not even close" * 4)
    expect_error(["generate", "-m", notgguf, "-p", "x"], 1, notgguf + ": offset 0: not a GGUF file", "not a GGUF file")
    rc, _, err = run(["generate", "-m", notgguf, "-p", "x"], 2)
    check(rc == 1 and err.count(notgguf) == 1, "not a GGUF file on 2 ranks: one message", err)
    bad = os.path.join(TMP, "bad.txt")
    with open(bad, "wb") as f:
        f.write(b"fine\n\xc3\x28 bad\n")
    expect_error(g + ["--prompts", bad], 1, f"baton generate: {bad}:2: the prompt is not valid UTF-8: byte 0 of the line",
                 "invalid UTF-8 in --prompts")
    with open(bad, "wb") as f:
        f.write(b"fine\n\nthird\n")
    expect_error(g + ["--prompts", bad], 1, f"baton generate: {bad}:2: the prompt is empty", "empty line in --prompts")
    expect_error(g + ["-p", "x", "--chat-template", "nope"], 1, "--chat-template: ", "unknown chat template")
    expect_error(["generate", "-p", "x"], 2, "missing -m FILE", "no model")
    expect_error(g + ["-p", "x", "--system", "s"], 2, "--system needs --chat", "--system without --chat")
    # an unsupported vocabulary type: the model's tokenizer.ggml.model says "bert"
    try:
        import gguf  # noqa: F401
        have_gguf = True
    except ImportError:
        have_gguf = False
    if have_gguf:
        import gguf
        vb = os.path.join(TMP, "bert-vocab.gguf")
        w = gguf.GGUFWriter(vb, "llama")
        w.add_string("tokenizer.ggml.model", "bert")
        w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(100)])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        mb = os.path.join(TMP, "bert.gguf")
        rc, _, err = run(["make-model", mb, "--vocab", vb, "--arch", "llama", "--embd", "64", "--head-dim", "16",
                          "--layers", "1"])
        check(rc == 0, "make-model with a bert vocabulary", err)
        rc, _, err = run(["generate", "-m", mb, "-p", "x"])
        check(rc == 1 and "bert" in err and err.startswith("baton generate: ") and err.count("\n") == 1,
              "unsupported vocabulary type", err)
    # a rank that dies mid-generation ends the job within seconds, naming the rank
    import signal
    import time
    p = subprocess.Popen([MPIEXEC, "-np", "2", "--oversubscribe", BATON, "generate", "-m", model, "-p", "hello",
                          "-n", "-1", "-c", "4096", "--temp", "0.8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(1)  # generation has started: text streams
    rank1 = None
    for _ in range(100):
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], stdout=subprocess.PIPE, text=True).stdout.split()
        for k in kids:
            try:
                if b"OMPI_COMM_WORLD_RANK=1" in open(f"/proc/{k}/environ", "rb").read().split(b"\0"):
                    rank1 = int(k)
            except OSError:
                pass
        if rank1:
            break
        time.sleep(0.1)
    check(rank1 is not None, "dead rank: rank 1's process found")
    if rank1:
        t0 = time.time()
        os.kill(rank1, signal.SIGKILL)
        try:
            _, err = p.communicate(timeout=120)
            err = err.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            p.kill()
            err = "still running after 120 s"
        check(p.returncode not in (0, None) and time.time() - t0 < 60 and "rank 1" in err,
              "a dead rank ends generate with a message naming it", f"exit {p.returncode}: {err[-400:]}")
    else:
        p.kill()
        p.communicate()

    # --chat through the file's template (gpt-2's vocabulary has none: the message says so)
    expect_error(g + ["-p", "x", "--chat"], 1, "--chat: the file has no tokenizer.chat_template", "--chat without a template")
    js = gen_json(["-m", model, "-p", "hi", "--chat-template", "chatml", "--system", "be brief", "-n", "3", "--temp", "0"])
    check(js is not None and js["completions"][0]["prompt_tokens"] > 10, "--chat-template chatml wraps the prompt",
          f"{js and js['completions'][0]}")

    chat_template_tests()


def count_tokens(model, text):
    rc, out, err = run(["tokenize", "-m", model, "-p", text, "--ids"])
    return len(json.loads(out)) if rc == 0 else None


def chat_template_tests():
    """--chat runs the model's own template (Jinja); --chat-template takes a file"""
    model = os.path.join(TMP, "qwen2-vocab.gguf")
    rc, _, err = run(["make-model", model, "--vocab", os.path.join(VOCAB, "ggml-vocab-qwen2.gguf"), "--embd", "64",
                      "--head-dim", "16", "--ff", "128"])
    check(rc == 0, "make-model with the Qwen2 vocabulary", err)
    if rc:
        return
    # the vocabulary's template adds its system message when the first message is not one
    want = count_tokens(model, "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
                               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    js = gen_json(["-m", model, "-p", "Hi", "--chat", "-n", "1", "--temp", "0"])
    got = js and js["completions"][0]["prompt_tokens"]
    check(want is not None and got == want, "--chat: the Qwen2 template's own system message",
          f"{got} prompt tokens, {want} expected")
    js = gen_json(["-m", model, "-p", "Hi", "--chat", "--system", "Be brief.", "-n", "1", "--temp", "0"])
    want = count_tokens(model, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                               "<|im_start|>assistant\n")
    got = js and js["completions"][0]["prompt_tokens"]
    check(got == want, "--chat --system: the system message given replaces the template's", f"{got} vs {want}")
    # a template file
    tfile = os.path.join(TMP, "t.jinja")
    with open(tfile, "w") as f:
        f.write("{%- for m in messages %}<|im_start|>{{ m.role | upper }}:{{ m.content }}<|im_end|>\n{% endfor -%}\n"
                "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}\n")
    js = gen_json(["-m", model, "-p", "Hi", "--chat-template", tfile, "-n", "1", "--temp", "0"])
    want = count_tokens(model, "<|im_start|>USER:Hi<|im_end|>\n<|im_start|>assistant")
    got = js and js["completions"][0]["prompt_tokens"]
    check(got == want, "--chat-template FILE: a Jinja template from a file", f"{got} vs {want}")
    with open(tfile, "w") as f:
        f.write("{% if messages[0].role != 'system' %}{{ raise_exception('a system message is required') }}{% endif %}")
    expect_error(["generate", "-m", model, "-p", "Hi", "--chat-template", tfile], 1,
                 "--chat-template: the chat template refused the messages: a system message is required",
                 "--chat-template FILE: the template's raise_exception")
    with open(tfile, "w") as f:
        f.write("{% for m in messages %}\n{{ m.content | nosuchfilter }}{% endfor %}")
    expect_error(["generate", "-m", model, "-p", "Hi", "--chat-template", tfile], 1,
                 f"--chat-template: {tfile}:2:16: No filter named 'nosuchfilter'.",
                 "--chat-template FILE: a template that does not compile, with its line and column")


def ref_tests():
    try:
        import gguf  # noqa: F401
    except ImportError:
        print("gguf package missing: skipped")
        sys.exit(77)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import model_ref  # the numpy reference, in this process

    vocab = os.path.join(VOCAB, "ggml-vocab-llama-spm.gguf")
    prompt, n = "Once upon a time", 6
    for arch in ("llama", "llama-moe", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "olmoe", "gemma3", "deepseek2",
                 "deepseek2-lite", "gpt-oss", "glm4moe", "minimax-m2"):
        m = os.path.join(TMP, arch + ".gguf")
        model_ref.write(arch, "f32", m, "none", vocab)
        rc, out, err = run(["tokenize", "-m", m, "-p", prompt, "--ids"])
        ids = json.loads(out)
        want, margin = model_ref.greedy(arch, m, ids, n)
        # a step whose top two logits are closer than the F32 error could swap them
        k = next((i for i, mg in enumerate(margin) if mg < 1e-4), n)
        js = gen_json(["-m", m, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "64"])
        got = tokens(js)[0] if js else None
        check(got is not None and k >= 3 and got[:k] == want[:k],
              f"{arch}: greedy tokens equal the numpy reference", f"baton {got}, numpy {want} (margins {margin})")
        js2 = gen_json(["-m", m, "-p", prompt, "-n", str(n), "--temp", "0", "-c", "64"], 2)
        got2 = tokens(js2)[0] if js2 else None
        check(got2 == got, f"{arch}: the same on 2 ranks", f"{got2} vs {got}")
        if arch in ("gemma3", "gpt-oss"):
            ring_test(m, arch)


def ring_test(m, arch):
    """gemma3 and gpt-oss, window 4: ubatches of 4 make each sliding layer a ring of 32
    cells, which a 50-token prompt and 8 steps wrap; every step's logits (a
    hash of them) the same on 1 to 4 ranks and 1 or 2 threads"""
    prompt = ("Once upon a time there was a little girl who lived in a village near the forest. Whenever she "
              "went out, the little girl wore a red riding cloak, so everyone in the village called her Little "
              "Red Riding Hood.")
    hashes = {}
    for np_, th in ((1, 1), (1, 2), (2, 1), (3, 1), (4, 1)):
        rc, out, err = run(["generate", "-m", m, "-p", prompt, "-n", "8", "--temp", "0", "-c", "256", "--ubatch", "4",
                            "-t", str(th), "--dump-tensors", "result_output"], np_)
        lines = [ln.split(" ubatch ", 1)[1] for ln in err.splitlines() if "result_output" in ln and " ubatch " in ln]
        check(rc == 0 and len(lines) == 8, f"{arch} ring: {np_} ranks x {th} threads runs",
              f"rc {rc}, {len(lines)} dumps: {err.strip()[-300:]}")
        hashes[(np_, th)] = lines
    first = hashes[(1, 1)]
    for k, v in hashes.items():
        check(v == first, f"{arch} ring: the logits on {k[0]} ranks x {k[1]} threads are one rank's bits")


try:
    if REF:
        ref_tests()
    else:
        cli_tests()
finally:
    subprocess.run(["rm", "-rf", TMP])
print(f"generate_test{' ref' if REF else ''}: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
