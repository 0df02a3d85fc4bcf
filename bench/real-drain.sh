#!/usr/bin/env bash
# Drain of a 110-pod KWOK node on the real control plane: `nodekeeper drain` vs the real
# `kubectl drain --ignore-daemonsets --delete-emptydir-data`, each on its own identical node, in one run,
# both as one operator ServiceAccount (the drain role of docs/drain.md). Figures go to docs/dev/benchmarks.md.
#   bench/real-drain.sh [RUNS]      (default 3; each run uses two fresh nodes)
# Pods: 10 Deployments × 11 replicas, terminationGracePeriodSeconds 2 (KWOK removes a deleted pod between
# 1 s and its grace period later, as a kubelet stopping containers would).
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
RUNS=${1:-3}
sh "$REPO/scripts/setup-kubectl.sh" >/dev/null
KUBECTL="$REPO/.cache/venv/bin/kubectl"
log "cargo build --release --bin nodekeeper"
cargo build --release --bin nodekeeper
NK="$REPO/target/release/nodekeeper"
DIR=$(mktemp -d /tmp/nodekeeper-bench-drain.XXXX)
at_exit "$REPO/scripts/k8s-cluster.sh" down "$DIR"
"$REPO/scripts/k8s-cluster.sh" up "$DIR" --owner-pid $$
export HOME="$DIR"
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: drain-operator, namespace: bench}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: drain-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nodekeeper-drain-operator}
subjects: [{kind: ServiceAccount, name: drain-operator, namespace: bench}]
EOF
k apply -f "$REPO/tests/fixtures/drain-operator-role.yaml" >/dev/null
OP="$DIR/operator.kubeconfig"
token_kubeconfig "$DIR" "$(k -n bench create token drain-operator --duration=2h)" "$OP"

# load NODE: a KWOK node with 110 Ready pods pinned to it.
load() {
  local n=$1 i
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels: {kubernetes.io/hostname: $n}
  annotations: {kwok.x-k8s.io/node: fake}
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "250"}
  capacity: {cpu: "32", memory: 256Gi, pods: "250"}
EOF
  for i in $(seq 0 9); do
    k -n bench apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $n-app$i}
spec:
  replicas: 11
  selector: {matchLabels: {app: $n-app$i}}
  template:
    metadata: {labels: {app: $n-app$i}}
    spec:
      nodeSelector: {kubernetes.io/hostname: $n}
      terminationGracePeriodSeconds: 2
      containers: [{name: app, image: registry.invalid/app:1}]
EOF
  done
}
ready_on() { k get pods -A --field-selector "spec.nodeName=$1,status.phase=Running" --no-headers 2>/dev/null | grep -vc '^nodekeeper ' || true; }
left_on() { k get pods -n bench --field-selector "spec.nodeName=$1" --no-headers 2>/dev/null | wc -l; }
now() { date +%s.%N; }

printf '%-4s %-12s %-12s %s\n' run nodekeeper kubectl ratio
for r in $(seq 1 "$RUNS"); do
  a="bench-nk-$r" b="bench-kc-$r"
  load "$a"; load "$b"
  for n in "$a" "$b"; do
    for _ in $(seq 1 300); do [ "$(ready_on "$n")" -ge 110 ] && break; sleep 0.2; done
  done
  t0=$(now); "$NK" drain "$a" --kubeconfig "$OP" --timeout 180s --skip-volume-wait >/dev/null 2>"$DIR/nk-$r.log" || { cat "$DIR/nk-$r.log" >&2; die "nodekeeper drain failed (run $r)"; }; t1=$(now)
  "$KUBECTL" --kubeconfig "$OP" drain "$b" --ignore-daemonsets --delete-emptydir-data --timeout=180s >"$DIR/kc-$r.log" 2>&1 || { cat "$DIR/kc-$r.log" >&2; die "kubectl drain failed (run $r)"; }; t2=$(now)
  [ "$(left_on "$a")" -eq 0 ] && [ "$(left_on "$b")" -eq 0 ] || die "pods left after the drains (run $r)"
  awk -v r="$r" -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "%-4s %-12.2f %-12.2f %.2f\n", r, b - a, c - b, (b - a) / (c - b) }'
  # Stop the Deployments from recreating pods elsewhere before the next run.
  for i in $(seq 0 9); do k -n bench delete deployment "$a-app$i" "$b-app$i" --wait=false >/dev/null; done
done
