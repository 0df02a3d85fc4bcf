#!/usr/bin/env bash
# Cost of one full health-check round on this machine (release build). Usage:
#   scripts/bench-checks.sh [--rounds N] [--bus unix:path=...] [--host-root DIR]
# Pass --bus with a systemd D-Bus address (e.g. an nspawn container's, see
# docs/checks.md) to include the systemd unit check. Figures are recorded in docs/checks.md.
. "$(dirname "$0")/lib.sh"
cd "$REPO"
log "cargo build --release --example checks_bench"
cargo build --release --example checks_bench
exec "$REPO/target/release/examples/checks_bench" "$@"
