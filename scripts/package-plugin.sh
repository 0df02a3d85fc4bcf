#!/usr/bin/env bash
# Builds the kubectl plugin archive and its krew manifest into target/packages/ and prints the
# archive's path:
#
#   target/packages/kubectl-nodekeeper_VERSION_linux_amd64.tar.gz
#       nodekeeper            the controller build (static: status, drain, explain, history, ...)
#       kubectl-nodekeeper    -> nodekeeper (a symlink: kubectl's plugin lookup, docs/kubectl-plugin.md)
#       kubectl_complete-nodekeeper -> nodekeeper (kubectl's completion of `kubectl nodekeeper …`)
#       LICENSE
#   target/packages/nodekeeper.yaml   packaging/krew/nodekeeper.yaml with VERSION, URI and SHA256 filled in
#
#   scripts/package-plugin.sh                                  # static release controller build (built if needed)
#   NODEKEEPER_BIN=target/debug/nodekeeper scripts/package-plugin.sh
#   NODEKEEPER_PLUGIN_URI=https://…/kubectl-nodekeeper_0.1.0_linux_amd64.tar.gz (default: the
#       repository's releases URL of Cargo.toml's `repository`)
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/package-lib.sh"

out="$REPO/target/packages"
mkdir -p "$out"
bin=$(static_binary controller)
[ -x "$bin" ] || { echo "package-plugin.sh: no binary at $bin" >&2; exit 1; }
version=$(crate_version)
name="kubectl-nodekeeper_${version}_linux_amd64.tar.gz"

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
install -m 0755 "$bin" "$tree/nodekeeper"
ln -s nodekeeper "$tree/kubectl-nodekeeper"
ln -s nodekeeper "$tree/kubectl_complete-nodekeeper"
install -m 0644 "$REPO/LICENSE" "$tree/LICENSE"
# Reproducible: fixed owner, mode and time, sorted names.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tree" -czf "$out/$name" \
  nodekeeper kubectl-nodekeeper kubectl_complete-nodekeeper LICENSE

sha=$(sha256sum "$out/$name" | cut -d' ' -f1)
repo_url=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["package"]["repository"])' "$REPO/Cargo.toml")
uri=${NODEKEEPER_PLUGIN_URI:-$repo_url/releases/download/v$version/$name}
sed -e "s|{{VERSION}}|v$version|g" -e "s|{{URI}}|$uri|g" -e "s|{{SHA256}}|$sha|g" \
  "$REPO/packaging/krew/nodekeeper.yaml" > "$out/nodekeeper.yaml"
log "krew manifest: $out/nodekeeper.yaml (sha256 $sha)"
echo "$out/$name"
