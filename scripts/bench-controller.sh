#!/usr/bin/env bash
# Controller throughput (authenticated reports/s with TokenReview caching) and report -> Node
# condition latency at N nodes, against the in-process sim over TLS (release build). Usage:
#   scripts/bench-controller.sh [--nodes 5000] [--seconds 10] [--concurrency 64] [--rate 500]
# Figures are recorded in docs/controller.md.
. "$(dirname "$0")/lib.sh"
cd "$REPO"
log "cargo build --release --example controller_bench"
cargo build --release --example controller_bench
exec "$REPO/target/release/examples/controller_bench" "$@"
