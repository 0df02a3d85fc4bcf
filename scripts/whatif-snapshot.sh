#!/usr/bin/env bash
# Regenerates the what-if fixture tests/fixtures/whatif/snapshot.json the way a user exports a
# real cluster: starts `nodekeeper sim apiserver` with tests/fixtures/whatif/cluster.toml, waits
# until every pod is Running, and runs the real kubectl (scripts/setup-kubectl.sh):
#   kubectl get nodes,pods,pdb -A -o json
#
#   scripts/whatif-snapshot.sh [OUT]      # default: tests/fixtures/whatif/snapshot.json
. "$(dirname "$0")/lib.sh"
out="${1:-$REPO/tests/fixtures/whatif/snapshot.json}"
"$REPO/scripts/setup-kubectl.sh" >&2
kubectl="$REPO/.cache/venv/bin/kubectl"
(cd "$REPO" && cargo build --locked --quiet)
dir=$(mktemp -d)
"$REPO/target/debug/nodekeeper" sim apiserver --listen 127.0.0.1:0 \
  --scenario "$REPO/tests/fixtures/whatif/cluster.toml" \
  --kubeconfig-out "$dir/kubeconfig" >"$dir/sim.log" 2>&1 &
sim=$!
trap 'kill "$sim" 2>/dev/null; wait "$sim" 2>/dev/null; rm -rf "$dir"' EXIT
k() { HOME="$dir" "$kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
# 16 web + 4 api + 2 db + 6 cilium + 6 node-exporter pods, all Running.
want=34
for _ in $(seq 1 300); do
  running=$( (k get pods -A --no-headers 2>/dev/null || true) | awk '$4 == "Running"' | wc -l)
  [ "$running" -ge "$want" ] && break
  sleep 0.2
done
[ "$running" -ge "$want" ] || { echo "only $running of $want pods Running" >&2; cat "$dir/sim.log" >&2; exit 1; }
k get nodes,pods,pdb -A -o json >"$out"
log "wrote $out ($running pods)"
