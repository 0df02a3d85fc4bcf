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

# real_cluster DIR: a real control plane in DIR for this script's lifetime, with the shipped manifests:
# the real kubectl, the control plane binaries (built once, then cached), `k8s-cluster.sh up` (stopped when
# this script exits, however it exits) and `k8s-cluster.sh install`. Sets REAL_KUBECONFIG.
real_cluster() {
  local dir=$1
  log "real kubectl (scripts/setup-kubectl.sh)"
  "$REPO/scripts/setup-kubectl.sh" >/dev/null
  log "control plane binaries (scripts/setup-k8s.sh: built once, then cached)"
  "$REPO/scripts/setup-k8s.sh" >/dev/null
  log "cluster up: $dir (logs in $dir/logs)"
  "$REPO/scripts/k8s-cluster.sh" up "$dir" --owner-pid $$
  # shellcheck disable=SC2064 # expand now: the directory of this cluster
  trap "\"$REPO/scripts/k8s-cluster.sh\" down \"$dir\"" EXIT
  log "shipped manifests (kubectl kustomize manifests/ | kubectl apply)"
  "$REPO/scripts/k8s-cluster.sh" install "$dir" >"$dir/logs/install.log" ||
    { cat "$dir/logs/install.log" >&2; return 1; }
  REAL_KUBECONFIG="$dir/kubeconfig"
}
