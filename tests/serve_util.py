"""serve_util.py - what the tests that call `baton serve` from Python share (serve_client.py,
serve_cache.py, serve_choices.py, serve_embeddings.py, serve_json.py): a check that ends the
script at the first failure, the openai client, and one plain HTTP request."""
import http.client
import json
import sys

import openai


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def client(port, key, timeout=120):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=timeout)


def request(port, method, path, body=None, key=None, headers=None, timeout=120):
    """(status, headers, bytes) of one request; body a dict (sent as JSON), text or bytes"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data
