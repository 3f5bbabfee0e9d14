#!/usr/bin/env python3
"""jinja_test.py - baton's Jinja interpreter (src/text/jinja.c) against
Python's jinja2, rendering real chat templates as Hugging Face transformers
does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
loopcontrols extension, a generation block, tojson as json.dumps with
ensure_ascii=False, raise_exception, strftime_now).

    jinja_test.py JINJA_TOOL DATA_DIR WORK_DIR

Every template is rendered with each message set (one user turn; system and
user; several turns; an assistant turn with tool_calls and a tool result),
with and without add_generation_prompt, with and without tools.  baton's
output must be byte for byte jinja2's; where the template raises
(raise_exception), baton must fail with its message; where jinja2 fails
otherwise (an undefined's attribute, a type error, the sandbox), baton must
fail with jinja2's message after its LINE:COLUMN.

The templates: DATA_DIR/chat_templates/*.jinja and the templates of
llama.cpp's test-chat-template cases (DATA_DIR/chat/llama_cpp_cases.h),
always; and the ones the llama-cpp-python source package carries under
vendor/llama.cpp/models/templates/, fetched with pip into WORK_DIR (skipped,
with a message, when pip cannot reach the index).  Exit 77 (skipped) when
jinja2 is missing."""
import glob
import json
import re
import os
import subprocess
import sys
import tarfile
import tempfile

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja_test: SKIP: jinja2 is not installed (pip install jinja2)")
    sys.exit(77)

import datetime

CORPUS_PACKAGE = "llama-cpp-python==0.3.36"
NOW = 1735787045  # the time strftime_now formats on both sides


class Generation(Extension):
    """transformers' {% generation %}: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class Raised(Exception):
    pass


def environment():
    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]

MESSAGE_SETS = {
    "user": [{"role": "user", "content": "Hello, how are you?"}],
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    "turns": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke.\nA short one."},
    ],
    "tool_calls": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees in Paris."},
        {"role": "user", "content": "Thanks!"},
    ],
    # OpenAI's form: the arguments a JSON text, an id of nine letters and digits (Mistral's rule)
    "tool_calls_json": [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather in Paris and in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a1b2c3d4e", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "f5g6h7i8j", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\", \"unit\": \"celsius\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": "21"},
        {"role": "tool", "tool_call_id": "f5g6h7i8j", "name": "get_weather", "content": "24"},
    ],
}


def contexts():
    for name, msgs in MESSAGE_SETS.items():
        for gen in (False, True):
            for tools in (None, TOOLS):
                ctx = {"messages": msgs, "tools": tools, "add_generation_prompt": gen,
                       "bos_token": "<s>", "eos_token": "</s>"}
                yield "%s%s%s" % (name, "+gen" if gen else "", "+tools" if tools else ""), ctx


def render_jinja2(env, src, ctx):
    """('ok', text) | ('raised', message) | ('error', message)"""
    try:
        return "ok", env.from_string(src).render(**ctx)
    except Raised as e:
        return "raised", str(e.args[0])
    except Exception as e:  # a syntax error, an undefined's attribute, the sandbox's refusal...
        return "error", str(e)


def render_baton(tool, path, ctx_path):
    p = subprocess.run([tool, path, ctx_path, str(NOW)], capture_output=True, timeout=60)
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 0:
        return "ok", p.stdout.decode("utf-8")
    if p.returncode == 3 and err.startswith("raised: "):
        return "raised", err[len("raised: "):]
    if p.returncode == 2 and err.startswith("error: "):
        # "error: [FILE: ]LINE:COLUMN: message": the message
        return "error", re.sub(r"^(.*?: )?\d+:\d+: ", "", err[len("error: "):], count=1)
    return "crash", "exit %d: %s" % (p.returncode, err)


def fetch_corpus(work):
    """The templates of llama-cpp-python's source package, or [] with a message."""
    os.makedirs(work, exist_ok=True)
    tars = glob.glob(os.path.join(work, "llama_cpp_python-*.tar.gz"))
    if not tars:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "-q", "-d", work, CORPUS_PACKAGE]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            out = getattr(e, "stderr", b"") or b""
            print("jinja_test: the template corpus is skipped: pip download %s failed: %s"
                  % (CORPUS_PACKAGE, out.decode("utf-8", "replace").strip().splitlines()[-1:] or e))
            return []
        tars = glob.glob(os.path.join(work, "llama_cpp_python-*.tar.gz"))
    out_dir = os.path.join(work, "templates")
    if not os.path.isdir(out_dir):
        os.makedirs(out_dir)
        with tarfile.open(tars[0]) as t:
            for m in t.getmembers():
                if "/vendor/llama.cpp/models/templates/" in m.name and m.name.endswith(".jinja") and m.isfile():
                    with open(os.path.join(out_dir, os.path.basename(m.name)), "wb") as f:
                        f.write(t.extractfile(m).read())
    return sorted(glob.glob(os.path.join(out_dir, "*.jinja")))


def header_templates(header, tmp):
    """The templates of llama_cpp_cases.h (C string literals) as files in tmp."""
    with open(header, encoding="utf-8") as f:
        src = f.read()
    body = src[src.index("k_llama_cpp_cases[] = {"):]
    lit = r'((?:"(?:[^"\\]|\\.)*"\s*)+)'
    paths = []
    for i, (name, tmpl, _) in enumerate(re.findall(r"\{\s*" + lit + r",\s*" + lit + r",\s*" + lit + r"\}", body)):
        # adjacent C literals read as Python's; \x escapes give bytes, read as UTF-8 (a literal
        # that holds UTF-8 text as it is reads right as it is)
        text = eval("(" + tmpl + ")")
        try:
            text = text.encode("latin-1").decode("utf-8")
        except UnicodeError:
            pass
        p = os.path.join(tmp, "case%02d.jinja" % i)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
        paths.append(p)
    return paths


def check(tool, templates, label, tmp):
    env = environment()
    ctxs = list(contexts())
    ctx_paths = []
    for name, ctx in ctxs:
        p = os.path.join(tmp, name + ".json")
        with open(p, "w") as f:
            json.dump(ctx, f)
        ctx_paths.append(p)
    match = total = 0
    kinds = {"ok": 0, "raised": 0, "error": 0}
    failures = []
    for path in templates:
        with open(path, encoding="utf-8") as f:
            src = f.read()
        for (name, ctx), ctx_path in zip(ctxs, ctx_paths):
            total += 1
            want = render_jinja2(env, src, ctx)
            kinds[want[0]] += 1
            got = render_baton(tool, path, ctx_path)
            ok = got == want
            if ok:
                match += 1
            else:
                failures.append((os.path.basename(path), name, want, got))
    print("jinja_test: %s: %d of %d renders (%d templates x %d contexts) match jinja2 "
          "(jinja2 rendered %d, the template raised %d, jinja2 failed %d)"
          % (label, match, total, len(templates), len(ctxs), kinds["ok"], kinds["raised"], kinds["error"]))
    for t, name, want, got in failures[:40]:
        at = 0
        while at < min(len(want[1]), len(got[1])) and want[1][at] == got[1][at]:
            at += 1
        lo = max(0, at - 80)
        print("  MISMATCH %s [%s] at character %d\n    jinja2: %s %r\n    baton:  %s %r"
              % (t, name, at, want[0], want[1][lo:at + 200], got[0], got[1][lo:at + 200]))
    if len(failures) > 40:
        print("  ... and %d more" % (len(failures) - 40))
    return not failures


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    tool, data, work = sys.argv[1:]
    core = sorted(glob.glob(os.path.join(data, "chat_templates", "*.jinja")))
    if not core:
        print("jinja_test: no templates in %s/chat_templates" % data)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        ok = check(tool, core, "core templates", tmp)
        cases = header_templates(os.path.join(data, "chat", "llama_cpp_cases.h"), tmp)
        ok = check(tool, cases, "llama.cpp's test-chat-template cases", tmp) and ok
        corpus = fetch_corpus(work)
        if corpus:
            ok = check(tool, corpus, "llama.cpp's templates (%s)" % CORPUS_PACKAGE, tmp) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
