#!/usr/bin/env bash
# Runs the whole test suite after installing what it needs. Usage: scripts/test.sh [cargo test args]
. "$(dirname "$0")/lib.sh"
"$REPO/scripts/setup.sh"
cd "$REPO"
log "cargo test"
cargo test --locked --workspace --all-targets "$@" -- --test-threads="${NODEKEEPER_TEST_THREADS:-4}"
"$REPO/scripts/check-agent-build.sh"
