#!/usr/bin/env python3
"""Watcher for bench/nth.sh: one spot notice, two nodes, seen from the API.

    notice-watch.py DIR NOTICE_T PDBNS OUT.json TIMEOUT PIDFILE TOOL=NODE=PDB …

DIR is a `scripts/k8s-cluster.sh up` directory (admin client certificate, CA, kubeconfig). NOTICE_T is the
instant (epoch seconds) from which both AEMMs serve the spot interruption notice. For each TOOL=NODE=PDB it
watches the Node and every pod on it (all namespaces) and reports, in seconds from NOTICE_T:
  - cordon: the first Node update with spec.unschedulable; taint: the first with a taint that is not
    node.kubernetes.io/* (NTH's aws-node-termination-handler/spot-itn, nodekeeper's nodekeeper.io/interruption);
  - drained: the deletion of the last pod of namespace PDBNS that was on the node (the workload; DaemonSet pods
    are counted apart: ds_left says whether the node's DaemonSet pods were removed);
  - how each workload pod left: its DisruptionTarget condition's reason (EvictionByEvictionAPI = evicted
    through the Eviction API, which honours PDBs; none = a plain DELETE);
  - PDB PDB (namespace PDBNS), sampled every 100 ms: samples with status.currentHealthy < desiredHealthy;
  - early: a cordon or taint seen before NOTICE_T (a run to discard).
PIDFILE lists "LABEL PID" lines (written by the script as processes start; re-read every sample): every 100 ms
the watcher samples each PID's VmRSS and CPU time (/proc/PID/status, /proc/PID/stat) and reports the peak RSS
(MiB) and the CPU seconds used from NOTICE_T to the end of the run.
It stops 1 s after every node is drained (or TIMEOUT s after NOTICE_T) and writes OUT.json. Stdlib only.
"""
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kwatch import Api, cond  # noqa: E402

DIR, NOTICE_T, PDBNS, OUT, TIMEOUT, PIDFILE = sys.argv[1:7]
NOTICE_T, TIMEOUT = float(NOTICE_T), float(TIMEOUT)
TARGETS = {}  # node -> (tool, pdb)
for spec in sys.argv[7:]:
    tool, node, pdb = spec.split("=")
    TARGETS[node] = (tool, pdb)

api = Api(DIR)
get = api.get


lock = threading.Lock()
stop = threading.Event()
nodes = {n: {"cordon": None, "taint": None, "taint_keys": []} for n in TARGETS}
pods = {}  # uid -> {node, ns, name, ds, left (time), how}


def note_node(n, deleted, now):
    name = n["metadata"]["name"]
    if name not in nodes:
        return
    spec = n.get("spec") or {}
    keys = [t["key"] for t in spec.get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]
    with lock:
        s = nodes[name]
        if spec.get("unschedulable") and s["cordon"] is None:
            s["cordon"] = now
        if keys and s["taint"] is None:
            s["taint"], s["taint_keys"] = now, keys


def note_pod(p, deleted, now):
    md, spec = p["metadata"], p.get("spec") or {}
    node = spec.get("nodeName")
    if node not in nodes:
        return
    owners = md.get("ownerReferences") or []
    with lock:
        e = pods.setdefault(md["uid"], {"node": node, "ns": md["namespace"], "name": md["name"],
                                        "ds": any(o.get("kind") == "DaemonSet" for o in owners),
                                        "seen": now, "left": None, "how": None})
        dt = cond(p, "DisruptionTarget")
        if dt.get("status") == "True" and not e["how"]:
            e["how"] = dt.get("reason")
        if deleted and e["left"] is None:
            e["left"] = now


def watch(path, note):
    api.watch(path, note, stop, "notice-watch", 0.2)


threading.Thread(target=watch, args=("/api/v1/nodes", note_node), daemon=True).start()
threading.Thread(target=watch, args=("/api/v1/pods", note_pod), daemon=True).start()

TICK = os.sysconf("SC_CLK_TCK")
procs = {}  # label -> {pid, rss_peak_kib, cpu_at_notice, cpu_last}


def sample_procs(now):
    try:
        lines = open(PIDFILE).read().split("\n")
    except FileNotFoundError:
        lines = []
    for line in lines:
        if not line.strip():
            continue
        label, pid = line.split()
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            cpu = (int(st[11]) + int(st[12])) / TICK
        except (FileNotFoundError, ProcessLookupError, StopIteration, IndexError):
            continue
        p = procs.setdefault(label, {"pid": int(pid), "rss_peak_kib": 0, "cpu_at_notice": None, "cpu_last": cpu,
                                     "cpu_total": cpu})
        p["rss_peak_kib"] = max(p["rss_peak_kib"], rss)
        if now >= NOTICE_T and p["cpu_at_notice"] is None:
            p["cpu_at_notice"] = p["cpu_last"]
        p["cpu_last"] = cpu
        p["cpu_total"] = cpu


def drained(node):
    w = [e for e in pods.values() if e["node"] == node and e["ns"] == PDBNS]
    return w and all(e["left"] for e in w)


pdb_viol = {pdb: 0 for _, pdb in TARGETS.values()}
pdb_samples = 0
done_at = None
while True:
    now = time.time()
    sample_procs(now)
    if now >= NOTICE_T:
        pdb_samples += 1
        try:
            for item in get(f"/apis/policy/v1/namespaces/{PDBNS}/poddisruptionbudgets", timeout=5)["items"]:
                name, st = item["metadata"]["name"], item.get("status") or {}
                if name in pdb_viol and st.get("currentHealthy", 0) < st.get("desiredHealthy", 0):
                    pdb_viol[name] += 1
        except Exception as e:
            print(f"notice-watch: PDB sample: {e}", file=sys.stderr)
        with lock:
            all_done = all(drained(n) for n in nodes)
        if all_done and done_at is None:
            done_at = now
        if (done_at is not None and now - done_at >= 1.0) or now - NOTICE_T >= TIMEOUT:
            break
    time.sleep(0.1)
stop.set()


def rel(t):
    return None if t is None else round(t - NOTICE_T, 3)


out = {"notice_t": NOTICE_T, "pdb_samples": pdb_samples, "tools": {}, "procs": {}}
with lock:
    for node, (tool, pdb) in TARGETS.items():
        s = nodes[node]
        w = [e for e in pods.values() if e["node"] == node and e["ns"] == PDBNS]
        ds = [e for e in pods.values() if e["node"] == node and e["ds"]]
        hows = {}
        for e in w:
            if e["left"]:
                k = e["how"] or "none (plain delete)"
                hows[k] = hows.get(k, 0) + 1
        out["tools"][tool] = {
            "node": node, "cordon_s": rel(s["cordon"]), "taint_s": rel(s["taint"]), "taint_keys": s["taint_keys"],
            "drained_s": rel(max(e["left"] for e in w)) if w and all(e["left"] for e in w) else None,
            "workload_pods": len(w), "left": hows, "ds_pods": len(ds), "ds_left": sum(1 for e in ds if e["left"]),
            "pdb": pdb, "pdb_violating_samples": pdb_viol[pdb],
            "early": any(t is not None and t < NOTICE_T for t in (s["cordon"], s["taint"])),
        }
for label, p in procs.items():
    out["procs"][label] = {"rss_peak_mib": round(p["rss_peak_kib"] / 1024, 1),
                           "cpu_s_since_notice": round(p["cpu_last"] - (p["cpu_at_notice"] or p["cpu_last"]), 3),
                           "cpu_s_total": round(p["cpu_total"], 3)}
with open(OUT, "w") as f:
    json.dump(out, f, indent=1)
