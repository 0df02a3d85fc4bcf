# shellcheck shell=bash
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

# Clean-up that runs however the script ends (its last line, an error under `set -e`, `exit`, Ctrl-C or
# SIGTERM), and touches only what the script started:
#   track PID…     processes it started (`cmd & track $!`): on exit each gets SIGTERM, then SIGKILL if it
#                  still runs STOP_GRACE seconds later (default 3), and is reaped;
#   at_exit CMD [ARG…]    a command (its arguments expanded now) run on exit after the tracked processes
#                  stopped, the last added first (e.g. stopping a cluster, removing a temporary directory);
#   stop_tracked PID…     stops those tracked processes now (`stop_tracked "${TRACKED[@]}"`: all) and forgets them;
#   forget PID…           forgets processes the script reaped itself (`wait PID`): they are no longer its own;
#   run_exit_hooks        stops every tracked process and runs the at_exit commands now, then forgets them all:
#                         for a script that tears down before its last steps (e.g. reading a log once closed).
TRACKED=() AT_EXIT=()
track() { TRACKED+=("$@"); _exit_traps; }
at_exit() { AT_EXIT+=("$(printf '%q ' "$@")"); _exit_traps; }
_exit_traps() { trap _on_exit EXIT; }  # bash runs it on SIGINT and SIGTERM too
_on_exit() { local rc=$?; set +e; trap - ERR; run_exit_hooks; exit "$rc"; }
# alive PID: the process exists and is not a zombie waiting to be reaped.
alive() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [ "${s%% *}" != Z ]; }
stop_tracked() {
  local p i targets=("$@")
  for p in "${targets[@]}"; do kill "$p" 2>/dev/null || true; done
  for i in $(seq 1 $(( ${STOP_GRACE:-3} * 10 ))); do
    for p in "${targets[@]}"; do alive "$p" && break; p=""; done
    [ -n "${p:-}" ] || break
    sleep 0.1
  done
  for p in "${targets[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  forget "${targets[@]}"
}
forget() {
  local p kept=()
  for p in "${TRACKED[@]}"; do [[ " $* " == *" $p "* ]] || kept+=("$p"); done
  TRACKED=("${kept[@]}")
}
run_exit_hooks() {
  local i
  stop_tracked "${TRACKED[@]}"
  for (( i = ${#AT_EXIT[@]} - 1; i >= 0; i-- )); do eval "${AT_EXIT[i]}" || true; done
  AT_EXIT=()
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
  at_exit "$REPO/scripts/k8s-cluster.sh" down "$dir"
  log "shipped manifests (kubectl kustomize manifests/ | kubectl apply)"
  "$REPO/scripts/k8s-cluster.sh" install "$dir" >"$dir/logs/install.log" ||
    { cat "$dir/logs/install.log" >&2; return 1; }
  REAL_KUBECONFIG="$dir/kubeconfig"
}

