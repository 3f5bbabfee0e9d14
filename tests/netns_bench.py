#!/usr/bin/env python3
"""netns_bench.py - baton across two "hosts" (network namespaces, launch/netns.sh)
for each link class, against the cost model: a benchmark, it prints figures.

    python3 tests/netns_bench.py PATH/TO/baton [--classes none,100g,25g,1g] [-m 16]
                                 [--model "--embd 256 --ff 512"]

For each class: `baton bench transport` (one-way time for 4 KiB .. 1 MiB) and
`baton bench pipeline --micro-batches M --progress compute` (two ranks, one a host), then the
projection of the same pipeline (`baton plan --project`, two nodes of one
device at this machine's measured speed, linked by the class) and the
comparison: transfer of one activation, stage time and tokens/s, predicted
against measured.  Two predictions of a transfer: the link alone (latency +
bytes / bandwidth, the class's figures) and the link after this machine's own
path (the unshaped veth/TCP time for those bytes plus the link's).  Compute is
predicted at the speed the one-process run of the same command reached (the
machine's load at the time), not at the planner's short probe.  Needs root.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(ROOT, "launch", "netns.sh")
RUN = os.path.join(ROOT, "launch", "baton-run")
CLASSES = {"none": None, "100g": (12.5, 5.0), "25g": (3.125, 20.0), "1g": (0.125, 200.0)}


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("netns_bench: %s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    return r.stdout


def on_hosts(hosts, args):
    env = dict(os.environ)
    return sh([NETNS, "exec", hosts, "0", RUN, "-t", os.path.join(hosts, "topology.yaml"), "--agent",
               os.path.join(hosts, "agent"), "--"] + args, env=env)


def transport(hosts):
    out = on_hosts(hosts, ["baton", "bench", "transport", "--max", "1048576"])
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[0].isdigit():
            rows[int(f[0])] = float(f[3])  # baton_us
    return rows


def pipeline(hosts, model, m):
    out = on_hosts(hosts, ["baton", "bench", "pipeline", "-m", str(m), "--progress", "compute"] + model)
    for line in out.splitlines():
        f = line.split()
        if len(f) > 4 and f[0] == "2" and f[1] == str(m):
            per = re.findall(r"\| ([\d.]+) / ([\d.]+) / ([\d.]+)", line)
            return float(f[3]), float(f[4]), [tuple(map(float, p)) for p in per], line
    sys.exit("netns_bench: no result line in:\n" + out)


def project(baton, model, m, link):
    gbs, lat = link
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write("cluster: {nodes: 2, devices_per_node: 1, micro_batches: %d}\n" % m)
        f.write("device: {name: this machine's CPU (1 thread), speed: measured, memory_gib: 64}\n")
        f.write("intra_node: {name: none, gbytes_per_s: 1000, latency_us: 0}\n")
        f.write("inter_node: {name: link, gbytes_per_s: %g, latency_us: %g}\n" % (gbs, lat))
        path = f.name
    try:
        out = sh([baton, "plan", "--project", path] + model)
    finally:
        os.unlink(path)
    stages = []
    for line in out.splitlines():
        mm = re.match(r"\s*(\d+)\s+\d+\s+[\d-]+\s+([\d.]+) (ms|us|s)\s+([\d.]+) (ms|us|s)\s+([\d.]+) (ms|us|s)", line)
        if mm:
            u = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
            stages.append((float(mm.group(2)) * u[mm.group(3)], float(mm.group(4)) * u[mm.group(5)],
                           float(mm.group(6)) * u[mm.group(7)]))
    tps = float(re.search(r"; ([\d.]+) tokens/s", out).group(1))
    return stages, tps


def interp(rows, b):
    """one-way time for b bytes, piecewise linear in the measured sizes"""
    xs = sorted(rows)
    if b <= xs[0]:
        return rows[xs[0]] * b / xs[0]
    for lo, hi in zip(xs, xs[1:]):
        if b <= hi:
            return rows[lo] + (rows[hi] - rows[lo]) * (b - lo) / (hi - lo)
    return rows[xs[-1]] * b / xs[-1]


def model_arg(model, name, default):
    """the last value given for an option"""
    v = default
    for i, x in enumerate(model[:-1]):
        if x == name:
            v = int(model[i + 1])
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("baton")
    ap.add_argument("--classes", default="none,100g,25g,1g")
    ap.add_argument("-m", type=int, default=16)
    ap.add_argument("--model", default="")
    a = ap.parse_args()
    baton = os.path.abspath(a.baton)
    os.environ["BATON_BIN"] = baton
    # the bench pipeline's model, stated for both the run and the projection
    model = ["--arch", "llama", "--experts", "0", "--layers", "8", "--embd", "1024", "--heads", "16", "--heads-kv",
             "16", "--head-dim", "64", "--ff", "2048", "--n-vocab", "256", "--tokens", "128", "--type", "f32"] + \
        a.model.split()
    act_bytes = model_arg(model, "--tokens", 128) * model_arg(model, "--embd", 1024) * 4
    work = tempfile.mkdtemp(prefix="baton-netns-bench.")
    hosts = os.path.join(work, "hosts")
    r = subprocess.run([NETNS, "up", hosts, "2"])
    if r.returncode != 0:
        sys.exit(r.returncode)
    results = []
    try:
        bare = None
        for cls in a.classes.split(","):
            if cls not in CLASSES:
                sys.exit("netns_bench: unknown class %s (%s)" % (cls, ", ".join(CLASSES)))
            r = subprocess.run([NETNS, "shape", hosts, cls], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit("netns_bench: shape %s: %s" % (cls, r.stderr))
            # without netem the class's latency is not there: predict without it
            no_delay = "no netem" in r.stderr
            if no_delay:
                print(r.stderr.strip())
            tr = transport(hosts)
            if cls == "none":
                bare = tr
            tps, one, per, line = pipeline(hosts, model, a.m)
            print("%-5s transport one-way us: %s" % (cls, "  ".join("%d B: %.1f" % kv for kv in sorted(tr.items()))))
            print("%-5s pipeline: %s" % (cls, line.strip()))
            sys.stdout.flush()
            results.append((cls, tr, tps, one, per, no_delay))
        # predictions
        print("\nactivation %d bytes a micro-batch; M = %d; model: bench pipeline defaults %s" % (act_bytes, a.m, a.model))
        print("| link | transfer measured | link alone | link + bare path | miss | compute a stage, measured (r0 / r1) | "
              "predicted (r0 / r1) | miss | tokens/s measured | predicted | miss |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for cls, tr, tps, one_tps, per, no_delay in results:
            link = CLASSES[cls] or (1e3, 0.0)
            if no_delay:
                link = (link[0], 0.0)
            alone = link[1] + act_bytes / (link[0] * 1e3)  # us
            with_bare = alone + (interp(bare, act_bytes) if bare else 0)
            meas_tr = interp(tr, act_bytes)
            # what the pipeline's stage costs the cost model: the link plus this machine's path
            eff_gbs = act_bytes / (with_bare * 1e3)
            stages, ptps = project(baton, model, a.m, (eff_gbs, 0.0))
            # the device's speed under this machine's load at the time: the
            # one-process run of the same command (2 threads on the 2 cores)
            # against the projection's speed (a short probe): k scales every
            # predicted compute time
            one_mb_s = model_arg(model, "--tokens", 128) / one_tps
            k = one_mb_s * 2 / (stages[0][0] + stages[1][0])
            meas_stage = [c / a.m for c, _, _ in per]
            pred_stage = [s[0] * k for s in stages]  # compute; the transfer is compared on its own
            pstage = [s[0] * k + s[1] for s in stages]
            ptps = a.m * model_arg(model, "--tokens", 128) / (sum(pstage) + (a.m - 1) * max(pstage))
            sm = max(abs(p / m - 1) for p, m in zip(pred_stage, meas_stage))
            print("| %s | %.0f us | %.0f us | %.0f us | %+.0f%% | %.1f / %.1f ms | %.1f / %.1f ms | %.0f%% | %.1f | %.1f | %+.0f%% |" % (
                cls, meas_tr, alone, with_bare, 100 * (with_bare / meas_tr - 1), 1e3 * meas_stage[0],
                1e3 * meas_stage[1], 1e3 * pred_stage[0], 1e3 * pred_stage[1], 100 * sm, tps, ptps,
                100 * (ptps / tps - 1)))
    finally:
        subprocess.run([NETNS, "down", hosts])
        os.rmdir(work)


if __name__ == "__main__":
    main()
