#!/usr/bin/env python3
"""Samples processes' resident memory and CPU from /proc for a while (bench/npd.sh).

    proc-sample.py OUT.json SECONDS GROUP=PID…

Every second: VmRSS of each PID and the 1-minute load average. At the end, per process: peak and mean RSS
(MiB) over the samples, VmHWM (the kernel's own peak since the start), CPU seconds (utime + stime) spent in
the window and the mean millicores; per GROUP the same, each as p50 / max over its processes. A process that
exits is reported with what was sampled until then (and `exited`).
"""
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) / 1024.0
    except OSError:
        return None
    return out


def cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)
    except OSError:
        return None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * len(xs) + 0.5)) - 1))] if xs else None


def main():
    out, secs = sys.argv[1], float(sys.argv[2])
    procs = []
    for a in sys.argv[3:]:
        g, _, p = a.partition("=")
        procs.append({"group": g, "pid": int(p), "rss": [], "hwm": None, "cpu0": cpu(int(p)), "cpu1": None})
    loads = []
    t0 = time.time()
    while time.time() - t0 < secs:
        for p in procs:
            s = status(p["pid"])
            if s is None:
                p["exited"] = True
                continue
            p["rss"].append(s.get("VmRSS", 0.0))
            p["hwm"] = s.get("VmHWM")
            c = cpu(p["pid"])
            if c is not None:
                p["cpu1"] = c
        with open("/proc/loadavg") as f:
            loads.append(float(f.read().split()[0]))
        time.sleep(max(0.0, 1.0 - (time.time() - t0) % 1.0))
    wall = time.time() - t0
    res = {"seconds": round(wall, 1), "load1": {"min": min(loads), "max": max(loads),
                                               "mean": round(sum(loads) / len(loads), 2)}, "groups": {}}
    for p in procs:
        cs = (p["cpu1"] - p["cpu0"]) if p["cpu1"] is not None and p["cpu0"] is not None else None
        p.update({
            "peak_rss_mib": round(max(p["rss"]), 1) if p["rss"] else None,
            "mean_rss_mib": round(sum(p["rss"]) / len(p["rss"]), 1) if p["rss"] else None,
            "hwm_mib": round(p["hwm"], 1) if p["hwm"] else None,
            "cpu_s": round(cs, 2) if cs is not None else None,
            "millicores": round(1000 * cs / wall, 2) if cs is not None else None,
        })
        del p["rss"], p["cpu0"], p["cpu1"], p["hwm"]
        g = res["groups"].setdefault(p["group"], {"procs": []})
        g["procs"].append(p)
    for g in res["groups"].values():
        for k in ("peak_rss_mib", "mean_rss_mib", "hwm_mib", "cpu_s", "millicores"):
            xs = [p[k] for p in g["procs"] if p[k] is not None]
            g[k] = {"p50": pct(xs, 0.5), "max": max(xs) if xs else None, "n": len(xs)}
        if len(g["procs"]) > 5:
            g["procs"] = g["procs"][:5]  # a sample; the group's figures cover all
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
