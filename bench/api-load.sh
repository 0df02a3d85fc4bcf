#!/usr/bin/env bash
# Karpenter's requests on kube-apiserver, per node-hour, from the API server's audit log (NPD
# and nodekeeper are measured by bench/npd.sh, the same way). Figures go to bench/results/ and docs/comparison.md.
#   bench/api-load.sh [MINUTES]   steady-state window (default 10), then a repair wave (WAVE_MINUTES)
#   NODES=20          nodes Karpenter provisions (one pod of 1500m each, required anti-affinity by host name)
#   WAVE=2            of them made NotReady (Ready=False, 10-minute toleration out 5 s later) for the wave
#   WAVE_MINUTES=5    the wave's window (0: no wave)
# One cluster: `scripts/k8s-cluster.sh up DIR --audit --karpenter --karpenter-feature-gates NodeRepair=true`
# (Karpenter v1.14.1's KWOK provider as a client certificate of its own with its chart's RBAC, leader election
# off: out of cluster it has no namespace for its Lease, so its lease renewals, which a real deployment adds,
# are not counted), the KWOKNodeClass and NodePool of tests/fixtures/karpenter (consolidation WhenEmpty here, so
# that the steady state is steady). nodekeeper is not installed. Requests per caller:
# bench/lib/api-load.py; Karpenter's per-node-hour figure splits its fixed part (lists, watches) from the rest.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
MINUTES=${1:-10}
NODES=${NODES:-20} WAVE=${WAVE:-2} WAVE_MINUTES=${WAVE_MINUTES:-5} WARMUP=${WARMUP:-60}
setup_real  # kubectl, the control plane, versions.env (bench/lib/bench.sh)
log "control plane + Karpenter KWOK binaries (scripts/setup-k8s.sh)"
OUTDIR=$(mktemp -d /tmp/nodekeeper-bench-api-load.XXXX)
DIR=$(mktemp -d /tmp/nodekeeper-bench-api-load-cluster.XXXX)
at_exit "$REPO/scripts/k8s-cluster.sh" down "$DIR"
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

log "cluster up (audit log on, Karpenter with NodeRepair): $DIR; output in $OUTDIR"
"$REPO/scripts/k8s-cluster.sh" up "$DIR" --owner-pid $$ --audit --karpenter --karpenter-feature-gates NodeRepair=true
k apply -f "$REPO/tests/fixtures/karpenter/kwoknodeclass.yaml" -f "$REPO/tests/fixtures/karpenter/nodepool.yaml" >/dev/null
k patch nodepool default --type=merge -p '{"spec":{"limits":{"cpu":"10000"},"disruption":{"consolidationPolicy":"WhenEmpty","consolidateAfter":"30s"}}}' >/dev/null
k create deployment big --image=registry.invalid/app:1 --replicas="$NODES" >/dev/null
k patch deployment big --type=strategic -p '{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":5,
  "affinity":{"podAntiAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":[{"topologyKey":"kubernetes.io/hostname","labelSelector":{"matchLabels":{"app":"big"}}}]}},
  "containers":[{"name":"app","resources":{"requests":{"cpu":"1500m","memory":"512Mi"}}}]}}}}' >/dev/null
pool_ready() { [ "$(k get nodes -l karpenter.sh/nodepool=default --no-headers 2>/dev/null | grep -c ' Ready ')" -ge "$NODES" ]; }
running() { [ "$(k get deployment big -o jsonpath='{.status.readyReplicas}')" = "$NODES" ]; }
wait_for 600 "$NODES Karpenter nodes Ready" pool_ready
wait_for 120 "$NODES pods Running" running
log "warm-up ${WARMUP}s"
sleep "$WARMUP"
log "steady state: $MINUTES min (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
t0=$(date +%s.%N); l0=$(cut -d' ' -f1 /proc/loadavg)
sleep $(( MINUTES * 60 ))
echo "steady $t0 $(date +%s.%N)" >"$OUTDIR/windows"
echo "steady load1 $l0 -> $(cut -d' ' -f1 /proc/loadavg)" >"$OUTDIR/load"
if [ "$WAVE_MINUTES" != 0 ]; then
  mapfile -t victims < <(k get nodes -l karpenter.sh/nodepool=default -o name | sed 's|node/||' | head -n "$WAVE")
  log "repair wave: ${victims[*]} NotReady (toleration out in 5 s), $WAVE_MINUTES min"
  k label node "${victims[@]}" nodekeeper.test/kubelet=not-ready >/dev/null
  t2=$(date +%s.%N); l0=$(cut -d' ' -f1 /proc/loadavg)
  not_ready $(( ${t2%.*} + 5 )) "${victims[@]}"
  sleep $(( WAVE_MINUTES * 60 ))
  echo "wave $t2 $(date +%s.%N)" >>"$OUTDIR/windows"
  echo "wave load1 $l0 -> $(cut -d' ' -f1 /proc/loadavg)" >>"$OUTDIR/load"
  echo "wave: $(k get nodes -l karpenter.sh/nodepool=default --no-headers | grep -c ' Ready ') pool nodes Ready at the end; of the faulted: $(k get nodes "${victims[@]}" --no-headers 2>/dev/null | wc -l) still exist"
fi
k get events -A -o json >"$OUTDIR/events.json" || true
run_exit_hooks  # the cluster down: its audit log complete
cat "$OUTDIR/load"
python3 "$REPO/bench/lib/api-load.py" "$DIR/logs/audit.log" "$OUTDIR/windows" "$OUTDIR/api-load.json" \
  karpenter="$NODES" nodes="$NODES" | tee "$OUTDIR/api-load.txt"
echo "versions: Karpenter v$KARPENTER_VERSION (KWOK provider), Kubernetes v$K8S_VERSION; output: $OUTDIR"
