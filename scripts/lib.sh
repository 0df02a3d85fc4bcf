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
