#!/usr/bin/env bash
# The same spot interruption notice, side by side on the real control plane: the AWS Node Termination Handler
# (NTH v1.22.0, IMDS mode) on one KWOK node, nodekeeper (agent with its AWS source + controller) on another,
# each node with its own Amazon EC2 metadata mock (AEMM v1.13.0). Figures go to bench/results/ and docs/comparison.md.
#   bench/nth.sh [NOTICES]      (default 20)
#   BENCH_PROFILE=release …              (default debug: target/debug/nodekeeper)
#   NK_POLL=200ms …                      the agent's [sources] poll_interval (default: unset, the shipped 1 s)
#   NK_SPOT_POLL=1s …                    its [sources.aws] spot_poll_interval (default: unset, the shipped 100 ms)
#   NK_LOG=debug …                       the controller's log level / directives (default info)
# One cluster (`scripts/k8s-cluster.sh up` + `install`: the shipped manifests). Per notice, fresh:
#   - nodes nth-N and nk-N (KWOK, same shape: 8 CPU, 32 Gi, 110 pods), each running 4 pods of its own
#     Deployment (app-nth-N / app-nk-N, required node affinity to its node or its spare, PDB maxUnavailable 1)
#     and the shipped agent DaemonSet's pod; then spare nodes nth-N-spare / nk-N-spare where the evicted
#     pods can go (created after the pods are placed, so every pod starts on the interrupted node);
#   - two AEMMs on loopback ports (`ec2-metadata-mock spot --mock-trigger-time T -t T+2min`, rebalance
#     recommendation moved a day later): both serve the notice from the same whole second T on — AEMM compares
#     the request's Unix second with T (pkg/mock/spot/spot.go) — and 404 before;
#   - NTH with its chart's defaults (cordon + drain through the Eviction API; taint-node false) and
#     --metadata-url at its AEMM, but for one: ENABLE_SCHEDULED_EVENT_DRAINING=false. AEMM's `spot` mode
#     does not serve events/maintenance/scheduled (404, where EC2 answers []); NTH counts a non-2xx answer
#     there as a monitor error and exits after 4 in a row ("Duplicate Error Threshold hit"). That monitor is
#     a goroutine of its own beside the spot one (each polls every 2 s); off, it also skips the 8 s
#     uncordon-after-reboot poll NTH runs at start. As the ServiceAccount of its chart's RBAC (tests/fixtures/nth/rbac.yaml):
#     NTH reads only the in-cluster config, so it runs in a private mount namespace with a tmpfs on /run
#     holding the token and CA at /run/secrets/kubernetes.io/serviceaccount (the host's /run is untouched);
#   - a nodekeeper agent: the shipped agent config with `[sources] cloud = "aws"` and `endpoint` at its AEMM
#     (poll intervals: the defaults, the Spot notice every 100 ms, the other paths every 1 s), reporting to the controller on loopback with tokens bound to the shipped
#     DaemonSet's pod on its node (host checks that read this machine's kernel log / systemd are off, as in
#     the demo). The controller (shipped config, acting) runs for the whole benchmark as its ServiceAccount.
# Measured by bench/lib/notice-watch.py from the API: T → cordon and taint seen by a watch, T → the last
# workload pod deleted (drained), how the pods left (DisruptionTarget reason), PDB samples below desiredHealthy,
# and per process (NTH, agent, controller) peak RSS and CPU seconds from T to the end of the run.
# Needs root (unshare -m, mount), openssl, python3, Go (scripts/setup-peers.sh builds AEMM and NTH once).
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
NOTICES=${1:-20}
PROFILE=${BENCH_PROFILE:-debug}
NK_POLL=${NK_POLL:-}
NK_SPOT_POLL=${NK_SPOT_POLL:-}
LEAD=${LEAD:-10}         # seconds from starting the AEMMs to T (the tools start and poll 404s meanwhile)
TIMEOUT=${TIMEOUT:-150}  # per notice, from T (NTH's drain gives up after node-termination-grace-period 120 s)
[ "$(id -u)" -eq 0 ] || die "needs root (NTH runs in a private mount namespace)"
setup_real  # kubectl, the control plane, versions.env (bench/lib/bench.sh)
log "control plane binaries (scripts/setup-k8s.sh), AEMM and NTH (scripts/setup-peers.sh)"
AEMM="$("$REPO/scripts/setup-peers.sh" aemm | tail -1)/ec2-metadata-mock"
NTH="$("$REPO/scripts/setup-peers.sh" nth | tail -1)/node-termination-handler"
build_nk "$PROFILE"  # sets NK (bench/lib/bench.sh)
OUTDIR=$(mktemp -d /tmp/nodekeeper-bench-nth.XXXX)
DIR=$(mktemp -d /tmp/nodekeeper-bench-nth-cluster.XXXX)
PIDFILE="$OUTDIR/pids"
# A round's processes (AEMMs, NTH, the agent) are stopped at its end with stop_tracked: SIGTERM, then SIGKILL
# whatever still runs 3 s later: NTH v1.22.0 does not exit on SIGTERM (its main loop's `case <-signalChan:
# break` leaves the select, not the loop; in a pod the kubelet's SIGKILL ends it). On exit, all that still runs.
ROUND_PIDS=()
at_exit "$REPO/scripts/k8s-cluster.sh" down "$DIR"
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

log "cluster up: $DIR"
"$REPO/scripts/k8s-cluster.sh" up "$DIR" --owner-pid $$
"$REPO/scripts/k8s-cluster.sh" install "$DIR" >"$DIR/logs/install.log"
K8S_VERSION=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
k apply -f "$REPO/tests/fixtures/nth/rbac.yaml" >/dev/null
k create namespace bench >/dev/null
SERVER=$(awk '/server:/ {print $2; exit}' "$DIR/kubeconfig")
API_HOST=$(echo "$SERVER" | sed -E 's|https://([^:/]+):([0-9]+).*|\1|')
API_PORT=$(echo "$SERVER" | sed -E 's|https://([^:/]+):([0-9]+).*|\2|')

# The controller: shipped config on a loopback port, as its ServiceAccount, for the whole benchmark.
start_nk_controller "$NK"

# workload NAME NODE: 4 pods of Deployment NAME on NODE (or its spare, once that exists), PDB maxUnavailable 1.
workload() {
  k -n bench apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1}
spec:
  replicas: 4
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}}
    spec:
      terminationGracePeriodSeconds: 2
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$2, $2-spare]}]}]
      containers: [{name: app, image: registry.invalid/app:1, resources: {requests: {cpu: 100m, memory: 128Mi}}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: $1}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: $1}}}
EOF
}
running_on() { k get pods -A --field-selector "spec.nodeName=$1,status.phase=Running" --no-headers 2>/dev/null | grep -c ' 1/1 ' || true; }
placed() { [ "$(running_on "$1")" -ge 5 ] && [ "$(running_on "$2")" -ge 5 ]; }  # 4 workload pods + the agent's
pdbs_ok() { [ "$(k -n bench get pdb "$1" "$2" -o jsonpath='{range .items[*]}{.status.currentHealthy}{" "}{end}')" = "4 4 " ]; }

for i in $(seq 1 "$NOTICES"); do
  a="nth-$i" b="nk-$i"
  log "notice $i/$NOTICES: nodes $a (NTH) and $b (nodekeeper)"
  kwok_nodes "$a" "$b"
  workload "app-$a" "$a"; workload "app-$b" "$b"
  wait_for 120 "4 pods + the agent's Running on $a and $b" placed "$a" "$b"
  wait_for 60 "both PDBs at 4 healthy" pdbs_ok "app-$a" "app-$b"
  kwok_nodes "$a-spare" "$b-spare"
  rd="$OUTDIR/$i"; mkdir -p "$rd/sa" "$rd/agent"
  : >"$PIDFILE"; echo "nk-controller $CTL_PID" >>"$PIDFILE"

  # The notice instant: LEAD s from now, a whole second (AEMM's resolution).
  T=$(( $(date +%s) + LEAD ))
  TS=$(date -u -d "@$T" +%Y-%m-%dT%H:%M:%SZ)
  LATER=$(date -u -d "@$(( T + 86400 ))" +%Y-%m-%dT%H:%M:%SZ)
  # The termination time in the notice: T + 2 min, fixed, as on EC2 (unset, AEMM answers "now + 2 min" to each
  # request, so every poll sees a different notice: NTH files each as a new event and drains again).
  TERM_AT=$(date -u -d "@$(( T + 120 ))" +%Y-%m-%dT%H:%M:%SZ)
  pa=$(free_port) pb=$(free_port)
  for p in "$pa" "$pb"; do
    HOME="$rd" "$AEMM" spot --mock-trigger-time "$TS" --rebalance-trigger-time "$LATER" -t "$TERM_AT" -n 127.0.0.1 -p "$p" \
      >"$rd/aemm-$p.log" 2>&1 &
    ROUND_PIDS+=($!); track $!
  done

  # NTH for node a: its ServiceAccount's token and the cluster CA where rest.InClusterConfig reads them.
  k -n kube-system create token aws-node-termination-handler --duration=1h >"$rd/sa/token"
  cp "$DIR/pki/ca.crt" "$rd/sa/ca.crt"; echo kube-system >"$rd/sa/namespace"
  NODE_NAME="$a" POD_NAME="aws-node-termination-handler-$a" NAMESPACE=kube-system \
    KUBERNETES_SERVICE_HOST="$API_HOST" KUBERNETES_SERVICE_PORT="$API_PORT" \
    INSTANCE_METADATA_URL="http://127.0.0.1:$pa" UPTIME_FROM_FILE=/proc/uptime ENABLE_SCHEDULED_EVENT_DRAINING=false \
    unshare -m --propagation private sh -c 'mount -t tmpfs nth /run &&
      mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
      cp "$1"/token "$1"/ca.crt "$1"/namespace /run/secrets/kubernetes.io/serviceaccount/ &&
      exec "$2"' sh "$rd/sa" "$NTH" >"$rd/nth.log" 2>&1 &
  ROUND_PIDS+=($!); track $!; echo "nth $!" >>"$PIDFILE"

  # The agent for node b: tokens bound to the shipped DaemonSet's pod on b (API: default audience; reports:
  # audience nodekeeper), the shipped agent config pointed at its AEMM and the controller on loopback.
  read -r pod uid < <(k -n nodekeeper get pods -l app.kubernetes.io/name=nodekeeper-agent \
    --field-selector "spec.nodeName=$b" -o jsonpath='{.items[0].metadata.name} {.items[0].metadata.uid}{"\n"}')  # read needs the newline
  bound=(--bound-object-kind Pod --bound-object-name "$pod" --bound-object-uid "$uid" --duration=1h)
  token_kubeconfig "$DIR" "$(k -n nodekeeper create token nodekeeper-agent "${bound[@]}")" "$rd/agent/kubeconfig"
  k -n nodekeeper create token nodekeeper-agent "${bound[@]}" --audience nodekeeper >"$rd/agent/report-token"
  shipped_agent_config "$rd/agent" |
    sed -e "s|^cloud = .*|cloud = \"aws\"\nendpoint = \"http://127.0.0.1:$pb\"${NK_POLL:+\\npoll_interval = \"$NK_POLL\"}|" >"$rd/agent/agent.toml"
  cat >>"$rd/agent/agent.toml" <<EOF

[node]
name = "$b"

[agent]
shutdown_watcher = false

# This machine is not the node: no kernel log, systemd or logind checks (as the demo's agents).
[checks.kmsg]
enabled = false
[checks.systemd]
enabled = false
[checks.disk]
paths = ["$rd/agent"]
EOF
  [ -z "$NK_SPOT_POLL" ] || printf '[sources.aws]\nspot_poll_interval = "%s"\n' "$NK_SPOT_POLL" >>"$rd/agent/agent.toml"
  KUBECONFIG="$rd/agent/kubeconfig" NODEKEEPER_NODE_NAME="$b" \
    "$NK" agent --config "$rd/agent/agent.toml" >"$rd/agent.log" 2>&1 &
  ROUND_PIDS+=($!); track $!; echo "nk-agent $!" >>"$PIDFILE"

  python3 "$REPO/bench/lib/notice-watch.py" "$DIR" "$T" bench "$OUTDIR/$i.json" "$TIMEOUT" "$PIDFILE" \
    "nth=$a=app-$a" "nodekeeper=$b=app-$b" 2>"$rd/watch.log" &
  WATCH_PID=$!; track "$WATCH_PID"
  # Both tools polling before T: NTH's monitors start after its "started successfully" line and poll every 2 s
  # from then (a first poll 2 s after it); the agent's source has read AEMM's identity. A notice whose tools
  # were not both up 2 s before T is counted as late (its times would include the tools' start).
  wait_for $(( LEAD + 30 )) "NTH on $a started" grep -q "has started successfully" "$rd/nth.log"
  wait_for $(( LEAD + 30 )) "the agent on $b read its AEMM" grep -q "instance identity" "$rd/agent.log"
  if [ "$(date +%s%N)" -gt $(( (T - 2) * 1000000000 )) ]; then
    echo "$BENCH: notice $i: NTH or the agent was up less than 2 s before T (raise LEAD)" >&2; echo "$i" >>"$OUTDIR/late"
  fi
  wait "$WATCH_PID" || true; forget "$WATCH_PID"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["tools"]; print("   ", {t: (v["cordon_s"], v["drained_s"]) for t, v in r.items()})' "$OUTDIR/$i.json" >&2 || true
  stop_tracked "${ROUND_PIDS[@]}"; ROUND_PIDS=()
  k -n bench delete deployment "app-$a" "app-$b" --wait=false >/dev/null
  k -n bench delete pdb "app-$a" "app-$b" --wait=false >/dev/null
  k delete node "$a" "$b" "$a-spare" "$b-spare" --wait=false >/dev/null
done
cp "$DIR/logs/nodekeeper-controller.log" "$OUTDIR/"

python3 "$REPO/bench/lib/notice-table.py" "$OUTDIR" "$NOTICES" \
  "NTH v$NTH_VERSION, AEMM v$AEMM_VERSION, nodekeeper $PROFILE build${NK_POLL:+ (agent poll_interval $NK_POLL)}${NK_SPOT_POLL:+ (agent spot_poll_interval $NK_SPOT_POLL)} $(git -C "$REPO" rev-parse --short HEAD), Kubernetes $K8S_VERSION"
