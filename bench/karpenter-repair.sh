#!/usr/bin/env bash
# Node repair side by side on the real control plane with Karpenter's KWOK provider (v1.14.1): Karpenter's
# own NodeRepair vs nodekeeper's controller. Figures go to bench/results/ and docs/comparison.md.
#   bench/karpenter-repair.sh [FAULTS]      (default "1 3": nodes of 10 made NotReady per run)
#   BENCH_PROFILE=release …                          (default debug: target/debug/nodekeeper)
#   TOOLS=karpenter …                                (default "karpenter nodekeeper")
# Each (tool, fault) pair runs on a fresh cluster (`scripts/k8s-cluster.sh up DIR --karpenter` … `down DIR`):
#   karpenter:  Karpenter started with FEATURE_GATES=NodeRepair=true (k8s-cluster.sh --karpenter-feature-gates);
#               nodekeeper's controller not running.
#   nodekeeper: Karpenter's defaults (NodeRepair off); nodekeeper's controller as its ServiceAccount with the
#               shipped config (repair Ready=False for 10m, drain → replace, max_unhealthy 20 %, budget one
#               node per NodePool), provider `karpenter`, dry_run off.
# Shape (both): nodekeeper's manifests installed; one NodePool (on-demand, WhenEmpty after 30s, budget 100 %);
# Deployment big: 10 × 1500m with required anti-affinity by hostname (→ Karpenter launches 10 nodes), PDB
# maxUnavailable 1; Deployment small: 10 × 100m, PDB minAvailable 80 %.
# Fault: the label nodekeeper.test/kubelet=not-ready (KWOK stops re-initialising the node) and Ready=False with
# lastTransitionTime backdated so that both tools' 10-minute tolerations (Karpenter's KWOK RepairPolicies,
# nodekeeper's shipped policy; both count from lastTransitionTime) run out LEAD s (default 5) after the fault:
# every faulted node is NotReady in both tools' caches before either may act (with LEAD=0 the first node's
# repair can start before the others are seen, and its replacement lowers the unhealthy ratio below 20 %:
# the 20 % guard of both tools is then raced, see bench/results/2026-12-02-karpenter-repair-raced.md).
# Times are from that expiry.
# Measured by bench/lib/repair-watch.py from the API (pod and Node watches + 200 ms samples): how the pods of
# the faulted nodes left (their DisruptionTarget condition: EvictionByEvictionAPI = evicted, DeletionByPodGC =
# deleted by the pod GC after their Node went, none = a plain delete), PDB samples with currentHealthy <
# desiredHealthy, seconds from the tolerations' expiry to a new Ready node of the pool with every app pod Running
# and Ready on a Ready, non-faulted node, and the most pool nodes cordoned / tainted karpenter.sh/disrupted /
# deleting at once. A run stops 20 s after that, or after WINDOW s (300; WINDOW_BLOCKED, 120, for more than 2
# faulted nodes, which both tools' 20 % guards hold). The script also needs openssl and python3.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
FAULTS=${1:-"1 3"}
PROFILE=${BENCH_PROFILE:-debug}
WINDOW=${WINDOW:-300}
WINDOW_BLOCKED=${WINDOW_BLOCKED:-120}
LEAD=${LEAD:-5}
log "kubectl, control plane + Karpenter KWOK binaries (scripts/setup-k8s.sh: built once, then cached)"
setup_real  # kubectl, the control plane, versions.env (bench/lib/bench.sh)
TOOLS=${TOOLS:-"karpenter nodekeeper"}
NK="$REPO/target/$PROFILE/nodekeeper"
if [[ " $TOOLS " == *" nodekeeper "* ]]; then build_nk "$PROFILE"; fi
OUTDIR=$(mktemp -d /tmp/nodekeeper-bench-karpenter-repair.XXXX)
DIR="" EXPIRY=""
# end_run: the run's processes (the controller, the watcher) stopped, then its cluster; also on exit.
end_run() {
  stop_tracked "${TRACKED[@]}"
  [ -z "$DIR" ] || "$REPO/scripts/k8s-cluster.sh" down "$DIR"
  DIR=""
}
at_exit end_run
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

shape() {
  k apply -f "$REPO/tests/fixtures/karpenter/kwoknodeclass.yaml" >/dev/null
  k apply -f - >/dev/null <<'EOF'
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: bench}
spec:
  template:
    spec:
      requirements:
        - {key: kubernetes.io/arch, operator: In, values: ["amd64"]}
        - {key: kubernetes.io/os, operator: In, values: ["linux"]}
        - {key: karpenter.sh/capacity-type, operator: In, values: ["on-demand"]}
      nodeClassRef: {group: karpenter.kwok.sh, kind: KWOKNodeClass, name: default}
      expireAfter: Never
  limits: {cpu: "1000"}
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 30s
    budgets: [{nodes: "100%"}]
---
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: big, namespace: bench}
spec:
  replicas: 10
  selector: {matchLabels: {app: big}}
  template:
    metadata: {labels: {app: big}}
    spec:
      terminationGracePeriodSeconds: 5
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: big}}}
      containers: [{name: app, image: registry.invalid/app:1, resources: {requests: {cpu: 1500m, memory: 512Mi}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: big, namespace: bench}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: big}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: small, namespace: bench}
spec:
  replicas: 10
  selector: {matchLabels: {app: small}}
  template:
    metadata: {labels: {app: small}}
    spec:
      terminationGracePeriodSeconds: 5
      containers: [{name: app, image: registry.invalid/app:1, resources: {requests: {cpu: 100m, memory: 128Mi}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: small, namespace: bench}
spec: {minAvailable: "80%", selector: {matchLabels: {app: small}}}
EOF
}

# wait_for SECS WHAT CMD…: until CMD succeeds.
pool_nodes() { k get nodes -l karpenter.sh/nodepool=bench -o name | sed 's|node/||'; }
settled() {
  [ "$(k get nodes -l karpenter.sh/nodepool=bench --no-headers 2>/dev/null | grep -c ' Ready ')" -ge 10 ] &&
    [ "$(k -n bench get pods --field-selector status.phase=Running --no-headers 2>/dev/null | grep -c ' 1/1 ')" -ge 20 ] &&
    [ "$(k get pdb -n bench -o jsonpath='{range .items[*]}{.status.currentHealthy}{" "}{end}')" = "10 10 " ]
}
seen_ready() {
  local n
  for n in $(pool_nodes); do
    [ -n "$(k get node "$n" -o jsonpath='{.metadata.annotations.nodekeeper\.io/seen-ready}')" ] || return 1
  done
}

start_nodekeeper() {
  loopback_tls "$DIR/nk-tls"
  token_kubeconfig "$DIR" "$(k -n nodekeeper create token nodekeeper-controller --duration=2h)" "$DIR/nk.kubeconfig"
  # The shipped config run here (bench/lib/bench.sh: loopback, these TLS files, acting), with provider karpenter.
  shipped_controller_config 127.0.0.1:0 "$DIR/nk-tls" |
    sed -e 's|^\[repair\]$|[controller.provider]\nkind = "karpenter"\n\n[repair]|' >"$DIR/nk-controller.toml"
  KUBECONFIG="$DIR/nk.kubeconfig" NODEKEEPER_LOG_FORMAT=json NODEKEEPER_LOG_LEVEL=info \
    "$NK" controller --config "$DIR/nk-controller.toml" >"$DIR/logs/nodekeeper-controller.log" 2>&1 &
  track $!
}

# run TOOL N: one fresh cluster, N of 10 nodes faulted; the watcher's JSON in $OUTDIR/TOOL-N.json.
run() {
  local tool=$1 n=$2 gates=() victims window
  [ "$tool" = karpenter ] && gates=(--karpenter-feature-gates NodeRepair=true)
  DIR=$(mktemp -d /tmp/nodekeeper-bench-karp-"$tool-$n".XXXX)
  log "$tool, $n of 10 NotReady: cluster $DIR"
  "$REPO/scripts/k8s-cluster.sh" up "$DIR" --owner-pid $$ --karpenter "${gates[@]}"
  "$REPO/scripts/k8s-cluster.sh" install "$DIR" >"$DIR/logs/install.log"
  [ -n "$K8S_VERSION" ] || K8S_VERSION=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
  shape
  wait_for 300 "10 nodes Ready and 20 pods Running" settled
  if [ "$tool" = nodekeeper ]; then
    start_nodekeeper
    wait_for 60 "every pool node seen ready by nodekeeper" seen_ready
  fi
  sleep 5
  victims=$(pool_nodes | head -n "$n" | tr '\n' ' ')
  window=$WINDOW; [ "$n" -le 2 ] || window=$WINDOW_BLOCKED
  python3 "$REPO/bench/lib/repair-watch.py" "$DIR" bench bench "$DIR/fault" "$window" "$OUTDIR/$tool-$n.json" \
    2>"$DIR/logs/repair-watch.log" &
  WATCH_PID=$!
  track "$WATCH_PID"
  sleep 2
  # The fault time: just before the status patches (the label alone changes nothing for either tool).
  # shellcheck disable=SC2086 # node names
  k label node $victims nodekeeper.test/kubelet=not-ready >/dev/null
  EXPIRY=$(( $(date +%s) + LEAD ))
  printf '%s\n%s\n%s\n' "$(date +%s.%N)" "$victims" "$EXPIRY" >"$DIR/fault.tmp" && mv "$DIR/fault.tmp" "$DIR/fault"
  # shellcheck disable=SC2086 # node names
  not_ready "$EXPIRY" $victims  # (bench/lib/bench.sh)
  wait "$WATCH_PID" || true; forget "$WATCH_PID"
  k get events -A -o json >"$OUTDIR/$tool-$n.events.json" || true
  cp -r "$DIR/logs" "$OUTDIR/$tool-$n.logs"
  end_run
}

K8S_VERSION=""
for n in $FAULTS; do
  for tool in $TOOLS; do run "$tool" "$n"; done
done

# The table: one row per run.
python3 - "$OUTDIR" "$FAULTS" "$K8S_VERSION" <<'EOF'
import json, sys, os
out, faults, ver = sys.argv[1], sys.argv[2].split(), sys.argv[3]
print(f"\nKarpenter v1.14.1 (KWOK provider), Kubernetes {ver}; raw data: {out}\n")
print("| fault | tool | pods of the faulted nodes: how they left | PDB violating samples (worst currentHealthy − desiredHealthy per PDB) | tolerations' expiry → replacement Ready, pods Running | max nodes disrupted at once | repair blocked |")
print("|---|---|---|---|---|---|---|")
for n in faults:
    for tool in ("karpenter", "nodekeeper"):
        try:
            r = json.load(open(os.path.join(out, f"{tool}-{n}.json")))
        except FileNotFoundError:
            print(f"| {n}/10 | {tool} | (no data) | | | | |"); continue
        ev = json.load(open(os.path.join(out, f"{tool}-{n}.events.json")))["items"]
        blocked = sum(1 for e in ev if e["reason"] == "NodeRepairBlocked" or "short-circuit" in (e.get("message") or ""))
        ctl_log = os.path.join(out, f"{tool}-{n}.logs", "nodekeeper-controller.log")
        if os.path.exists(ctl_log):
            blocked += sum(1 for l in open(ctl_log, errors="replace") if "short-circuit" in l)
        label = {"EvictionByEvictionAPI": "evicted (Eviction API)", "DeletionByPodGC": "deleted by PodGC (Node gone)",
                 "DeletionByTaintManager": "deleted by the taint manager"}
        hows = ", ".join(f"{v} {label.get(k, k)}" for k, v in sorted(r["pods_left_victims"].items())) or "none left"
        viol = sum(r["pdb_violating_samples"].values())
        worst = ", ".join(f"{k} {v:+d}" for k, v in sorted(r["pdb_worst_slack"].items()))
        rep = f'{r["repaired_s"]} s' if r["repaired_s"] is not None else f"not within the window"
        print(f"| {n}/10 | {tool} | {hows} | {viol} of {r['samples']} ({worst}) | {rep} | {r['max_disrupted']} | {'yes (' + str(blocked) + ' events / log lines)' if blocked else 'no'} |")
EOF
