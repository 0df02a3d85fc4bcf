#!/usr/bin/env bash
# Node Problem Detector (NPD) vs nodekeeper on the same host, reporting node problems to the same real API
# (resources, and requests per node-hour). Figures go to bench/results/ and docs/comparison.md.
#   bench/npd.sh [MINUTES]      steady-state window (default 10), then a repair wave (WAVE_MINUTES)
#   NODES=100          KWOK nodes in the cluster; every one but the NPD nodes runs a nodekeeper agent
#   PAIRS=2            NPD processes and "compared" agents (host checks on), each pair on this host
#   WAVE=10            nodes made NotReady (Ready=False, tolerations out 5 s later) for the repair wave
#   WAVE_MINUTES=5     the wave's window (0: no wave)
#   AGENT_PROFILE=agent   the agents' build: agent = `cargo build --profile agent --no-default-features`
#                         (what ships to nodes, README "Builds"), debug = the full debug build
#   BENCH_PROFILE=debug   the controller's build (debug, or release)
#   NK_CONTROLLER_SET='heartbeat_write_interval = "5m"'   TOML lines added to the controller's [controller] table
#   REPLICAS=2            controller replicas, as the shipped Deployment runs (1: the leader only); the standby
#                         listens on its own port and no agent reports to it: what it costs is its election
#                         and its watches
#   AGENT_BIN=PATH        the agents' binary as built before (no build; e.g. target/agent/nodekeeper while
#                         HEAD moved on: the version string embeds the commit, so cargo would rebuild)
# One cluster (`scripts/k8s-cluster.sh up DIR --audit` + `install`: the shipped manifests; kube-apiserver
# writes an audit log at Metadata level, the only place it records who sent each request: its metrics count
# requests by verb/resource/code, and `authenticated_user_requests` only as "admin"/"other"):
#   - nodes npd-1…PAIRS: one NPD each, as NPD's ServiceAccount with NPD's own RBAC (its deployment/rbac.yaml:
#     tests/fixtures/npd/rbac.yaml, bound to kube-apiserver's bootstrap ClusterRole system:node-problem-detector:
#     get nodes, patch nodes/status, create/patch/update events), a TokenRequest token in a kubeconfig given by
#     --apiserver-override=…?inClusterConfig=false&auth=…, `--hostname-override=npd-N`, and NPD's default
#     system-log monitors from its module's config/ — the DaemonSet's kernel-monitor.json, readonly-monitor.json,
#     docker-monitor.json (deployment/node-problem-detector.yaml) plus systemd-monitor.json: kmsg and the
#     journal of THIS host. Not run: the health-checker custom plugins (health-checker-kubelet.json, …): they
#     need the health-checker binary, a kubelet / container runtime on the host, and their --enable-repair=true
#     would `systemctl kill` the host's units;
#   - nodes nk-1…PAIRS: one nodekeeper agent each with its default checks, host checks on (kmsg, disk,
#     memory, pids, systemd units: this host's kernel log and systemd), `[sources] cloud = "none"` (no
#     metadata endpoint may be reached from a bench), tokens bound to the shipped DaemonSet's pod on its node;
#   - every other node (fill-N): an agent of the same build with the host checks that read the kernel log and
#     systemd off (CPU on 2 cores), so that the controller serves NODES - PAIRS agents as in a real fleet;
#   - the controller (shipped config, acting) as its ServiceAccount on loopback, for the whole benchmark, and
#     (REPLICAS=2) its standby replica;
# The repair wave: WAVE fill nodes (10 % of 100) turn NotReady; the controller repairs them with its shipped
# policy (drain -> replace, max_unhealthy 20 %, one node at a time) and provider `none`, which only records the
# request: the script plays the cloud, deleting a node (and stopping its agent) once nodekeeper requested its
# replacement (Event ReplacementRequested), which lets the next repair start. No replacement node joins.
# NPD has no repair: its nodes stay healthy, its requests do not depend on other nodes' health.
# Measured: per process RSS (VmRSS every 1 s, peak and mean; VmHWM) and CPU seconds (bench/lib/proc-sample.py)
# over the steady window after a WARMUP (default 60 s); requests per caller from the audit log
# (bench/lib/api-load.py) in the steady window and in the wave window (from the wave's fault on).
# Needs root (host checks read /dev/kmsg), openssl, python3, Go (scripts/setup-peers.sh npd builds NPD once).
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
MINUTES=${1:-10}
NODES=${NODES:-100} PAIRS=${PAIRS:-2} WAVE=${WAVE:-10} WAVE_MINUTES=${WAVE_MINUTES:-5} WARMUP=${WARMUP:-60}
AGENT_PROFILE=${AGENT_PROFILE:-agent} PROFILE=${BENCH_PROFILE:-debug}
FILL=$(( NODES - 2 * PAIRS ))
[ "$FILL" -ge "$WAVE" ] || { echo "$BENCH: NODES=$NODES leaves $FILL fill nodes, fewer than WAVE=$WAVE" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "needs root (the host checks read /dev/kmsg)"
setup_real  # kubectl, the control plane, versions.env (bench/lib/bench.sh)
log "control plane binaries (scripts/setup-k8s.sh), NPD (scripts/setup-peers.sh npd)"
NPD="$("$REPO/scripts/setup-peers.sh" npd | tail -1)/node-problem-detector"
NPD_CONFIG="$(cd "$REPO/tools/k8s/npd" && PATH="$PATH:/usr/local/go/bin" go env GOMODCACHE)/k8s.io/node-problem-detector@v$NPD_VERSION/config"
# The binary may be cached while the module cache was emptied since: fetch the module's source (its config/).
[ -f "$NPD_CONFIG/kernel-monitor.json" ] ||
  (cd "$REPO/tools/k8s/npd" && GOTOOLCHAIN=local GOFLAGS=-mod=mod PATH="$PATH:/usr/local/go/bin" go mod download "k8s.io/node-problem-detector@v$NPD_VERSION")
[ -f "$NPD_CONFIG/kernel-monitor.json" ] || die "NPD's config not found at $NPD_CONFIG"
build_nk "$PROFILE"  # sets NK (bench/lib/bench.sh)
if [ -n "${AGENT_BIN:-}" ]; then AGENT=$AGENT_BIN; AGENT_PROFILE="given ($("$AGENT_BIN" --version | head -1))"; else
case $AGENT_PROFILE in
  agent) log "cargo build --profile agent --no-default-features (the agent build)"
         cargo build --profile agent --locked --no-default-features; AGENT="$REPO/target/agent/nodekeeper" ;;
  debug) AGENT="$NK" ;;
  *) echo "$BENCH: AGENT_PROFILE must be agent or debug" >&2; exit 2 ;;
esac
fi
OUTDIR=$(mktemp -d /tmp/nodekeeper-bench-npd.XXXX)
DIR=$(mktemp -d /tmp/nodekeeper-bench-npd-cluster.XXXX)
STANDBY_PID=""
# Every process started below is tracked (bench/lib/bench.sh): stopped on exit, however the script exits.
at_exit "$REPO/scripts/k8s-cluster.sh" down "$DIR"
k() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

log "cluster up (audit log on): $DIR; output in $OUTDIR"
"$REPO/scripts/k8s-cluster.sh" up "$DIR" --owner-pid $$ --audit
"$REPO/scripts/k8s-cluster.sh" install "$DIR" >"$DIR/logs/install.log"
K8S_VERSION=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
k apply -f "$REPO/tests/fixtures/npd/rbac.yaml" >/dev/null
SERVER=$(awk '/server:/ {print $2; exit}' "$DIR/kubeconfig")
start_nk_controller "$NK"
REPLICAS=${REPLICAS:-2}
if [ "$REPLICAS" -ge 2 ]; then
  # The standby: the same config on another port, started once the first leads.
  sleep 3
  sed "s|127.0.0.1:$CTL_PORT|127.0.0.1:$(free_port)|" "$DIR/nk-controller.toml" >"$DIR/nk-standby.toml"
  KUBECONFIG="$DIR/nk-controller.kubeconfig" NODEKEEPER_LOG_FORMAT=json NODEKEEPER_LOG_LEVEL="${NK_LOG:-info}" \
    "$NK" controller --config "$DIR/nk-standby.toml" >"$DIR/logs/nodekeeper-standby.log" 2>&1 &
  STANDBY_PID=$!; track "$STANDBY_PID"
fi

npd_nodes=() nk_nodes=() fill_nodes=()
for i in $(seq 1 "$PAIRS"); do npd_nodes+=("npd-$i"); nk_nodes+=("nk-$i"); done
for i in $(seq 1 "$FILL"); do fill_nodes+=("fill-$i"); done
log "$NODES KWOK nodes: ${#npd_nodes[@]} for NPD, ${#nk_nodes[@]} compared agents, $FILL more agents"
kwok_nodes "${npd_nodes[@]}" "${nk_nodes[@]}" "${fill_nodes[@]}"
# all_pods: the DaemonSet's pod scheduled on every node (a pod kube-scheduler has not placed yet has no nodeName):
# OUTDIR/agent-pods, one line per node, "NODE POD UID".
all_pods() {
  k -n nodekeeper get pods -l app.kubernetes.io/name=nodekeeper-agent \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"|"}{.metadata.name}{"|"}{.metadata.uid}{"\n"}{end}' |
    awk -F'|' '$1 != "" {print $1, $2, $3}' | sort -u -k1,1 >"$OUTDIR/agent-pods"
  [ "$(grep -c . "$OUTDIR/agent-pods")" -ge "$NODES" ]
}
wait_for 180 "the agent DaemonSet's pod scheduled on every node (see $OUTDIR/agent-pods)" all_pods

# agent NODE CHECKS: tokens bound to the DaemonSet's pod on NODE (API: default audience; reports: audience
# nodekeeper), the shipped config pointed at the controller, then the agent. CHECKS=host keeps the shipped
# checks; CHECKS=fill turns off those that read this host's kernel log and systemd.
agent() {
  local node=$1 rd="$OUTDIR/agent/$1" pod uid bound
  mkdir -p "$rd"
  read -r pod uid < <(awk -v n="$node" '$1 == n {print $2, $3}' "$OUTDIR/agent-pods") ||
    die "no agent pod on node $node in $OUTDIR/agent-pods"
  bound=(--bound-object-kind Pod --bound-object-name "$pod" --bound-object-uid "$uid" --duration=2h)
  token_kubeconfig "$DIR" "$(k -n nodekeeper create token nodekeeper-agent "${bound[@]}")" "$rd/kubeconfig"
  k -n nodekeeper create token nodekeeper-agent "${bound[@]}" --audience nodekeeper >"$rd/report-token"
  shipped_agent_config "$rd" | sed -e 's|^cloud = .*|cloud = "none"|' >"$rd/agent.toml"
  printf '\n[node]\nname = "%s"\n\n[agent]\nshutdown_watcher = false\n' "$node" >>"$rd/agent.toml"
  [ "$2" = host ] || printf '\n[checks.kmsg]\nenabled = false\n[checks.systemd]\nenabled = false\n[checks.disk]\npaths = ["%s"]\n' \
    "$rd" >>"$rd/agent.toml"
  KUBECONFIG="$rd/kubeconfig" NODEKEEPER_NODE_NAME="$node" "$AGENT" agent --config "$rd/agent.toml" >"$rd/agent.log" 2>&1 &
  track $!
  echo "$!" >"$rd/pid"
}
log "agents: ${#nk_nodes[@]} with host checks, $FILL without (tokens bound to the DaemonSet's pods)"
for n in "${nk_nodes[@]}"; do agent "$n" host; done
for n in "${fill_nodes[@]}"; do agent "$n" fill; done

log "NPD v$NPD_VERSION on ${npd_nodes[*]} (kernel, readonly, docker, systemd monitors)"
mkdir -p "$OUTDIR/npd"
token_kubeconfig "$DIR" "$(k -n kube-system create token node-problem-detector --duration=2h)" "$OUTDIR/npd/kubeconfig"
MONITORS="$NPD_CONFIG/kernel-monitor.json,$NPD_CONFIG/readonly-monitor.json,$NPD_CONFIG/docker-monitor.json,$NPD_CONFIG/systemd-monitor.json"
for n in "${npd_nodes[@]}"; do
  "$NPD" --logtostderr --hostname-override="$n" \
    --apiserver-override="$SERVER?inClusterConfig=false&auth=$OUTDIR/npd/kubeconfig" \
    --config.system-log-monitor="$MONITORS" --port="$(free_port)" --prometheus-port="$(free_port)" \
    >"$OUTDIR/npd/$n.log" 2>&1 &
  track $!; echo "$!" >"$OUTDIR/npd/$n.pid"
done

samples=()
for n in "${npd_nodes[@]}"; do samples+=("npd=$(cat "$OUTDIR/npd/$n.pid")"); done
for n in "${nk_nodes[@]}"; do samples+=("agent-host=$(cat "$OUTDIR/agent/$n/pid")"); done
for n in "${fill_nodes[@]}"; do samples+=("agent-fill=$(cat "$OUTDIR/agent/$n/pid")"); done
samples+=("controller=$CTL_PID")
[ -z "$STANDBY_PID" ] || samples+=("standby=$STANDBY_PID")
log "warm-up ${WARMUP}s (start-up lists and first writes are outside the windows)"
sleep "$WARMUP"
for p in "${TRACKED[@]}"; do alive "$p" || die "process $p exited early (logs in $OUTDIR)"; done

log "steady state: $MINUTES min (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
t0=$(date +%s.%N)
python3 "$REPO/bench/lib/proc-sample.py" "$OUTDIR/steady-proc.json" $(( MINUTES * 60 )) "${samples[@]}"
t1=$(date +%s.%N)
echo "steady $t0 $t1" >"$OUTDIR/windows"
k get nodes "${npd_nodes[0]}" "${nk_nodes[0]}" -o json >"$OUTDIR/nodes-steady.json"

# wave_provider END: until END (Unix s), every 2 s, deletes the nodes nodekeeper asked to replace and stops
# their agents (the cloud taking the instance away); records when in OUTDIR/agent/NODE/replaced.
wave_provider() {
  local n
  while [ "$(date +%s)" -lt "$1" ]; do
    for n in $(k -n default get events --field-selector reason=ReplacementRequested \
                 -o jsonpath='{range .items[*]}{.involvedObject.name}{"\n"}{end}' 2>/dev/null | sort -u); do
      [ -d "$OUTDIR/agent/$n" ] && [ ! -e "$OUTDIR/agent/$n/replaced" ] || continue
      kill "$(cat "$OUTDIR/agent/$n/pid")" 2>/dev/null || true
      k delete node "$n" --wait=false >/dev/null 2>&1 || true
      date +%s.%N >"$OUTDIR/agent/$n/replaced"
    done
    sleep 2
  done
}

if [ "$WAVE_MINUTES" != 0 ]; then
  victims=("${fill_nodes[@]:0:$WAVE}")
  log "repair wave: ${#victims[@]} of $NODES nodes NotReady (tolerations out in 5 s), $WAVE_MINUTES min"
  k label node "${victims[@]}" nodekeeper.test/kubelet=not-ready >/dev/null
  t2=$(date +%s.%N)
  not_ready $(( ${t2%.*} + 5 )) "${victims[@]}"
  wave_provider $(( ${t2%.*} + WAVE_MINUTES * 60 )) &
  track $!
  python3 "$REPO/bench/lib/proc-sample.py" "$OUTDIR/wave-proc.json" $(( WAVE_MINUTES * 60 )) "${samples[@]}"
  echo "wave $t2 $(date +%s.%N)" >>"$OUTDIR/windows"
  k get events -A -o json >"$OUTDIR/events.json" || true
  k get nodes -o json >"$OUTDIR/nodes-wave.json"
  echo "wave: $(ls "$OUTDIR"/agent/*/replaced 2>/dev/null | wc -l) of ${#victims[@]} NotReady nodes repaired (drained, replacement requested, deleted)"
fi
cp "$DIR/logs/nodekeeper-controller.log" "$OUTDIR/"
[ -z "$STANDBY_PID" ] || cp "$DIR/logs/nodekeeper-standby.log" "$OUTDIR/"
run_exit_hooks  # every process stopped, the cluster down: its audit log complete
log "API load from the audit log ($(du -h "$DIR/logs/audit.log" | cut -f1))"
python3 "$REPO/bench/lib/api-load.py" "$DIR/logs/audit.log" "$OUTDIR/windows" "$OUTDIR/api-load.json" \
  npd="$PAIRS" agents=$(( NODES - PAIRS )) nodes="$NODES" | tee "$OUTDIR/api-load.txt"
python3 - "$OUTDIR" <<'EOF'
import json, sys
d = sys.argv[1]
for w in ("steady", "wave"):
    try:
        r = json.load(open(f"{d}/{w}-proc.json"))
    except OSError:
        continue
    print(f"{w}: {r['seconds']} s, load average (1 min) {r['load1']}")
    for g, v in r["groups"].items():
        print(f"  {g}: peak RSS p50/max {v['peak_rss_mib']['p50']}/{v['peak_rss_mib']['max']} MiB, "
              f"mean RSS p50 {v['mean_rss_mib']['p50']} MiB, CPU p50/max {v['cpu_s']['p50']}/{v['cpu_s']['max']} s "
              f"({v['millicores']['p50']}/{v['millicores']['max']} mc), n={v['peak_rss_mib']['n']}")
for n in json.load(open(f"{d}/nodes-steady.json"))["items"]:
    print(f"conditions on {n['metadata']['name']}: " + ", ".join(
        f"{c['type']}={c['status']} ({c['reason']})" for c in n["status"]["conditions"] if c["type"] != "Ready"))
EOF
echo "versions: NPD v$NPD_VERSION, Kubernetes $K8S_VERSION, nodekeeper $(git -C "$REPO" rev-parse --short HEAD) (agents: $AGENT_PROFILE build, controller: $PROFILE build, $REPLICAS replica(s)${NK_CONTROLLER_SET:+, [controller] $NK_CONTROLLER_SET}); output: $OUTDIR"
