#!/usr/bin/env python3
"""serve_json.py - constrained output of `baton serve` through the official
openai package: response_format (json_schema, json_object) on chat and
completions, tools with tool_choice "required", a named function and
"auto", streamed and not, and the bad inputs (an invalid schema, an
unsupported keyword, a tool without a name, a tool_choice naming an unknown
function), each a 400 naming the field.  The model has random weights: every
answer must still be valid for its schema, whatever the weights.

Usage: serve_json.py PORT MODEL OUT [FORMAT [MARK_ID]]
FORMAT: the tool-call format of the served template (hermes, the default:
every check; llama3, mistral, mistral-args, mistral-call-id: the tools
checks only).  MARK_ID (mistral): the vocabulary's control token
"[TOOL_CALLS]", which logit_bias then pushes up: the calls come with
tool_choice "auto" (the token shown, the trigger fired) and "required"
(the grammar takes it).  OUT gets the answers of the greedy requests, for
serve_json_test.sh to compare between 1 and 2 ranks.  Prints one line per
check; exits 1 on the first failure."""
import concurrent.futures as cf
import http.client
import json
import re
import sys

import serve_util

PORT, MODEL, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
FMT = sys.argv[4] if len(sys.argv) > 4 else "hermes"
MARK_ID = sys.argv[5] if len(sys.argv) > 5 else None  # mistral: "[TOOL_CALLS]" a control token of this id
client = serve_util.client(PORT, "none", timeout=300)
check = serve_util.check
answers = []


# ---- a small JSON schema checker (the keywords the server supports) ----

def resolve(root, ref):
    node = root
    for part in ref.lstrip("#").split("/")[1:]:
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
FORMATS = {"date": f"^{DATE}$", "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"}


def valid(v, s, root=None):
    root = root if root is not None else s
    if s is True or s == {}:
        return True
    if "$ref" in s:
        return valid(v, resolve(root, s["$ref"]), root)
    if "const" in s:
        return v == s["const"] and type(v) is type(s["const"])
    if "enum" in s:
        return any(v == e and type(v) is type(e) for e in s["enum"])
    for key in ("anyOf", "oneOf"):
        if key in s:
            return any(valid(v, x, root) for x in s[key])
    t = s.get("type")
    if isinstance(t, list):
        return any(valid(v, dict(s, type=x), root) for x in t)
    if t == "object":
        if not isinstance(v, dict):
            return False
        props = s.get("properties", {})
        if any(k not in v for k in s.get("required", [])):
            return False
        if not s.get("additionalProperties", False) and any(k not in props for k in v):
            return False
        return all(valid(v[k], props[k], root) for k in v if k in props)
    if t == "array":
        if not isinstance(v, list):
            return False
        if "prefixItems" in s:  # a tuple: exactly its schemas
            return len(v) == len(s["prefixItems"]) and all(valid(x, p, root) for x, p in zip(v, s["prefixItems"]))
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", len(v)):
            return False
        return all(valid(x, s.get("items", True), root) for x in v)
    if t == "string":
        pattern = s.get("pattern", FORMATS.get(s.get("format")))
        # ECMAScript's "$" is the end only; \d, \w, \s as ASCII (the checker's patterns need no more)
        if pattern is not None and not (isinstance(v, str) and re.search(pattern.replace("$", r"\Z"), v, re.ASCII)):
            return False
        return isinstance(v, str) and s.get("minLength", 0) <= len(v) <= s.get("maxLength", len(v))
    if t == "integer":
        bounds = (v >= s.get("minimum", v) and v > s.get("exclusiveMinimum", v - 1) and v <= s.get("maximum", v)
                  and v < s.get("exclusiveMaximum", v + 1)) if isinstance(v, int) else False
        return isinstance(v, int) and not isinstance(v, bool) and bounds
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    raise ValueError(f"the checker does not know {s}")


def valid_text(text, schema):
    try:
        return valid(json.loads(text), schema)
    except ValueError:
        return False


# every string and list bounded, so that an answer ends whatever the weights
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(x|yz)?$"},
        "born": {"type": "string", "format": "date"},
        "point": {"type": "array", "prefixItems": [{"type": "integer", "exclusiveMinimum": -16, "maximum": 27},
                                                    {"type": "number"}], "items": False},
        "height": {"type": "number"},
        "member": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "address": {"$ref": "#/$defs/address"},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    },
    "required": ["name", "age", "code", "role", "address"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "integer"}},
            "required": ["city"],
        }
    },
}
RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
MSGS = [{"role": "user", "content": "Describe a person as JSON."}]

def response_format_checks():
    # ---- response_format json_schema, chat: greedy, sampled, streamed ----
    for temp, seed in ((0, None), (0.9, 11), (1.0, 12)):
        r = client.chat.completions.create(model=MODEL, messages=MSGS, response_format=RF, temperature=temp, seed=seed,
                                           max_tokens=400)
        c = r.choices[0]
        check(c.finish_reason == "stop" and valid_text(c.message.content, PERSON),
              f"json_schema, temperature {temp}: valid for the schema: {c.message.content!r} ({c.finish_reason})")
        if temp == 0:
            greedy = c.message.content
            answers.append(greedy)
    # top_k: the fast path that asks about a few candidates
    r = client.chat.completions.create(model=MODEL, messages=MSGS, response_format=RF, temperature=0.8, seed=5,
                                       max_tokens=400, extra_body={"top_k": 20})
    check(valid_text(r.choices[0].message.content, PERSON), "json_schema with top_k 20: valid")
    answers.append(r.choices[0].message.content)
    stream = client.chat.completions.create(model=MODEL, messages=MSGS, response_format=RF, temperature=0,
                                            max_tokens=400, stream=True)
    text, finish = "", None
    for ch in stream:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    check(text == greedy and finish == "stop", "json_schema streamed: the same text as not streamed")

    # alone and among concurrent requests: the same answer
    with cf.ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda i: client.chat.completions.create(
            model=MODEL, messages=MSGS if i == 0 else [{"role": "user", "content": f"other {i}"}],
            response_format=RF if i % 2 == 0 else None, temperature=0, max_tokens=400).choices[0].message.content,
            range(4)))
    check(outs[0] == greedy, "json_schema among concurrent requests: the same answer as alone")

# ---- json_object ----
class Cut(Exception):
    """the text ended inside a value"""


def json_prefix(s):
    """True when s is a whole JSON object or the start of one (a prefix no
    parser refuses before its end), False when it breaks JSON somewhere."""
    i = 0

    def ws():
        nonlocal i
        while i < len(s) and s[i] in " \t\n\r":
            i += 1

    def need(k=1):
        if i + k > len(s):
            raise Cut

    def lit(w):
        nonlocal i
        for ch in w:
            need()
            if s[i] != ch:
                raise ValueError(w)
            i += 1

    def string():
        nonlocal i
        lit('"')
        while True:
            need()
            ch = s[i]
            i += 1
            if ch == '"':
                return
            if ch == "\\":
                need()
                i += 1
            elif ord(ch) < 0x20:
                raise ValueError("control character")

    def number():
        nonlocal i
        j = i
        while i < len(s) and s[i] in "+-0123456789.eE":
            i += 1
        if i == len(s):
            raise Cut
        float(s[j:i])

    def value():
        ws()
        need()
        ch = s[i]
        if ch == "{":
            members("}", True)
        elif ch == "[":
            members("]", False)
        elif ch == '"':
            string()
        elif ch in "tfn":
            lit({"t": "true", "f": "false", "n": "null"}[ch])
        else:
            number()

    def members(close, keyed):
        nonlocal i
        i += 1
        ws()
        need()
        if s[i] == close:
            i += 1
            return
        while True:
            if keyed:
                ws()
                string()
                ws()
                lit(":")
            value()
            ws()
            need()
            if s[i] == close:
                i += 1
                return
            lit(",")

    try:
        ws()
        need()
        if s[i] != "{":
            return False
        value()
        return i == len(s)
    except Cut:
        return True
    except ValueError:
        return False


def json_object_checks():
    r = client.chat.completions.create(model=MODEL, messages=MSGS, response_format={"type": "json_object"},
                                       temperature=0.7, seed=3, max_tokens=300)
    c = r.choices[0]
    text = c.message.content
    ok = (c.finish_reason == "stop" and isinstance(json.loads(text), dict)) or (
        c.finish_reason == "length" and json_prefix(text))
    check(json_prefix('{"a": [1, "x') and json_prefix('{"a":{}}') and not json_prefix('{"a" 1') and not json_prefix(
        '{"a":1}}') and not json_prefix("[1]"), "the prefix checker")
    check(ok,
          f"json_object: a JSON object, or the start of one where max_tokens cut it ({c.finish_reason})")
    # the grammar outweighs the weights: '}' pushed up by logit_bias still cannot come first, so the answer is {}
    st_tok = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    st_tok.request("POST", "/tokenize", body=json.dumps({"content": "}"}), headers={"Content-Type": "application/json"})
    close_id = json.loads(st_tok.getresponse().read())["tokens"][0]
    st_tok.close()
    r = client.chat.completions.create(model=MODEL, messages=MSGS, response_format={"type": "json_object"},
                                       temperature=0, max_tokens=50, logit_bias={str(close_id): 100})
    check(r.choices[0].message.content == "{}" and r.choices[0].finish_reason == "stop",
          f"json_object with '}}' favoured: {r.choices[0].message.content!r}")
    r = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, max_tokens=3,
                                       logit_bias={str(close_id): 100})
    check(r.choices[0].message.content.startswith("}"), "the same without response_format starts with '}'")

    # ---- completions ----
    SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                              "n": {"type": "integer", "minimum": -15, "maximum": 27},
                                              "word": {"enum": ["alpha", "beta"]}}, "required": ["ok", "n", "word"]}
    r = client.completions.create(model=MODEL, prompt="JSON:", max_tokens=200, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "s", "schema": SMALL}}})
    check(r.choices[0].finish_reason == "stop" and valid_text(r.choices[0].text, SMALL),
          f"completions with json_schema: valid: {r.choices[0].text!r}")
    answers.append(r.choices[0].text)

# ---- tools ----
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14},
                                                         "id": {"type": "string", "format": "uuid"}},
                       "required": ["zone"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TMSGS = [{"role": "user", "content": "What is the weather in Oslo?"}]


def check_calls(msg, finish, what, only=None, most=None):
    calls = msg.tool_calls or []
    most = 1 if FMT == "llama3" else most  # the Llama 3.1 template allows one call
    check(finish == "tool_calls" and len(calls) >= 1 and (most is None or len(calls) <= most),
          f"{what}: finish_reason tool_calls with {len(calls)} call(s)")
    for tc in calls:
        f = tc.function
        check(tc.type == "function" and tc.id and f.name in SCHEMAS and (only is None or f.name == only)
              and valid_text(f.arguments, SCHEMAS[f.name]), f"{what}: {f.name}({f.arguments}) follows its schema")
    check(len({tc.id for tc in calls}) == len(calls), f"{what}: the call ids differ")
    if FMT in ("mistral", "mistral-call-id"):  # the ids the model wrote, as its template wants them back
        check(all(len(tc.id) == 9 and tc.id.isalnum() for tc in calls), f"{what}: ids of 9 letters or digits")
    return [(tc.function.name, tc.function.arguments) for tc in calls]


def stream_chat(**kw):
    """A streamed chat with TOOLS: its calls by index (name, arguments, id as the deltas build them), its
    finish_reason and its content."""
    stream = client.chat.completions.create(model=MODEL, messages=TMSGS, tools=TOOLS, temperature=0, stream=True, **kw)
    calls, finish, content = {}, None, ""
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": None})
            if tc.id:
                e["id"] = tc.id
            if tc.function and tc.function.name:
                e["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                e["arguments"] += tc.function.arguments
        finish = ch.choices[0].finish_reason or finish
    return calls, finish, content


def tools_checks():
    r = client.chat.completions.create(model=MODEL, messages=TMSGS, tools=TOOLS, tool_choice="required", temperature=0,
                                       max_tokens=1000)
    req_calls = check_calls(r.choices[0].message, r.choices[0].finish_reason, "tool_choice required")
    req_content = r.choices[0].message.content or ""  # the start of a call max_tokens cut
    answers.append(json.dumps(req_calls))
    r = client.chat.completions.create(model=MODEL, messages=TMSGS, tools=TOOLS, temperature=0, max_tokens=1000,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}},
                                       parallel_tool_calls=False)
    answers.append(json.dumps(check_calls(r.choices[0].message, r.choices[0].finish_reason, "a named function",
                                          only="get_time", most=1)))
    # (Mistral's list of several calls, sampled from random weights, seldom closes inside max_tokens: one call)
    r = client.chat.completions.create(model=MODEL, messages=TMSGS, tools=TOOLS, tool_choice="required", temperature=0.9,
                                       seed=4, max_tokens=1000, parallel_tool_calls=FMT == "hermes")
    check_calls(r.choices[0].message, r.choices[0].finish_reason, "tool_choice required, sampled")

    # streamed: the calls come as tool_calls deltas, the same as not streamed
    calls, finish, content = stream_chat(tool_choice="required", max_tokens=1000)
    got = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
    check(finish == "tool_calls" and got == req_calls and all(calls[i]["id"] for i in calls)
          and content.strip() == req_content, f"tools streamed: the same calls as not streamed: {got}")

    # auto: text or calls, either well formed; streamed, the same
    r = client.chat.completions.create(model=MODEL, messages=TMSGS, tools=TOOLS, tool_choice="auto", temperature=0,
                                       max_tokens=24)
    m = r.choices[0].message
    check((r.choices[0].finish_reason == "tool_calls") == bool(m.tool_calls) and (m.tool_calls or m.content is not None),
          f"tool_choice auto: an answer ({r.choices[0].finish_reason})")
    calls, finish, content = stream_chat(tool_choice="auto", max_tokens=24)
    got = [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]
    want = [(tc.function.name, tc.function.arguments) for tc in m.tool_calls or []]
    check(finish == r.choices[0].finish_reason and got == want and content.strip() == (m.content or "").strip(),
          f"tool_choice auto streamed: the same answer ({finish}, {content!r})")
    # a history with a call and its result goes through the template
    hist = TMSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
                    {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "12 degrees"}]
    r = client.chat.completions.create(model=MODEL, messages=hist, tools=TOOLS, tool_choice="required", temperature=0,
                                       max_tokens=1000)
    check_calls(r.choices[0].message, r.choices[0].finish_reason, "required after a call and its result")


def control_mark_checks():
    for choice in ("auto", "required"):
        for stream in (False, True):
            what = f"[TOOL_CALLS] a control token, tool_choice {choice}{', streamed' if stream else ''}"
            kw = dict(tool_choice=choice, max_tokens=400, parallel_tool_calls=False, logit_bias={MARK_ID: 100})
            if stream:
                calls, finish, content = stream_chat(**kw)
                check(finish == "tool_calls" and len(calls) == 1 and content == "", f"{what}: {finish}, {content!r}")
                continue
            r = client.chat.completions.create(model=MODEL, messages=TMSGS, tools=TOOLS, temperature=0, **kw)
            check_calls(r.choices[0].message, r.choices[0].finish_reason, what, most=1)


# ---- bad inputs: a 400 naming the field ----
def raw(path, body):
    st, _, data = serve_util.request(PORT, "POST", path, body, timeout=60)
    return st, json.loads(data)


def expect_400(body, param, words, path="/v1/chat/completions"):
    base = {"model": MODEL, "max_tokens": 4}
    base.update({"prompt": "x"} if path == "/v1/completions" else {"messages": MSGS})
    st, e = raw(path, dict(base, **body))
    err = e.get("error", {})
    check(st == 400 and err.get("param") == param and words in err.get("message", ""),
          f"400 {param}: {err.get('message')}")


def bad_input_checks():
    expect_400({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
               "response_format.json_schema.schema", "a schema must be an object or a boolean")
    expect_400({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"age": {"type": "integer", "multipleOf": 2}}}}}},
               "response_format.json_schema.schema.properties.age.multipleOf", "'multipleOf' is not supported")
    expect_400({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "^(?=a)"}}}}}},
               "response_format.json_schema.schema.properties.code.pattern",
               "'pattern' at offset 1: a group '(?' other than '(?:' (a lookaround, a named group) is not supported")
    expect_400({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
               "response_format.json_schema.schema", "is required")
    expect_400({"response_format": {"type": "xml"}}, "response_format.type", "'text', 'json_object' or 'json_schema'")
    expect_400({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
               "response_format.json_schema.schema.type", "unknown type 'strin'", path="/v1/completions")
    expect_400({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]},
               "tools[0].function.name", "name")
    expect_400({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
               "tool_choice.function.name", "'nope'")
    expect_400({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "\"auto\"")
    expect_400({"tool_choice": "required"}, "tool_choice", "no 'tools'")
    expect_400({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(a+"}}}}}]},
               "tools[0].function.parameters.properties.x.pattern", "'pattern' at offset 0: '(' is not closed")

if FMT == "hermes":
    response_format_checks()
    json_object_checks()
if MARK_ID is None:
    tools_checks()
else:
    control_mark_checks()
if FMT == "hermes":
    bad_input_checks()
with open(OUT, "w") as f:
    json.dump(answers, f)
print("serve_json.py: all checks passed", flush=True)
