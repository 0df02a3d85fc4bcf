# shellcheck shell=bash
# What every benchmark script shares. Source it first, in place of scripts/lib.sh:
#   . "$(dirname "$0")/lib/bench.sh"
# It sources scripts/lib.sh (REPO, log, apt_install, track / at_exit / stop_tracked / run_exit_hooks, real_cluster)
# and makes the script fail loudly: any command that fails under `set -e` prints its file, line and text
# before the script exits, and on exit (however it exits) every process the script tracked is stopped and its
# at_exit commands run. The helpers below for the real control plane expect DIR (the `k8s-cluster.sh up`
# directory) and k() (the real kubectl with DIR's admin kubeconfig: the harness, never a nodekeeper process).
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
BENCH="bench/$(basename "$0")"
set -E  # the ERR trap in functions and subshells too
trap 'bench_failed "$?" "$LINENO" "$BASH_COMMAND"' ERR
# bench_failed STATUS LINE COMMAND: the message of the ERR trap (once: a subshell's failure is named by its
# parent's line too).
bench_failed() {
  [ "$BASH_SUBSHELL" -eq 0 ] || return 0
  echo "$BENCH: failed (exit $1) at ${BASH_SOURCE[1]#"$REPO"/}:$2: $3" >&2
}
# die MESSAGE: the script's own error, named, then exit 1 (the exit hooks still run).
die() { echo "$BENCH: $*" >&2; exit 1; }

# setup_real: the real kubectl (KUBECTL), the control plane's binaries (scripts/setup-k8s.sh, built once) and
# their versions (tools/k8s/versions.env: K8S_VERSION, …).
setup_real() {
  "$REPO/scripts/setup-kubectl.sh" >/dev/null
  KUBECTL="$REPO/.cache/venv/bin/kubectl"
  "$REPO/scripts/setup-k8s.sh" >/dev/null
  . "$REPO/tools/k8s/versions.env"
}

# wait_for SECS WHAT CMD…: runs CMD every 0.5 s until it succeeds; exits the script after SECS.
wait_for() {
  local secs=$1 what=$2 end; shift 2
  end=$(( $(date +%s) + secs ))
  until "$@"; do
    [ "$(date +%s)" -lt $end ] || die "$what not reached in ${secs}s (cluster: ${DIR:-none})"
    sleep 0.5
  done
}

# build_nk PROFILE: builds nodekeeper's full binary (debug, or release) and sets NK to it.
build_nk() {
  if [ "$1" = release ]; then
    log "cargo build --release --bin nodekeeper"; cargo build --release --bin nodekeeper
  else
    log "cargo build --bin nodekeeper"; cargo build --bin nodekeeper
  fi
  NK="$REPO/target/$1/nodekeeper"
}

# kwok_nodes NAME…: KWOK nodes (KWOK plays their kubelet: Ready, pods Running), all of the same shape
# (8 CPU, 32 Gi, 110 pods), created by one apply.
kwok_nodes() {
  local n
  for n in "$@"; do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels: {kubernetes.io/hostname: $n, kubernetes.io/os: linux, kubernetes.io/arch: amd64, node.kubernetes.io/instance-type: m5.2xlarge}
  annotations: {kwok.x-k8s.io/node: fake}
spec: {providerID: "kwok://$n"}
status:
  allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
  capacity: {cpu: "8", memory: 32Gi, pods: "110"}
EOF
  done | k apply -f - >/dev/null
}

# not_ready EXPIRY NODE…: Ready=False since EXPIRY - 10 min (so 10-minute tolerations run out at EXPIRY, a Unix
# second), KWOK kept off the status by the label nodekeeper.test/kubelet=not-ready (set on every node first);
# the status patches are sent in parallel, so that the nodes turn NotReady within a few tens of ms.
not_ready() {
  local expiry=$1; shift
  node_condition "$expiry" 600 Ready False KubeletNotReady "container runtime network not ready: NetworkReady=false" "$@"
}

# node_condition EXPIRY SECS TYPE STATUS REASON MESSAGE NODE…: the condition TYPE=STATUS patched into each NODE's
# status (in parallel), its lastTransitionTime SECS before EXPIRY (epoch seconds): a toleration of SECS runs out then.
node_condition() {
  local expiry=$1 secs=$2 type=$3 status=$4 reason=$5 message=$6 n ago now pids=(); shift 6
  ago=$(date -u -d "@$(( expiry - secs ))" +%Y-%m-%dT%H:%M:%SZ)
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for n in "$@"; do
    k patch node "$n" --subresource=status --type=strategic -p "{\"status\":{\"conditions\":[{\"type\":\"$type\",\"status\":\"$status\",\"reason\":\"$reason\",\"message\":\"$message\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$ago\"}]}}" >/dev/null &
    pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n"; done
}

# start_nk_controller NK: nodekeeper's controller (binary NK) with its shipped config (acting) on a loopback
# port, as its ServiceAccount (a TokenRequest token, 6 h), logging to DIR/logs/nodekeeper-controller.log.
# Sets CTL_PORT, CTL_PID and DIR/nk-tls (tls.crt: the agents' CA). NK_CONTROLLER_SET: TOML lines added to the
# [controller] table (e.g. 'heartbeat_write_interval = "5m"'), for a variant of the shipped config. NK_LOG: its
# log level or directives (default info).
start_nk_controller() {
  CTL_PORT=$(free_port)
  loopback_tls "$DIR/nk-tls"
  token_kubeconfig "$DIR" "$(k -n nodekeeper create token nodekeeper-controller --duration=6h)" "$DIR/nk-controller.kubeconfig"
  shipped_controller_config "127.0.0.1:$CTL_PORT" "$DIR/nk-tls" |
    awk -v set="${NK_CONTROLLER_SET:-}" '{ print } /^\[controller\]$/ && set != "" { print set }' >"$DIR/nk-controller.toml"
  KUBECONFIG="$DIR/nk-controller.kubeconfig" NODEKEEPER_LOG_FORMAT=json NODEKEEPER_LOG_LEVEL="${NK_LOG:-info}" \
    "$1" controller --config "$DIR/nk-controller.toml" >"$DIR/logs/nodekeeper-controller.log" 2>&1 &
  CTL_PID=$!
  track "$CTL_PID"
}

# shipped_agent_config RUNDIR: the shipped agent config.toml (manifests/12-agent-config.yaml) on stdout, pointed
# at the controller on CTL_PORT (CA DIR/nk-tls/tls.crt), with its report token at RUNDIR/report-token and its
# state and CRI-O drop-ins under RUNDIR. Callers append their own sections (or sed the [sources] line).
shipped_agent_config() {
  awk '/config.toml: \|/ {on=1; next} on { sub(/^    /, ""); print }' "$REPO/manifests/12-agent-config.yaml" |
    sed -e "s|^url = .*|url = \"https://127.0.0.1:$CTL_PORT\"|" -e "s|^ca_file = .*|ca_file = \"$DIR/nk-tls/tls.crt\"|" \
        -e '/^server_name = /d' -e "s|^token_file = .*|token_file = \"$1/report-token\"|" \
        -e "s|^state_dir = .*|state_dir = \"$1/state\"\ndropin_dir = \"$1/crio.conf.d\"|"
}

# token_kubeconfig DIR TOKEN OUT: a kubeconfig for the `k8s-cluster.sh up` cluster in DIR that authenticates
# with TOKEN (a ServiceAccount's, from `kubectl create token`): a tool run outside a pod as its ServiceAccount.
token_kubeconfig() {
  local dir=$1 token=$2 out=$3 server
  server=$(awk '/server:/ {print $2; exit}' "$dir/kubeconfig")
  cat >"$out" <<EOC
apiVersion: v1
kind: Config
clusters: [{name: real, cluster: {server: $server, certificate-authority: $dir/pki/ca.crt}}]
users: [{name: sa, user: {token: $token}}]
contexts: [{name: real, context: {cluster: real, user: sa}}]
current-context: real
EOC
}

# loopback_tls OUTDIR: a self-signed certificate for 127.0.0.1 and the shipped Service's name
# nodekeeper-controller.nodekeeper.svc (the server name bench/examples/controller_bench.rs's agents pin):
# OUTDIR/tls.crt (also the agents' CA) and OUTDIR/tls.key. An end-entity certificate (CA:FALSE): `req -x509`
# marks it a CA by default, which rustls (webpki) refuses as a server's certificate (CaUsedAsEndEntity).
loopback_tls() {
  mkdir -p "$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=nodekeeper-controller \
    -addext "subjectAltName=IP:127.0.0.1,DNS:nodekeeper-controller.nodekeeper.svc" -addext "basicConstraints=critical,CA:FALSE" \
    -addext "keyUsage=critical,digitalSignature" -addext "extendedKeyUsage=serverAuth" -keyout "$1/tls.key" -out "$1/tls.crt" 2>/dev/null
}

# shipped_controller_config LISTEN TLSDIR: the controller's shipped config.toml (manifests/21-controller-config.yaml)
# on stdout, run outside the cluster: listening on LISTEN with TLSDIR's files, and acting (dry_run off).
shipped_controller_config() {
  awk '/config.toml: \|/ {on=1; next} on { sub(/^    /, ""); print }' "$REPO/manifests/21-controller-config.yaml" |
    sed -e "s|^listen = .*|listen = \"$1\"|" \
        -e "s|^tls_cert_file = .*|tls_cert_file = \"$2/tls.crt\"|" -e "s|^tls_key_file = .*|tls_key_file = \"$2/tls.key\"|" \
        -e 's|^dry_run = true|dry_run = false|'
}

# free_port: a TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
