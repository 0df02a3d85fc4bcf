#!/usr/bin/env bash
# The main job: `nodekeeper demo`, the whole loop on an embedded cluster (no cloud, no root
# needed): the sim API server, one real agent process per node against its own OCI metadata
# emulator, the controller, a scripted scenario with a live timeline; exit 0 only if every
# expected outcome happened. Arguments are passed on (e.g. `--serve`, `--speed 120`).
. "$(dirname "$0")/lib.sh"
command -v cargo >/dev/null || { echo "error: cargo not found: install Rust (rustup) first" >&2; exit 1; }
log "cargo build --locked"
(cd "$REPO" && cargo build --locked --quiet)
exec "$REPO/target/debug/nodekeeper" demo "$@"
