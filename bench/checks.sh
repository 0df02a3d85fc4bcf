#!/usr/bin/env bash
# Cost of one full health-check round on this machine (release build). Usage:
#   bench/checks.sh [--nspawn] [--rounds N] [--bus unix:path=...] [--host-root DIR]
# --nspawn boots the test rootfs (scripts/nspawn-rootfs.sh) with systemd-nspawn in its own cgroup
# and passes its system bus to the benchmark, so the systemd unit check is measured against a real
# systemd; it is powered off afterwards. Needs root for --nspawn. Figures go to docs/checks.md.
. "$(dirname "$0")/lib/bench.sh"
cd "$REPO"

nspawn=0
args=()
for a in "$@"; do
  if [ "$a" = "--nspawn" ]; then nspawn=1; else args+=("$a"); fi
done

log "cargo build --release --example checks_bench"
cargo build --release --example checks_bench
bench="$REPO/target/release/examples/checks_bench"

if [ "$nspawn" -eq 0 ]; then
  exec "$bench" "${args[@]}"
fi

rootfs=$("$REPO/scripts/nspawn-rootfs.sh" | tail -n1)
tmp=$(mktemp -d /tmp/nk-bench-XXXXXX)
mkdir "$tmp/dbus" "$tmp/crio.conf.d"
machine="nk-bench-$$"
cgroups=()
STOP_GRACE=30  # on exit the container (tracked below) gets SIGTERM, which powers it off: 30 s before SIGKILL
# remove_cgroups: on exit, once the container stopped.
remove_cgroups() {
  for c in "${cgroups[@]}"; do
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    rmdir "$(dirname "$c")" 2>/dev/null || true   # the shared parent, when no other bench runs
  done
  rm -rf "/run/systemd/nspawn/propagate/$machine" 2>/dev/null || true   # this container's only
  rm -rf "$tmp"
}
at_exit remove_cgroups
for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
  [ -e "$h/cgroup.procs" ] || continue
  mkdir -p "$h/nodekeeper-bench/$machine"
  cgroups+=("$h/nodekeeper-bench/$machine")
done
procs=""
for c in "${cgroups[@]}"; do procs="$procs $c/cgroup.procs"; done

NK_CGROUP_PROCS="$procs" sh -c 'for f in $NK_CGROUP_PROCS; do echo $$ > "$f" || exit 1; done; exec "$@"' sh \
  systemd-nspawn -D "$rootfs" --volatile=overlay -b --register=no --keep-unit --console=passive \
  --machine="$machine" --bind="$tmp/dbus:/run/dbus" --bind="$tmp/crio.conf.d:/etc/crio/crio.conf.d" \
  </dev/null >"$tmp/nspawn.log" 2>&1 &
track $!

bus="unix:path=$tmp/dbus/system_bus_socket"
for _ in $(seq 1 200); do
  state=$(busctl --address="$bus" get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 \
    org.freedesktop.systemd1.Manager SystemState 2>/dev/null || true)
  case "$state" in *running*|*degraded*) break ;; esac
  sleep 0.1
done
log "container $machine: $state"
"$bench" --bus "$bus" "${args[@]}"
