#!/usr/bin/env bash
# Builds the nodekeeper container image from packaging/Containerfile and checks it.
#
#   scripts/build-image.sh            # static release binaries (built if needed), images
#                                     # localhost/nodekeeper:VERSION (controller build: the Deployment)
#                                     # and localhost/nodekeeper-agent:VERSION (agent build: the
#                                     # DaemonSet), then the checks below on each
#   NODEKEEPER_IMAGE=name:tag NODEKEEPER_AGENT_IMAGE=name:tag scripts/build-image.sh
#   scripts/build-image.sh --save FILE.tar   # also write OCI archives FILE.tar and FILE-agent.tar
#
# Engine: buildah (Debian package, installed when missing) with the vfs storage driver and a
# private store in .cache/containers, so nothing else on the machine is touched. `podman run` and
# `docker run` cannot start containers in this sandbox (crun/runc cannot set rlimits; no docker
# daemon), so the image is checked without running a container: mount its root filesystem
# (`buildah from` + `buildah mount`) and run `chroot ROOT /usr/bin/nodekeeper --version` (the
# binary is static, so the image's root needs nothing else), check the binary is static (ldd),
# the user is 65532 and the image holds only the expected files.
# Takes minutes from cold (two release builds, ~4 min each on 2 cores): not part of `cargo test`; run by
# tests/host/packaging_image.rs (#[ignore]d: `cargo test --test host packaging_image:: -- --ignored`).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/package-lib.sh"

save=""
if [ "${1:-}" = "--save" ]; then save=${2:?--save needs a file}; fi

apt_install buildah ca-certificates
version=$(crate_version)
store=(--root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)

ctx=""
ctr=""
cleanup() {
  if [ -n "$ctr" ]; then buildah "${store[@]}" rm "$ctr" >/dev/null 2>&1 || true; fi
  if [ -n "$ctx" ]; then rm -rf "$ctx"; fi
}
trap cleanup EXIT

# build_one FLAVOR IMAGE PREFIX SAVE: builds IMAGE from the FLAVOR binary, checks it, prints
# PREFIXimage=, PREFIXversion=, PREFIXuser=, PREFIXbinary= lines, saves it to SAVE when set.
build_one() {
  local flavor=$1 image=$2 prefix=$3 save=$4 bin files want out user size
  bin=$(static_binary "$flavor")
  # ldd prints "statically linked" (static-pie) or "not a dynamic executable" for static binaries.
  case "$(ldd "$bin" 2>&1 | head -n1)" in
    *"statically linked"* | *"not a dynamic executable"*) ;;
    *) echo "build-image.sh: $bin is dynamically linked: $(ldd "$bin" 2>&1 | head -n1)" >&2; exit 1 ;;
  esac
  ctx=$(mktemp -d)
  cp "$bin" "$ctx/nodekeeper"
  strip "$ctx/nodekeeper"
  cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
  printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$ctx/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/group"

  log "buildah build $image ($flavor build)"
  buildah "${store[@]}" build --quiet --isolation chroot -f "$REPO/packaging/Containerfile" -t "$image" "$ctx" >&2
  rm -rf "$ctx"
  ctx=""

  log "check: chroot into the image's root filesystem"
  ctr=$(buildah "${store[@]}" from --quiet "$image")
  root=$(buildah "${store[@]}" mount "$ctr")
  files=$(cd "$root" && find . -type f | sort | tr '\n' ' ')
  want="./etc/group ./etc/passwd ./etc/ssl/certs/ca-certificates.crt ./usr/bin/nodekeeper "
  [ "$files" = "$want" ] || { echo "unexpected files in $image: $files" >&2; exit 1; }
  out=$(chroot "$root" /usr/bin/nodekeeper --version)
  case "$out" in *"$version"*) ;; *) echo "unexpected --version output: $out" >&2; exit 1 ;; esac
  if [ "$flavor" = agent ]; then
    case "$out" in *"agent build"*) ;; *) echo "$image: not the agent build: $out" >&2; exit 1 ;; esac
  fi
  user=$(buildah "${store[@]}" inspect --format '{{.OCIv1.Config.User}}' "$image")
  [ "$user" = "65532:65532" ] || { echo "image user is '$user', want 65532:65532" >&2; exit 1; }
  size=$(du -sh "$root/usr/bin/nodekeeper" | cut -f1)
  buildah "${store[@]}" umount "$ctr" >/dev/null
  buildah "${store[@]}" rm "$ctr" >/dev/null
  ctr=""

  if [ -n "$save" ]; then
    buildah "${store[@]}" push --quiet "$image" "oci-archive:$save" >&2
    log "saved $save"
  fi
  echo "${prefix}image=$image"
  echo "${prefix}version=$out"
  echo "${prefix}user=$user"
  echo "${prefix}binary=$size static"
}

# The agent build (profile `agent`, target/$STATIC_TARGET/agent/) and the controller build (profile
# `release`, target/$STATIC_TARGET/release/) no longer share an output directory; the order stays.
build_one agent "${NODEKEEPER_AGENT_IMAGE:-localhost/nodekeeper-agent:$version}" agent_ \
  "${save:+${save%.tar}-agent.tar}"
build_one controller "${NODEKEEPER_IMAGE:-localhost/nodekeeper:$version}" "" "$save"
