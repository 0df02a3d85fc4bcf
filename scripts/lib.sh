# Shared helpers for the project's scripts. Source it: . "$(dirname "$0")/lib.sh"
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$REPO/.cache"
mkdir -p "$CACHE"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# apt_install PKG...: installs the Debian packages that are missing (apt-get update once per run).
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    return 1
  fi
  log "apt-get install ${missing[*]}"
  if [ -z "${NODEKEEPER_APT_UPDATED:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    export NODEKEEPER_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# real_cluster DIR [UP-ARG…]: a real control plane in DIR for this script's lifetime, with the shipped manifests:
# the real kubectl, the control plane binaries (built once, then cached), `k8s-cluster.sh up DIR UP-ARG…` (stopped
# when this script exits, however it exits) and `k8s-cluster.sh install`. Sets REAL_KUBECONFIG.
real_cluster() {
  local dir=$1; shift
  log "real kubectl (scripts/setup-kubectl.sh)"
  "$REPO/scripts/setup-kubectl.sh" >/dev/null
  log "control plane binaries (scripts/setup-k8s.sh: built once, then cached)"
  "$REPO/scripts/setup-k8s.sh" >/dev/null
  log "cluster up: $dir (logs in $dir/logs)"
  "$REPO/scripts/k8s-cluster.sh" up "$dir" --owner-pid $$ "$@"
  # shellcheck disable=SC2064 # expand now: the directory of this cluster
  trap "\"$REPO/scripts/k8s-cluster.sh\" down \"$dir\"" EXIT
  log "shipped manifests (kubectl kustomize manifests/ | kubectl apply)"
  "$REPO/scripts/k8s-cluster.sh" install "$dir" >"$dir/logs/install.log" ||
    { cat "$dir/logs/install.log" >&2; return 1; }
  REAL_KUBECONFIG="$dir/kubeconfig"
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
# nodekeeper-controller.nodekeeper.svc (the server name examples/controller_bench.rs's agents pin):
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
