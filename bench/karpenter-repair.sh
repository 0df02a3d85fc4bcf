#!/usr/bin/env bash
# Node repair side by side on the real control plane with Karpenter's KWOK provider (v1.15.0, tools/k8s/versions.env):
# Karpenter's own NodeRepair (graceful since v1.15: a disruption method that pre-spins the replacement, counts against
# the NodePool's `Unhealthy` budget and drains under the policy's termination grace period) vs nodekeeper's
# controller. Figures go to bench/results/ and docs/comparison.md (the v1.14.1 runs: bench/results/2026-12-02-*).
#   bench/karpenter-repair.sh [CASES]   (default "1 3 3of4": N of 10 nodes faulted, or N of M ("3of4": the
#                                        correlated case, 3 nodes of a 4-node NodePool, Karpenter #2739))
#   FAULT=ready …                       (default kwok-unhealthy: the KWOK provider's KWOKUnhealthy=True, a
#                                        node-monitoring agent's fault while Ready stays True, whose policy drains:
#                                        30 s, TGP 45 s; ready: Ready=False as in the v1.14 table, whose KWOK
#                                        policy is 10 min with TGP 0 — see "Fault" below for why it takes 10 min)
#   BENCH_PROFILE=release …             (default debug: target/debug/nodekeeper)
#   TOOLS=karpenter …                   (default "karpenter nodekeeper")
# Each (case, tool) pair runs on a fresh cluster (`scripts/k8s-cluster.sh up DIR --karpenter` … `down DIR`):
#   karpenter:  Karpenter started with FEATURE_GATES=NodeRepair=true (k8s-cluster.sh --karpenter-feature-gates);
#               nodekeeper's controller not running.
#   nodekeeper: Karpenter's defaults (NodeRepair off); nodekeeper's controller as its ServiceAccount with the
#               shipped config (repair Ready=False for 10m, drain → replace, max_unhealthy 20 %, budget one
#               node per NodePool), provider `karpenter`, dry_run off; FAULT=kwok-unhealthy adds the policy
#               KWOKUnhealthy=True for 30s (Karpenter's KWOK toleration for it).
# Shape (both): nodekeeper's manifests installed; one NodePool (on-demand, WhenEmpty after 30s, budget 100 %);
# Deployment big: M × 1500m (M = 10, or 4 for "3of4") with required anti-affinity by hostname (→ Karpenter
# launches M nodes), PDB maxUnavailable 1; Deployment small: 10 × 100m, PDB minAvailable 80 %.
# Fault: the label nodekeeper.test/kubelet=not-ready (KWOK stops re-initialising the node) and the condition with
# lastTransitionTime backdated so that both tools' tolerations (Karpenter's KWOK RepairPolicies: Ready=False 10m,
# KWOKUnhealthy 30s; nodekeeper's the same; both count from lastTransitionTime) run out LEAD s (default 5) after
# the fault: every faulted node is unhealthy in both tools' caches before either may act (with LEAD=0 the first
# node's repair can start before the others are seen, and its replacement lowers the unhealthy ratio below 20 %:
# the 20 % guard of both tools is then raced, see bench/results/2026-12-02-karpenter-repair-raced.md).
# v1.15 clamps a condition's lastTransitionTime to the Node's creation (pkg/controllers/node/health/policy.go,
# Match: "A condition cannot predate its Node"), so the expiry is also no earlier than the newest pool node's
# creation plus the toleration: with FAULT=ready (10 min) a run first waits for its nodes to be 10 min old.
# Times are from that expiry.
# Measured by bench/lib/repair-watch.py from the API (pod and Node watches + 200 ms samples): how the pods of
# the faulted nodes left (their DisruptionTarget condition: EvictionByEvictionAPI = evicted, DeletionByPodGC =
# deleted by the pod GC after their Node went, none = a plain delete), PDB samples with currentHealthy <
# desiredHealthy, seconds from the tolerations' expiry to a new Ready node of the pool with every app pod Running
# and Ready on a Ready, non-faulted node, the most pool nodes cordoned / tainted karpenter.sh/disrupted /
# deleting at once, and what each tool says about each faulted node (the Events about it, and the
# NodekeeperHeld condition's reasons seen on it). A run stops 20 s after that, or after WINDOW s (300;
# WINDOW_BLOCKED, 120, for more than 20 % of the pool faulted, which both tools' 20 % guards hold). The script
# also needs openssl and python3.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
CASES=${1:-"1 3 3of4"}
FAULT=${FAULT:-kwok-unhealthy}
case $FAULT in ready|kwok-unhealthy) ;; *) die "FAULT is ready or kwok-unhealthy, not $FAULT" ;; esac
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
# The machine's load through the runs (other builds share it): epoch seconds and the 1/5/15-min load averages,
# every 10 s, in $OUTDIR/load.txt.
( while :; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 10; done ) >"$OUTDIR/load.txt" &
LOAD_PID=$!
at_exit kill "$LOAD_PID"
DIR="" EXPIRY=""
# end_run: the run's processes (the controller, the watcher) stopped, then its cluster; also on exit.
end_run() {
  stop_tracked "${TRACKED[@]}"
  [ -z "$DIR" ] || "$REPO/scripts/k8s-cluster.sh" down "$DIR"
  DIR=""
}
at_exit end_run
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

# shape M: the NodePool and the apps (big: M replicas, one per node).
shape() {
  k apply -f "$REPO/tests/fixtures/karpenter/kwoknodeclass.yaml" >/dev/null
  k apply -f - >/dev/null <<EOF
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
  replicas: $1
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
# settled M: M nodes Ready, every pod Running, both PDBs whole.
settled() {
  [ "$(k get nodes -l karpenter.sh/nodepool=bench --no-headers 2>/dev/null | grep -c ' Ready ')" -ge "$1" ] &&
    [ "$(k -n bench get pods --field-selector status.phase=Running --no-headers 2>/dev/null | grep -c ' 1/1 ')" -ge $(( $1 + 10 )) ] &&
    [ "$(k get pdb -n bench -o jsonpath='{range .items[*]}{.status.currentHealthy}{" "}{end}')" = "$1 10 " ]
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
  if [ "$FAULT" = kwok-unhealthy ]; then
    printf '\n[[repair.policy]]\ncondition_type = "KWOKUnhealthy"\ncondition_status = "True"\ntoleration = "30s"\nallow_destructive = true\n' \
      >>"$DIR/nk-controller.toml"
  fi
  KUBECONFIG="$DIR/nk.kubeconfig" NODEKEEPER_LOG_FORMAT=json NODEKEEPER_LOG_LEVEL=info \
    "$NK" controller --config "$DIR/nk-controller.toml" >"$DIR/logs/nodekeeper-controller.log" 2>&1 &
  track $!
}

# run TOOL CASE: one fresh cluster, CASE ("N": N of 10 nodes faulted; "NofM": N of M); the watcher's JSON in
# $OUTDIR/TOOL-CASE.json.
run() {
  local tool=$1 case=$2 n size gates=() victims window newest toleration=30
  [ "$FAULT" = kwok-unhealthy ] || toleration=600
  n=${case%%of*}; size=10; [ "$case" = "$n" ] || size=${case##*of}
  [ "$tool" = karpenter ] && gates=(--karpenter-feature-gates NodeRepair=true)
  DIR=$(mktemp -d /tmp/nodekeeper-bench-karp-"$tool-$case".XXXX)
  log "$tool, $n of $size faulted ($FAULT): cluster $DIR"
  "$REPO/scripts/k8s-cluster.sh" up "$DIR" --owner-pid $$ --karpenter "${gates[@]}"
  "$REPO/scripts/k8s-cluster.sh" install "$DIR" >"$DIR/logs/install.log"
  [ -n "$K8S_VERSION" ] || K8S_VERSION=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
  shape "$size"
  wait_for 300 "$size nodes Ready and $(( size + 10 )) pods Running" settled "$size"
  if [ "$tool" = nodekeeper ]; then
    start_nodekeeper
    wait_for 60 "every pool node seen ready by nodekeeper" seen_ready
  fi
  sleep 5
  victims=$(pool_nodes | head -n "$n" | tr '\n' ' ')
  window=$WINDOW; [ $(( n * 5 )) -le "$size" ] || window=$WINDOW_BLOCKED
  python3 "$REPO/bench/lib/repair-watch.py" "$DIR" bench bench "$DIR/fault" "$window" "$OUTDIR/$tool-$case.json" \
    2>"$DIR/logs/repair-watch.log" &
  WATCH_PID=$!
  track "$WATCH_PID"
  sleep 2
  # The fault time: just before the status patches (the label alone changes nothing for either tool).
  # shellcheck disable=SC2086 # node names
  k label node $victims nodekeeper.test/kubelet=not-ready >/dev/null
  EXPIRY=$(( $(date +%s) + LEAD ))
  newest=$(k get nodes -l karpenter.sh/nodepool=bench -o jsonpath='{range .items[*]}{.metadata.creationTimestamp}{"\n"}{end}' |
    sort | tail -1)
  newest=$(( $(date -d "$newest" +%s) + toleration + 1 ))
  [ "$EXPIRY" -ge "$newest" ] || EXPIRY=$newest
  printf '%s\n%s\n%s\n' "$(date +%s.%N)" "$victims" "$EXPIRY" >"$DIR/fault.tmp" && mv "$DIR/fault.tmp" "$DIR/fault"
  if [ "$FAULT" = ready ]; then
    # shellcheck disable=SC2086 # node names
    not_ready "$EXPIRY" $victims  # (bench/lib/bench.sh)
  else
    # shellcheck disable=SC2086 # node names
    node_condition "$EXPIRY" 30 KWOKUnhealthy True SimulatedFault "bench fault" $victims  # (bench/lib/bench.sh)
  fi
  wait "$WATCH_PID" || true; forget "$WATCH_PID"
  k get events -A -o json >"$OUTDIR/$tool-$case.events.json" || true
  cp -r "$DIR/logs" "$OUTDIR/$tool-$case.logs"
  end_run
}

K8S_VERSION=""
for case in $CASES; do
  for tool in $TOOLS; do run "$tool" "$case"; done
done

# The table: one row per run.
python3 "$REPO/bench/lib/repair-table.py" "$OUTDIR" "$CASES" "$K8S_VERSION" "$KARPENTER_VERSION" "$FAULT"
