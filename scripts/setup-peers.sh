#!/usr/bin/env bash
# Builds the tools nodekeeper is tested and compared against ("peers") from Go modules, into the control
# plane's cache (scripts/setup-k8s.sh) but each under a key of its own, so adding or bumping a peer rebuilds
# nothing else:
#   ${NODEKEEPER_K8S_CACHE:-$HOME/.cache/nodekeeper/k8s}/peer-<name>-<key>/bin/<binary>
# The key hashes the Go version, the peer's line in tools/k8s/versions.env, its tools/k8s/<name>/go.mod +
# go.sum and its build command. Prints the bin directory of each peer named on stdout (one line each, in the
# order given), build times on stderr. Idempotent; a lock per peer serialises concurrent runs.
#
#   scripts/setup-peers.sh aemm              Amazon's EC2 metadata mock (the AWS source's real peer; the tests
#                                            build it on first use, scripts/setup.sh builds it for CI)
#   scripts/setup-peers.sh nth npd           AWS Node Termination Handler, Node Problem Detector (benchmarks)
#   scripts/setup-peers.sh ocisdk            the OCI Go SDK's own clients signing requests, for the signing
#                                            cross-check (tests/host/oci_sdk_crosscheck.rs; tools/k8s/ocisdk)
#   scripts/setup-peers.sh coredns           CoreDNS with the Kubernetes add-on's plugins: the real node's
#                                            cluster DNS (scripts/k8s-node.sh; tools/k8s/coredns)
#   scripts/setup-peers.sh --print NAME…     print the bin dirs only if all are built (exit 1 otherwise)
#   scripts/setup-peers.sh --check NAME…     build, then run each binary's --version/--help (a smoke check)
. "$(dirname "$0")/lib.sh"

TOOLS="$REPO/tools/k8s"
. "$TOOLS/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

if ! command -v go >/dev/null 2>&1; then
  echo "setup-peers: Go is not installed (need go >= 1.26 on PATH; Debian machines of this project have /usr/local/go/bin)" >&2
  [ -x /usr/local/go/bin/go ] || exit 1
  export PATH="/usr/local/go/bin:$PATH"
fi
ROOT="${NODEKEEPER_K8S_CACHE:-$HOME/.cache/nodekeeper/k8s}"

# peer NAME: sets BIN_NAME PKG VERSION_VAR TAGS CGO LDF NOSUMDB for NAME.
peer() {
  NOSUMDB="" TAGS="" CGO=0 LDF="-s -w"
  case $1 in
    aemm) BIN_NAME=ec2-metadata-mock PKG=github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock
          VERSION_VAR=AEMM_VERSION ;;
    # NTH v1.22.0 is the only version the module proxy serves (v1.21.0, v1.23.1, v1.24.0, v1.25.2: 403 "not
    # available"), and the checksum database answers 404 for it: go.sum pins the hashes of the module as the
    # proxy served it on the day it was added (docs/dev/testing.md, "Peers").
    nth)  BIN_NAME=node-termination-handler PKG=github.com/aws/aws-node-termination-handler/cmd
          VERSION_VAR=NTH_VERSION NOSUMDB=github.com/aws/aws-node-termination-handler ;;
    # As upstream's Makefile builds it for Linux (ENABLE_JOURNALD=1): the journald log watcher (build tag
    # journald) needs cgo and libsystemd's headers; its version comes from ldflags.
    npd)  BIN_NAME=node-problem-detector PKG=k8s.io/node-problem-detector/cmd/nodeproblemdetector
          VERSION_VAR=NPD_VERSION TAGS=journald CGO=1
          LDF="-s -w -X k8s.io/node-problem-detector/pkg/version.version=v$NPD_VERSION" ;;
    # nodekeeper's own small program on the OCI Go SDK (tools/k8s/ocisdk/main.go): the SDK's service
    # clients build and sign each request of a cases file; the test compares nodekeeper's with them.
    ocisdk) BIN_NAME=ocisdk PKG=nodekeeper.invalid/tools/k8s/ocisdk VERSION_VAR=OCI_SDK_VERSION ;;
    # Not a peer but a cluster add-on: the plugins of Kubernetes' own Corefile (tools/k8s/coredns/main.go).
    coredns) BIN_NAME=coredns PKG=nodekeeper.invalid/tools/k8s/coredns VERSION_VAR=COREDNS_VERSION ;;
    *) echo "setup-peers: unknown peer '$1' (aemm, nth, npd, ocisdk, coredns)" >&2; exit 2 ;;
  esac
}

# bindir NAME: the bin directory of NAME (sets BIN).
bindir() {
  peer "$1"
  local k
  k=$( { go env GOVERSION; grep "^$VERSION_VAR=" "$TOOLS/versions.env"; cat "$TOOLS/$1/go.mod" "$TOOLS/$1/go.sum"
         [ ! -f "$TOOLS/$1/main.go" ] || cat "$TOOLS/$1/main.go"
         echo "$PKG tags=$TAGS cgo=$CGO"; [ "$LDF" = "-s -w" ] || echo "ldflags=$LDF"; } | sha256sum | cut -c1-16)
  BIN="$ROOT/peer-$1-$k/bin"
}

build_peer() {
  local name=$1 t0 log_file
  bindir "$name"
  [ -x "$BIN/$BIN_NAME" ] && { echo "$BIN"; return 0; }
  mkdir -p "$BIN"
  exec 9>"$BIN/../.lock"
  flock 9
  if [ ! -x "$BIN/$BIN_NAME" ]; then
    log_file="$BIN/../build.log"
    if ! (cd "$TOOLS/$name" && GONOSUMDB="$NOSUMDB" go mod download) >"$BIN/../download.log" 2>&1; then
      echo "setup-peers: downloading the Go modules of tools/k8s/$name failed; log: $BIN/../download.log" >&2
      tail -20 "$BIN/../download.log" >&2
      exit 1
    fi
    if [ "$CGO" = 1 ]; then apt_install gcc libc6-dev libsystemd-dev pkg-config; fi
    log "building $name ($PKG) …"
    t0=$(date +%s)
    if ! (cd "$TOOLS/$name" && GONOSUMDB="$NOSUMDB" CGO_ENABLED=$CGO go build -trimpath ${TAGS:+-tags "$TAGS"} \
          -ldflags "$LDF" -o "$BIN/.$BIN_NAME.tmp" "$PKG") >"$log_file" 2>&1; then
      echo "setup-peers: building $name failed ($PKG in tools/k8s/$name); log: $log_file" >&2
      tail -20 "$log_file" >&2
      rm -f "$BIN/.$BIN_NAME.tmp"
      exit 1
    fi
    mv "$BIN/.$BIN_NAME.tmp" "$BIN/$BIN_NAME"
    log "built $name in $(( $(date +%s) - t0 )) s: $BIN/$BIN_NAME"
  fi
  exec 9>&-
  echo "$BIN"
}

# smoke NAME: the built binary runs and names its version.
smoke() {
  local name=$1 out
  bindir "$name"
  case $name in
    aemm) out=$("$BIN/$BIN_NAME" --version) ;;
    # NTH has no version flag: its --help lists its flags (exit 0 or 2, as Go's flag package does).
    nth)  out=$("$BIN/$BIN_NAME" --help 2>&1 || true) ;;
    npd)  out=$("$BIN/$BIN_NAME" --version) ;;
    ocisdk) out=$("$BIN/$BIN_NAME" 2>&1 || true) ;;
    coredns) out=$("$BIN/$BIN_NAME" -version; "$BIN/$BIN_NAME" -plugins) ;;
  esac
  case $name in
    aemm) [[ $out == *"v$AEMM_VERSION"* ]] ;;
    nth)  [[ $out == *"-enable-spot-interruption-draining"* ]] ;;
    npd)  [[ $out == *"v$NPD_VERSION"* ]] ;;
    ocisdk) [[ $out == *"usage: ocisdk"* ]] ;;
    coredns) [[ $out == *"CoreDNS-$COREDNS_VERSION"* && $out == *"dns.kubernetes"* ]] ;;
  esac || { echo "setup-peers: $name ($BIN/$BIN_NAME) does not run as expected:" >&2; echo "$out" >&2; exit 1; }
  log "$name runs: $(echo "$out" | sed -n 1p)"
}

mode=build
case ${1:-} in
  --print) mode=print; shift ;;
  --check) mode=check; shift ;;
esac
[ $# -gt 0 ] || { echo "usage: scripts/setup-peers.sh [--print|--check] aemm|nth|npd|ocisdk|coredns …" >&2; exit 2; }
for name in "$@"; do
  case $mode in
    print) bindir "$name"; [ -x "$BIN/$BIN_NAME" ] || exit 1; echo "$BIN" ;;
    build) build_peer "$name" ;;
    check) build_peer "$name" >/dev/null; smoke "$name"; bindir "$name"; echo "$BIN" ;;
  esac
done
