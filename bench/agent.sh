#!/usr/bin/env bash
# Benchmark: the agent's steady RSS and CPU at default settings with every check on and a 1 s
# metadata poll (goal: RSS <= 12 MiB, CPU <= 2 millicores). The agent polls a local OCI metadata
# emulator on loopback (never 169.254.169.254 from this namespace).
# Usage: bench/agent.sh [SECONDS] [agent|full]   (default 60 s, the agent build that nodes
#   run, `cargo build --profile agent --no-default-features`: README "Builds"; the goal's figure is
#   for 600 s). `full` measures the build with every
#   command. The metadata emulator (`sim imds`) runs from the full build.
#   NODEKEEPER_BIN=/path/to/nodekeeper bench/agent.sh   measures that binary (no build),
#   e.g. to compare release profiles side by side. NODEKEEPER_SIM_BIN names the emulator's binary
#   (any build with `sim imds`, e.g. target/debug/nodekeeper: its speed does not matter here); by
#   default the same binary with NODEKEEPER_BIN, else the full release build, built first.
. "$(dirname "$0")/lib/bench.sh"
DURATION="${1:-60}"
FLAVOR="${2:-agent}"
if [ -n "${NODEKEEPER_BIN:-}" ]; then
  NK="$NODEKEEPER_BIN"
  SIM="${NODEKEEPER_SIM_BIN:-$NK}"
else
  case "$FLAVOR" in
    agent)
      # The agent profile: release with panic = "abort" (Cargo.toml), into target/agent/.
      (cd "$REPO" && cargo build --profile agent --locked --quiet --no-default-features)
      NK="$REPO/target/agent/nodekeeper"
      ;;
    full) NK="$REPO/target/release/nodekeeper" ;;
    *) echo "$BENCH: build must be agent or full, not '$FLAVOR'" >&2; exit 2 ;;
  esac
  SIM="${NODEKEEPER_SIM_BIN:-$REPO/target/release/nodekeeper}"
  if [ "$FLAVOR" = full ] || [ -z "${NODEKEEPER_SIM_BIN:-}" ]; then
    (cd "$REPO" && cargo build --release --locked --quiet)
  fi
fi
T="$(mktemp -d)"
at_exit rm -rf "$T"
PORT=$((20000 + RANDOM % 20000))
"$SIM" sim imds --cloud oci --listen "127.0.0.1:$PORT" >"$T/imds.log" 2>&1 &
track $!
cat >"$T/agent.toml" <<TOML
[log]
level = "warn"
[sources]
cloud = "oci"
endpoint = "http://127.0.0.1:$PORT"
poll_interval = "1s"
[checks]
interval = "1s"
[agent]
shutdown_watcher = false
TOML
mkdir -p "$T/root/etc/crio/crio.conf.d"
DBUS_SYSTEM_BUS_ADDRESS="unix:path=$T/no-bus" "$NK" agent --config "$T/agent.toml" --root "$T/root" 2>"$T/agent.log" &
AGENT=$!
track "$AGENT"
sleep 5 # warm-up: first check round, identity, first polls
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$AGENT/stat"; }
c0=$(cpu); t0=$(date +%s.%N)
max_rss=0
for _ in $(seq 1 "$DURATION"); do
  sleep 1
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$AGENT/status")
  [ "$rss" -gt "$max_rss" ] && max_rss=$rss
done
c1=$(cpu); t1=$(date +%s.%N)
awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v tick="$tick" -v rss="$max_rss" -v d="$DURATION" 'BEGIN {
  mc = (c1 - c0) / tick / (t1 - t0) * 1000;
  printf "agent over %d s (checks every 1 s, OCI metadata poll every 1 s): peak RSS %.1f MiB, CPU %.2f millicores\n", d, rss / 1024, mc
}'
# Where the resident memory is: file-backed (the binary's touched code and data pages) vs anonymous
# (heap, stacks), at the end of the run.
awk '/^Rss:/ {rss=$2} /^Anonymous:/ {anon=$2} END {
  printf "  at the end: RSS %.1f MiB = file-backed %.1f MiB (touched pages of the binary and libc) + anonymous %.1f MiB (heap, stacks)\n", rss/1024, (rss-anon)/1024, anon/1024
}' "/proc/$AGENT/smaps_rollup"
printf '  binary: %s (%.1f MiB on disk, .text %s bytes)\n' "$NK" "$(stat -c %s "$NK" | awk '{print $1/1048576}')" \
  "$(size -A "$NK" 2>/dev/null | awk '$1==".text" {print $2}')"
grep -c . "$T/imds.log" >/dev/null || true
printf '  build: %s\n' "$("$NK" --version)"
