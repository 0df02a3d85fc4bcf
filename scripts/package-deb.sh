#!/usr/bin/env bash
# Builds the nodekeeper .deb into target/packages/ and prints its path.
#
#   scripts/package-deb.sh                       # static release agent build (built if needed)
#   NODEKEEPER_BIN=target/debug/nodekeeper scripts/package-deb.sh
#   NODEKEEPER_DEB_COMPRESSION=none|gzip|xz (default xz; tests use none)
#
# The file list is [package.metadata.deb] in Cargo.toml. With cargo-deb installed
# (`cargo install cargo-deb`) and no NODEKEEPER_BIN, cargo-deb builds it; otherwise (the default
# here: installing cargo-deb compiles ~150 crates) dpkg-deb builds the same package from the same
# assets and packaging/deb/ maintainer scripts.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/package-lib.sh"

out="$REPO/target/packages"
mkdir -p "$out"
bin=$(static_binary agent)
[ -x "$bin" ] || { echo "package-deb.sh: no binary at $bin" >&2; exit 1; }

if [ -z "${NODEKEEPER_BIN:-}" ] && cargo deb --version >/dev/null 2>&1; then
  log "cargo deb"
  (cd "$REPO" && cargo deb --no-build --target "$STATIC_TARGET" --output "$out" >&2)
  ls -t "$out"/nodekeeper_*.deb | head -n1
  exit 0
fi

log "dpkg-deb (assets from [package.metadata.deb])"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
chmod 0755 "$tree"
python3 - "$REPO" "$tree" "$bin" <<'PY'
import hashlib, os, shutil, sys, tomllib
repo, tree, binary = sys.argv[1:4]
cargo = tomllib.load(open(os.path.join(repo, "Cargo.toml"), "rb"))
pkg, deb = cargo["package"], cargo["package"]["metadata"]["deb"]
release_bin = "target/x86_64-unknown-linux-gnu/agent/nodekeeper"
md5 = []
for src, dest, mode in deb["assets"]:
    src = binary if src == release_bin else os.path.join(repo, src)
    if dest.endswith("/"):
        dest += os.path.basename(src)
    path = os.path.join(tree, dest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shutil.copyfile(src, path)
    os.chmod(path, int(mode, 8))
    md5.append(f"{hashlib.md5(open(path, 'rb').read()).hexdigest()}  {dest}\n")
# The state directory belongs to the package (postinst creates it too, as cargo-deb cannot
# ship an empty directory).
os.makedirs(os.path.join(tree, "var/lib/nodekeeper"), exist_ok=True)
os.chmod(os.path.join(tree, "var/lib/nodekeeper"), 0o750)
os.makedirs(os.path.join(tree, "etc/nodekeeper"), exist_ok=True)
ctl = os.path.join(tree, "DEBIAN")
os.makedirs(ctl)
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tree) for f in fs) // 1024
desc = deb["extended-description"].replace("\n", " ")
with open(os.path.join(ctl, "control"), "w") as f:
    f.write(f"Package: {pkg['name']}\nVersion: {pkg['version']}\nArchitecture: amd64\n"
            f"Maintainer: {deb['maintainer']}\nSection: {deb['section']}\n"
            f"Priority: {deb['priority']}\nDepends: {deb['depends']}\nInstalled-Size: {size}\n"
            f"Homepage: {pkg['repository']}\nDescription: {pkg['description']}\n {desc}\n")
with open(os.path.join(ctl, "md5sums"), "w") as f:
    f.writelines(md5)
scripts = os.path.join(repo, deb["maintainer-scripts"])
for name in ("postinst", "prerm", "postrm"):
    shutil.copyfile(os.path.join(scripts, name), os.path.join(ctl, name))
    os.chmod(os.path.join(ctl, name), 0o755)
PY
version=$(crate_version)
deb="$out/nodekeeper_${version}_amd64.deb"
dpkg-deb --root-owner-group "-Z${NODEKEEPER_DEB_COMPRESSION:-xz}" --build "$tree" "$deb" >&2
echo "$deb"
