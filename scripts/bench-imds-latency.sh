#!/bin/sh
# Notice visible -> NodeEvent emitted latency per metadata source, against the loopback
# emulators (no network beyond 127.0.0.1). Prints p50/p99/max per source.
# Usage: scripts/bench-imds-latency.sh [--release] [--iterations N] [--e2e]
set -eu
cd "$(dirname "$0")/.."
profile=""
if [ "${1:-}" = "--release" ]; then profile="--release"; shift; fi
exec cargo run -q $profile --example imds_latency -- "$@"
