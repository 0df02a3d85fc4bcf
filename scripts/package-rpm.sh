#!/usr/bin/env bash
# Builds the nodekeeper .rpm into target/packages/ and prints its path.
#
#   scripts/package-rpm.sh                       # static release agent build (built if needed)
#   NODEKEEPER_BIN=path scripts/package-rpm.sh   # package another binary
#   NODEKEEPER_RPM_COMPRESSION=none|gzip|zstd|xz (default zstd; tests use none)
#
# The file list and scriptlets are [package.metadata.generate-rpm] in Cargo.toml; the tool is
# cargo-generate-rpm (pure Rust, no rpmbuild), installed with `cargo install --locked` into
# ~/.cargo/bin on first use (a few minutes of compiling, once per machine).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/package-lib.sh"

out="$REPO/target/packages"
mkdir -p "$out"
bin=$(static_binary agent)
[ -x "$bin" ] || { echo "package-rpm.sh: no binary at $bin" >&2; exit 1; }
ensure_generate_rpm
version=$(crate_version)
rpm="$out/nodekeeper-$version-1.x86_64.rpm"
args=()
if [ -n "${NODEKEEPER_BIN:-}" ]; then
  # The assets of Cargo.toml with the binary's source pointed at NODEKEEPER_BIN.
  args+=(--set-metadata "$(python3 - "$REPO/Cargo.toml" "$bin" <<'PY'
import json, sys, tomllib
assets = tomllib.load(open(sys.argv[1], "rb"))["package"]["metadata"]["generate-rpm"]["assets"]
def entry(a):
    if a["dest"] == "/usr/bin/nodekeeper":
        a = dict(a, source=sys.argv[2])
    return "  { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in a.items()) + " },"
print("\n".join(["assets = ["] + [entry(a) for a in assets] + ["]"]))
PY
)")
fi
(cd "$REPO" && cargo generate-rpm --target "$STATIC_TARGET" \
  --payload-compress "${NODEKEEPER_RPM_COMPRESSION:-zstd}" -o "$rpm" "${args[@]}" >&2)
echo "$rpm"
