#!/usr/bin/env bash
# `nodekeeper crio apply` end to end against a throw-away root, a REAL systemd and the REAL CRI-O
# (Debian booted with systemd-nspawn, CRI-O 1.34.0 from scripts/setup-crio.sh as crio.service, the
# drop-in directory, CRI-O's socket and the journal bind-mounted). Shows: a change -> exactly one
# restart and CRI-O's live config has the value; a second run -> no change, no restart; a drop-in
# CRI-O refuses -> failed restart -> rollback, exit 1, with CRI-O's own error line.
. "$(dirname "$0")/lib.sh"
"$REPO/scripts/setup.sh" >&2
log "cargo build --release"
(cd "$REPO" && cargo build --release --locked --quiet)
NK="$REPO/target/release/nodekeeper"
ROOTFS="$("$REPO/scripts/nspawn-rootfs.sh" --crio)"
CRIO_BIN="$("$REPO/scripts/setup-crio.sh" --print)"

T="$(mktemp -d /tmp/nodekeeper-demo.XXXXXX)"
MACHINE="nk-demo-$$"
mkdir -p "$T/dbus" "$T/root/etc/crio/crio.conf.d" "$T/root/var/lib/nodekeeper" "$T/root/var/run/crio" "$T/root/run/log/journal"
CGROUPS=()
for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do
  [ -f "$h/cgroup.procs" ] || continue
  mkdir -p "$h/nodekeeper-demo/$MACHINE" && CGROUPS+=("$h/nodekeeper-demo/$MACHINE")
  [ "$h" = /sys/fs/cgroup ] && break
done
NSPAWN_PID=""
cleanup() {
  if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$NSPAWN_PID" 2>/dev/null || true
  fi
  for cg in "${CGROUPS[@]}"; do find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
  rm -rf "/run/systemd/nspawn/propagate/$MACHINE" "$T"
}
trap cleanup EXIT

log "booting a real systemd (Debian in systemd-nspawn) with the real CRI-O as crio.service"
NK_CGROUP_PROCS="${CGROUPS[*]/%//cgroup.procs}" sh -c 'for f in $NK_CGROUP_PROCS; do echo $$ > "$f" || exit 1; done; exec "$@"' sh \
  systemd-nspawn -D "$ROOTFS" --volatile=overlay -b --register=no --keep-unit --console=passive \
  --machine="$MACHINE" --bind="$T/dbus:/run/dbus" --bind="$T/root/etc/crio/crio.conf.d:/etc/crio/crio.conf.d" \
  --private-network --bind="$T/root/var/run/crio:/run/crio" --bind="$T/root/run/log/journal:/run/log/journal" \
  </dev/null >"$T/nspawn.log" 2>&1 &
NSPAWN_PID=$!
export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$T/dbus/system_bus_socket"
bus() { busctl --address="$DBUS_SYSTEM_BUS_ADDRESS" "$@"; }
for _ in $(seq 1 300); do
  state="$(bus get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager SystemState 2>/dev/null || true)"
  case "$state" in *running*|*degraded*) break ;; esac
  sleep 0.1
done
case "$state" in *running*|*degraded*) ;; *) echo "systemd in the container did not come up:" >&2; cat "$T/nspawn.log" >&2; exit 1 ;; esac
live() { "$CRIO_BIN/crio" status --socket "$T/root/var/run/crio/crio.sock" config 2>/dev/null | grep -E '^\s*pids_limit'; }
unit_info() {
  local p=/org/freedesktop/systemd1/unit/crio_2eservice
  printf 'crio.service: %s/%s, NRestarts=%s, started at %s\n' \
    "$(bus get-property org.freedesktop.systemd1 $p org.freedesktop.systemd1.Unit ActiveState | cut -d'"' -f2)" \
    "$(bus get-property org.freedesktop.systemd1 $p org.freedesktop.systemd1.Unit SubState | cut -d'"' -f2)" \
    "$(bus get-property org.freedesktop.systemd1 $p org.freedesktop.systemd1.Service NRestarts | cut -d' ' -f2)" \
    "$(bus get-property org.freedesktop.systemd1 $p org.freedesktop.systemd1.Unit ActiveEnterTimestampMonotonic | cut -d' ' -f2)"
}
unit_info
echo "CRI-O's live config: $(live)"

cat >"$T/agent.toml" <<'TOML'
[crio]
restart_timeout = "30s"

[[crio.dropin]]
name = "20-runtime.conf"
[crio.dropin.settings.crio.runtime]
pids_limit = 4096
TOML
log "1. nodekeeper validate"
"$NK" validate --config "$T/agent.toml" >/dev/null && echo "valid"
log "2. nodekeeper crio apply (a change: files written atomically, crio.service restarted over D-Bus)"
NODEKEEPER_LOG_LEVEL=warn "$NK" crio apply --config "$T/agent.toml" --root "$T/root"
unit_info
echo "CRI-O's live config: $(live)"
for f in "$T"/root/etc/crio/crio.conf.d/*; do echo "--- $(basename "$f")"; cat "$f"; done
log "3. the same again (no change: no restart)"
NODEKEEPER_LOG_LEVEL=warn "$NK" crio apply --config "$T/agent.toml" --root "$T/root" --output json
unit_info
log "4. a drop-in CRI-O refuses to start with (default_runtime names no runtime): restart fails, rollback"
sed -i 's/pids_limit = 4096/pids_limit = 4096\ndefault_runtime = "does-not-exist"/' "$T/agent.toml"
set +e
NODEKEEPER_LOG_LEVEL=off "$NK" crio apply --config "$T/agent.toml" --root "$T/root"
rc=$?
set -e
echo "exit code: $rc (1 = failed and rolled back)"
unit_info
echo "CRI-O's live config: $(live)"
grep -q does-not-exist "$T"/root/etc/crio/crio.conf.d/* && { echo "refused drop-in left behind!" >&2; exit 1; }
[ "$rc" = 1 ] || { echo "expected exit code 1" >&2; exit 1; }
log "demo finished: change -> 1 restart, no change -> 0 restarts, refused change -> rolled back"
