#!/usr/bin/env bash
# Checks the agent build (`--no-default-features`, README "Builds"): it has the agent's commands
# and none of the others, and the controller, sim and demo code is not even compiled (cargo tree)
# and gone from the binary (that is what makes it smaller in memory). Run by scripts/test.sh after `cargo test`; the debug
# build reuses the test build's dependencies, so only nodekeeper itself is compiled again.
. "$(dirname "$0")/lib.sh"
cd "$REPO"
log "cargo build --no-default-features (the agent build)"
cargo build --locked --quiet --no-default-features
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cp target/debug/nodekeeper "$T/nodekeeper-agent"
# target/debug/nodekeeper is the full build again for whatever runs next (fresh: no compile).
cargo build --locked --quiet
NK="$T/nodekeeper-agent"
fail() { echo "check-agent-build.sh: $*" >&2; exit 1; }

# (outputs go through files: `cmd | grep -q` under pipefail can fail on SIGPIPE, or pass wrongly)
"$NK" --version >"$T/version"
grep -q "agent build" "$T/version" || fail "--version does not say 'agent build': $(cat "$T/version")"
"$NK" --help >"$T/help"
grep -q "This is the agent build" "$T/help" || fail "--help does not say it is the agent build"
for cmd in agent crio validate; do
  "$NK" "$cmd" --help >/dev/null || fail "no '$cmd' command"
done
for cmd in controller drain status sim demo; do
  set +e
  err=$("$NK" "$cmd" --help 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" = 2 ] || fail "'$cmd' exited $rc, want 2 (usage)"
  [[ "$err" == *"unrecognized subcommand '$cmd'"* ]] || fail "'$cmd': $err"
done
# The agent's own paths work: the packaged example config validates, `agent --once` reports.
"$NK" validate --config packaging/agent.toml >/dev/null || fail "validate packaging/agent.toml"
cat >"$T/agent.toml" <<'TOML'
[sources]
cloud = "none"
[checks.kmsg]
enabled = false
[checks.systemd]
enabled = false
TOML
mkdir -p "$T/root/etc/crio/crio.conf.d"
NODEKEEPER_NODE_NAME=n1 "$NK" agent --config "$T/agent.toml" --root "$T/root" --once -o json >"$T/once.json" ||
  fail "agent --once"
python3 - "$T/once.json" <<'PY' || fail "agent --once: unexpected report: $(cat "$T/once.json")"
import json, sys
r = json.load(open(sys.argv[1]))
types = {c["condition_type"] for c in r["conditions"]}
assert {"NodekeeperMemoryPressure", "NodekeeperPIDPressure"} <= types, types
assert r["node"] == "n1" and "agent build" in r["agent_version"], r
PY
# The agent build compiles no controller, sim or demo code: neither the stand-ins crate nor the
# controller's own dependencies are in its dependency tree...
cargo tree --locked -p nodekeeper --no-default-features -e normal --prefix none >"$T/tree"
grep -q "^nodekeeper-core " "$T/tree" || fail "no nodekeeper-core in the agent build's tree (cargo tree broken?)"
for crate in nodekeeper-sim axum cron chrono-tz hmac rcgen serde_yaml prost; do
  if grep -q "^$crate " "$T/tree"; then
    fail "the agent build depends on $crate"
  fi
done
# ...and its binary holds none of their symbols.
nm -C "$NK" >"$T/symbols"
grep -q "nodekeeper_core::agent::" "$T/symbols" || fail "no nodekeeper_core::agent code at all (nm broken?)"
for module in nodekeeper_core::controller:: nodekeeper_sim::; do
  if grep -q "$module" "$T/symbols"; then
    fail "the agent build still holds $module code"
  fi
done
# The shipped agent build aborts on panic (`[profile.agent]` in Cargo.toml: panic = "abort"), so no
# code it compiles may count on catching one (the controller's modules, which do, are not in it).
grep -q '^panic = "abort"' <(sed -n '/^\[profile.agent\]/,/^\[/p' Cargo.toml) ||
  fail "[profile.agent] in Cargo.toml no longer sets panic = \"abort\" (update this check and docs/dev/benchmarks.md)"
if grep -rnE 'catch_unwind|is_panic|into_panic' src crates/core/src --exclude-dir=controller >"$T/catch"; then
  fail "the agent build (panic = \"abort\") has code that catches panics: $(cat "$T/catch")"
fi
log "agent build: ok ($(size -A "$NK" | awk '$1==".text" {print $2}') bytes of .text in debug)"
