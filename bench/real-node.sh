#!/usr/bin/env bash
# The agent pod beside Node Problem Detector's, on one real node (kubelet v1.37 + CRI-O: scripts/k8s-node.sh),
# each as its project ships it: nodekeeper's DaemonSet and controller from `kubectl apply -k` of manifests/ (the
# images of scripts/build-image.sh), NPD's DaemonSet, ConfigMap and RBAC from its Go module (deployment/, the
# binary of scripts/setup-peers.sh npd as the image the DaemonSet names). Memory and CPU of both pods from the
# same source: the kubelet's Summary API (/stats/summary: each container's workingSetBytes and
# usageCoreNanoSeconds), every 10 s over MINUTES after a warm-up. Figures go to bench/results/ and the NPD table
# of docs/comparison.md.
#   bench/real-node.sh [MINUTES]   (default 10; WARMUP=60 seconds before sampling)
# Patches, as the e2e tests name them (tests/e2e/real_node/mod.rs): ServiceMonitor/PrometheusRule left out, one
# controller replica (the agent reports to the shipped Service name through the node's cluster DNS); NPD's
# image pull policy Never
# (no registry). Not patched here: the agent's bus and /etc/crio are the host's (this host runs no systemd: its
# CRI-O apply and unit checks fail, as NPD's journald monitors do). Needs root.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
MINUTES=${1:-10} WARMUP=${WARMUP:-60}
[ "$(id -u)" -eq 0 ] || die "needs root (scripts/k8s-node.sh)"
setup_real
NPD_BIN="$("$REPO/scripts/setup-peers.sh" npd | tail -1)/node-problem-detector"
NPD_MOD="$(cd "$REPO/tools/k8s/npd" && PATH="$PATH:/usr/local/go/bin" go env GOMODCACHE)/k8s.io/node-problem-detector@v$NPD_VERSION"
[ -f "$NPD_MOD/deployment/node-problem-detector.yaml" ] ||
  (cd "$REPO/tools/k8s/npd" && GOTOOLCHAIN=local GOFLAGS=-mod=mod PATH="$PATH:/usr/local/go/bin" go mod download "k8s.io/node-problem-detector@v$NPD_VERSION")
log "images (scripts/build-image.sh)"
built=$("$REPO/scripts/build-image.sh")
DIR=$(mktemp -d /tmp/nodekeeper-bench-real-node.XXXX)
NODE=nk-bench
down_quietly() { "$REPO/scripts/$1" down "$2" >/dev/null 2>&1; }
at_exit down_quietly k8s-cluster.sh "$DIR/cluster"
at_exit down_quietly k8s-node.sh "$DIR/node"  # the node first: the last added runs first
K8S_NODE_MONITOR_GRACE=40s "$REPO/scripts/k8s-cluster.sh" up "$DIR/cluster" --owner-pid $$
"$REPO/scripts/k8s-node.sh" up "$DIR/node" "$DIR/cluster" --name "$NODE" --index 249 --owner-pid $$
k() { "$KUBECTL" --kubeconfig "$DIR/cluster/kubeconfig" "$@"; }
image_of() { awk '$1 == "image:" {print $2; exit}' "$1"; }
"$REPO/scripts/k8s-node.sh" load "$DIR/node" "$(sed -n 's/^agent_image=//p' <<<"$built")" "$(image_of manifests/11-agent-daemonset.yaml)"
"$REPO/scripts/k8s-node.sh" load "$DIR/node" "$(sed -n 's/^image=//p' <<<"$built")" "$(image_of manifests/22-controller-deployment.yaml)"
# NPD's image: its binary (cgo, journald: it links libc) at the path its DaemonSet runs, with the libraries it
# links, named as that DaemonSet names it.
NPD_IMAGE=$(image_of "$NPD_MOD/deployment/node-problem-detector.yaml")
. "$DIR/node/env"
store=(--root "$CRIO_ROOT" --runroot "$CRIO_RUNROOT" --storage-driver vfs)
ctr=$(buildah "${store[@]}" from --quiet scratch)
mnt=$(buildah "${store[@]}" mount "$ctr")
install -D -m 0755 "$NPD_BIN" "$mnt/node-problem-detector"
for lib in $(ldd "$NPD_BIN" | grep -o '/[^ ]*'); do install -D "$lib" "$mnt$lib"; done
buildah "${store[@]}" commit --quiet "$ctr" "$NPD_IMAGE" >/dev/null
buildah "${store[@]}" rm "$ctr" >/dev/null

log "nodekeeper: kubectl apply -k (an overlay of manifests/)"
mkdir -p "$DIR/kustomize"
rel=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$REPO/manifests" "$DIR/kustomize")
cat >"$DIR/kustomize/kustomization.yaml" <<EOF
resources: ["$rel"]
patches:
  - target: {group: monitoring.coreos.com}
    patch: |-
      \$patch: delete
      apiVersion: monitoring.coreos.com/v1
      kind: Any
      metadata: {name: any}
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: nodekeeper-controller, namespace: nodekeeper}
      spec: {replicas: 1}
EOF
k apply -k "$DIR/kustomize" >"$DIR/install.log"
loopback_tls "$DIR/tls"
k -n nodekeeper create secret tls nodekeeper-controller-tls --cert="$DIR/tls/tls.crt" --key="$DIR/tls/tls.key" >/dev/null
k -n nodekeeper create configmap nodekeeper-controller-ca --from-file=ca.crt="$DIR/tls/tls.crt" >/dev/null

log "NPD: its module's deployment/ (rbac, config, DaemonSet; image pull policy Never)"
sed 's/imagePullPolicy: Always/imagePullPolicy: Never/' "$NPD_MOD/deployment/node-problem-detector.yaml" >"$DIR/npd-ds.yaml"
k apply -f "$NPD_MOD/deployment/rbac.yaml" -f "$NPD_MOD/deployment/node-problem-detector-config.yaml" -f "$DIR/npd-ds.yaml" >>"$DIR/install.log"
for w in -n\ nodekeeper\ daemonset/nodekeeper-agent -n\ nodekeeper\ deployment/nodekeeper-controller -n\ kube-system\ daemonset/node-problem-detector; do
  # shellcheck disable=SC2086
  k rollout status $w --timeout=180s >/dev/null
done
log "warm-up ${WARMUP}s, then ${MINUTES} min of samples from the kubelet's /stats/summary"
sleep "$WARMUP"
end=$(( $(date +%s) + MINUTES * 60 ))
: >"$DIR/samples.jsonl"
while [ "$(date +%s)" -lt $end ]; do
  k get --raw "/api/v1/nodes/$NODE/proxy/stats/summary" | python3 -c '
import json, sys, time
s = json.load(sys.stdin)
out = {"t": time.time()}
for p in s.get("pods", []):
    for c in p.get("containers", []):
        key = {"agent": "agent", "node-problem-detector": "npd"}.get(c["name"])
        if key:
            out[key] = {"ws": c.get("memory", {}).get("workingSetBytes"), "cpu_ns": c.get("cpu", {}).get("usageCoreNanoSeconds")}
print(json.dumps(out))' >>"$DIR/samples.jsonl"
  sleep 10
done
mkdir -p "$REPO/bench/results"
result="$REPO/bench/results/$(date -u +%Y-%m-%d)-real-node.md"
python3 - "$DIR/samples.jsonl" "$MINUTES" "$(sed -n 's/^agent_version=//p' <<<"$built")" "$NPD_VERSION" >"$result" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def fig(k):
    xs = [r[k] for r in rows if k in r and r[k]["ws"] is not None]
    ws = [x["ws"] / 2**20 for x in xs]
    cpu = (xs[-1]["cpu_ns"] - xs[0]["cpu_ns"]) / 1e9
    secs = rows[-1]["t"] - rows[0]["t"]
    return statistics.mean(ws), max(ws), 1000 * cpu / secs, len(xs)
a, n = fig("agent"), fig("npd")
print(f"# The agent pod beside NPD's on a real node ({sys.argv[2]} min, bench/real-node.sh)\n")
print(f"kubelet v1.37 /stats/summary every 10 s after a 60 s warm-up; agent `{sys.argv[3]}`, NPD v{sys.argv[4]}.\n")
print("| pod | working set mean (MiB) | working set max (MiB) | CPU (millicores) | samples |")
print("|---|---|---|---|---|")
for name, f in (("nodekeeper agent", a), ("Node Problem Detector", n)):
    print(f"| {name} | {f[0]:.1f} | {f[1]:.1f} | {f[2]:.2f} | {f[3]} |")
print(f"\nagent / NPD working set (mean): {a[0] / n[0]:.2f}")
PY
cat "$result"
log "written: $result"
