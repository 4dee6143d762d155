"""Summarise the ONNX Runtime profiles that voxmux's provider option `profile` makes.

Each session (lm, flow_encoder, flow_estimator, vocoder) writes PREFIX<session>_<time>.json when
it is released. For every session and input shape this prints how long its runs took, how much of
that the executor spent issuing nodes on the host (the sum of the nodes' kernel_time: for CUDA
nodes the time to launch them, not to compute), and what is left: waiting for the GPU at the end of
the run and copies. A run counts as "together" when it overlapped a run of another session; the
profiles are lined up by the start time in their file names (millisecond precision).

    python3 -m scripts.common.ort_profile_summary /tmp/prof/run-   # the prefix given as profile

Standard library only, so it runs on a GPU host as it is.
"""
import argparse
import collections
import datetime
import glob
import json
import os
import re
import sys

NAME = re.compile(r"(?P<session>.+)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<time>\d{2}-\d{2}-\d{2})(?:_(?P<ms>\d+))?\.json$")


def load(path, prefix):
    m = NAME.match(os.path.basename(path)[len(os.path.basename(prefix)):])
    if not m:
        return None
    start = datetime.datetime.strptime(m["date"] + " " + m["time"], "%Y-%m-%d %H-%M-%S").timestamp() * 1e6
    start += int(m["ms"] or 0) * 1000
    with open(path) as f:
        try:
            events = json.load(f)
        except json.JSONDecodeError as e:
            # A session still running when its process was stopped leaves its profile unfinished.
            print("skipping %s: not a whole profile (%s)" % (path, e), file=sys.stderr)
            return None
    runs, nodes = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        if e["cat"] == "Session" and e["name"] == "model_run":
            runs.append((start + e["ts"], e["dur"]))
        elif e["cat"] == "Node" and e["name"].endswith("_kernel_time"):
            a = e.get("args", {})
            nodes.append((start + e["ts"], e["dur"], a.get("op_name", "?"), a.get("provider", "?"), shape(a)))
    runs.sort()
    nodes.sort()
    return m["session"], runs, nodes


def shape(args):
    s = args.get("input_type_shape") or []
    dims = []
    for t in s:
        for v in t.values():
            dims.append("x".join(str(d) for d in v))
    return ",".join(dims)


def overlaps(run, others):
    s, d = run
    for o in others:
        for os_, od in o:
            if os_ < s + d and s < os_ + od:
                return True
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefix", help="the provider option profile's value (a path prefix)")
    ap.add_argument("--top", type=int, default=8, help="op types to list per session and mode")
    ap.add_argument("--by-shape", action="store_true",
                    help="list op types per input shape too (a session's prefills apart from its decode steps)")
    a = ap.parse_args()
    files = sorted(glob.glob(a.prefix + "*.json"))
    if not files:
        sys.exit(f"no profiles match {a.prefix}*.json")
    sessions = {}
    for i, f in enumerate(files):
        print(f"reading {f} ({os.path.getsize(f) / 1e6:.0f} MB, {i + 1}/{len(files)})", file=sys.stderr)
        r = load(f, a.prefix)
        if r:
            sessions[r[0]] = (r[1], r[2])
    print(f"# ONNX Runtime profiles: {a.prefix}*\n")
    print("Host: the executor issuing the run's nodes (for CUDA nodes, launching them). Rest: the run's")
    print("time beyond that (waiting for the GPU at the end, copies in and out).\n")
    print("| session | input shape | mode | runs | ms per run | host ms | rest ms | nodes | CPU-provider nodes |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    ops = collections.defaultdict(lambda: collections.Counter())
    counts = collections.defaultdict(lambda: collections.Counter())
    cpu_ops = collections.defaultdict(lambda: collections.Counter())
    nruns = collections.Counter()
    for name, (runs, nodes) in sorted(sessions.items()):
        others = [r for n, (r, _) in sessions.items() if n != name]
        groups = collections.OrderedDict()
        j = 0
        for run in runs:
            s, d = run
            while j < len(nodes) and nodes[j][0] < s:
                j += 1
            k = j
            host, count, cpu, first = 0, 0, 0, None
            while k < len(nodes) and nodes[k][0] <= s + d:
                t, nd, op, prov, shp = nodes[k]
                if first is None:
                    first = shp
                host += nd
                count += 1
                cpu += prov == "CPUExecutionProvider"
                k += 1
            mode = "together" if overlaps(run, others) else "alone"
            nruns[(name, mode)] += 1
            key = (name, mode, first or "?") if a.by_shape else (name, mode)
            nruns[key] += a.by_shape
            for t, nd, op, prov, shp in nodes[j:k]:
                ops[key][op] += nd
                counts[key][op] += 1
                if prov == "CPUExecutionProvider":
                    cpu_ops[name][op] += 1
            g = groups.setdefault((first or "?", mode), [0, 0, 0, 0, 0])
            g[0] += 1
            g[1] += d
            g[2] += host
            g[3] += count
            g[4] += cpu
            j = k
        for (shp, mode), (n, d, host, count, cpu) in groups.items():
            print(f"| {name} | {shp[:40]} | {mode} | {n} | {d / n / 1e3:.2f} | {host / n / 1e3:.2f} | "
                  f"{(d - host) / n / 1e3:.2f} | {count / n:.0f} | {cpu / n:.0f} |")
    print()
    print("Time by op type (ms per run, nodes per run); under CUDA_LAUNCH_BLOCKING=1 each CUDA")
    print("node's time includes its kernels' run on the GPU.\n")
    for key, c in sorted(ops.items()):
        n = nruns[key] or 1
        total = sum(c.values()) or 1
        top = ", ".join(f"{op} {v / n / 1e3:.2f} ms ({v / total:.0%}, {counts[key][op] / n:.0f})"
                        for op, v in c.most_common(a.top))
        print(f"- {', '.join(key)}: {top}")
    print()
    for name, c in sorted(cpu_ops.items()):
        n = sum(nruns[(name, m)] for m in ("alone", "together")) or 1
        print(f"- {name}: nodes on the CPU provider per run: " +
              ", ".join(f"{op} {v / n:.0f}" for op, v in c.most_common()))


if __name__ == "__main__":
    main()
