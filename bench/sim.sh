#!/usr/bin/env bash
# Scale benchmark of `nodekeeper sim apiserver` (release build): 5,000 nodes / 100,000 pods by default.
# Usage: bench/sim.sh [NODES] [PODS_PER_NODE] [WATCHERS] [EVENTS_PER_SEC]
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
exec cargo run --release --example sim_bench -- "${1:-5000}" "${2:-20}" "${3:-10}" "${4:-1000}"
