#!/bin/sh
# Build (once) the Debian bookworm root filesystem that the real-systemd tests boot with systemd-nspawn.
#
#   scripts/nspawn-rootfs.sh            # builds <repo>/.cache/nspawn-rootfs, prints its path
#   NSPAWN_ROOTFS=/some/dir scripts/nspawn-rootfs.sh
#   scripts/nspawn-rootfs.sh --crio     # <repo>/.cache/nspawn-rootfs-crio: the same with the REAL CRI-O
#                                       # (scripts/setup-crio.sh) as crio.service; prints its path
#
# Idempotent: a stamp file holds a hash of this script; when it matches, nothing is done. Needs root.
# Installs the Debian packages `systemd-container` and `debootstrap` when missing. The Debian mirror is
# the one of the machine's own apt sources. Inside the rootfs: systemd, dbus, systemd-logind, and
# stand-in `crio.service` / `kubelet.service` units (see the unit texts below), enabled.
set -eu

repo=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
if [ "${1:-}" = "--crio" ]; then
    exec "$repo/scripts/nspawn-rootfs-crio.sh" "$("$0")"
fi
rootfs=${NSPAWN_ROOTFS:-$repo/.cache/nspawn-rootfs}
stamp="$rootfs.stamp"
want=$(sha256sum "$0" | cut -d' ' -f1)
mkdir -p "$(dirname "$rootfs")"

# Parallel test processes call this script at once: one builds, the others wait for it.
exec 9>"$rootfs.lock"
flock 9

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$rootfs/lib/systemd/systemd" ]; then
    echo "$rootfs"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "nspawn-rootfs.sh: must run as root (debootstrap, systemd-nspawn)" >&2
    exit 1
fi

missing=""
command -v systemd-nspawn >/dev/null 2>&1 || missing="$missing systemd-container"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
    echo "nspawn-rootfs.sh: installing$missing" >&2
    apt-get update -qq >&2 || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2
fi

# The Debian mirror of the machine's own apt sources: deb822 *.sources first, then sources.list.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    mirror=$(awk '
        /^[ \t]*$/ { if (uri != "" && suites ~ /(^| )bookworm( |$)/ && uri !~ /security/) { print uri; exit } uri=""; suites=""; next }
        /^URIs:/ { uri=$2 }
        /^Suites:/ { $1=""; suites=$0 }
        END { if (uri != "" && suites ~ /(^| )bookworm( |$)/ && uri !~ /security/) print uri }
    ' "$f" | head -n1)
    [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $3 == "bookworm" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list | head -n1)
fi
if [ -z "$mirror" ]; then
    echo "nspawn-rootfs.sh: no Debian bookworm mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources" >&2
    exit 1
fi

echo "nspawn-rootfs.sh: debootstrapping bookworm from $mirror into $rootfs" >&2
rm -rf "$rootfs" "$rootfs.tmp" "$stamp"
mkdir -p "$(dirname "$rootfs")"
# conmon, runc, crun and the CNI plugins: what the real CRI-O of nspawn-rootfs-crio.sh runs with (Debian's).
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,iproute2,conmon,runc,crun,containernetworking-plugins \
    bookworm "$rootfs.tmp" "$mirror" >&2

units="$rootfs.tmp/etc/systemd/system"
mkdir -p "$units/multi-user.target.wants" "$rootfs.tmp/etc/crio/crio.conf.d"

# Stand-in CRI-O: every start attempt appends a line to /run/crio-starts (tests count restarts);
# a drop-in containing BROKEN makes the start fail for real (as CRI-O refuses a bad config); one
# containing SLOW_START makes the start take 30 s (for restart timeouts).
cat >"$units/crio.service" <<'UNIT'
[Unit]
Description=Stand-in CRI-O (nodekeeper tests)
[Service]
Type=simple
ExecStartPre=/bin/sh -c 'echo start >>/run/crio-starts'
ExecStartPre=/bin/sh -c '! grep -qs BROKEN /etc/crio/crio.conf.d/*'
ExecStartPre=/bin/sh -c 'if grep -qs SLOW_START /etc/crio/crio.conf.d/*; then sleep 30; fi'
ExecStart=/bin/sh -c 'exec sleep infinity'
[Install]
WantedBy=multi-user.target
UNIT

cat >"$units/kubelet.service" <<'UNIT'
[Unit]
Description=Stand-in kubelet (nodekeeper tests)
After=crio.service
[Service]
Type=simple
ExecStart=/bin/sh -c 'exec sleep infinity'
[Install]
WantedBy=multi-user.target
UNIT

# A unit whose start always outlasts a short restart timeout (not enabled: started on demand).
cat >"$units/slow.service" <<'UNIT'
[Unit]
Description=Slow-starting unit (nodekeeper restart-timeout tests)
[Service]
Type=simple
ExecStartPre=/bin/sleep 20
ExecStart=/bin/sh -c 'exec sleep infinity'
UNIT

ln -sf ../crio.service "$units/multi-user.target.wants/crio.service"
ln -sf ../kubelet.service "$units/multi-user.target.wants/kubelet.service"

# Quiet, fast boots: no getty on the console, no network configuration, fixed machine id source.
ln -sf /dev/null "$units/console-getty.service"
ln -sf /dev/null "$units/getty@.service"
ln -sf /dev/null "$units/systemd-networkd-wait-online.service"
: >"$rootfs.tmp/etc/machine-id"
echo nodekeeper-test >"$rootfs.tmp/etc/hostname"

mv "$rootfs.tmp" "$rootfs"
echo "$want" >"$stamp"
echo "$rootfs"
