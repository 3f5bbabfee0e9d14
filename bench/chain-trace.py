#!/usr/bin/env python3
"""chain-trace.py - where a two-rank expert group's time goes, chain by chain.

Reads the Chrome trace that `baton demo --trace FILE` writes for a group of
two ranks (rank 0 runs the layers, rank 1 is the group's member; a topology
such as configs/local-cpu-2-divided.yaml) and prints, for one micro-batch,
each chain (a divided product, attention or experts' share, in graph order):

  U      rank 0 alone before the chain: the nodes nobody divides (norms,
         rope, routing, concatenations) and the copies of the last chain's
         rows into place; rank 1 has nothing to do meanwhile
  send   rank 0 packing and posting the chain's inputs
  h      rank 0 computing its own share
  wait   rank 0 waiting for rank 1's share to arrive
  mwait  rank 1 waiting for the chain's inputs (U, send and the transfer;
         none for a product of the x it kept from the chain before)
  m      rank 1 computing its share
  in/out MiB sent to rank 1 / received from it

then the totals, the time the micro-batch would take if transfers cost
nothing (each chain U + max(h, m)) and if the two ranks shared all of the
work evenly ((U + h + m) / 2).

usage: bench/chain-trace.py TRACE.json [MICRO_BATCH]   (default micro-batch 1,
the first after the warm-up of memory)

  launch/baton-run -t configs/local-cpu-2-divided.yaml -- baton demo \\
      --model FILE --tokens 512 --micro-batches 2 --no-check --trace t.json
  bench/chain-trace.py t.json 1
"""
import json
import sys


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    path = sys.argv[1]
    mb = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        print(f"chain-trace.py: {path}: {e}", file=sys.stderr)
        return 1
    events = data["traceEvents"] if isinstance(data, dict) else data
    ranks = {e.get("pid") for e in events if e.get("ph") == "X"}
    if ranks != {0, 1}:
        print(f"chain-trace.py: {path}: the trace has ranks {sorted(ranks)}; this reads two", file=sys.stderr)
        return 1

    def sel(rank, kind):
        suffix = f" mb {mb}"
        return sorted(
            (e for e in events if e.get("ph") == "X" and e.get("pid") == rank and e["name"].startswith(kind)
             and e["name"].endswith(suffix)),
            key=lambda e: e["ts"])

    splits = sel(0, "split")
    if not splits:
        print(f"chain-trace.py: {path}: rank 0 ran no split of micro-batch {mb}", file=sys.stderr)
        return 1
    split = splits[0]

    def inside(e):  # a chain's send or wait happens within rank 0's split (a pipeline's after it)
        return split["ts"] <= e["ts"] and e["ts"] + e["dur"] <= split["ts"] + split["dur"]

    sends, waits = [e for e in sel(0, "send") if inside(e)], [e for e in sel(0, "wait") if inside(e)]
    mwaits, mcomps = sel(1, "wait"), sel(1, "split")
    if not sends:
        print(f"chain-trace.py: {path}: no chains of micro-batch {mb} (an expert group's trace?)", file=sys.stderr)
        return 1
    n = min(len(sends), len(waits), len(mwaits), len(mcomps))
    if n != len(sends):
        print(f"chain-trace.py: {path}: rank 0 has {len(sends)} chains, rank 1 {len(mcomps)}", file=sys.stderr)
        return 1
    ms = 1e-3
    tot = dict(U=0.0, send=0.0, h=0.0, wait=0.0, mwait=0.0, m=0.0, inb=0.0, outb=0.0)
    sync = even = 0.0
    prev = split["ts"]
    print(f"micro-batch {mb}: {n} chains, ms and MiB")
    print(f"{'chain':>5} {'U':>8} {'send':>7} {'h':>8} {'wait':>7} | {'mwait':>7} {'m':>8} | {'in':>6} {'out':>6}")
    for i in range(n):
        s, w, mw, mc = sends[i], waits[i], mwaits[i], mcomps[i]
        u = s["ts"] - prev
        h = w["ts"] - (s["ts"] + s["dur"])
        row = dict(U=u, send=s["dur"], h=h, wait=w["dur"], mwait=mw["dur"], m=mc["dur"],
                   inb=s["args"]["bytes"] / 2**20, outb=w["args"]["bytes"] / 2**20)
        for k in tot:
            tot[k] += row[k]
        sync += u + max(h, mc["dur"])
        even += (u + h + mc["dur"]) / 2
        prev = w["ts"] + w["dur"]
        print(f"{i:>5} {u * ms:8.3f} {s['dur'] * ms:7.3f} {h * ms:8.3f} {w['dur'] * ms:7.3f} | "
              f"{mw['dur'] * ms:7.3f} {mc['dur'] * ms:8.3f} | {row['inb']:6.2f} {row['outb']:6.2f}")
    tail = split["ts"] + split["dur"] - prev
    print(f"{'all':>5} {tot['U'] * ms:8.1f} {tot['send'] * ms:7.1f} {tot['h'] * ms:8.1f} {tot['wait'] * ms:7.1f} | "
          f"{tot['mwait'] * ms:7.1f} {tot['m'] * ms:8.1f} | {tot['inb']:6.0f} {tot['outb']:6.0f}")
    print(f"rank 0's split: {split['dur'] * ms:.1f} ms ({tail * ms:.1f} after the last chain); "
          f"transfers free: {(sync + tail) * ms:.1f}; the work shared evenly: {(even + tail) * ms:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
