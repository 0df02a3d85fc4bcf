#!/usr/bin/env python3
"""Watcher for bench/karpenter-repair.sh: observes a repair on the real control plane from the API.

    repair-watch.py DIR NS POOL FAULTFILE TIMEOUT OUT.json

DIR is a `scripts/k8s-cluster.sh up` directory (admin client certificate, CA, kubeconfig). It watches the
pods of namespace NS (every update: how each pod left — the DisruptionTarget condition the API server
puts on a pod evicted through the Eviction API, `EvictionByEvictionAPI`, or none for a plain delete such
as Karpenter's forced one) and samples every 200 ms the nodes of NodePool POOL and the PDBs of NS.
FAULTFILE appears when the script injects the fault: line 1 the fault time (epoch seconds), line 2 the
faulted nodes, line 3 when the tolerations run out (epoch seconds; "repaired" is reported from then). From then on it measures:
  - PDB violations: samples in which a PDB has status.currentHealthy < status.desiredHealthy (counted
    per PDB and sample; the worst shortfall is kept too);
  - max nodes disrupted at once: from a Node watch, each pool node's span from the first update that shows
    it cordoned, tainted karpenter.sh/disrupted or deleting (or its deletion) to its deletion; the most
    overlapping spans (the 200 ms samples miss a node deleted within a sample, as Karpenter does on KWOK);
  - what each tool says about each faulted node: the Events about it (by source and reason, with one
    message per reason) and the NodekeeperHeld condition reasons seen True on it;
  - repaired: the first sample with a node of the pool created after the fault and Ready, and every pod
    of NS that a Deployment wants Running and Ready on a Ready node that is not a faulted one.
It stops 20 s after "repaired", or TIMEOUT s after the tolerations' expiry, and writes OUT.json. Stdlib only.
"""
import json
import os
import sys
import threading
import time
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kwatch import Api, cond  # noqa: E402

DIR, NS, POOL, FAULTFILE, TIMEOUT, OUT = sys.argv[1:7]
TIMEOUT = float(TIMEOUT)

api = Api(DIR)
get = api.get


def ts(s):
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=__import__("datetime").timezone.utc).timestamp()


lock = threading.Lock()
pods_left = {}  # uid -> {name, node, how, t}
stop = threading.Event()


def note_pod(p, deleted, now):
    md = p["metadata"]
    if not (md.get("deletionTimestamp") or deleted):
        return
    uid = md["uid"]
    dt = cond(p, "DisruptionTarget")
    with lock:
        e = pods_left.setdefault(uid, {"name": md["name"], "node": (p.get("spec") or {}).get("nodeName"),
                                       "t": now, "how": None, "grace": md.get("deletionGracePeriodSeconds")})
        if dt.get("status") == "True" and not e["how"]:
            e["how"] = dt.get("reason")


node_spans = {}  # node -> [first seen disrupted (cordoned, tainted karpenter.sh/disrupted, deleting), gone]
held = {}  # node -> the NodekeeperHeld reasons seen True on it (nodekeeper's "why is this node held")


def note_node(n, deleted, now):
    md, spec = n["metadata"], n.get("spec") or {}
    if (md.get("labels") or {}).get("karpenter.sh/nodepool") != POOL:
        return
    taints = {t["key"] for t in spec.get("taints") or []}
    name = md["name"]
    h = cond(n, "NodekeeperHeld")
    with lock:
        if h.get("status") == "True":
            held.setdefault(name, set()).add(h.get("reason"))
        if (spec.get("unschedulable") or "karpenter.sh/disrupted" in taints or md.get("deletionTimestamp")
                or deleted):
            node_spans.setdefault(name, [now, None])
        if deleted and name in node_spans:
            node_spans[name][1] = now


def watch(path, note):
    api.watch(path, note, stop, "repair-watch", 0.5)


threading.Thread(target=watch, args=(f"/api/v1/namespaces/{NS}/pods", note_pod), daemon=True).start()
threading.Thread(target=watch, args=("/api/v1/nodes", note_node), daemon=True).start()

fault_t, victims, expiry_t = None, set(), None
samples = 0
viol = {}          # pdb -> violating samples after the fault
# pdb -> samples below both 0 and what the fault alone would leave if the faulted nodes' pods counted unhealthy
# (KWOK keeps them Ready, so the PDBs count them healthy: informational, the table uses the plain violations)
beyond = {}
fault_only, prev_pdbs, prev_pods = None, [], []
worst = {}         # pdb -> worst (currentHealthy - desiredHealthy) after the fault
max_disrupted, max_disrupted_names = 0, []
repaired_t = None
new_nodes = set()
started = time.time()
while True:
    now = time.time()
    if fault_t is None and os.path.exists(FAULTFILE):
        with open(FAULTFILE) as f:
            ls = f.read().split("\n")
        if len(ls) >= 3 and ls[2].strip():
            fault_t, victims, expiry_t = float(ls[0]), set(ls[1].split()), float(ls[2])
    try:
        nodes = get(f"/api/v1/nodes?labelSelector=karpenter.sh/nodepool%3D{POOL}")["items"]
        pdbs = get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets")["items"]
        pods = get(f"/api/v1/namespaces/{NS}/pods")["items"]
        deps = get(f"/apis/apps/v1/namespaces/{NS}/deployments")["items"]
    except Exception as e:
        print(f"repair-watch: {e}", file=sys.stderr)
        time.sleep(0.2)
        continue
    if fault_t is not None and fault_only is None:
        fault_only = {}
        for b in prev_pdbs:
            sel = b["spec"]["selector"].get("matchLabels") or {}
            on = sum(1 for p in prev_pods if (p.get("spec") or {}).get("nodeName") in victims
                     and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items()))
            st = b.get("status") or {}
            fault_only[b["metadata"]["name"]] = st.get("currentHealthy", 0) - on - st.get("desiredHealthy", 0)
    if fault_t is None:
        prev_pdbs, prev_pods = pdbs, pods
    if fault_t is not None:
        samples += 1
        for b in pdbs:
            st = b.get("status") or {}
            name = b["metadata"]["name"]
            slack = st.get("currentHealthy", 0) - st.get("desiredHealthy", 0)
            worst[name] = min(worst.get(name, slack), slack)
            if slack < 0:
                viol[name] = viol.get(name, 0) + 1
            if slack < min(0, fault_only.get(name, 0)):
                beyond[name] = beyond.get(name, 0) + 1
        disrupted = []
        ready_nodes = set()
        for n in nodes:
            md, spec = n["metadata"], n.get("spec") or {}
            taints = {t["key"] for t in spec.get("taints") or []}
            if spec.get("unschedulable") or "karpenter.sh/disrupted" in taints or md.get("deletionTimestamp"):
                disrupted.append(md["name"])
            if cond(n, "Ready").get("status") == "True" and not md.get("deletionTimestamp"):
                ready_nodes.add(md["name"])
            if ts(md["creationTimestamp"]) >= int(fault_t):
                new_nodes.add(md["name"])
        if len(disrupted) > max_disrupted:
            max_disrupted, max_disrupted_names = len(disrupted), sorted(disrupted)
        want = sum((d.get("spec") or {}).get("replicas", 0) for d in deps)
        good = 0
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if (not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running"
                    and cond(p, "Ready").get("status") == "True" and node in ready_nodes and node not in victims):
                good += 1
        if repaired_t is None and good >= want and any(n in ready_nodes for n in new_nodes):
            repaired_t = now
        if (repaired_t is not None and now - repaired_t > 20) or now - expiry_t > TIMEOUT:
            break
    elif now - started > 600:
        break
    time.sleep(max(0.0, 0.2 - (time.time() - now)))

stop.set()
with lock:
    left = [e for e in pods_left.values() if e["node"] in victims and e["t"] >= (fault_t or 0)]
end_t = time.time()
with lock:
    spans = {k: [v[0] - (fault_t or 0), None if v[1] is None else v[1] - (fault_t or 0)] for k, v in node_spans.items()}
    pts = sorted([(v[0], 1) for v in node_spans.values()] + [(v[1], -1) for v in node_spans.values() if v[1] is not None],
                 key=lambda x: (x[0], x[1]))
max_overlap = cur = 0
for _, d in pts:
    cur += d
    max_overlap = max(max_overlap, cur)
hows = {}
for e in left:
    k = e["how"] or "deleted (no DisruptionTarget)"
    hows[k] = hows.get(k, 0) + 1
events = {}
try:
    for ev in get(f"/api/v1/namespaces/{NS}/events")["items"]:
        if ev["involvedObject"].get("kind") == "Pod":
            k = f'{ev.get("reportingComponent") or (ev.get("source") or {}).get("component") or "?"}:{ev["reason"]}'
            events[k] = events.get(k, 0) + ev.get("count", 1)
except Exception as e:
    print(f"repair-watch: events: {e}", file=sys.stderr)
# What each tool said about each faulted node: the Events about it (any namespace), by source and reason.
node_events = {v: {} for v in victims}
try:
    for ev in get("/api/v1/events")["items"]:
        io = ev["involvedObject"]
        if io.get("kind") == "Node" and io.get("name") in node_events:
            src = ev.get("reportingComponent") or (ev.get("source") or {}).get("component") or "?"
            k = f'{src}:{ev["reason"]}'
            d = node_events[io["name"]]
            d[k] = d.get(k, 0) + (ev.get("count") or 1)
            d.setdefault("messages", {}).setdefault(ev["reason"], ev.get("message") or ev.get("note") or "")
except Exception as e:
    print(f"repair-watch: node events: {e}", file=sys.stderr)
out = {
    "node_events": node_events,
    "held_reasons": {k: sorted(v) for k, v in held.items() if k in victims},
    "fault_t": fault_t, "victims": sorted(victims), "samples": samples,
    "expiry_t": expiry_t,
    "repaired_s": None if repaired_t is None or fault_t is None else round(repaired_t - expiry_t, 1),
    "pdb_violating_samples": viol, "pdb_worst_slack": worst,
    "pdb_fault_only_slack": fault_only, "pdb_samples_beyond_fault": beyond,
    "max_disrupted_sampled": max_disrupted, "max_disrupted_nodes_sampled": max_disrupted_names,
    "max_disrupted": max_overlap, "node_spans": spans,
    "new_nodes": sorted(new_nodes),
    "pods_left_victims": hows, "pod_events": events,
    "pods_left_detail": sorted(left, key=lambda e: e["t"]),
}
with open(OUT, "w") as f:
    json.dump(out, f, indent=1)
