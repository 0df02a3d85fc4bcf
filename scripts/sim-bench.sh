#!/bin/sh
# Scale benchmark of `nodekeeper sim apiserver` (release build): 5,000 nodes / 100,000 pods by default.
# Usage: scripts/sim-bench.sh [NODES] [PODS_PER_NODE] [WATCHERS] [EVENTS_PER_SEC]
set -eu
cd "$(dirname "$0")/.."
exec cargo run --release --example sim_bench -- "${1:-5000}" "${2:-20}" "${3:-10}" "${4:-1000}"
