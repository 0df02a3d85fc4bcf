#!/usr/bin/env bash
# Drain of a 110-pod node: nodekeeper vs the real kubectl, side by side on one sim, in one run.
# Usage: bench/drain.sh [--runs N] [--termination-ms M]
# Installs kubectl (scripts/setup-kubectl.sh) if missing. Figures are recorded in docs/drain.md.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"
sh "$REPO/scripts/setup-kubectl.sh" >/dev/null
log "cargo build --release --bin nodekeeper --example drain_bench"
cargo build --release --bin nodekeeper --example drain_bench
exec "$REPO/target/release/examples/drain_bench" \
  --kubectl "$REPO/.cache/venv/bin/kubectl" --nodekeeper "$REPO/target/release/nodekeeper" "$@"
