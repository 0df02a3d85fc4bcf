#!/usr/bin/env bash
# A real Kubernetes node joined to a `scripts/k8s-cluster.sh up` control plane: kubelet and kube-proxy (built by
# scripts/setup-k8s.sh from the control plane's module, v1.37) over a real CRI-O (scripts/setup-crio.sh), in a
# network namespace of the node's own, so that pods, Services, `kubectl logs` and `exec` work as on a cluster.
#
#   scripts/k8s-node.sh up NODEDIR CLUSTERDIR [--name NAME] [--index N] [--owner-pid PID]
#                                  start the node; returns once the Node is Ready. N (1–250, default 1) picks
#                                  the node's addresses: the link 10.213.N.0/24 (host .1, node .2), pods
#                                  10.244.N.0/24; two nodes on one machine need two indexes.
#   scripts/k8s-node.sh load NODEDIR IMAGE [AS]
#                                  copy IMAGE from scripts/build-image.sh's store into the node's CRI-O, named AS
#                                  (e.g. the manifests' image reference, so that they run unchanged: IfNotPresent)
#   scripts/k8s-node.sh exec NODEDIR CMD…
#                                  run CMD in the node's mount and network namespaces (e.g. mount a disk)
#   scripts/k8s-node.sh run NODEDIR NAME CMD…
#                                  start CMD there in the background, as part of the node (stopped by `stop
#                                  NODEDIR NAME` or `down`; log NODEDIR/logs/NAME.log), e.g. a metadata emulator
#   scripts/k8s-node.sh stop NODEDIR NAME
#   scripts/k8s-node.sh crio NODEDIR stop|start
#                                  stop the node's CRI-O (its containers live on under conmon), start it again
#   scripts/k8s-node.sh down NODEDIR
#                                  remove every pod, stop what `up` started (by PID), unmount, delete the
#                                  namespace; keeps the logs
#
# The node: netns nk-node-N, a veth link to the host (10.213.N.1 ↔ .2), pods on a bridge (CNI bridge +
# host-local, masqueraded), kube-proxy (iptables mode) inside; the kubelet authenticates as system:node:NAME
# (Node authorization, NodeRestriction) and kube-proxy as system:kube-proxy. The control plane listens on
# loopback only: a forwarder (scripts/lib/node/tcp-forward.py) listens on 10.213.N.1:6443 for the node, and an
# EndpointSlice of the `kubernetes` Service points there, so pods reach the API at 10.0.0.1:443. Cluster DNS is
# Kubernetes' own add-on (cluster/addons/dns/coredns of the k8s.io/kubernetes module, unchanged but for its three
# variables) running CoreDNS built from Go modules (scripts/setup-peers.sh coredns) as a pod on the node, at
# the kube-dns Service 10.0.0.10; the kubelet's clusterDNS points there.
#
# What differs from a production node, test-only, each said where it is set (docs/dev/testing.md "The real node"):
# cgroup v1 (`failCgroupV1: false`), a cgroup root of its own (/nk-node-N), CRI-O as a plain process with its
# files under NODEDIR (vfs storage, runc through scripts/lib/node/runc-wrap.py: no CAP_SYS_RESOURCE here), images
# loaded without a registry (a static pause and busybox are built in; CoreDNS's image holds the binary built
# here, under the add-on's own reference), no upstream resolver (names outside the cluster fail fast), image GC
# and disk eviction off (the images cannot be pulled again).
#
# Writes NODEDIR/env (NODE_NAME, NODE_IP, HOST_IP, NETNS, POD_CIDR, CRIO_SOCKET, CRIO_ROOT, CRIO_RUNROOT,
# KUBELET_ROOT), NODEDIR/pids, logs in NODEDIR/logs/. Needs root.
. "$(dirname "$0")/lib.sh"

usage() { echo "usage: $0 up NODEDIR CLUSTERDIR [--name NAME] [--index N] [--owner-pid PID] | load NODEDIR IMAGE [AS] | exec NODEDIR CMD… | run NODEDIR NAME CMD… | stop NODEDIR NAME | crio NODEDIR stop|start | down NODEDIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
CMD=$1 NODEDIR=$2; shift 2
mkdir -p "$NODEDIR/logs"
NODEDIR=$(cd "$NODEDIR" && pwd)
IMAGES_FROM=(--root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)

# proc_start PID: start time in clock ticks ("" if gone or a zombie): a recycled PID is never signalled.
proc_start() { awk '$3 != "Z" {print $22}' "/proc/$1/stat" 2>/dev/null || true; }

node_store() {
  # shellcheck disable=SC1091
  . "$NODEDIR/env"
  STORE=(--root "$CRIO_ROOT" --runroot "$CRIO_RUNROOT" --storage-driver vfs)
}

# start NAME CMD…: in the node's namespaces (one mount namespace for all, so the kubelet's volume mounts are
# CRI-O's), own session, log in NODEDIR/logs/NAME.log, recorded "NAME PID START" in NODEDIR/pids.
start() {
  local name=$1; shift
  setsid nsenter --mount="$NODEDIR/mntns" --net="/run/netns/$NETNS" -- "$@" >"$NODEDIR/logs/$name.log" 2>&1 </dev/null &
  local pid=$! st=""
  for _ in 1 2 3 4 5; do st=$(proc_start $pid); [ -n "$st" ] && break; sleep 0.01; done
  echo "$name $pid $st" >>"$NODEDIR/pids"
}
# start_crio: the node's CRI-O (its files under NODEDIR, written by `up`).
start_crio() {
  start crio "$("$REPO/scripts/setup-crio.sh" --print)/crio" --config "$NODEDIR/crio/crio.conf" \
    --config-dir "$NODEDIR/crio/conf.d" --registries-conf "$NODEDIR/registries.conf" \
    --registries-conf-dir "$NODEDIR/registries.d" --log-level info
}

down() {
  [ -f "$NODEDIR/env" ] || return 0
  # shellcheck disable=SC1091
  . "$NODEDIR/env"
  local pids="$NODEDIR/pids" name pid start i crictl
  # Pods first, while CRI-O runs: conmon and the containers outlive CRI-O otherwise.
  crictl=$("$REPO/scripts/setup-crio.sh" --print 2>/dev/null)/crictl || true
  if [ -S "$CRIO_SOCKET" ] && [ -x "$crictl" ] && [ -f "$pids" ]; then
    # the kubelet would start them again
    while read -r name pid start; do
      [ "$name" = kubelet ] && [ "$(proc_start "$pid")" = "$start" ] && kill -TERM "$pid" 2>/dev/null
    done <"$pids"
    timeout 60 "$crictl" -r "unix://$CRIO_SOCKET" rmp -fa >>"$NODEDIR/logs/down.log" 2>&1 || true
  fi
  if [ -f "$pids" ]; then
    tac "$pids" | while read -r name pid start; do
      [ "$(proc_start "$pid")" = "$start" ] && kill -TERM "$pid" 2>/dev/null || true
    done
    for i in $(seq 1 50); do
      local alive=0
      while read -r name pid start; do [ "$(proc_start "$pid")" = "$start" ] && alive=1; done <"$pids"
      [ $alive = 0 ] && break
      sleep 0.1
    done
    while read -r name pid start; do
      [ "$(proc_start "$pid")" = "$start" ] && kill -KILL "$pid" 2>/dev/null || true
    done <"$pids"
    mv -f "$pids" "$pids.stopped"
  fi
  # The kubelet's and CRI-O's mounts (volumes, shm, namespaces) go with the node's mount namespace.
  umount "$NODEDIR/mntns" 2>/dev/null || true
  ip netns del "$NETNS" 2>/dev/null || true
  for c in /sys/fs/cgroup/*/; do
    [ -d "$c${CGROUP_ROOT#/}" ] || continue
    find "$c${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

case $CMD in
  down) down; exit 0 ;;
  exec)
    # shellcheck disable=SC1091
    . "$NODEDIR/env"
    exec nsenter --mount="$NODEDIR/mntns" --net="/run/netns/$NETNS" -- "$@" ;;
  run)
    [ $# -ge 2 ] || usage
    # shellcheck disable=SC1091
    . "$NODEDIR/env"
    name=$1; shift
    start "$name" "$@"
    exit 0 ;;
  crio)
    # The kubelet's CRI-O: stop (SIGTERM; the containers live on under conmon) or start it again.
    # shellcheck disable=SC1091
    . "$NODEDIR/env"
    case ${1:-} in
      stop) exec "$0" stop "$NODEDIR" crio ;;
      start) mv -f "$NODEDIR/logs/crio.log" "$NODEDIR/logs/crio.$(date +%s).log"; start_crio ;;
      *) usage ;;
    esac
    exit 0 ;;
  stop)
    [ $# -eq 1 ] || usage
    gone=()
    while read -r name pid st; do
      [ "$name" = "$1" ] && [ "$(proc_start "$pid")" = "$st" ] && kill -TERM "$pid" 2>/dev/null && gone+=("$pid $st")
    done <"$NODEDIR/pids"
    for p in ${gone[@]+"${gone[@]}"}; do   # until it exited (its socket, its ports are free again)
      for _ in $(seq 1 100); do [ "$(proc_start "${p% *}")" = "${p#* }" ] || break; sleep 0.1; done
    done
    awk -v n="$1" '$1 != n' "$NODEDIR/pids" >"$NODEDIR/pids.tmp" && mv -f "$NODEDIR/pids.tmp" "$NODEDIR/pids"
    exit 0 ;;
  load)
    [ $# -ge 1 ] || usage
    node_store
    log "load $1 into the node's CRI-O${2:+ as $2}"
    buildah push --quiet "${IMAGES_FROM[@]}" "$1" "containers-storage:[vfs@$CRIO_ROOT+$CRIO_RUNROOT]${2:-$1}" >/dev/null
    exit 0 ;;
  up) ;;
  *) usage ;;
esac

[ $# -ge 1 ] || usage
CLUSTER=$(cd "$1" && pwd); shift
NAME=real-node INDEX=1 OWNER=""
while [ $# -gt 0 ]; do
  case $1 in
    --name) NAME=${2:?--name needs a NAME}; shift 2 ;;
    --index) INDEX=${2:?--index needs N}; shift 2 ;;
    --owner-pid) OWNER=${2:?--owner-pid needs a PID}; shift 2 ;;
    *) usage ;;
  esac
done
[[ $INDEX =~ ^[0-9]+$ ]] && [ "$INDEX" -ge 1 ] && [ "$INDEX" -le 250 ] || { echo "k8s-node: --index must be 1–250" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "k8s-node: needs root (network namespace, cgroups, CRI-O)" >&2; exit 1; }
[ -f "$CLUSTER/kubeconfig" ] || { echo "k8s-node: no cluster at $CLUSTER (scripts/k8s-cluster.sh up $CLUSTER)" >&2; exit 1; }
if [ -s "$NODEDIR/pids" ]; then echo "k8s-node: $NODEDIR already has a running node (run: $0 down $NODEDIR)" >&2; exit 1; fi

NETNS=nk-node-$INDEX HOST_IP=10.213.$INDEX.1 NODE_IP=10.213.$INDEX.2 POD_CIDR=10.244.$INDEX.0/24
VETH_HOST=nkh$INDEX VETH_NODE=nkn$INDEX CGROUP_ROOT=/nk-node-$INDEX
if ip netns list | grep -qw "$NETNS"; then
  echo "k8s-node: network namespace $NETNS exists (another node with --index $INDEX? $0 down its NODEDIR)" >&2; exit 1
fi
apt_install buildah busybox-static gcc libc6-dev iptables conmon runc containernetworking-plugins
K8S_BIN=$("$REPO/scripts/setup-k8s.sh" | tail -1)
COREDNS_BIN=$("$REPO/scripts/setup-peers.sh" coredns | tail -1)
CRIO_BIN=$("$REPO/scripts/setup-crio.sh" | tail -1)
KUBECTL="$REPO/.cache/venv/bin/kubectl"
[ -x "$KUBECTL" ] || "$REPO/scripts/setup-kubectl.sh" >/dev/null
CRIO_ROOT=$NODEDIR/crio/storage CRIO_RUNROOT=$NODEDIR/crio/run CRIO_SOCKET=$NODEDIR/crio/crio.sock
KUBELET_ROOT=$NODEDIR/kubelet
cat >"$NODEDIR/env" <<EOF
NODE_NAME=$NAME
NODE_IP=$NODE_IP
HOST_IP=$HOST_IP
NETNS=$NETNS
POD_CIDR=$POD_CIDR
CRIO_SOCKET=$CRIO_SOCKET
CRIO_ROOT=$CRIO_ROOT
CRIO_RUNROOT=$CRIO_RUNROOT
KUBELET_ROOT=$KUBELET_ROOT
CGROUP_ROOT=$CGROUP_ROOT
EOF
: >"$NODEDIR/pids"
fail() { echo "k8s-node: $*" >&2; down; exit 1; }
trap 'fail "interrupted"' INT TERM
t0=$(date +%s.%N)
mkdir -p "$NODEDIR"/{pki,cni/net.d,crio/conf.d,crio/ns,crio/exits,crio/logs,crio/policies,registries.d} "$KUBELET_ROOT"

# wait_for SECONDS WHAT CMD…: until CMD succeeds.
wait_for() {
  local secs=$1 what=$2 end; shift 2
  end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge $end ] && fail "$what not within ${secs}s (logs: $NODEDIR/logs/)"
    sleep 0.2
  done
}

# ---- the node's mount namespace: a copy of the host's, its / shared within it (this host's / is private; a
# pod's HostToContainer mount needs a shared or slave source). The kubelet's and CRI-O's mounts stay in it.
touch "$NODEDIR/mntns"
unshare --mount="$NODEDIR/mntns" --propagation shared true || fail "cannot create the node's mount namespace"

# ---- network: namespace, link to the host, forwarding and bridge netfilter for pods and Services (in the
# namespace only: these sysctls are per namespace)
ip netns add "$NETNS"
ip link add "$VETH_HOST" type veth peer name "$VETH_NODE"
ip link set "$VETH_NODE" netns "$NETNS"
ip addr add "$HOST_IP/24" dev "$VETH_HOST"
ip link set "$VETH_HOST" up
nsx() { ip netns exec "$NETNS" "$@"; }
nsx ip link set lo up
nsx ip addr add "$NODE_IP/24" dev "$VETH_NODE"
nsx ip link set "$VETH_NODE" up
nsx ip route add default via "$HOST_IP"
# Link-local stays inside the node: a metadata emulator a test starts here answers at 169.254.169.254 (a local
# address, which wins); without one, nothing leaves for whatever answers there on this machine's network.
nsx ip route add unreachable 169.254.0.0/16
nsx sysctl -qw net.ipv4.ip_forward=1
nsx sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true

# ---- the API server for the node: a forwarder on the link, the `kubernetes` Service's endpoint there
API_PORT=$(awk -F= '$1 == "kube-apiserver" {print $2}' "$CLUSTER/ports")
setsid python3 "$REPO/scripts/lib/node/tcp-forward.py" "$HOST_IP" 6443 127.0.0.1 "$API_PORT" \
  >"$NODEDIR/logs/api-forward.log" 2>&1 </dev/null &
echo "api-forward $! $(proc_start $!)" >>"$NODEDIR/pids"
kc() { "$KUBECTL" --kubeconfig "$CLUSTER/kubeconfig" "$@"; }
cat <<EOF | kc apply -f - >>"$NODEDIR/logs/setup.log" 2>&1 || fail "the kubernetes Service's EndpointSlice (log: $NODEDIR/logs/setup.log)"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-$NAME
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: k8s-node.sh}
addressType: IPv4
endpoints: [{addresses: ["$HOST_IP"], conditions: {ready: true}}]
ports: [{name: https, port: 6443, protocol: TCP}]
EOF

# ---- identities, signed by the cluster's CA
PKI=$NODEDIR/pki
ossl() { openssl "$@" 2>>"$NODEDIR/logs/pki.log" >/dev/null || fail "openssl $1 failed; log: $NODEDIR/logs/pki.log"; }
leaf() {
  ossl ecparam -name prime256v1 -genkey -noout -out "$PKI/$1.key"
  ossl req -new -key "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr"
  printf '%s\n' "$3" >"$PKI/$1.ext"
  ossl x509 -req -in "$PKI/$1.csr" -CA "$CLUSTER/pki/ca.crt" -CAkey "$CLUSTER/pki/ca.key" -CAcreateserial -days 7 \
    -extfile "$PKI/$1.ext" -out "$PKI/$1.crt"
}
CLIENT_EXT=$'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature'
leaf kubelet "/O=system:nodes/CN=system:node:$NAME" "$CLIENT_EXT"
leaf kubelet-serving "/O=system:nodes/CN=system:node:$NAME" \
  $'subjectAltName=IP:'"$NODE_IP"$',DNS:'"$NAME"$'\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature'
leaf kube-proxy "/CN=system:kube-proxy" "$CLIENT_EXT"
node_kubeconfig() {
  cat >"$NODEDIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://$HOST_IP:6443", certificate-authority: "$CLUSTER/pki/ca.crt", tls-server-name: kubernetes}}]
users: [{name: $1, user: {client-certificate: "$PKI/$1.crt", client-key: "$PKI/$1.key"}}]
contexts: [{name: local, context: {cluster: local, user: $1}}]
current-context: local
EOF
}
node_kubeconfig kubelet
node_kubeconfig kube-proxy

# ---- images without a registry: a static pause and busybox, committed into CRI-O's store
STORE=(--root "$CRIO_ROOT" --runroot "$CRIO_RUNROOT" --storage-driver vfs)
gcc -static -Os -o "$NODEDIR/pause" "$REPO/scripts/lib/node/pause.c" || fail "building the pause binary"
image() {   # image NAME FILE DEST [LINK…]: FILE at DEST in an image of its own, with symlinks LINK → DEST
  local name=$1 file=$2 dest=$3 ctr mnt l; shift 3
  ctr=$(buildah "${STORE[@]}" from --quiet scratch)
  mnt=$(buildah "${STORE[@]}" mount "$ctr")
  install -D -m 0755 "$file" "$mnt$dest"
  install -d -m 1777 "$mnt/tmp"
  for l in "$@"; do ln -s "$dest" "$mnt$l"; done
  buildah "${STORE[@]}" umount "$ctr" >/dev/null
  # as the upstream image: the binary is the entrypoint, the manifest gives only its arguments
  [ "$name" != "$COREDNS_IMAGE" ] || buildah "${STORE[@]}" config --entrypoint "[\"$dest\"]" "$ctr"
  buildah "${STORE[@]}" commit --quiet "$ctr" "$name" >/dev/null
  buildah "${STORE[@]}" rm "$ctr" >/dev/null
}
# Kubernetes' own CoreDNS add-on, from the module the control plane is built from; the image it names is the
# CoreDNS this project builds (tools/k8s/versions.env keeps the two versions equal).
K8S_MOD=$(cd "$REPO/tools/k8s/kubernetes" && PATH="$PATH:/usr/local/go/bin" GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json k8s.io/kubernetes \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') || fail "the k8s.io/kubernetes module"
DNS_ADDON=$K8S_MOD/cluster/addons/dns/coredns/coredns.yaml.sed
COREDNS_IMAGE=$(awk '$1 == "image:" {print $2}' "$DNS_ADDON")
. "$REPO/tools/k8s/versions.env"
[ "$COREDNS_IMAGE" = "registry.k8s.io/coredns/coredns:v$COREDNS_VERSION" ] ||
  fail "the DNS add-on of k8s.io/kubernetes names $COREDNS_IMAGE; tools/k8s/versions.env builds CoreDNS $COREDNS_VERSION"
{
  image localhost/nk-pause:test "$NODEDIR/pause" /pause
  image "$COREDNS_IMAGE" "$COREDNS_BIN/coredns" /coredns
  image localhost/nk-busybox:test /bin/busybox /bin/busybox /bin/sh /bin/sleep /bin/cat /bin/echo /bin/touch \
    /bin/test /bin/ls /bin/date /bin/dd /bin/rm /bin/mkdir /bin/grep /bin/wc /bin/true /bin/false /bin/nc /bin/wget
} >>"$NODEDIR/logs/images.log" 2>&1 || fail "building the node's images (log: $NODEDIR/logs/images.log)"

# ---- CRI-O (a plain process: no systemd here), its files under NODEDIR
cat >"$NODEDIR/registries.conf" <<'EOF'
# Offline and private: no search registries, no aliases. Every image the node runs is loaded beforehand.
unqualified-search-registries = []
EOF
echo '{"default": [{"type": "insecureAcceptAnything"}]}' >"$NODEDIR/policy.json"
cat >"$NODEDIR/crio/crio.conf" <<EOF
[crio]
root = "$CRIO_ROOT"
runroot = "$CRIO_RUNROOT"
storage_driver = "vfs"
log_dir = "$NODEDIR/crio/logs"
version_file = "$CRIO_RUNROOT/version"
version_file_persist = "$NODEDIR/crio/version"
clean_shutdown_file = "$NODEDIR/crio/clean.shutdown"
[crio.api]
listen = "$CRIO_SOCKET"
[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
namespaces_dir = "$NODEDIR/crio/ns"
pinns_path = "$CRIO_BIN/pinns"
container_exits_dir = "$NODEDIR/crio/exits"
container_attach_socket_dir = "$CRIO_RUNROOT/attach"
disable_hostport_mapping = true
[crio.runtime.runtimes.runc]
runtime_path = "$REPO/scripts/lib/node/runc-wrap.py"
runtime_root = "$CRIO_RUNROOT/runc"
[crio.image]
pause_image = "localhost/nk-pause:test"
pause_command = "/pause"
signature_policy = "$NODEDIR/policy.json"
signature_policy_dir = "$NODEDIR/crio/policies"
[crio.network]
network_dir = "$NODEDIR/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]
[crio.nri]
enable_nri = false
EOF
cat >"$NODEDIR/cni/net.d/10-bridge.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "nk-pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$NODEDIR/cni/ipam"}},
  {"type": "loopback"}]}
EOF
start_crio
wait_for 60 "CRI-O's socket" test -S "$CRIO_SOCKET"

# ---- the kubelet: cgroup v1 (failCgroupV1: false), its cgroup root present in every v1 controller first
for c in /sys/fs/cgroup/*/; do
  [ -f "${c}cgroup.procs" ] || continue
  mkdir -p "$c${CGROUP_ROOT#/}"
  if [ -f "${c}cpuset.cpus" ]; then
    cat "${c}cpuset.cpus" >"$c${CGROUP_ROOT#/}/cpuset.cpus"
    cat "${c}cpuset.mems" >"$c${CGROUP_ROOT#/}/cpuset.mems"
  fi
done
DNS_IP=10.0.0.10
echo "nameserver $HOST_IP" >"$NODEDIR/resolv.conf"
cat >"$NODEDIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$CRIO_SOCKET
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CLUSTER/pki/ca.crt}
authorization: {mode: Webhook}
failSwapOn: false
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
# The upstream of pods with dnsPolicy Default (CoreDNS's `forward .`): the host end of the link, where nothing
# answers port 53, so a name outside the cluster fails at once and nothing leaves the node.
resolvConf: $NODEDIR/resolv.conf
podLogsDir: $NODEDIR/pod-logs
# The images were loaded, not pulled: never collect them. Disk eviction off: the tests fill disks of their own.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}
EOF
start kubelet "$K8S_BIN/kubelet" --config "$NODEDIR/kubelet.yaml" --kubeconfig "$NODEDIR/kubelet.kubeconfig" \
  --root-dir "$KUBELET_ROOT" --cert-dir "$PKI" --hostname-override "$NAME" --node-ip "$NODE_IP" --v 1

# ---- kube-proxy (iptables mode, in the node's namespace); conntrack sysctls left as they are
cat >"$NODEDIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODEDIR/kube-proxy.kubeconfig}
hostnameOverride: $NAME
mode: iptables
clusterCIDR: 10.244.0.0/16
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
iptables: {localhostNodePorts: false}
EOF
start kube-proxy "$K8S_BIN/kube-proxy" --config "$NODEDIR/kube-proxy.yaml"

ready() { [ "$(kc get node "$NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_for 90 "node $NAME Ready" ready

# ---- cluster DNS: the add-on as Kubernetes ships it, its variables set (kept if another node applied it)
sed -e "s/\$DNS_SERVER_IP/$DNS_IP/; s/\$DNS_DOMAIN/cluster.local/; s/\$DNS_MEMORY_LIMIT/170Mi/" "$DNS_ADDON" |
  kc apply -f - >>"$NODEDIR/logs/setup.log" 2>&1 || fail "applying the DNS add-on (log: $NODEDIR/logs/setup.log)"
kc -n kube-system rollout status deployment/coredns --timeout=90s >>"$NODEDIR/logs/setup.log" 2>&1 ||
  fail "CoreDNS not Ready (log: $NODEDIR/logs/setup.log; kubectl -n kube-system describe pod -l k8s-app=kube-dns)"
if [ -n "$OWNER" ]; then
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" down "$3"' \
    owner-watch "$OWNER" "$REPO/scripts/k8s-node.sh" "$NODEDIR" >"$NODEDIR/logs/owner-watch.log" 2>&1 </dev/null &
fi
trap - INT TERM
awk -v a="$t0" -v b="$(date +%s.%N)" -v n="$NAME" -v ip="$NODE_IP" \
  'BEGIN { printf "k8s-node: %s Ready in %.1f s at %s\n", n, b - a, ip }' >&2
