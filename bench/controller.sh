#!/usr/bin/env bash
# Controller throughput (authenticated reports/s with TokenReview caching) and report -> Node
# condition latency at N nodes, against the in-process sim over TLS (release build); with
# --connections 1, every node's agent reporting at the default interval (controller RSS,
# connections, handshakes, CPU, change latency). Usage:
#   bench/controller.sh [--nodes 5000] [--seconds 10] [--concurrency 64] [--rate 500]
#                               [--connections 1 [--window 30]] [--transport h1-idle]
#   bench/controller.sh --transports h2-held,h1-held,h2-idle,h1-idle [other flags]
#     runs the example once per transport, in a row (side by side in one run; each its own process).
#     (with --connections 1 --seconds 0: phase 3 only, the transport comparison of docs/controller.md)
# Figures are recorded in docs/controller.md.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
log "cargo build --release --example controller_bench"
cargo build --release --example controller_bench
bin="$REPO/target/release/examples/controller_bench"
transports=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --transports) transports="$2"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
[ -n "$transports" ] || exec "$bin" "${args[@]}"
IFS=, read -r -a list <<<"$transports"
for t in "${list[@]}"; do
    log "transport $t ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$bin" "${args[@]}" --transport "$t"
done
