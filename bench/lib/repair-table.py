#!/usr/bin/env python3
"""The table of bench/karpenter-repair.sh: one row per (case, tool) run, from repair-watch.py's JSON.

    repair-table.py OUTDIR CASES K8S_VERSION KARPENTER_VERSION FAULT

CASES as the script takes them ("1 3 3of4"). Per faulted node, "says" is what the tool told the user about it:
the reasons of the Events about the Node (Karpenter's and nodekeeper's) and the NodekeeperHeld condition's
reasons; "held back" names the nodes it explained not repairing. Stdlib only.
"""
import json
import os
import sys

out, cases, k8s, karp, fault = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4], sys.argv[5]
# Events about a Node that explain a repair or a hold (the rest, e.g. the kubelet's, are noise here).
SAYS = {
    "karpenter": ("NodeRepairBlocked", "DisruptionBlocked", "DisruptionLaunching", "DisruptionTerminating",
                  "DisruptionWaitingReadiness", "TerminationGracePeriodExpiring"),
    "nodekeeper": ("RepairStarted", "RepairEscalated", "ReplacementRequested", "RepairShortCircuited",
                   "BlockedByBudget", "BlockedByPDB", "BlockedByKarpenter", "BlockedByDoNotRepair", "HoldReleased"),
}
HELD = {"karpenter": ("NodeRepairBlocked", "DisruptionBlocked"),
        "nodekeeper": ("RepairShortCircuited", "BlockedByBudget", "BlockedByPDB", "BlockedByKarpenter",
                       "BlockedByDoNotRepair")}
LEFT = {"EvictionByEvictionAPI": "evicted (Eviction API)", "DeletionByPodGC": "deleted by PodGC (Node gone)",
        "DeletionByTaintManager": "deleted by the taint manager"}

print(f"\nKarpenter v{karp} (KWOK provider), Kubernetes {k8s}, fault {fault}; raw data: {out}\n")
print("| case | tool | pods of the faulted nodes: how they left | PDB violating samples (worst currentHealthy − "
      "desiredHealthy per PDB) | expiry → replacement Ready, pods Running | max nodes disrupted at once | what it "
      "says about the faulted nodes (Events, NodekeeperHeld) | faulted nodes held back with a reason |")
print("|---|---|---|---|---|---|---|---|")
for case in cases:
    n, _, size = case.partition("of")
    label = f"{n}/{size or 10}"
    for tool in ("karpenter", "nodekeeper"):
        try:
            r = json.load(open(os.path.join(out, f"{tool}-{case}.json")))
        except FileNotFoundError:
            print(f"| {label} | {tool} | (no data) | | | | | |")
            continue
        hows = ", ".join(f"{v} {LEFT.get(k, k)}" for k, v in sorted(r["pods_left_victims"].items())) or "none left"
        viol = sum(r["pdb_violating_samples"].values())
        worst = ", ".join(f"{k} {v:+d}" for k, v in sorted(r["pdb_worst_slack"].items()))
        rep = f'{r["repaired_s"]} s' if r["repaired_s"] is not None else "not within the window"
        said, held = {}, 0
        for node, evs in sorted((r.get("node_events") or {}).items()):
            msgs = evs.get("messages") or {}
            # Karpenter's DisruptionBlocked is about every disruption method; only its repair ones count.
            reasons = {k.split(":", 1)[1] for k in evs if k != "messages" and k.split(":", 1)[1] in SAYS[tool]
                       and (k.split(":", 1)[1] != "DisruptionBlocked" or "repair" in msgs.get("DisruptionBlocked", ""))}
            reasons |= set((r.get("held_reasons") or {}).get(node, []))
            for x in reasons:
                said[x] = said.get(x, 0) + 1
            held += bool(reasons & set(HELD[tool]))
        says = ", ".join(f"{k} ×{v}" for k, v in sorted(said.items())) or "nothing"
        print(f"| {label} | {tool} | {hows} | {viol} of {r['samples']} ({worst}) | {rep} | {r['max_disrupted']} | "
              f"{says} | {held} of {len(r['victims'])} |")
