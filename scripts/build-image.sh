#!/usr/bin/env bash
# Builds the nodekeeper container image from packaging/Containerfile and checks it.
#
#   scripts/build-image.sh            # static release binary (built if needed), image
#                                     # localhost/nodekeeper:VERSION, then the checks below
#   NODEKEEPER_IMAGE=name:tag scripts/build-image.sh
#   scripts/build-image.sh --save FILE.tar   # also write an OCI archive (to push elsewhere)
#
# Engine: buildah (Debian package, installed when missing) with the vfs storage driver and a
# private store in .cache/containers, so nothing else on the machine is touched. `podman run` and
# `docker run` cannot start containers in this sandbox (crun/runc cannot set rlimits; no docker
# daemon), so the image is checked without running a container: mount its root filesystem
# (`buildah from` + `buildah mount`) and run `chroot ROOT /usr/bin/nodekeeper --version` (the
# binary is static, so the image's root needs nothing else), check the binary is static (ldd),
# the user is 65532 and the image holds only the expected files.
# Takes minutes from cold (release build, ~4 min on 2 cores): not part of `cargo test`; run by
# tests/packaging_image.rs (#[ignore]d: `cargo test --test packaging_image -- --ignored`).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/package-lib.sh"

save=""
if [ "${1:-}" = "--save" ]; then save=${2:?--save needs a file}; fi

apt_install buildah ca-certificates
version=$(crate_version)
image=${NODEKEEPER_IMAGE:-localhost/nodekeeper:$version}
store=(--root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)

bin=$(static_binary)
# ldd prints "statically linked" (static-pie) or "not a dynamic executable" for static binaries.
case "$(ldd "$bin" 2>&1 | head -n1)" in
  *"statically linked"* | *"not a dynamic executable"*) ;;
  *) echo "build-image.sh: $bin is dynamically linked: $(ldd "$bin" 2>&1 | head -n1)" >&2; exit 1 ;;
esac

ctx=$(mktemp -d)
ctr=""
cleanup() {
  [ -n "$ctr" ] && buildah "${store[@]}" rm "$ctr" >/dev/null 2>&1
  rm -rf "$ctx"
}
trap cleanup EXIT
cp "$bin" "$ctx/nodekeeper"
strip "$ctx/nodekeeper"
cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$ctx/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ctx/group"

log "buildah build $image"
buildah "${store[@]}" build --quiet --isolation chroot -f "$REPO/packaging/Containerfile" -t "$image" "$ctx" >&2

log "check: chroot into the image's root filesystem"
ctr=$(buildah "${store[@]}" from --quiet "$image")
root=$(buildah "${store[@]}" mount "$ctr")
files=$(cd "$root" && find . -type f | sort | tr '\n' ' ')
want="./etc/group ./etc/passwd ./etc/ssl/certs/ca-certificates.crt ./usr/bin/nodekeeper "
[ "$files" = "$want" ] || { echo "unexpected files in the image: $files" >&2; exit 1; }
out=$(chroot "$root" /usr/bin/nodekeeper --version)
case "$out" in *"$version"*) ;; *) echo "unexpected --version output: $out" >&2; exit 1 ;; esac
user=$(buildah "${store[@]}" inspect --format '{{.OCIv1.Config.User}}' "$image")
[ "$user" = "65532:65532" ] || { echo "image user is '$user', want 65532:65532" >&2; exit 1; }
size=$(du -sh "$root/usr/bin/nodekeeper" | cut -f1)
buildah "${store[@]}" umount "$ctr" >/dev/null

if [ -n "$save" ]; then
  buildah "${store[@]}" push --quiet "$image" "oci-archive:$save" >&2
  log "saved $save"
fi
echo "image=$image"
echo "version=$out"
echo "user=$user"
echo "binary=$size static"
