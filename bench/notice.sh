#!/usr/bin/env bash
# Notice visible -> interruption taint + cordon on the Node, per source side by side (OCI Events
# push; OCI, AWS, Azure metadata polls; GCP long poll), through real agent processes, the
# controller and the sim, all on loopback. Prints p50/p99/max per source with the poll interval.
# Usage: bench/notice.sh [--debug] [--real] [--trials N] [--poll-ms MS]
# --debug uses the debug build (no 20-40 min release build). --real runs it on a real control plane (started
# for the run, see scripts/lib.sh real_cluster) instead of the sim. Figures: docs/dev/benchmarks.md.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
profile=release
flag=--release
if [ "${1:-}" = "--debug" ]; then profile=debug; flag=; shift; fi
real=()
if [ "${1:-}" = "--real" ]; then
  shift
  work=$(mktemp -d "${TMPDIR:-/tmp}/nodekeeper-bench-notice.XXXXXX")
  real_cluster "$work/cluster"
  real=(--kubeconfig "$REAL_KUBECONFIG")
fi
log "cargo build $flag --bin nodekeeper --example notice_bench"
cargo build --locked $flag --bin nodekeeper --example notice_bench
# not exec: with --real, this script's exit stops the cluster
NODEKEEPER_BIN="$REPO/target/$profile/nodekeeper" "$REPO/target/$profile/examples/notice_bench" "${real[@]}" "$@"
