#!/usr/bin/env python3
"""stop_test.py BATON BATON_RUN - every way a user stops `baton serve` or
`baton generate` lets it finish what it is doing, and leaves nothing behind.

serve on two ranks, a stream running:
  ^C under launch/baton-run (SIGINT to its process group, as a terminal sends it),
  SIGTERM to baton-run alone, SIGUSR1 to a plain mpirun, SIGINT to rank 0:
  the stream gets to its end and [DONE], the job ends, and the files Open MPI
  keeps while a job runs (the folder of its mpirun, the ranks' shared-memory segments)
  are gone.
generate on two ranks under baton-run, and alone: ^C ends it with what it has
(the text so far on stdout, a line that says so), exit 130; -cnv too.
A second ^C under baton-run stops the job at once."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

BATON, RUN, HERE = sys.argv[1], sys.argv[2], os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOPO = os.path.join(ROOT, "configs", "local-cpu-2.yaml")
MPIRUN = os.environ.get("MPIEXEC") or "mpirun"
fails = 0


def fail(msg):
    global fails
    print("FAIL: " + msg)
    fails += 1


def ok(msg):
    print("ok: " + msg)


def wait_for(cond, limit=60.0, step=0.05):
    t0 = time.time()
    while time.time() - t0 < limit:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return None


def children(pid):
    """Every process below pid (by /proc's parent links)."""
    kids, found = {}, []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    todo = [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            found.append(c)
            todo.append(c)
    return found


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def job_files(top):
    """Open MPI's files of the job below top: the folder of its mpirun under ompi.*
    and the shared-memory segments its ranks map."""
    files = set()
    for p in [top] + children(top):
        if comm(p) in ("mpirun", "orterun"):
            for d in os.listdir(tempfile.gettempdir()):
                path = os.path.join(tempfile.gettempdir(), d, f"pid.{p}")
                if d.startswith("ompi.") and os.path.exists(path):
                    files.add(path)
        try:
            with open(f"/proc/{p}/maps") as f:
                for line in f:
                    m = re.search(r"(/dev/shm/\S*(vader|sm_segment)\S*)", line)
                    if m:
                        files.add(m.group(1).replace(" (deleted)", ""))
        except OSError:
            pass
    return files


def start(argv, new_group=True, **kw):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=new_group, **kw)


def text(b):
    return b.decode("utf-8", "replace")


def start_server(argv, tag):
    """argv runs the server; returns (process, port, rank 0's pid) once it listens."""
    p = start(argv)
    line = ""
    t0 = time.time()
    while time.time() - t0 < 120:
        line = text(p.stdout.readline())
        if not line or "listening on" in line:
            break
    m = re.search(r":(\d+) \(model.*pid (\d+)\)", line)
    if not m:
        p.kill()
        out, err = p.communicate()
        raise SystemExit(f"FAIL: {tag}: the server did not start: {line}{text(out)}{text(err)}")
    return p, int(m.group(1)), int(m.group(2))


def stream(port, max_tokens):
    """A streamed completion; returns (connection, response)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"model": "model.gguf", "prompt": "Once upon a time", "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    return c, r


def late_request(port):
    """A request sent during the drain: 503, or no answer once the server is gone."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", "/v1/completions", json.dumps({"model": "model.gguf", "prompt": "Late", "max_tokens": 2}),
                  {"Content-Type": "application/json"})
        return c.getresponse().status
    except OSError:
        return 0


def finish(p, name, limit=120):
    """The process's (stdout, stderr) once it ends; killed, and a failure, past limit seconds."""
    try:
        return p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        fail(f"{name}: did not end within {limit} s")
        return p.communicate()


def serve_case(name, argv, stop, want_rc, want_err):
    """Start the server with argv, a stream running, stop(process, rank 0's pid)."""
    p, port, pid0 = start_server(argv, name)
    files = job_files(p.pid)
    conn, r = stream(port, 1500)
    first = r.readline()  # the first piece: generating now
    if not first.startswith(b"data: "):
        fail(f"{name}: the stream did not start: {first!r}")
    stop(p, pid0)
    time.sleep(0.3)
    late = late_request(port)
    try:
        rest = r.read().decode()
    except (OSError, http.client.HTTPException) as e:  # cut mid-stream
        rest = f"(cut: {e!r})"
    conn.close()
    err = text(finish(p, name)[1])
    done = rest.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in rest
    if done:
        ok(f"{name}: the running stream got to its end and [DONE]")
    else:
        fail(f"{name}: the stream was cut: ...{rest[-300:]!r}")
    if late in (0, 503):
        ok(f"{name}: a request during the drain: {late or 'no server'}")
    else:
        fail(f"{name}: a request during the drain got {late}")
    if p.returncode == want_rc:
        ok(f"{name}: exit {want_rc}")
    else:
        fail(f"{name}: exit {p.returncode}, wanted {want_rc}: {err}")
    for w in want_err:
        if w not in err:
            fail(f"{name}: stderr lacks '{w}': {err}")
    if not files:
        fail(f"{name}: found none of Open MPI's files of the running job (the check would mean nothing)")
    left = [f for f in files if os.path.exists(f)]
    if left:
        fail(f"{name}: left behind: {left}")
    else:
        ok(f"{name}: nothing left behind ({len(files)} files of the job gone)")


def run_cmd(mode):
    return [RUN, "-t", TOPO, "--no-bind", "--", "baton", "serve", "-m", MODEL, "--port", "0", "--parallel", "1",
            "--ctx-size", "2048"] if mode == "run" else \
        [MPIRUN, "-np", "2", "--bind-to", "none", BATON, "serve", "-m", MODEL, "--port", "0", "--threads", "1",
         "--parallel", "1", "--ctx-size", "2048"]


def generate_case(name, argv, stop, want_rc, cnv=False):
    p = start(argv, stdin=subprocess.PIPE if cnv else subprocess.DEVNULL)
    if cnv:
        p.stdin.write(b"Tell me a story\n")
        p.stdin.flush()
    # the first piece of text: generating now (stdout is a pipe, flushed a token at a time)
    piece = p.stdout.read(1) if wait_for(lambda: p.poll() is None, 5) else b""
    time.sleep(0.3)
    stop(p)
    out, err = finish(p, name)
    out, err = text(piece + out), text(err)
    if p.returncode != want_rc:
        fail(f"{name}: exit {p.returncode}, wanted {want_rc}: {err[-600:]}")
    elif len(out.strip()) < 2:
        fail(f"{name}: no text on stdout: {out!r}")
    elif "the output above is what was generated until then" not in err:
        fail(f"{name}: no line saying it stopped: {err[-600:]}")
    else:
        ok(f"{name}: ended with what it had ({len(out)} characters), exit {want_rc}")


def main():
    global MODEL
    try:
        import gguf, numpy  # noqa: F401  (tests/model_ref.py writes the model with them)
    except ImportError:
        print("SKIP: python3 with gguf and numpy is needed (launch/bootstrap.sh test installs them)")
        sys.exit(77)
    tmp = tempfile.mkdtemp()
    try:
        subprocess.run([sys.executable, os.path.join(HERE, "model_ref.py"), "llama", "f32", tmp, "vocab",
                        os.path.join(HERE, "data", "vocab", "ggml-vocab-phi-3.gguf")], check=True,
                       stdout=subprocess.DEVNULL)
        MODEL = os.path.join(tmp, "model.gguf")
        os.environ["BATON_BIN"] = BATON

        def ctrl_c(p, pid0=None):
            os.killpg(p.pid, signal.SIGINT)  # what a terminal's ^C does: the whole foreground group

        def term_run(p, pid0=None):
            os.kill(p.pid, signal.SIGTERM)

        def usr1_mpirun(p, pid0=None):
            os.kill(p.pid, signal.SIGUSR1)

        def int_rank0(p, pid0):
            os.kill(pid0, signal.SIGINT)

        serve_case("serve, ^C under baton-run", run_cmd("run"), ctrl_c, 130,
                   ["baton-run: got SIGINT: asking the 2 ranks to finish", "draining",
                    "baton-run: the job finished what it was doing after SIGINT"])
        serve_case("serve, SIGTERM to baton-run", run_cmd("run"), term_run, 143,
                   ["baton-run: got SIGTERM: asking the 2 ranks to finish", "draining"])
        serve_case("serve, SIGUSR1 to mpirun", run_cmd("mpirun"), usr1_mpirun, 0, ["draining"])
        serve_case("serve, SIGINT to rank 0", run_cmd("mpirun"), int_rank0, 0, ["draining"])

        gen = ["baton", "generate", "-m", MODEL, "-p", "Once upon a time", "-n", "1900", "-c", "2048"]
        generate_case("generate, ^C under baton-run", [RUN, "-t", TOPO, "--no-bind", "--"] + gen, ctrl_c, 130)
        generate_case("generate, ^C alone", [BATON] + gen[1:] + ["-t", "1"], ctrl_c, 130)
        cnv = [BATON, "generate", "-m", MODEL, "-cnv", "-n", "1900", "-c", "2048", "-t", "1"]
        generate_case("generate -cnv, ^C during a reply", cnv, ctrl_c, 130, cnv=True)

        # a second ^C: at once, whatever runs
        p = start([RUN, "-t", TOPO, "--no-bind", "--"] + gen)
        p.stdout.read(1)
        os.killpg(p.pid, signal.SIGINT)
        os.killpg(p.pid, signal.SIGINT)
        finish(p, "a second ^C", 60)
        if p.returncode == 130:
            ok("a second ^C under baton-run: the job stopped, exit 130")
        else:
            fail(f"a second ^C: exit {p.returncode}")
    finally:
        subprocess.run(["rm", "-rf", tmp])
    if fails:
        print(f"stop_test: {fails} failed")
        sys.exit(1)
    print("stop_test: all passed")


if __name__ == "__main__":
    main()
