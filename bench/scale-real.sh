#!/usr/bin/env bash
# nodekeeper's controller at scale on the real control plane. Figures go to bench/results/ and
# docs/comparison.md ("Scale on the real control plane").
#   bench/scale-real.sh [--nodes 500,1000,2000,5000] [--pods-per-node 20] [--max-pods N]
#     --max-pods: at most N bench pods in all (the nodes of a size past it get fewer or none; pods are created
#     at ~50–150/s on the shared 2 cores, so 100,000 take longer than one run may)
#   BENCH_PROFILE=dev …                             a debug build (default release)
#   BENCH_BUILD=0 …                                 run the binaries already built (a commit makes cargo rebuild
#                                                   nodekeeper-core: its build.rs records the commit)
#   WINDOW=30 NOTICES=50 FAILS=20 TOLERATION=20 …   seconds per measurement, notices and Ready=False nodes per size,
#                                                   the repair toleration (s) of the bench's controller config
#   WAIT=1800 …                                     seconds at most for a size's pods to run and its nodes' not-ready taints
#                                                   to be lifted (100,000 pods take longer)
#   SETTLE=60 …                                     seconds more before the Ready=False posts, so that the decision is
#                                                   measured after the notices' burst rather than in its tail
#   POOLS=100 …                                     Karpenter NodePools the nodes are spread over (label karpenter.sh/nodepool=
#                                                   pool-(i % POOLS)); 0: no NodePool label, so no Karpenter fence (side by side)
#   NK_CONTROLLER_SET='max_connections = 1024' …    TOML lines added to the controller's [controller] table (to
#                                                   compare settings side by side: one run each)
#   PERF=1 …                                        the controller sampled by `perf record` (97 Hz, DWARF call graphs)
#                                                   in its idle, agents and notices windows: SIZE/perf-PHASE.txt, its hottest
#                                                   symbols, and SIZE/perf-PHASE-callers.txt, who calls them (the CPU
#                                                   figures then include perf's share)
#   NODEKEEPER_BIN=path …                           that controller binary (e.g. an older build, side by side)
#   FLEET_BIN=path …                                that agents' simulator (bench/examples/controller_bench.rs: the agent's own
#                                                   Reporter, so an older build of the agent, side by side)
#   AGENT_IDLE_MS=60000 …                           the agents close a connection after this long without a report (default
#                                                   1000, the agent's; with the controller's idle_timeout raised through
#                                                   NK_CONTROLLER_SET, each agent holds its connection: a held transport)
#   AUDIT=1 …                                       kube-apiserver audits the controller's Node PATCHes (Metadata level,
#                                                   nothing else): SIZE/audit.json splits each notice's cordon into the
#                                                   controller's side and kube-apiserver's, and the time before it into delivery (the
#                                                   agent's send and the wire, by the simulator's `post` lines), handler and engine
#                                                   (by the controller's `notice acted on` lines: the hop to the fast path's
#                                                   task, its wait for a worker and the node's lane, its decision; scale-fleet.py audit)
#   GCTRACE=1 AUDIT=1 …                             the control plane's Go runtimes trace their garbage collections
#                                                   (K8S_GODEBUG=gctrace=1): SIZE/gc.json, per component the cycles, their
#                                                   wall and CPU time, and the notices that came while kube-apiserver's
#                                                   was marking against the others (scale-fleet.py gc)
#   CHANGES=1 …                                     in each window with the controller up, a Node watch of its own:
#                                                   SIZE/changes-PHASE.json, which fields the controller's wake filter
#                                                   reads changed and who wrote them (scale-fleet.py node-changes)
#   OPEN_GAP=3 …                                    seconds between the scrapes before each window (kube-apiserver's
#                                                   /metrics, the controller's) and the window's opening, so that their
#                                                   aftermath does not fall in its first seconds
#   NOTICE_APART=0 …                                the noticing nodes' agents in the fleet's simulator process, as
#                                                   before 2026-12-05 (default 1: in a process of their own, `--part
#                                                   noticed`, the fleet's `--part fleet`: on a fleet each agent has its
#                                                   node's runtime to itself, where in one simulator the notice's POST
#                                                   waits behind the other agents' reports and handshakes)
#   FLEET_NICE=19 …                                 the fleet's stand-ins — KWOK, playing every kubelet, and the agents'
#                                                   simulator — in scheduler groups at that nice (their autogroups':
#                                                   each setsid process is one group, /proc/PID/autogroup), so that the
#                                                   control plane and the controller take the shared cores first, as
#                                                   they would on a fleet whose kubelets and agents run on the nodes
# Around each window with the controller up, SIZE/engine-PHASE-0.txt and -1.txt keep its reconciles and wakes by
# cause (`nodekeeper_engine_reconciles_total`, `nodekeeper_engine_wakes_total`): the rate of reconciles; SIZE/engine-end.txt
# the same after the expiry, with the due paths taken and the reconciles held for them. Around the
# notices, SIZE/delay-notices-{0,1}.txt keep the controller's scheduling delays (how late its runtime and a
# thread of its own ran: scale-fleet.py delays, printed after the table). Around the
# notices (with their drains) and around the expiry, SIZE/histograms-{notices,expiry}.json keep kube-apiserver's own
# latency histograms for them (scale-fleet.py's HISTOGRAMS: APF queue wait and execution of the controller's flows,
# every Node PATCH, etcd's Node updates), printed after the table: where a cordon's PATCH spends its time.
# One cluster (`scripts/k8s-cluster.sh up` + `install`: the shipped manifests, with the kubelet's and
# kube-controller-manager's default node heartbeat: Leases of 40 s, NotReady after 50 s), grown size by size:
#   - KWOK nodes n0 … nN-1 (label karpenter.sh/nodepool=pool-(i % POOLS)), PODS-PER-NODE pods each bound with
#     spec.nodeName (namespace bench; no scheduler work, KWOK marks them Running) and the shipped agent
#     DaemonSet's pod (placed by kube-scheduler); waits until all are Running and kube-controller-manager has
#     lifted the not-ready taint of every Ready node (at 5,000 nodes ten minutes: its 20 requests a second);
#   - one token per node: TokenRequest for nodekeeper-agent, audience nodekeeper, bound to the DaemonSet's pod on it;
# then per size, each phase measured over WINDOW s by bench/lib/scale-fleet.py (RSS and CPU of each process from
# /proc; kube-apiserver's apiserver_request_total from its /metrics, read with the harness's admin certificate):
#   1. base: the control plane without nodekeeper;
#   2. idle: a fresh controller (release build, the shipped config acting — dry_run off — with budgets and
#      max_unhealthy at 100 % and a TOLERATION s repair toleration, so that neither holds what is timed), as its
#      ServiceAccount (token from `kubectl create token`), on a loopback port, no agent connected yet;
#   3. agents: N agents connected, bench/examples/controller_bench.rs `--agents` (the agent's own Reporter, one
#      connection each, the default 10 s heartbeat and 1 s idle close, one condition change per 100 ms);
#   4. notice → cordon: the agents of NOTICES new nodes each report a spot interruption notice (one per 200 ms,
#      starting as the notices' window opens: SIZE/notices.start), from the notice handed to the agent's reporter to
#      the cordon seen by a Node watch; in that window also every process's CPU, the machine's (busy, runnable
#      tasks) and kube-apiserver's goroutine scheduling latency (go_sched_latencies_seconds);
#   5. decision after a toleration expires: the kubelets of FAILS new nodes post Ready=False with one whole-second
#      lastTransitionTime T; from T + TOLERATION to the repair's cordon seen by the same watch.
#   For 4 and 5 also (in brackets) to the controller's `node written` log line with the node's cordon, written once
#   its PATCH returned: the watch (one Python client) falls behind the event stream under load.
# Needs root (only for the cluster's ports and /proc of its processes), openssl, python3, the cached control plane.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
SIZES=500,1000,2000,5000 PER=20 MAXPODS=""
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) SIZES=$2; shift 2 ;;
    --pods-per-node) PER=$2; shift 2 ;;
    --max-pods) MAXPODS=$2; shift 2 ;;
    *) echo "usage: $0 [--nodes 500,1000,2000,5000] [--pods-per-node 20] [--max-pods N]" >&2; exit 2 ;;
  esac
done
POOLS=${POOLS:-100} WINDOW=${WINDOW:-30} NOTICES=${NOTICES:-50} FAILS=${FAILS:-20} TOLERATION=${TOLERATION:-20} SETTLE=${SETTLE:-0} WAIT=${WAIT:-1800}
NOTICE_APART=${NOTICE_APART:-1}
export POOLS NOTICE_APART
PROFILE=${BENCH_PROFILE:-release}
if [ "${BENCH_BUILD:-1}" = 0 ]; then
  log "BENCH_BUILD=0: the $PROFILE binaries already built ($("$REPO/target/${PROFILE/dev/debug}/nodekeeper" --version))"
else
  log "nice -n 10 cargo build --profile $PROFILE --bin nodekeeper --example controller_bench"
  nice -n 10 cargo build --profile "$PROFILE" --bin nodekeeper --example controller_bench
fi
[ "$PROFILE" = dev ] && PROFILE=debug
NK="${NODEKEEPER_BIN:-$REPO/target/$PROFILE/nodekeeper}" FLEET_BIN="${FLEET_BIN:-$REPO/target/$PROFILE/examples/controller_bench}"
F=(python3 "$REPO/bench/lib/scale-fleet.py")
OUT=$(mktemp -d /tmp/nodekeeper-bench-scale.XXXX)
DIR="$OUT/cluster" FLEET="$OUT/fleet" RESULTS="$OUT/results.jsonl"
mkdir -p "$FLEET/state"
export K8S_NODE_LEASE_SECONDS=40 K8S_NODE_MONITOR_GRACE=50s
[ "${GCTRACE:-0}" != 1 ] || export K8S_GODEBUG=gctrace=1
UP=()
if [ "${AUDIT:-0}" = 1 ]; then
  cat >"$OUT/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    users: ["system:serviceaccount:nodekeeper:nodekeeper-controller"]
    verbs: [patch]
    resources: [{group: "", resources: [nodes]}]
  - level: None
EOF
  UP=(--audit-policy "$OUT/audit-policy.yaml")
fi
real_cluster "$DIR" ${UP[@]+"${UP[@]}"}
CTL_PID="" AGENTS_PID="" NOTICED_PID=""  # tracked (scripts/lib.sh), with the Node watch: stopped on exit
k() { "$REPO/.cache/venv/bin/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"; }
pid_of() { awk -v n="$1" '$1 == n {print $2}' "$DIR/pids"; }
CP=("apiserver=$(pid_of kube-apiserver)" "etcd=$(pid_of etcd)" "kcm=$(pid_of kube-controller-manager)" \
    "scheduler=$(pid_of kube-scheduler)" "kwok=$(pid_of kwok)")
# FLEET_NICE: KWOK's group now, the agents' when they start (setsid: a group of their own).
fleet_nice() { [ -z "${FLEET_NICE:-}" ] || echo "$FLEET_NICE" >"/proc/$1/autogroup"; }
fleet_nice "$(pid_of kwok)"
K8S=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')

CTL_PORT=$(free_port)
loopback_tls "$OUT/tls"
cp "$OUT/tls/tls.crt" "$FLEET/ca.pem"
token_kubeconfig "$DIR" "$(k -n nodekeeper create token nodekeeper-controller --duration=6h)" "$OUT/controller.kubeconfig"
shipped_controller_config "127.0.0.1:$CTL_PORT" "$OUT/tls" |
  sed -e "s|^toleration = .*|toleration = \"${TOLERATION}s\"|" -e 's|^max_unhealthy = .*|max_unhealthy = "100%"|' \
      -e 's|^budgets = .*|budgets = [{ nodes = "100%" }]|' |
  awk -v set="${NK_CONTROLLER_SET:-}" '{ print } /^\[controller\]$/ && set != "" { print set }' >"$OUT/controller.toml"
ctl_metric() { curl -sk "https://127.0.0.1:$CTL_PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
# ctl_metrics REGEX FILE: the controller's metrics lines matching REGEX (nothing before the controller runs).
ctl_metrics() {
  [ -n "$CTL_PID" ] || return 0
  curl -sk "https://127.0.0.1:$CTL_PORT/metrics" | grep -E "$1" >"$2" || true
}
# The controller's scheduling delay histograms (nodekeeper_scheduling_delay_seconds), for scale-fleet.py delays.
ctl_delays() { ctl_metrics '^nodekeeper_scheduling_delay_seconds' "$1"; }
# The engine's reconciles and wakes by cause around a window.
engine_counters() { ctl_metrics '^nodekeeper_engine_(reconciles|reconciles_held|wakes|due_paths|fast_paths)_total' "$1"; }
# perf_start NAME SECONDS / perf_end NAME: with PERF=1, the controller sampled by perf for SECONDS, then its hottest
# symbols (SIZE/perf-NAME.txt) and who calls them (SIZE/perf-NAME-callers.txt).
PERF_PID=""
perf_start() {
  PERF_PID=""
  if [ "${PERF:-0}" = 1 ] && [ -n "$CTL_PID" ]; then
    # DWARF call graphs: the release build keeps no frame pointers.
    perf record -q -F 97 --call-graph dwarf,16384 -p "$CTL_PID" -o "$SD/perf-$1.data" -- sleep "$2" >/dev/null 2>&1 &
    PERF_PID=$!; track "$PERF_PID"
  fi
}
perf_end() {
  [ -n "$PERF_PID" ] || return 0
  wait "$PERF_PID" || true; forget "$PERF_PID"
  PERF_PID=""
  perf report -i "$SD/perf-$1.data" --no-children --sort symbol -g none --stdio 2>/dev/null |
    grep -v '^$' | head -80 >"$SD/perf-$1.txt" || true
  # Who calls the hottest symbols (the flat list above names only the leaves).
  perf report -i "$SD/perf-$1.data" --no-children --sort symbol -g caller,2,callee --stdio 2>/dev/null |
    grep -v '^$' | head -400 >"$SD/perf-$1-callers.txt" || true
}
# phase NAME SECONDS LABEL=PID…: SECONDS of samples (SIZE/NAME.json), and around them kube-apiserver's request
# counters and the controller's engine counters and scheduling delays (with PERF=1, its hottest symbols in that
# window too). SIZE/NAME.start marks the window's opening (the agents' notices wait for SIZE/notices.start).
phase() {
  local name=$1 secs=$2 changes=""; shift 2
  "${F[@]}" requests "$DIR" "$SD/req-$name-0.json"
  engine_counters "$SD/engine-$name-0.txt"
  ctl_delays "$SD/delay-$name-0.txt"
  sleep "${OPEN_GAP:-0}"
  perf_start "$name" "$secs"
  if [ "${CHANGES:-0}" = 1 ] && [ -n "$CTL_PID" ]; then
    "${F[@]}" node-changes "$DIR" "$secs" >"$SD/changes-$name.json" &
    changes=$!; track "$changes"
  fi
  : >"$SD/$name.start"
  "${F[@]}" sample "$secs" "$SD/$name.json" "${CP[@]}" "$@"
  [ -z "$changes" ] || { wait "$changes"; forget "$changes"; }
  "${F[@]}" requests "$DIR" "$SD/req-$name-1.json"
  engine_counters "$SD/engine-$name-1.txt"
  ctl_delays "$SD/delay-$name-1.txt"
  perf_end "$name"
}

prev=0 pods=0
IFS=, read -r -a sizes <<<"$SIZES"
for n in "${sizes[@]}"; do
  SD="$OUT/$n"; mkdir -p "$SD"
  per=$PER
  [ -z "$MAXPODS" ] || per=$(( (MAXPODS - pods) / (n - prev) < PER ? (MAXPODS - pods) / (n - prev) : PER ))
  [ "$per" -ge 0 ] || per=0
  pods=$(( pods + per * (n - prev) ))
  log "size $n: nodes n$prev … n$((n - 1)), $per pods each, $pods in all ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  t0=$(date +%s)
  "${F[@]}" nodes "$DIR" "$prev" "$n" "$POOLS"
  [ "$per" -eq 0 ] || "${F[@]}" pods "$DIR" "$prev" "$n" "$per"
  t1=$(date +%s)
  "${F[@]}" wait "$DIR" "$n" "$WAIT"
  t2=$(date +%s)
  "${F[@]}" tokens "$DIR" "$prev" "$n" "$FLEET"
  log "size $n: created in $((t1 - t0)) s, all Running and no Ready node tainted not-ready $((t2 - t1)) s later; tokens in $(( $(date +%s) - t2 )) s"
  phase base "$WINDOW"

  KUBECONFIG="$OUT/controller.kubeconfig" NODEKEEPER_LOG_FORMAT=json NODEKEEPER_LOG_LEVEL=info \
    "$NK" controller --config "$OUT/controller.toml" >"$SD/controller.log" 2>&1 &
  CTL_PID=$!; track "$CTL_PID"
  end=$(( $(date +%s) + 120 ))
  until curl -skf "https://127.0.0.1:$CTL_PORT/readyz" >/dev/null; do
    [ "$(date +%s)" -lt $end ] || die "controller not ready in 120 s: $SD/controller.log"
    sleep 0.5
  done
  sleep 10   # the first reconcile (seen-ready stamps on nodes younger than 2 minutes)
  phase idle "$WINDOW" "controller=$CTL_PID"
  "${F[@]}" watch "$DIR" "$SD/watch.log" &
  WATCH_PID=$!; track "$WATCH_PID"
  rm -rf "$FLEET/state"   # each size's agents start afresh (no notice queued from the last size)
  fleet() {   # fleet PART OUT: the agents' simulator, its pid in FLEET_PID (the noticing agents' own is not niced)
    ${FLEET_NICE:+setsid} "$FLEET_BIN" --agents "$n" --port "$CTL_PORT" --dir "$FLEET" --idle-ms "${AGENT_IDLE_MS:-1000}" \
      --notices "$NOTICES" --notice-from "$prev" --notice-go "$SD/notices.start" --part "$1" >"$SD/$2.out" 2>"$SD/$2.err" &
    FLEET_PID=$!; track "$FLEET_PID"
    [ "$1" = noticed ] || fleet_nice "$FLEET_PID"
  }
  SIMS=()
  if [ "$NOTICE_APART" = 1 ]; then
    fleet fleet agents; AGENTS_PID=$FLEET_PID
    fleet noticed noticed; NOTICED_PID=$FLEET_PID
    SIMS=("noticed=$NOTICED_PID")
  else
    fleet all agents; AGENTS_PID=$FLEET_PID
  fi
  for part in agents ${NOTICED_PID:+noticed}; do
    until grep -q '^started' "$SD/$part.out"; do
      kill -0 "$AGENTS_PID" 2>/dev/null && { [ -z "$NOTICED_PID" ] || kill -0 "$NOTICED_PID" 2>/dev/null; } ||
        die "agents exited: $SD/$part.err"
      sleep 0.5
    done
  done
  "${F[@]}" sample 5 "$SD/warm.json" "controller=$CTL_PID"  # the agents' first TokenReviews
  open=$(ctl_metric nodekeeper_connections_open)
  phase agents "$WINDOW" "controller=$CTL_PID" "agents=$AGENTS_PID" ${SIMS[@]+"${SIMS[@]}"}
  # kube-apiserver's latency histograms (APF wait and execution of the controller's flows, Node PATCHes, etcd's
  # Node updates) around the notices (with their drains) and around the expiry: SIZE/req-{notices,expiry}-{0,1}.json.
  # The notices start when the window opens (the agents wait for SIZE/notices.start): NOTICES / 5 s of them, then
  # 15 s of their drains; SIZE/notices.json, every process's CPU and the machine's in that window.
  phase notices $(( NOTICES / 5 + 15 )) "controller=$CTL_PID" "agents=$AGENTS_PID" ${SIMS[@]+"${SIMS[@]}"}
  sleep "$SETTLE"
  fails=()
  for i in $(seq $((prev + NOTICES)) $((prev + NOTICES + FAILS - 1))); do fails+=("n$i"); done
  "${F[@]}" requests "$DIR" "$SD/req-expiry-0.json"
  "${F[@]}" not-ready "$DIR" "$TOLERATION" "${fails[@]}" >"$SD/expiry.out"
  sleep $((TOLERATION + 15))
  "${F[@]}" requests "$DIR" "$SD/req-expiry-1.json"
  engine_counters "$SD/engine-end.txt"   # after the expiry: due paths taken, reconciles held
  for w in notices expiry; do "${F[@]}" histograms "$SD/req-$w-0.json" "$SD/req-$w-1.json" >"$SD/histograms-$w.json"; done
  accepted=$(ctl_metric nodekeeper_connections_accepted_total)
  shed=$(ctl_metric nodekeeper_reports_shed_total)
  engine="$(ctl_metric nodekeeper_engine_reconciles_total) $(ctl_metric nodekeeper_engine_node_write_conflicts_total)"
  # The agents' lines (notices, their posts) from both simulators when the noticing ones ran apart.
  cat "$SD/agents.out" ${NOTICED_PID:+"$SD/noticed.out"} >"$SD/events.out"
  [ "${AUDIT:-0}" != 1 ] || "${F[@]}" audit "$DIR/logs/audit.log" "$SD/controller.log" "$SD/events.out" >"$SD/audit.json"
  [ "${GCTRACE:-0}" != 1 ] || [ "${AUDIT:-0}" != 1 ] || "${F[@]}" gc "$DIR" "$SD/audit.json" >"$SD/gc.json"
  stop_tracked "${TRACKED[@]}"  # the noticing agents, the fleet, the watch, the controller
  NOTICED_PID="" AGENTS_PID="" CTL_PID=""
  python3 - "$SD" "$n" "$pods" "$open" "$accepted" "$shed" "$engine" "$((t2 - t0))" "$K8S" \
    "$("${F[@]}" latency "$SD/events.out" "$SD/expiry.out" "$SD/watch.log" "$SD/controller.log")" \
    "$("${F[@]}" delays "$SD/delay-notices-0.txt" "$SD/delay-notices-1.txt")" >>"$RESULTS" <<'EOF'
import json, os, sys
sd, n, pods, open_, accepted, shed, engine, grow, k8s, lat, delays = sys.argv[1:]
hist = {w: json.load(open(f"{sd}/histograms-{w}.json")) for w in ("notices", "expiry")}
try:
    audit = json.load(open(f"{sd}/audit.json"))
except FileNotFoundError:
    audit = None
try:
    gc = json.load(open(f"{sd}/gc.json"))
except FileNotFoundError:
    gc = None
reconciles, conflicts = (engine.split() + ["", ""])[:2]
ph = {p: json.load(open(f"{sd}/{p}.json")) for p in ("base", "idle", "agents")}
def rate(p):
    a, b = (json.load(open(f"{sd}/req-{p}-{i}.json")) for i in (0, 1))
    return {k: (v - a["total"].get(k, 0)) / (b["t"] - a["t"]) for k, v in b["total"].items()}
rates = {p: rate(p) for p in ph}
extra = {k: round(v - rates["base"].get(k, 0), 1) for k, v in rates["agents"].items()}
top = dict(sorted(((k, v) for k, v in extra.items() if abs(v) >= 0.5), key=lambda kv: -abs(kv[1]))[:8])
print(json.dumps({"nodes": int(n), "pods": int(pods), "k8s": k8s, "grow_s": int(grow),
                  "connections_open": open_, "accepted_total": accepted, "reports_shed_total": shed,
                  "reconciles_total": reconciles, "node_write_conflicts_total": conflicts, "phases": ph,
                  "apiserver_req_per_s": {p: round(sum(r.values()), 1) for p, r in rates.items()},
                  "agents_minus_base_req_per_s": top, "latency": json.loads(lat), "apiserver_histograms": hist,
                  "cordon_audit": audit, "gc": gc, "scheduling_delay_notices": json.loads(delays),
                  "notices_window": json.load(open(f"{sd}/notices.json")),
                  "fleet_nice": os.environ.get("FLEET_NICE"), "notice_apart": os.environ["NOTICE_APART"] == "1", "pools": int(os.environ["POOLS"])}))
EOF
  tail -1 "$RESULTS" >&2
  prev=$n
done
log "results: $RESULTS"
python3 - "$RESULTS" <<'EOF'
import json, sys
print("| nodes | pods | controller RSS idle / agents (max) MiB | controller CPU agents m | apiserver RSS base → agents MiB | apiserver CPU base → agents m | etcd RSS base → agents MiB | API req/s base → agents | notice→cordon p50/p99 ms: watch (controller log) | decision p50/p99 ms: watch (controller log) [Ready=False posted late: n, max ms] | change→visible p50/p99 ms | load |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line); p = r["phases"]; l = r["latency"]
    c, a, e = p["agents"]["controller"], p["agents"]["apiserver"], p["agents"]["etcd"]
    print(f'| {r["nodes"]} | {r["pods"]} | {p["idle"]["controller"]["rss_mib_end"]} / {c["rss_mib_end"]} ({c["rss_mib_max"]}) | {c["cpu_millicores"]} '
          f'| {p["base"]["apiserver"]["rss_mib_end"]} → {a["rss_mib_end"]} | {p["base"]["apiserver"]["cpu_millicores"]} → {a["cpu_millicores"]} '
          f'| {p["base"]["etcd"]["rss_mib_end"]} → {e["rss_mib_end"]} | {r["apiserver_req_per_s"]["base"]} → {r["apiserver_req_per_s"]["agents"]} '
          f'| {l["notice"]["p50_ms"]}/{l["notice"]["p99_ms"]} ({l["notice"]["acted_p50_ms"]}/{l["notice"]["acted_p99_ms"]}) ({l["notice"]["cordoned"]}/{l["notice"]["sent"]}) '
          f'| {l["expiry"]["p50_ms"]}/{l["expiry"]["p99_ms"]} ({l["expiry"]["acted_p50_ms"]}/{l["expiry"]["acted_p99_ms"]}) ({l["expiry"]["cordoned"]}/{l["expiry"]["sent"]}) [{l["expiry"].get("posted_late", "?")}, {l["expiry"].get("posted_late_max_ms", "?")}] '
          f'| {l["change"]["p50_ms"]}/{l["change"]["p99_ms"]} | {" ".join(p["agents"]["loadavg"])} |')
print("\nkube-apiserver's histograms (requests; p50 / p99 at most, bucket bounds, s) around the notices and the expiry:")
for line in open(sys.argv[1]):
    r = json.loads(line)
    for w, h in r.get("apiserver_histograms", {}).items():
        for series, v in sorted(h.items()):
            print(f'  {r["nodes"]} nodes, {w}: {series}: {v["n"]}; {v["p50_le_s"]} / {v["p99_le_s"]}')
for line in open(sys.argv[1]):
    r = json.loads(line)
    for probe, d in r.get("scheduling_delay_notices", {}).items():
        print(f'controller scheduling delay during the notices at {r["nodes"]} nodes, probe {probe}: {d["n"]} samples, '
              + ", ".join(f'{d[f"over_{s}s"]} over {s} s' for s in ("0.1", "0.25", "0.5", "1")))
    w = r.get("notices_window")
    if w:
        m = w["machine"]
        print(f'the notices\' window at {r["nodes"]} nodes ({w["seconds"]} s): the machine {m["busy_pct"]} % busy '
              f'({m["busy_pct_max_tick"]} % in its busiest 0.5 s), runnable tasks p50 {m["runnable_p50"]}, max {m["runnable_max"]}; CPU m: '
              + ", ".join(f'{k} {v["cpu_millicores"]}' for k, v in w.items() if isinstance(v, dict) and "cpu_millicores" in v))
        if "steal_pct" in m:
            print(f'  of it stolen by the hypervisor: {m["steal_pct"]} % ({m["steal_pct_max_tick"]} % in one 0.5 s); '
                  f'ticks with 10 % or more (end, s since the epoch; %): {m["steal_ticks"]}')
    for series, v in r.get("apiserver_histograms", {}).get("notices", {}).items():
        if series.startswith("go_sched"):
            print(f'kube-apiserver goroutines during the notices at {r["nodes"]} nodes: {v["n"]} waits to run, '
                  + ", ".join(f'{n} over {float(le) * 1000:.1f} ms' for le, n in v["over_s"].items()))
for line in open(sys.argv[1]):
    r = json.loads(line); a = r.get("cordon_audit")
    if a:
        print(f'\nnotice → cordon at {r["nodes"]} nodes by the audit log ({a["matched"]} of {a["cordons"]} cordons; p50 / p99 ms): '
              + ", ".join(f'{k} {a[k]["p50_ms"]} / {a[k]["p99_ms"]}' for k in ("client", "server", "before", "after")))
        for s in a["slowest"]:
            print(f'  slowest: {s}')
        if "delivery" in a:
            print('  before the PATCH (p50 / p99 ms): '
                  + ", ".join(f'{k} {a[k]["p50_ms"]} / {a[k]["p99_ms"]}'
                              for k in ("delivery", "send", "wire", "handler", "engine", "hop", "queued", "decided")
                              if k in a))
            for s in a.get("slowest_before_patch", []):
                split = f' (send {s["send"]:.1f}, wire {s["wire"]:.1f})' if "send" in s else ""
                turn = (f' (hop {s["hop"]:.1f}, queued {s["queued"]:.1f}, decided {s["decided"]:.1f})'
                        if "queued" in s else "")
                print(f'  slowest before its PATCH: {s["node"]}: delivery {s["delivery"]:.1f}{split}, '
                      f'handler {s["handler"]:.1f}, engine {s["engine"]:.1f}{turn} ms')
    g = r.get("gc")
    if g:
        print(f'garbage collections at {r["nodes"]} nodes (cycles; wall p50 / max ms; CPU p50 / max ms; in the notices): '
              + "; ".join(f'{k} {c["cycles"]}; {c["wall_ms_p50"]} / {c["wall_ms_max"]}; {c["cpu_ms_p50"]} / {c["cpu_ms_max"]}; '
                          f'{c["in_notices"]}' for k, c in g["components"].items()))
        for side in ("inside", "outside"):
            s = g[side]
            print(f'  notices {side} kube-apiserver\'s marking: {s["n"]}; '
                  + ", ".join(f'{k} p50 {s[k]["p50_ms"]} max {s[k]["max_ms"]} ms' for k in ("client", "delivery") if k in s))
EOF
