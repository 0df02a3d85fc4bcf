#!/usr/bin/env bash
# Installs everything nodekeeper's demo and tests need on a fresh Debian machine (idempotent):
# Debian packages (openssl: tests/sim/provider_oci.rs makes its RSA keys with it; rpm and cpio for the .rpm
# test; prometheus for promtool), cargo-generate-rpm, real kubectl in a venv, the cached nspawn rootfs, the real Kubernetes
# control plane built from Go modules (scripts/setup-k8s.sh; needs Go and the Go module proxy), the real CRI-O
# built from Go modules (scripts/setup-crio.sh) with the nspawn rootfs that runs it as crio.service, and Amazon's
# EC2 metadata mock, the OCI Go SDK cross-check and the real node's CoreDNS (scripts/setup-peers.sh aemm ocisdk
# coredns).
. "$(dirname "$0")/lib.sh"

apt_install ca-certificates systemd systemd-container debootstrap dbus iproute2 util-linux hyperfine python3-venv \
  openssl rpm cpio curl
# The real CRI-O (scripts/setup-crio.sh): cgo with libseccomp; buildah and strace for the short-name tests
# (tests/host/crio_shortnames.rs). conmon, runc and the CNI plugins go into the nspawn rootfs (debootstrap).
apt_install gcc libc6-dev libseccomp-dev buildah strace
# The real node on the host (scripts/k8s-node.sh: kubelet and kube-proxy over CRI-O, tests/e2e/real_node):
# CRI-O's conmon, runc and CNI plugins, kube-proxy's iptables, a static busybox for the test images.
apt_install conmon runc containernetworking-plugins iptables busybox-static
# Prometheus 2.42 (Debian's `prometheus`): promtool runs `check rules` and `test rules` on the shipped alerts
# (tests/host/prometheus_rules.rs); the server itself scrapes a real controller in tests/e2e/prometheus.rs (its
# own config, temp dir and loopback port). In a container policy-rc.d keeps the package's service from
# starting; where systemd runs, prometheus.service listens on :9090 (unused here).
apt_install prometheus
# The .rpm test's packager (tests/host/packaging_rpm.rs).
. "$REPO/scripts/package-lib.sh"
ensure_generate_rpm
[ -x "$REPO/scripts/setup-kubectl.sh" ] && "$REPO/scripts/setup-kubectl.sh"
[ -x "$REPO/scripts/setup-helm.sh" ] && "$REPO/scripts/setup-helm.sh"
# Grafana's foundation SDK for the chart's dashboard generator (tools/grafana/dashboard.py).
"$REPO/scripts/setup-grafana-sdk.sh" >/dev/null
[ -x "$REPO/scripts/nspawn-rootfs.sh" ] && "$REPO/scripts/nspawn-rootfs.sh"
# The real control plane (etcd, kube-apiserver, kcm, scheduler, KWOK) and the real node's kubelet and kube-proxy
# from Go modules, cached by version.
"$REPO/scripts/setup-k8s.sh" >/dev/null
# The real CRI-O (crio, pinns, crictl) from Go modules, cached by version, and the nspawn node that runs it.
"$REPO/scripts/setup-crio.sh" >/dev/null
[ -x "$REPO/scripts/nspawn-rootfs.sh" ] && "$REPO/scripts/nspawn-rootfs.sh" --crio >/dev/null
# Amazon's EC2 metadata mock, the AWS source's real peer (tests/host/aemm_netns.rs), keyed by its own version.
"$REPO/scripts/setup-peers.sh" aemm >/dev/null
# The OCI Go SDK's clients for the signing cross-check (tests/host/oci_sdk_crosscheck.rs), keyed by its version.
"$REPO/scripts/setup-peers.sh" ocisdk >/dev/null
# CoreDNS for the real node's cluster DNS (scripts/k8s-node.sh), with the plugins of Kubernetes' add-on.
"$REPO/scripts/setup-peers.sh" coredns >/dev/null
# The container images the real node runs (tests/e2e/real_node): two static release builds, minutes cold, then
# only what changed; built here, before the tests, so that they do not compete with the e2e tests for the cores.
"$REPO/scripts/build-image.sh" >/dev/null
log "setup done"
