#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, the real node's kubelet and kube-proxy, kwok, and Karpenter's KWOK provider as karpenter-kwok) from Go modules, once, into a cache keyed by the versions pinned in tools/k8s/:
#   ${NODEKEEPER_K8S_CACHE:-$HOME/.cache/nodekeeper/k8s}/<key>/bin
# The key hashes the control plane's tools/k8s/*/go.mod + go.sum (not the peers': scripts/setup-peers.sh),
# versions.env above its peers' section (so KARPENTER_GOTOOLCHAIN too) and the Go version, so a warm machine rebuilds nothing and a version bump builds into a new directory. Prints the bin directory on stdout (the last line), how long each
# build took on stderr. Idempotent; safe to run from several shells at once (a lock serialises them).
#
#   scripts/setup-k8s.sh            build what is missing, print the bin dir
#   scripts/setup-k8s.sh --print    print the bin dir only if everything is built (exit 1 otherwise)
. "$(dirname "$0")/lib.sh"

TOOLS="$REPO/tools/k8s"
. "$TOOLS/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
# The Go toolchain of a module DIR: the machine's own (local), except Karpenter's, whose v1.15.0 needs
# go >= 1.26.9: there the go command fetches $KARPENTER_GOTOOLCHAIN from the module proxy (once per machine,
# ~76 MB, into the module cache) and runs it. Only these commands see it, never the caller's shell.
toolchain() { if [ "$1" = karpenter ]; then echo "$KARPENTER_GOTOOLCHAIN"; else echo local; fi; }

if ! command -v go >/dev/null 2>&1; then
  echo "setup-k8s: Go is not installed (need go >= 1.26 on PATH; Debian machines of this project have /usr/local/go/bin)" >&2
  [ -x /usr/local/go/bin/go ] || exit 1
  export PATH="/usr/local/go/bin:$PATH"
fi

# The control plane's modules. Peers (tools/k8s/aemm, nth, npd: scripts/setup-peers.sh) have keys of their own,
# so adding or bumping one rebuilds no kube-apiserver: the key hashes only these modules and the part of
# versions.env above its peers' section, byte for byte what it hashed before the peers came.
CP_MODULES=(etcd karpenter kubernetes kwok)
key=$( { go env GOVERSION; sed '/^# --- peers/,$d' "$TOOLS/versions.env"
         for d in "${CP_MODULES[@]}"; do cat "$TOOLS/$d/go.mod"; done
         for d in "${CP_MODULES[@]}"; do cat "$TOOLS/$d/go.sum"; done; } | sha256sum | cut -c1-16)
ROOT="${NODEKEEPER_K8S_CACHE:-$HOME/.cache/nodekeeper/k8s}"
BIN="$ROOT/$key/bin"
ALL=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kwok karpenter-kwok)

STAGES="$ROOT/$key/kwok-stages"
CRDS="$ROOT/$key/karpenter-crds"
built() {
  for b in "${ALL[@]}"; do [ -x "$BIN/$b" ] || return 1; done
  [ -e "$STAGES/.v2" ] && [ -e "$CRDS/.v1" ]
}
# KWOK's stage definitions ship in its module zip (kustomize/stage); copy the ones the cluster uses: nodes
# become Ready and heartbeat their Lease; pods go Ready at once and, once deleted, go away between 1 s
# and the end of their grace period (KWOK's "general" pod-delete; a finalizer holds them as on a kubelet).
stages() {
  local mod
  mod=$(cd "$TOOLS/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) || return 1
  mkdir -p "$STAGES"
  cp -f "$mod"/kustomize/stage/node/fast/node-initialize.yaml \
    "$mod"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    "$mod"/kustomize/stage/pod/fast/pod-ready.yaml "$mod"/kustomize/stage/pod/fast/pod-complete.yaml \
    "$mod"/kustomize/stage/pod/general/pod-delete.yaml "$STAGES/"
  chmod u+w "$STAGES"/*
  # A node labelled nodekeeper.test/kubelet (any value) keeps the status a test writes, as a kubelet whose
  # runtime broke would post it: KWOK neither re-initializes it to Ready nor heartbeats its conditions.
  local f
  for f in node-initialize.yaml node-heartbeat-with-lease.yaml; do
    python3 - "$STAGES/$f" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
extra = "    - key: '.metadata.labels[\"nodekeeper.test/kubelet\"]'\n      operator: 'DoesNotExist'\n"
assert "matchExpressions:\n" in s, p
s = s.replace("matchExpressions:\n", "matchExpressions:\n" + extra, 1)
open(p, "w").write(s)
PY
  done
  touch "$STAGES/.v2"
}
# Karpenter's CRDs ship in its module zip: NodePool and NodeClaim from the KWOK chart (its copies allow the
# karpenter.kwok.sh label domain), KWOKNodeClass from kwok/apis/crds (the chart's copy is a symlink, which module
# zips drop). NodeOverlay and CapacityBuffer are behind feature gates that are off; their controllers are not run.
karpenter_crds() {
  local mod
  mod=$(cd "$TOOLS/karpenter" && GOTOOLCHAIN=$(toolchain karpenter) go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter) || return 1
  mkdir -p "$CRDS"
  cp -f "$mod"/kwok/charts/crds/karpenter.sh_nodepools.yaml "$mod"/kwok/charts/crds/karpenter.sh_nodeclaims.yaml \
    "$mod"/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml "$CRDS/"
  chmod u+w "$CRDS"/*
  touch "$CRDS/.v1"
}
if [ "${1:-}" = "--print" ]; then built && { echo "$BIN"; exit 0; }; exit 1; fi
if built; then log "control plane already built: $BIN"; echo "$BIN"; exit 0; fi

mkdir -p "$BIN"
exec 9>"$ROOT/$key.lock"
flock 9
if built; then echo "$BIN"; exit 0; fi

# Version stamps, as upstream's hack/lib/version.sh sets them, so /version and `kubectl version` are right.
ldflags_k8s() {
  local l="-s -w" p minor="${K8S_VERSION#*.}"; minor="${minor%%.*}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    l="$l -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
    l="$l -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$l"
}

# build NAME DIR PKG [LDFLAGS]: go build PKG in module DIR into $BIN/NAME (atomically: a killed build leaves nothing).
build() {
  local name=$1 dir=$2 pkg=$3 ldf=${4:-"-s -w"} t0 log_file
  [ -x "$BIN/$name" ] && return 0
  log_file="$ROOT/$key/build-$name.log"
  log "building $name ($pkg) …"
  t0=$(date +%s)
  if ! (cd "$TOOLS/$dir" && GOTOOLCHAIN=$(toolchain "$dir") go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldf" \
        -o "$BIN/.$name.tmp" "$pkg") >"$log_file" 2>&1; then
    echo "setup-k8s: building $name failed ($pkg in tools/k8s/$dir); log: $log_file" >&2
    tail -20 "$log_file" >&2
    rm -f "$BIN/.$name.tmp"
    exit 1
  fi
  mv "$BIN/.$name.tmp" "$BIN/$name"
  log "built $name in $(( $(date +%s) - t0 )) s"
}

# Module downloads first, so "not served" is told apart from a compile error.
for d in "${CP_MODULES[@]}"; do
  if ! (cd "$TOOLS/$d" && GOTOOLCHAIN=$(toolchain "$d") go mod download) >"$ROOT/$key/download-$d.log" 2>&1; then
    echo "setup-k8s: downloading the Go modules of tools/k8s/$d failed; log: $ROOT/$key/download-$d.log" >&2
    tail -20 "$ROOT/$key/download-$d.log" >&2
    exit 1
  fi
done

build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
K8S_LDF=$(ldflags_k8s)
build kube-apiserver kubernetes k8s.io/kubernetes/cmd/kube-apiserver "$K8S_LDF"
build kube-controller-manager kubernetes k8s.io/kubernetes/cmd/kube-controller-manager "$K8S_LDF"
build kube-scheduler kubernetes k8s.io/kubernetes/cmd/kube-scheduler "$K8S_LDF"
# The real node's (scripts/k8s-node.sh): the same module and version as the control plane.
build kubelet kubernetes k8s.io/kubernetes/cmd/kubelet "$K8S_LDF"
build kube-proxy kubernetes k8s.io/kubernetes/cmd/kube-proxy "$K8S_LDF"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok \
  "-s -w"
# Its main package is sigs.k8s.io/karpenter/kwok: `go build` would name it kwok, as the KWOK controller.
build karpenter-kwok karpenter sigs.k8s.io/karpenter/kwok "-s -w"

stages || { echo "setup-k8s: copying KWOK's stage files failed" >&2; exit 1; }
karpenter_crds || { echo "setup-k8s: copying Karpenter's CRDs failed" >&2; exit 1; }
built || { echo "setup-k8s: a binary is missing from $BIN after the build" >&2; exit 1; }
"$BIN/kube-apiserver" --version >&2
"$BIN/etcd" --version | sed -n 1p >&2   # sed reads all of it: `head -1` could close the pipe early (SIGPIPE, exit 141 under pipefail)
echo "$BIN"
