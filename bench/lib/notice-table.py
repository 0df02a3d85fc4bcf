#!/usr/bin/env python3
"""Table of bench/nth.sh: notice-watch.py's N.json files side by side, per tool.

    notice-table.py OUTDIR NOTICES "what was run"

Percentiles are nearest-rank (p99 of 20 notices is the slowest of them). Notices flagged early (a cordon
or taint before the notice) are left out of the times and counted. Stdlib only.
"""
import json
import math
import os
import sys

out, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = []
for i in range(1, n + 1):
    try:
        runs.append(json.load(open(os.path.join(out, f"{i}.json"))))
    except FileNotFoundError:
        pass


def pct(xs, p):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def fmt(x, unit=" s"):
    return "—" if x is None else f"{x:.3f}{unit}" if unit == " s" else f"{x:.1f}{unit}"


TOOLS = {"nth": ["nth"], "nodekeeper": ["nk-agent", "nk-controller"]}
try:
    late = open(os.path.join(out, "late")).read().split()
except FileNotFoundError:
    late = []
print(f"\n{what}; {len(runs)} of {n} notices; raw data: {out}")
print(f"notices where NTH or the agent was up less than 2 s before the notice: {len(late)} {late or ''}\n")
print("| | NTH | nodekeeper |")
print("|---|---|---|")
rows = {}
for tool in TOOLS:
    rs = [r["tools"][tool] for r in runs if tool in r["tools"]]
    ok = [t for t in rs if not t["early"]]
    cordon = [t["cordon_s"] for t in ok]
    taint = [t["taint_s"] for t in ok]
    drained = [t["drained_s"] for t in ok]
    left, keys = {}, set()
    for t in rs:
        for k, v in t["left"].items():
            left[k] = left.get(k, 0) + v
        keys.update(t["taint_keys"])
    wl = sum(t["workload_pods"] for t in rs)
    ds, ds_left = sum(t["ds_pods"] for t in rs), sum(t["ds_left"] for t in rs)
    r = rows[tool] = {}
    r["notice → cordon p50 / p99 / max"] = " / ".join(fmt(pct(cordon, p)) for p in (50, 99, 100)) + \
        f" ({sum(c is None for c in cordon)} never)"
    tt = [x for x in taint if x is not None]
    r["notice → taint p50 / p99"] = (" / ".join(fmt(pct(tt, p)) for p in (50, 99)) + f" ({', '.join(sorted(keys))})"
                                    if tt else "no taint (off by default)")
    r["notice → drained (last workload pod deleted) p50 / p99"] = " / ".join(fmt(pct(drained, p)) for p in (50, 99)) + \
        f" ({sum(d is None for d in drained)} not drained in the window)"
    r["workload pods: how they left"] = ", ".join(f"{v} {k}" for k, v in sorted(left.items())) + f" (of {wl})"
    r["DaemonSet pods removed"] = f"{ds_left} of {ds}"
    r["PDB samples below desiredHealthy"] = f"{sum(t['pdb_violating_samples'] for t in rs)} of {sum(r_['pdb_samples'] for r_ in runs)}"
    r["notices discarded (cordon/taint before the notice)"] = str(len(rs) - len(ok))
    for label in TOOLS[tool]:
        ps = [x["procs"][label] for x in runs if label in x["procs"]]
        r[f"peak RSS, p50 / max ({label})"] = " / ".join(fmt(pct([p["rss_peak_mib"] for p in ps], q), " MiB") for q in (50, 100))
        r[f"CPU from notice to drained, p50 / max ({label})"] = " / ".join(
            fmt(pct([p["cpu_s_since_notice"] for p in ps], q)) for q in (50, 100))
    rows[tool]["_cordon_p99"] = pct(cordon, 99)
labels = []
for tool in TOOLS:
    for k in rows[tool]:
        if not k.startswith("_") and k not in labels:
            labels.append(k)
for k in labels:
    print(f"| {k} | {rows['nth'].get(k, '—')} | {rows['nodekeeper'].get(k, '—')} |")
a, b = rows["nth"]["_cordon_p99"], rows["nodekeeper"]["_cordon_p99"]
if a and b is not None:
    print(f"\nnotice → cordon p99: nodekeeper / NTH = {b / a:.2f} (goal ≤ 0.1: {'met' if b <= 0.1 * a else 'not met'})")
