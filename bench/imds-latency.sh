#!/usr/bin/env bash
# Notice visible -> NodeEvent emitted latency per metadata source, against the loopback
# emulators (no network beyond 127.0.0.1). Prints p50/p99/max per source.
# Usage: bench/imds-latency.sh [--release] [--iterations N] [--e2e]
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
profile=()
if [ "${1:-}" = "--release" ]; then profile=(--release); shift; fi
exec cargo run -q "${profile[@]}" --example imds_latency -- "$@"
