#!/bin/sh
# Build (once) the root filesystem of a node whose crio.service is the REAL CRI-O: a copy of the base rootfs
# (scripts/nspawn-rootfs.sh: Debian with systemd, conmon, runc, crun, CNI plugins) with crio, pinns and crictl from
# scripts/setup-crio.sh in /usr/local/bin, CRI-O's own unit file and a base /etc/crio/crio.conf. Prints its path.
#
#   scripts/nspawn-rootfs.sh --crio                  # the usual way: builds the base first
#   scripts/nspawn-rootfs-crio.sh BASE_ROOTFS        # <BASE_ROOTFS>-crio
#
# Idempotent: a stamp holds a hash of this script, the base's stamp and the CRI-O build; when it matches, nothing
# is done. Needs root. What each setting works around is in docs/dev/testing.md ("The real CRI-O").
set -eu

repo=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
base=${1:?usage: nspawn-rootfs-crio.sh BASE_ROOTFS}
rootfs="$base-crio"
stamp="$rootfs.stamp"
bin=$("$repo/scripts/setup-crio.sh" | tail -n 1)
want=$(cat "$0" "$base.stamp" | sha256sum | cut -d' ' -f1)-$(basename "$(dirname "$bin")")

exec 8>"$rootfs.lock"
flock 8
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$rootfs/usr/local/bin/crio" ]; then
    echo "$rootfs"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "nspawn-rootfs-crio.sh: must run as root" >&2; exit 1; }

echo "nspawn-rootfs-crio.sh: $base + CRI-O from $bin -> $rootfs" >&2
rm -rf "$rootfs" "$rootfs.tmp" "$stamp"
cp -a "$base" "$rootfs.tmp"
r="$rootfs.tmp"
install -m 0755 "$bin/crio" "$bin/pinns" "$bin/crictl" "$r/usr/local/bin/"

# CRI-O's unit (contrib/systemd/crio.service of the same release), less OOMScoreAdjust=-999: this sandbox has
# no CAP_SYS_RESOURCE, so a negative oom_score_adj fails the start.
cat >"$r/etc/systemd/system/crio.service" <<'UNIT'
[Unit]
Description=Container Runtime Interface for OCI (CRI-O)
Documentation=https://github.com/cri-o/cri-o
Wants=network-online.target
Before=kubelet.service
After=network-online.target

[Service]
Type=notify
EnvironmentFile=-/etc/sysconfig/crio
Environment=GOTRACEBACK=crash
ExecStart=/usr/local/bin/crio $CRIO_CONFIG_OPTIONS $CRIO_RUNTIME_OPTIONS $CRIO_STORAGE_OPTIONS $CRIO_NETWORK_OPTIONS $CRIO_METRICS_OPTIONS
ExecReload=/bin/kill -s HUP $MAINPID
TasksMax=infinity
LimitNOFILE=1048576
LimitNPROC=1048576
LimitCORE=infinity
TimeoutStartSec=0
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target
Alias=cri-o.service
UNIT

mkdir -p "$r/etc/crio/crio.conf.d" "$r/etc/containers" "$r/etc/systemd/journald.conf.d"
cat >"$r/etc/crio/crio.conf" <<'TOML'
# The tests' real CRI-O in systemd-nspawn: only what this sandbox needs differs from CRI-O's defaults
# (docs/dev/testing.md, "The real CRI-O"). Drop-ins in /etc/crio/crio.conf.d are read after this file.
[crio]
# vfs: no overlay on the container's own overlay root (--volatile=overlay)
storage_driver = "vfs"

[crio.runtime]
# crun 1.8 refuses this hybrid cgroup v1 host ("cgroups in hybrid mode not supported")
default_runtime = "runc"
# no iptables or nftables in nspawn
disable_hostport_mapping = true
pinns_path = "/usr/local/bin/pinns"

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"

[crio.network]
# Debian's path of the CNI plugins
plugin_dirs = ["/usr/lib/cni"]

[crio.nri]
enable_nri = false
TOML

# Offline and private: two unqualified-search registries (so a short name is ambiguous), no aliases (Debian's
# shortnames.conf would resolve `busybox` to Docker Hub, skipping the short-name checks).
rm -rf "$r/etc/containers/registries.conf.d"
cat >"$r/etc/containers/registries.conf" <<'TOML'
unqualified-search-registries = ["registry-a.invalid", "registry-b.invalid"]
TOML
printf '{"default": [{"type": "insecureAcceptAnything"}]}\n' >"$r/etc/containers/policy.json"

# The journal in /run/log/journal, which the tests bind to the host to read CRI-O's own error lines.
printf '[Journal]\nStorage=volatile\n' >"$r/etc/systemd/journald.conf.d/volatile.conf"

mv "$r" "$rootfs"
echo "$want" >"$stamp"
echo "$rootfs"
