# Shared by scripts/build-image.sh and scripts/package-{deb,rpm}.sh. Source it after lib.sh.

# The static binary that the images and the packages ship: x86_64-unknown-linux-gnu with
# crt-static (the only target installed here; no musl toolchain can be fetched on a fresh
# machine). `static_binary controller` is the controller's image: the controller build
# (--no-default-features --features controller: controller, drain, status, agent, crio, validate; no API
# stand-in, no demo), release profile, into target/$STATIC_TARGET/release/; `static_binary agent`
# the agent build (--no-default-features: agent, crio apply, validate; the DaemonSet's image and
# the node packages), built with `--profile agent` (release with panic = "abort", Cargo.toml) into
# target/$STATIC_TARGET/agent/, so that both builds sit side by side. NODEKEEPER_BIN overrides
# either (e.g. tests package the debug binary). Prints the path.
STATIC_TARGET=x86_64-unknown-linux-gnu
static_binary() {
  local flavor=${1:?static_binary needs controller or agent}
  if [ -n "${NODEKEEPER_BIN:-}" ]; then
    echo "$NODEKEEPER_BIN"
    return 0
  fi
  local profile features
  case $flavor in
    agent) profile=agent features=(--no-default-features) ;;
    controller) profile=release features=(--no-default-features --features controller) ;;
    *) echo "static_binary: flavor must be controller or agent, not '$flavor'" >&2; return 2 ;;
  esac
  log "cargo build --profile $profile ${features[*]} (static, $STATIC_TARGET)"
  # RUSTFLAGS apply to the target only (build scripts and proc macros stay dynamic) because
  # --target is given; the output goes to target/$STATIC_TARGET/$profile.
  (cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --profile "$profile" --locked --target "$STATIC_TARGET" "${features[@]}" >&2)
  echo "$REPO/target/$STATIC_TARGET/$profile/nodekeeper"
}

# The crate version from Cargo.toml.
crate_version() {
  python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["package"]["version"])' "$REPO/Cargo.toml"
}

# cargo-generate-rpm (pure Rust, no rpmbuild), installed with `cargo install` into ~/.cargo/bin on
# first use (a few minutes of compiling, once per machine; scripts/setup.sh does it up front).
GENERATE_RPM_VERSION=0.21.1
ensure_generate_rpm() {
  if cargo generate-rpm --version >/dev/null 2>&1; then
    return 0
  fi
  log "cargo install cargo-generate-rpm $GENERATE_RPM_VERSION"
  cargo install --locked --quiet --version "$GENERATE_RPM_VERSION" cargo-generate-rpm >&2
}
