#!/usr/bin/env bash
# Benchmark: `nodekeeper crio apply` when nothing changed (goal: <= 10 ms wall, 0 restarts).
# The drop-ins are already on disk and owned, so the run only reads, compares and exits; it
# never connects to D-Bus. Prints hyperfine's table; record the figure in docs/dev/benchmarks.md.
. "$(dirname "$0")/lib/bench.sh"
apt_install hyperfine
(cd "$REPO" && cargo build --release --locked --quiet)
NK="$REPO/target/release/nodekeeper"
T="$(mktemp -d)"; at_exit rm -rf "$T"
mkdir -p "$T/root/etc/crio/crio.conf.d"
{
  echo '[crio]'
  for i in $(seq -w 1 8); do
    printf '[[crio.dropin]]\nname = "%s-bench.conf"\nadopt = true\ncontent = """\n[crio.runtime]\npids_limit = %d\n"""\n' "$i" "$((4000 + 10#$i))"
    printf '[crio.runtime]\npids_limit = %d\n' "$((4000 + 10#$i))" > "$T/root/etc/crio/crio.conf.d/$i-bench.conf"
  done
} > "$T/agent.toml"
# First run adopts the identical files (no change, no restart); later runs are pure no-ops.
NODEKEEPER_LOG_LEVEL=warn "$NK" crio apply --config "$T/agent.toml" --root "$T/root" --output json
out="$(NODEKEEPER_LOG_LEVEL=warn "$NK" crio apply --config "$T/agent.toml" --root "$T/root" --output json)"
echo "$out"
case "$out" in *'"changed":false'*'"restarted":false'*) ;; *) die "expected a no-op, got: $out" ;; esac
NODEKEEPER_LOG_LEVEL=warn hyperfine --warmup 20 --runs 300 -N \
  --export-markdown "$T/result.md" "$NK crio apply --config $T/agent.toml --root $T/root"
cat "$T/result.md"
