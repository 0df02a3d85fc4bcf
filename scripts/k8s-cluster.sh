#!/usr/bin/env bash
# A real, local Kubernetes control plane on loopback for nodekeeper's tests and `demo --real`:
# etcd, kube-apiserver (Node,RBAC authorization, bound ServiceAccount tokens, TokenReview, admission),
# kube-controller-manager, kube-scheduler and KWOK (plays kubelet for nodes annotated kwok.x-k8s.io/node=fake),
# and on request Karpenter's KWOK provider (--karpenter).
#
#   scripts/k8s-cluster.sh up DIR [--owner-pid PID] [--audit | --audit-policy FILE] [--karpenter [--karpenter-feature-gates GATES]]
#                                                     start everything; returns once all are healthy.
#                                                     --audit: kube-apiserver writes an audit log of every
#                                                     request at Metadata level (who, verb, resource, code,
#                                                     user agent; no bodies) to DIR/logs/audit.log, JSON
#                                                     lines: the API load per caller (bench/lib/api-load.py)
#                                                     --audit-policy: the same log, of what FILE's audit
#                                                     policy selects (e.g. one caller's writes, cheap at scale)
#                                                     --karpenter: also Karpenter's KWOK provider (its CRDs
#                                                     installed and Established, its chart's RBAC bound to a
#                                                     client certificate of its own, leader election off)
#                                                     --karpenter-feature-gates: its FEATURE_GATES env, e.g.
#                                                     NodeRepair=true (unset: Karpenter's defaults, NodeRepair off)
#   scripts/k8s-cluster.sh down DIR                   stop exactly what `up` started (by PID), keep the logs
#   scripts/k8s-cluster.sh install DIR [FILE…]        apply the shipped manifests (`kubectl kustomize manifests/`,
#                                                     without the controller Deployment, which the tests and the
#                                                     demo run themselves; the Prometheus Operator's objects are an
#                                                     opt-in component, not in it), then FILEs, with the real kubectl
#
# Feature gates: NodeLifecycleConditions (alpha in 1.37, KEP-5683) on kube-apiserver and kube-controller-manager,
# the lifecycle conditions nodekeeper sets around its drains (docs/drain.md).
# Node heartbeats: KWOK's node Leases last 10 s and kube-controller-manager marks a node NotReady 8 s after its
# last one (fast tests); K8S_NODE_LEASE_SECONDS and K8S_NODE_MONITOR_GRACE override both (e.g. 40 and 50s, the
# kubelet's and kube-controller-manager's defaults, for thousands of nodes: bench/scale-real.sh).
# K8S_GODEBUG: GODEBUG for the components only (e.g. gctrace=1: each garbage collection of their Go runtimes is
# a line of their logs, `gc N @SECONDS_SINCE_START …`; DIR/pids holds each start, in clock ticks since boot).
#
# `up` writes DIR/kubeconfig (the harness's admin: O=system:masters — never given to a nodekeeper process),
# DIR/env (`export KUBECONFIG=…`), DIR/ports, DIR/pids, and one log per component in DIR/logs/.
# With --owner-pid, a watcher runs `down DIR` when that process exits (test binaries use this).
# The binaries come from scripts/setup-k8s.sh (built on first use). Ports are free loopback ports.
# A component that fails to start: one message naming it and its log, everything stopped, exit 1.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { echo "usage: $0 up DIR [--owner-pid PID] [--audit | --audit-policy FILE] [--karpenter [--karpenter-feature-gates GATES]] | down DIR | install DIR [FILE…]" >&2; exit 2; }
[ $# -ge 2 ] || usage
CMD=$1 DIR=$2; shift 2
OWNER="" KARPENTER="" KARPENTER_GATES=() AUDIT=() AUDIT_POLICY=""
while [ "$CMD" != install ] && [ $# -gt 0 ]; do
  case $1 in
    --owner-pid) OWNER=${2:?--owner-pid needs a PID}; shift 2 ;;
    --karpenter) KARPENTER=1; shift ;;
    --audit) AUDIT=(1); shift ;;
    --audit-policy) AUDIT=(1) AUDIT_POLICY=${2:?--audit-policy needs a FILE}; shift 2 ;;
    --karpenter-feature-gates) KARPENTER_GATES=(FEATURE_GATES="${2:?--karpenter-feature-gates needs GATES}"); shift 2 ;;
    *) usage ;;
  esac
done

# stop PIDFILE-lines: SIGTERM each recorded PID (only if it is still the process we started), then SIGKILL.
down() {
  local pids="$DIR/pids" name pid start
  [ -f "$pids" ] || return 0
  tac "$pids" | while read -r name pid start; do
    if [ "$(proc_start "$pid")" = "$start" ]; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  wait_gone "$pids"
  while read -r name pid start; do
    if [ "$(proc_start "$pid")" = "$start" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
  done <"$pids"
  wait_gone "$pids"   # SIGKILL is not instant: return only once every process is gone
  mv -f "$pids" "$pids.stopped"
}

# wait_gone PIDFILE: waits up to 5 s until none of its processes runs.
wait_gone() {
  local i alive name pid start
  for i in $(seq 1 50); do
    alive=0
    while read -r name pid start; do
      [ "$(proc_start "$pid")" = "$start" ] && alive=1
    done <"$1"
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
}

# proc_start PID: the process's start time in clock ticks (field 22 of /proc/PID/stat), "" if gone or a
# zombie. Guards against a recycled PID: we only signal a PID whose start time is the one we recorded.
proc_start() { awk '$3 != "Z" {print $22}' "/proc/$1/stat" 2>/dev/null || true; }

# install DIR [FILE…]: the shipped manifests minus what the cluster cannot or should not run, then FILEs.
install() {
  local kubectl="$REPO/.cache/venv/bin/kubectl" out="$DIR/manifests.yaml" extra=() f
  [ -x "$kubectl" ] || { echo "k8s-cluster: real kubectl not found at $kubectl (run scripts/setup-kubectl.sh)" >&2; exit 1; }
  [ -f "$DIR/kubeconfig" ] || { echo "k8s-cluster: no cluster at $DIR (run: $0 up $DIR)" >&2; exit 1; }
  "$kubectl" kustomize "$REPO/manifests" | awk '
    function flush() { if (doc != "" && !(doc ~ /kind: Deployment/ && doc ~ /name: nodekeeper-controller/)) {
                         printf "%s%s", sep, doc; sep = "---\n" }
                       doc = "" }
    /^---$/ { flush(); next }
    { doc = doc $0 "\n" }
    END { flush() }' >"$out"
  for f in "$@"; do extra+=(-f "$f"); done
  "$kubectl" --kubeconfig "$DIR/kubeconfig" apply -f "$out" "${extra[@]}"
}

case $CMD in
  down) down; exit 0 ;;
  install) install "$@"; exit 0 ;;
  up) ;;
  *) usage ;;
esac

mkdir -p "$DIR"/{logs,pki,etcd}
DIR="$(cd "$DIR" && pwd)"
if [ -s "$DIR/pids" ]; then
  echo "k8s-cluster: $DIR already has a running cluster (run: $0 down $DIR)" >&2
  exit 1
fi
: >"$DIR/pids"

fail() {
  echo "k8s-cluster: $*" >&2
  down
  exit 1
}
trap 'fail "interrupted"' INT TERM

command -v openssl >/dev/null || fail "openssl is not installed (scripts/setup.sh installs it)"
command -v curl >/dev/null || fail "curl is not installed"
BIN=$("$REPO/scripts/setup-k8s.sh" --print 2>/dev/null) || {
  echo "k8s-cluster: building the control plane first (scripts/setup-k8s.sh) …" >&2
  BIN=$("$REPO/scripts/setup-k8s.sh" | tail -1) || fail "building the control plane failed (see above)"
}
STAGES="$BIN/../kwok-stages"
t0=$(date +%s.%N)

# ---- certificates (ECDSA P-256; the SA signing key RSA 2048, as kube-apiserver's default algorithm RS256 wants)
PKI="$DIR/pki"
ossl() { openssl "$@" 2>>"$DIR/logs/pki.log" >/dev/null || fail "openssl $1 failed; log: $DIR/logs/pki.log"; }
ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key"
ossl req -x509 -new -key "$PKI/ca.key" -subj "/CN=nodekeeper-test-ca" -days 7 -out "$PKI/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
# leaf NAME SUBJECT EXT
leaf() {
  ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/$1.key"
  ossl req -new -key "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr"
  printf '%s\n' "$3" >"$PKI/$1.ext"
  ossl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 7 \
    -extfile "$PKI/$1.ext" -out "$PKI/$1.crt"
}
# 10.0.0.1: the `kubernetes` Service, as pods on a real node (scripts/k8s-node.sh) reach it.
SERVER_EXT="subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature"
CLIENT_EXT="extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
leaf apiserver "/CN=kube-apiserver" "$SERVER_EXT"
leaf admin "/O=system:masters/CN=nodekeeper-test-admin" "$CLIENT_EXT"
leaf kcm "/CN=system:kube-controller-manager" "$CLIENT_EXT"
# kube-apiserver → kubelet (logs, exec, port-forward on a real node: scripts/k8s-node.sh), as kubeadm's
# apiserver-kubelet-client: the kubelet authorizes it by SubjectAccessReview.
leaf apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client" "$CLIENT_EXT"
leaf scheduler "/CN=system:kube-scheduler" "$CLIENT_EXT"
# KWOK plays every kubelet (node status, leases, pod status, pod deletion): test infrastructure, so admin.
leaf kwok "/O=system:masters/CN=kwok" "$CLIENT_EXT"
# Karpenter: a user of its own, given exactly the RBAC of its chart (tools/k8s/karpenter/rbac.yaml).
[ -z "$KARPENTER" ] || leaf karpenter "/CN=nodekeeper-test-karpenter" "$CLIENT_EXT"
ossl genrsa -out "$PKI/sa.key" 2048
ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"


# start NAME CMD...: runs CMD in its own session with output to DIR/logs/NAME.log, records "NAME PID START".
start() {
  local name=$1; shift
  setsid env ${K8S_GODEBUG:+GODEBUG="$K8S_GODEBUG"} "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
  local pid=$!
  local st=""
  for _ in 1 2 3 4 5; do st=$(proc_start $pid); [ -n "$st" ] && break; sleep 0.01; done
  echo "$name $pid $st" >>"$DIR/pids"
}

# free_ports N: N free loopback ports, asked of the kernel (bound to port 0, then closed).
free_ports() {
  python3 -c 'import socket,sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}

# listener PORT: the PID that listens on TCP PORT (any address), "" if none does.
# "?" if one does but its PID is not shown (another user's process, when not run as root).
listener() {
  local line
  line=$(ss -Hltnp "sport = :$1" 2>/dev/null | head -1) || true
  [ -z "$line" ] && return 0
  [[ $line =~ pid=([0-9]+) ]] && echo "${BASH_REMATCH[1]}" || echo "?"
}

# serve NAME SECONDS N CMD… -- CURL-ARGS…: starts a component on N free loopback ports (@P1@…@PN@ in CMD and
# CURL-ARGS stand for them) and waits until curl succeeds AND the component itself listens on each port.
# The binaries cannot report a port of their own choice, so the ports are picked beforehand, and another
# process may be given one of them before the component binds it: then the component fails to bind
# ("address already in use") or a stranger answers its health check. Either way it is stopped and started
# again on new ports, at most 3 times. Sets PORTS to the ports it got. Any other failure: fail, naming it.
# `--state DIR` (before CMD): the component writes its ports into DIR on its first start (etcd's member
# and cluster records hold its peer URL), so DIR is emptied before it starts again on new ports.
serve() {
  local name=$1 secs=$2 n=$3; shift 3
  local cmd=() check=() state="" try i pid end owner mine
  [ "$1" = --state ] && { state=$2; shift 2; }
  while [ "$1" != -- ]; do cmd+=("$1"); shift; done
  shift; check=("$@")
  for try in 1 2 3; do
    if [ "$try" -gt 1 ] && [ -n "$state" ]; then
      rm -rf "$state" && mkdir -p "$state"
    fi
    read -r -a PORTS <<<"$(free_ports "$n")"
    local c=("${cmd[@]}") k=("${check[@]}")
    for i in "${!PORTS[@]}"; do
      c=("${c[@]//@P$((i + 1))@/${PORTS[$i]}}"); k=("${k[@]//@P$((i + 1))@/${PORTS[$i]}}")
    done
    start "$name" "${c[@]}"
    pid=$(awk -v n="$name" '$1==n {p=$2} END {print p}' "$DIR/pids")
    end=$(( $(date +%s) + secs ))
    while :; do
      if ! kill -0 "$pid" 2>/dev/null; then
        grep -q "address already in use" "$DIR/logs/$name.log" && break
        tail -15 "$DIR/logs/$name.log" >&2
        fail "$name exited at start; log: $DIR/logs/$name.log"
      fi
      mine=0 owner=""
      for i in "${PORTS[@]}"; do
        owner=$(listener "$i")
        [ "$owner" = "$pid" ] && mine=$((mine + 1))
        [ -n "$owner" ] && [ "$owner" != "$pid" ] && break
        owner=""
      done
      [ -n "$owner" ] && break   # a stranger holds one of the ports
      [ $mine = "$n" ] && curl -fsS --max-time 2 "${k[@]}" >/dev/null 2>&1 && return 0
      if [ "$(date +%s)" -ge $end ]; then
        tail -15 "$DIR/logs/$name.log" >&2
        fail "$name was not healthy after ${secs}s; log: $DIR/logs/$name.log"
      fi
      sleep 0.2
    done
    echo "k8s-cluster: $name: a port picked for it was taken meanwhile (try $try); starting it on new ports" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true   # (and no "Killed" line from bash)
    mv -f "$DIR/logs/$name.log" "$DIR/logs/$name.try$try.log"
    awk -v n="$name" '$1 != n' "$DIR/pids" >"$DIR/pids.tmp" && mv -f "$DIR/pids.tmp" "$DIR/pids"
  done
  fail "$name: its picked ports were taken 3 times; logs: $DIR/logs/$name.try*.log"
}

# kubeconfig FILE CERTNAME
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $API
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: local
  context: {cluster: local, user: $2}
current-context: local
EOF
}
serve etcd 20 2 --state "$DIR/etcd" "$BIN/etcd" --name local --data-dir "$DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:@P1@" --advertise-client-urls "http://127.0.0.1:@P1@" \
  --listen-peer-urls "http://127.0.0.1:@P2@" --initial-advertise-peer-urls "http://127.0.0.1:@P2@" \
  --initial-cluster "local=http://127.0.0.1:@P2@" --unsafe-no-fsync --log-level warn \
  -- "http://127.0.0.1:@P1@/health"
P_ETCD=${PORTS[0]}

if [ ${#AUDIT[@]} -gt 0 ]; then
  # Metadata level: one JSON line per request and stage (user, user agent, verb, URI, code), no bodies;
  # RequestReceived omitted, so a request has one ResponseComplete line (a watch also a ResponseStarted).
  if [ -n "$AUDIT_POLICY" ]; then
    cp "$AUDIT_POLICY" "$DIR/audit-policy.yaml"
  else
    cat >"$DIR/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules: [{level: Metadata}]
EOF
  fi
  AUDIT=(--audit-policy-file="$DIR/audit-policy.yaml" --audit-log-path="$DIR/logs/audit.log" --audit-log-format=json
         --audit-log-maxsize=0 --audit-log-maxbackup=0)
fi
serve kube-apiserver 60 1 "$BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$P_ETCD" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=@P1@ \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet.crt" --kubelet-client-key="$PKI/apiserver-kubelet.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --authorization-mode=Node,RBAC \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-lookup=true \
  --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
  --enable-admission-plugins=NodeRestriction \
  --endpoint-reconciler-type=none \
  --feature-gates=NodeLifecycleConditions=true \
  --profiling=false ${AUDIT[@]+"${AUDIT[@]}"} \
  -- --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:@P1@/readyz"
P_API=${PORTS[0]}
API="https://127.0.0.1:$P_API"
kubeconfig "$DIR/kubeconfig" admin
for c in kcm scheduler kwok; do kubeconfig "$DIR/$c.kubeconfig" $c; done
[ -z "$KARPENTER" ] || kubeconfig "$DIR/karpenter.kubeconfig" karpenter

serve kube-controller-manager 40 1 "$BIN/kube-controller-manager" \
  --kubeconfig="$DIR/kcm.kubeconfig" \
  --authentication-kubeconfig="$DIR/kcm.kubeconfig" --authorization-kubeconfig="$DIR/kcm.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=@P1@ --leader-elect=false \
  --use-service-account-credentials=true \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --controllers=serviceaccount-token-controller,serviceaccount-controller,namespace-controller,root-ca-certificate-publisher-controller,garbage-collector-controller,replicaset-controller,deployment-controller,statefulset-controller,daemonset-controller,endpointslice-controller,disruption-controller,node-lifecycle-controller,taint-eviction-controller,pod-garbage-collector-controller,validatingadmissionpolicy-status-controller \
  --node-monitor-period=1s --node-monitor-grace-period="${K8S_NODE_MONITOR_GRACE:-8s}" --node-startup-grace-period=20s \
  --concurrent-gc-syncs=5 --profiling=false --feature-gates=NodeLifecycleConditions=true \
  -- -k "https://127.0.0.1:@P1@/healthz"
P_KCM=${PORTS[0]}

cat >"$DIR/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $DIR/scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
serve kube-scheduler 30 1 "$BIN/kube-scheduler" --config="$DIR/scheduler.yaml" \
  --authentication-kubeconfig="$DIR/scheduler.kubeconfig" --authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=@P1@ --profiling=false -- -k "https://127.0.0.1:@P1@/healthz"
P_SCHED=${PORTS[0]}

stage_args=()
for f in "$STAGES"/*.yaml; do stage_args+=(--config "$f"); done
serve kwok 20 1 "$BIN/kwok" --kubeconfig="$DIR/kwok.kubeconfig" \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds="${K8S_NODE_LEASE_SECONDS:-10}" \
  --server-address="127.0.0.1:@P1@" --node-ip=127.0.0.1 "${stage_args[@]}" -- "http://127.0.0.1:@P1@/healthz"
P_KWOK=${PORTS[0]}
cat >"$DIR/ports" <<EOF
etcd=$P_ETCD
kube-apiserver=$P_API
kube-controller-manager=$P_KCM
kube-scheduler=$P_SCHED
kwok=$P_KWOK
EOF

# The default ServiceAccount exists once kcm's serviceaccount controller ran: pods are refused before that.
end=$(( $(date +%s) + 30 ))
until curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "$API/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1; do
  [ "$(date +%s)" -ge $end ] && fail "the default ServiceAccount did not appear; log: $DIR/logs/kube-controller-manager.log"
  sleep 0.2
done

if [ -n "$KARPENTER" ]; then
  # CRDs (from the module, copied by setup-k8s.sh) and the chart's RBAC, applied as the admin; Karpenter's
  # readiness check needs NodePool and NodeClaim served, so wait until they are Established.
  KUBECTL="$REPO/.cache/venv/bin/kubectl"
  [ -x "$KUBECTL" ] || fail "real kubectl not found at $KUBECTL (run scripts/setup-kubectl.sh); --karpenter needs it"
  CRDS="$BIN/../karpenter-crds"
  kc() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@" >>"$DIR/logs/karpenter-setup.log" 2>&1; }
  kc apply -f "$CRDS" -f "$REPO/tools/k8s/karpenter/rbac.yaml" \
    || fail "applying Karpenter's CRDs and RBAC failed; log: $DIR/logs/karpenter-setup.log"
  kc wait --for condition=Established --timeout=30s crd/nodepools.karpenter.sh crd/nodeclaims.karpenter.sh \
    crd/kwoknodeclasses.karpenter.kwok.sh \
    || fail "Karpenter's CRDs were not Established in 30 s; log: $DIR/logs/karpenter-setup.log"
  # Out of cluster: KUBECONFIG (it has no --kubeconfig flag), no leader election (it would need a namespace
  # it cannot guess out of cluster). It binds metrics and health on ALL interfaces (":PORT", no bind-address
  # setting in v1.14.1): the ports are free loopback ports, the tests talk to 127.0.0.1 only.
  # /readyz: its caches synced and NodePool/NodeClaim mapped.
  serve karpenter-kwok 60 2 env KUBECONFIG="$DIR/karpenter.kubeconfig" DISABLE_LEADER_ELECTION=true \
    METRICS_PORT=@P1@ HEALTH_PROBE_PORT=@P2@ LOG_LEVEL="${KARPENTER_LOG_LEVEL:-info}" \
    ${KARPENTER_GATES[@]+"${KARPENTER_GATES[@]}"} "$BIN/karpenter-kwok" -- "http://127.0.0.1:@P2@/readyz"
  printf 'karpenter-kwok-metrics=%s\nkarpenter-kwok-health=%s\n' "${PORTS[0]}" "${PORTS[1]}" >>"$DIR/ports"
fi

echo "export KUBECONFIG=$DIR/kubeconfig" >"$DIR/env"
if [ -n "$OWNER" ]; then
  # Stops the cluster when the owner (a test binary) exits, however it exits.
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down "$3"' \
    owner-watch "$OWNER" "$REPO/scripts/k8s-cluster.sh" "$DIR" >"$DIR/logs/owner-watch.log" 2>&1 </dev/null &
fi
trap - INT TERM
awk -v a="$t0" -v b="$(date +%s.%N)" -v api="$API" -v k="$DIR/kubeconfig" \
  'BEGIN { printf "k8s-cluster: up in %.1f s: %s (KUBECONFIG=%s)\n", b - a, api, k }' >&2
