#!/usr/bin/env bash
# Builds (or reuses) the images of kind-tests/node.sh, without a registry:
#   kai.test/debian:bookworm  a dynamically linked Debian 12 rootfs
#                             (debootstrap --variant=minbase from the mirror of
#                             apt's configured source) with user kai, uid/gid 1000
#   kai.test/pause:1          the pod sandbox: pause.c, linked static
# each an OCI archive (oci_image.py) for `ctr -n k8s.io images import`, under
# ~/.cache/kai-tools/node-images-<hash of this script, oci_image.py, pause.c>/.
# Prints that directory on the last line. Needs root (debootstrap, chroot), cc.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pin="$(cat "$here/images.sh" "$here/oci_image.py" "$here/pause.c" | sha256sum | cut -c1-12)"
out="${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/node-images-${pin}"
if [ -f "$out/debian.oci.tar" ] && [ -f "$out/pause.oci.tar" ]; then
  echo "node images (pin $pin): cached in $out" >&2
  echo "$out"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "images.sh: debootstrap needs root" >&2; exit 1; }
for t in debootstrap cc tar python3; do
  command -v "$t" >/dev/null || { echo "images.sh: '$t' is missing (apt-get install debootstrap gcc libc6-dev)" >&2; exit 1; }
done
# The mirror apt already uses (deb822 or one-line sources), else Debian's CDN.
mirror="${DEBIAN_MIRROR:-$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null \
  | grep -v security | grep -Eo 'https?://[^ ]+/debian/?' | head -n1 || true)}"
mirror="${mirror:-http://deb.debian.org/debian}"

work="$(mktemp -d "${TMPDIR:-/tmp}/kai-node-images.XXXXXX")"
cleanup() {
  # debootstrap mounts proc/sys in the target while it runs; never leave them.
  for m in proc sys dev/pts; do umount "$work/rootfs/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
start=$SECONDS
echo "images.sh: debootstrap --variant=minbase bookworm from $mirror" >&2
debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
  || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
for m in proc sys dev/pts; do umount "$work/rootfs/$m" 2>/dev/null || true; done
echo "images.sh: debootstrap took $((SECONDS - start)) s" >&2
chroot "$work/rootfs" /usr/sbin/useradd --uid 1000 --user-group --create-home --shell /bin/bash kai
rm -rf "$work/rootfs"/var/cache/apt/archives/*.deb "$work/rootfs"/var/lib/apt/lists/* "$work/rootfs"/dev/*
# Numeric owners, sorted names, fixed mtimes: one layer, as close to
# reproducible as a debootstrap gets.
tar --numeric-owner --sort=name --mtime=@0 -C "$work/rootfs" -cf "$work/debian.layer.tar" .
mkdir -p "$out.partial"
python3 "$here/oci_image.py" kai.test/debian:bookworm "$work/debian.layer.tar" "$out.partial/debian.oci.tar" --cmd /bin/bash >&2

mkdir -p "$work/pause"
cc -static -O2 -o "$work/pause/pause" "$here/pause.c"
tar --numeric-owner --sort=name --mtime=@0 --owner=0 --group=0 -C "$work/pause" -cf "$work/pause.layer.tar" pause
python3 "$here/oci_image.py" kai.test/pause:1 "$work/pause.layer.tar" "$out.partial/pause.oci.tar" --cmd /pause >&2
rm -rf "$out"
mv "$out.partial" "$out"
echo "images.sh: node images built in $((SECONDS - start)) s into $out" >&2
echo "$out"
