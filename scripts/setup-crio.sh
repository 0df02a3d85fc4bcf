#!/usr/bin/env bash
# Builds the real CRI-O the tests run (crio and pinns from github.com/cri-o/cri-o, crictl from
# sigs.k8s.io/cri-tools) from Go modules, once, into a cache keyed by the versions pinned in tools/crio/:
#   ${NODEKEEPER_K8S_CACHE:-$HOME/.cache/nodekeeper/k8s}/crio-<key>/bin/{crio,pinns,crictl}
# The key hashes the Go version, tools/crio/versions.env, tools/crio/*/go.mod + go.sum and the build commands,
# so a warm machine rebuilds nothing. Prints the bin directory on stdout (the last line), how long each build
# took on stderr. Idempotent; a lock serialises concurrent runs. Debian's conmon, runc, CNI plugins and
# libseccomp-dev come from scripts/setup.sh.
#
# What this CRI-O reads: the Go module proxy serves cri-o only at v1.34.0, an early snapshot of that tag
# (commit 5dd0877c, May 2025) without `[crio.image] short_name_mode` (docs/dev/testing.md, "The real CRI-O").
#
#   scripts/setup-crio.sh            build what is missing, print the bin dir
#   scripts/setup-crio.sh --print    print the bin dir only if everything is built (exit 1 otherwise)
. "$(dirname "$0")/lib.sh"

TOOLS="$REPO/tools/crio"
. "$TOOLS/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

if ! command -v go >/dev/null 2>&1; then
  echo "setup-crio: Go is not installed (need go >= 1.26 on PATH; Debian machines of this project have /usr/local/go/bin)" >&2
  [ -x /usr/local/go/bin/go ] || exit 1
  export PATH="/usr/local/go/bin:$PATH"
fi

# As CRI-O's Makefile builds it, less what these machines cannot link (btrfs, devicemapper, ostree, gpgme):
# seccomp needs cgo and libseccomp-dev; signatures are checked with the pure-Go openpgp.
CRIO_TAGS="containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs btrfs_noversion exclude_graphdriver_devicemapper seccomp"
PINNS_CC="gcc -std=c99 -Os -Wall -Werror -Wextra -static"
key=$( { go env GOVERSION; cat "$TOOLS/versions.env"; cat "$TOOLS"/*/go.mod "$TOOLS"/*/go.sum
         echo "crio tags=$CRIO_TAGS; pinns=$PINNS_CC"; } | sha256sum | cut -c1-16)
ROOT="${NODEKEEPER_K8S_CACHE:-$HOME/.cache/nodekeeper/k8s}"
BIN="$ROOT/crio-$key/bin"
ALL=(crio pinns crictl)
built() { for b in "${ALL[@]}"; do [ -x "$BIN/$b" ] || return 1; done; }

if [ "${1:-}" = "--print" ]; then built && { echo "$BIN"; exit 0; }; exit 1; fi
if built; then log "CRI-O already built: $BIN"; echo "$BIN"; exit 0; fi

mkdir -p "$BIN"
exec 9>"$ROOT/crio-$key.lock"
flock 9
if built; then echo "$BIN"; exit 0; fi

# download DIR MODULE VERSION: the module's sources, or an error naming the module the proxy refused.
download() {
  local dir=$1 module=$2 version=$3 log_file="$ROOT/crio-$key/download-$1.log"
  if ! (cd "$TOOLS/$dir" && go mod download) >"$log_file" 2>&1; then
    echo "setup-crio: the Go module proxy did not serve what tools/crio/$dir needs; log: $log_file" >&2
    grep -E 'not available|403|404|410' "$log_file" | head -5 >&2 || tail -5 "$log_file" >&2
    echo "setup-crio: $module@$version is pinned in tools/crio/versions.env; the proxy refuses other cri-o" \
      "versions than v1.34.0 (docs/dev/testing.md): pin the next-best served version there and in tools/crio/$dir/go.mod" >&2
    exit 1
  fi
}
download cri-o github.com/cri-o/cri-o "v$CRIO_VERSION"
download cri-tools sigs.k8s.io/cri-tools "v$CRICTL_VERSION"

# build NAME DIR PKG CGO TAGS: go build PKG in module DIR into $BIN/NAME (atomically: a killed build leaves nothing).
build() {
  local name=$1 dir=$2 pkg=$3 cgo=$4 tags=$5 t0 log_file="$ROOT/crio-$key/build-$1.log"
  [ -x "$BIN/$name" ] && return 0
  log "building $name ($pkg) …"
  t0=$(date +%s)
  if ! (cd "$TOOLS/$dir" && CGO_ENABLED=$cgo go build -trimpath -tags "$tags" -ldflags "-s -w" \
        -o "$BIN/.$name.tmp" "$pkg") >"$log_file" 2>&1; then
    echo "setup-crio: building $name failed ($pkg in tools/crio/$dir); log: $log_file" >&2
    tail -20 "$log_file" >&2
    rm -f "$BIN/.$name.tmp"
    exit 1
  fi
  mv "$BIN/.$name.tmp" "$BIN/$name"
  log "built $name in $(( $(date +%s) - t0 )) s"
}
build crio cri-o github.com/cri-o/cri-o/cmd/crio 1 "$CRIO_TAGS"
build crictl cri-tools sigs.k8s.io/cri-tools/cmd/crictl 0 ""

# pinns (CRI-O's namespace pinning helper) is C inside the module tree: static, as CRI-O's Makefile builds it.
if [ ! -x "$BIN/pinns" ]; then
  src=$(cd "$TOOLS/cri-o" && go list -m -f '{{.Dir}}' github.com/cri-o/cri-o)/pinns/src
  t0=$(date +%s)
  # shellcheck disable=SC2086 # PINNS_CC is a command line
  $PINNS_CC -o "$BIN/.pinns.tmp" "$src"/*.c || { echo "setup-crio: building pinns from $src failed" >&2; exit 1; }
  mv "$BIN/.pinns.tmp" "$BIN/pinns"
  log "built pinns in $(( $(date +%s) - t0 )) s"
fi
built || { echo "setup-crio: a binary is missing from $BIN after the build" >&2; exit 1; }
"$BIN/crio" --version | sed -n 1p >&2
echo "$BIN"
