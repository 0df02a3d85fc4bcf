#!/usr/bin/env python3
"""Requests each caller put on kube-apiserver, from its audit log (bench/npd.sh).

    api-load.py AUDIT_LOG WINDOWS OUT.json KEY=VALUE…

AUDIT_LOG: kube-apiserver's JSON audit log at Metadata level (`scripts/k8s-cluster.sh up DIR --audit`).
WINDOWS: lines `NAME START END` (Unix seconds). KEY=VALUE: npd=<NPD processes>, agents=<nodekeeper agents>,
karpenter=<nodes Karpenter manages>, nodes=<nodes in the cluster> (each but nodes optional, default 0). A request counts in a window when kube-apiserver received it in the window
(`requestReceivedTimestamp`), once (one auditID, whatever its stages); a watch counts once, when opened.

Callers by authenticated user: NPD's ServiceAccount (kube-system:node-problem-detector), nodekeeper's agent
and controller ServiceAccounts, Karpenter's client certificate; everyone else (KWOK playing the kubelets,
kube-controller-manager, kube-scheduler, the harness's admin) is listed as "others".

Per node-hour: NPD = its requests / NPD processes (NPD has no cluster-wide part). nodekeeper = the agents'
requests / agents + the controller's **per-node** requests (every request that is not a list, a watch or a
Lease: Node status patches, TokenReviews of agents' tokens, Events, evictions, …) / agents, plus the
controller's **fixed** part (lists, watches, its leader Lease) / the cluster's nodes — given at the measured
size and at 100 and 1,000 nodes (the fixed part does not grow with nodes, the per-node part does).
Karpenter the same way: its per-node requests / the nodes it manages + its fixed part / the cluster's nodes.
"""
import json
import sys
from collections import Counter, defaultdict
from datetime import datetime

TOOLS = {
    "system:serviceaccount:kube-system:node-problem-detector": "npd",
    "system:serviceaccount:nodekeeper:nodekeeper-agent": "nk-agent",
    "system:serviceaccount:nodekeeper:nodekeeper-controller": "nk-controller",
    "nodekeeper-test-karpenter": "karpenter",
}


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def what(ev):
    o = ev.get("objectRef") or {}
    r = o.get("resource", ev.get("requestURI", "?").split("?")[0])
    if o.get("subresource"):
        r += "/" + o["subresource"]
    return f"{ev['verb']} {r}"


def fixed(ev):
    o = ev.get("objectRef") or {}
    return ev["verb"] in ("list", "watch") or o.get("resource") == "leases"


def main():
    log, windows_file, out = sys.argv[1:4]
    kv = dict(a.split("=", 1) for a in sys.argv[4:])
    n_npd, n_agents, n_nodes = int(kv.get("npd", 0)), int(kv.get("agents", 0)), int(kv["nodes"])
    n_karp = int(kv.get("karpenter", 0))
    windows = []
    with open(windows_file) as f:
        for line in f:
            name, a, b = line.split()
            windows.append((name, float(a), float(b)))
    seen = set()
    counts = {w[0]: defaultdict(Counter) for w in windows}
    split = {w[0]: Counter() for w in windows}
    ksplit = {w[0]: Counter() for w in windows}
    others = {w[0]: Counter() for w in windows}
    agents_ua = {w[0]: Counter() for w in windows}
    with open(log) as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev["auditID"] in seen:
                continue
            t = ts(ev["requestReceivedTimestamp"])
            user = ev["user"].get("username", "?")
            for name, a, b in windows:
                if a <= t < b:
                    seen.add(ev["auditID"])
                    tool = TOOLS.get(user)
                    if tool is None:
                        others[name][user] += 1
                        break
                    counts[name][tool][what(ev)] += 1
                    if tool == "nk-controller":
                        split[name]["fixed" if fixed(ev) else "per_node"] += 1
                    if tool == "karpenter":
                        ksplit[name]["fixed" if fixed(ev) else "per_node"] += 1
                    agents_ua[name][(tool, ev.get("userAgent", "?").split(" ")[0])] += 1
                    break
    res = {"npd": n_npd, "agents": n_agents, "nodes": n_nodes, "windows": {}}
    for name, a, b in windows:
        hours = (b - a) / 3600.0
        c = counts[name]
        tot = {t: sum(v.values()) for t, v in c.items()}
        npd_nh = tot.get("npd", 0) / n_npd / hours if n_npd else None
        agent_nh = tot.get("nk-agent", 0) / n_agents / hours if n_agents else 0.0
        per_node = split[name]["per_node"] / n_agents / hours if n_agents else 0.0
        fixed_h = split[name]["fixed"] / hours
        nk = {str(n): round(agent_nh + per_node + fixed_h / n, 2) for n in (n_nodes, 100, 1000)} if n_agents else None
        karp = None
        if n_karp:
            kp, kf = ksplit[name]["per_node"] / n_karp / hours, ksplit[name]["fixed"] / hours
            karp = {"per_node": round(kp, 2), "fixed_per_hour": round(kf, 1),
                    "at_nodes": {str(n): round(kp + kf / n, 2) for n in (n_nodes, 100, 1000)}}
        res["windows"][name] = {
            "seconds": round(b - a, 1),
            "requests": tot,
            "by_request": {t: dict(v.most_common()) for t, v in c.items()},
            "user_agents": {f"{t} {ua}": n for (t, ua), n in agents_ua[name].items()},
            "controller_split": dict(split[name]),
            "karpenter_split": dict(ksplit[name]),
            "per_node_hour": {
                "npd": round(npd_nh, 2) if npd_nh is not None else None,
                "nk_agent": round(agent_nh, 2),
                "nk_controller_per_node": round(per_node, 2),
                "nk_controller_fixed_per_hour": round(fixed_h, 1),
                "nodekeeper_at_nodes": nk,
                "karpenter": karp,
            },
            "others_top": dict(others[name].most_common(8)),
        }
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    for name, w in res["windows"].items():
        p = w["per_node_hour"]
        print(f"{name} ({w['seconds']:.0f} s): requests {w['requests']}; controller {w['controller_split']}")
        print(f"  per node-hour: NPD {p['npd']}, nodekeeper agent {p['nk_agent']} + controller per-node "
              f"{p['nk_controller_per_node']} + fixed {p['nk_controller_fixed_per_hour']}/h over N nodes "
              f"-> {p['nodekeeper_at_nodes']}; Karpenter {p['karpenter']}")
        for t, v in w["by_request"].items():
            print(f"  {t}: " + ", ".join(f"{k} {n}" for k, n in list(v.items())[:10]))


if __name__ == "__main__":
    main()
