#!/usr/bin/env bash
# The main job: `nodekeeper demo`, the whole loop on an embedded cluster (no cloud, no root
# needed): the sim API server, one real agent process per node against its own OCI metadata
# emulator, the controller, a scripted scenario with a live timeline; exit 0 only if every
# expected outcome happened. Arguments are passed on (e.g. `--serve`, `--speed 120`).
#
#   scripts/demo.sh --real [ARGS…]   the same scenario on a real control plane built from Go modules
#                                    (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#                                    KWOK; built on first use, ~12 min on 2 cores, then cached), with
#                                    the shipped manifests installed and nodekeeper running as its
#                                    ServiceAccounts. The cluster is stopped at the end (kept while
#                                    `--serve` runs); its files and logs stay in the work directory.
# NODEKEEPER_DEMO_BIN=PATH uses that nodekeeper binary instead of building one (the tests do).
. "$(dirname "$0")/lib.sh"
real=0
args=()
for a in "$@"; do
  if [ "$a" = --real ]; then real=1; else args+=("$a"); fi
done
BIN="${NODEKEEPER_DEMO_BIN:-}"
if [ -z "$BIN" ]; then
  command -v cargo >/dev/null || { echo "error: cargo not found: install Rust (rustup) first" >&2; exit 1; }
  log "cargo build --locked"
  (cd "$REPO" && cargo build --locked --quiet)
  BIN="$REPO/target/debug/nodekeeper"
fi
[ $real = 1 ] || exec "$BIN" demo "${args[@]}"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/nodekeeper-demo-real.XXXXXX")
real_cluster "$WORK/cluster"
log "nodekeeper demo --kubeconfig $REAL_KUBECONFIG"
set +e
"$BIN" demo --kubeconfig "$REAL_KUBECONFIG" --dir "$WORK/demo" "${args[@]}"
rc=$?
set -e
echo "work directory (cluster logs, agent configs and logs): $WORK" >&2
exit $rc
