#!/usr/bin/env bash
# Builds the nodekeeper .rpm into target/packages/ and prints its path.
#
#   scripts/package-rpm.sh                       # static release binary (built if needed)
#   NODEKEEPER_BIN=path scripts/package-rpm.sh   # package another binary
#
# The file list and scriptlets are [package.metadata.generate-rpm] in Cargo.toml; the tool is
# cargo-generate-rpm (pure Rust, no rpmbuild), installed with `cargo install --locked` into
# ~/.cargo/bin on first use (a few minutes of compiling, once per machine).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/package-lib.sh"

out="$REPO/target/packages"
mkdir -p "$out"
bin=$(static_binary)
[ -x "$bin" ] || { echo "package-rpm.sh: no binary at $bin" >&2; exit 1; }
if ! cargo generate-rpm --version >/dev/null 2>&1; then
  log "cargo install cargo-generate-rpm"
  cargo install --locked --quiet cargo-generate-rpm >&2
fi
version=$(crate_version)
rpm="$out/nodekeeper-$version-1.x86_64.rpm"
args=()
if [ -n "${NODEKEEPER_BIN:-}" ]; then
  # Point the binary asset at NODEKEEPER_BIN (the other assets are unchanged).
  args+=(--set-metadata "assets = [
    { source = \"$bin\", dest = \"/usr/bin/nodekeeper\", mode = \"755\" },
    { source = \"systemd/nodekeeper-agent.service\", dest = \"/usr/lib/systemd/system/nodekeeper-agent.service\", mode = \"644\" },
    { source = \"systemd/nodekeeper-crio-apply.service\", dest = \"/usr/lib/systemd/system/nodekeeper-crio-apply.service\", mode = \"644\" },
    { source = \"packaging/systemd/10-state-dir.conf\", dest = \"/usr/lib/systemd/system/nodekeeper-agent.service.d/10-state-dir.conf\", mode = \"644\" },
    { source = \"packaging/systemd/10-state-dir.conf\", dest = \"/usr/lib/systemd/system/nodekeeper-crio-apply.service.d/10-state-dir.conf\", mode = \"644\" },
    { source = \"packaging/agent.toml\", dest = \"/usr/share/doc/nodekeeper/examples/agent.toml\", mode = \"644\", doc = true },
    { source = \"README.md\", dest = \"/usr/share/doc/nodekeeper/README.md\", mode = \"644\", doc = true },
  ]")
fi
(cd "$REPO" && cargo generate-rpm --target "$STATIC_TARGET" -o "$rpm" "${args[@]}" >&2)
echo "$rpm"
