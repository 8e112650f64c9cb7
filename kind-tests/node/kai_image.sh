#!/usr/bin/env bash
# The project's image from the binaries of TARGET_DIR, laid out as
# nix/image.nix lays it out (that build needs the network), so the chart's
# pods run it unchanged:
#   /bin/kai-webhook, kai-node, kai-csi, kai-aggregator   (stripped)
#   /artifacts/libvgpu.so   the stand-in libkai_fake_vgpu.so (services/fake-vgpu)
#   /tmp (1777), the CA bundle, user 65532:65532
# plus what the binaries are linked against (ldd: glibc, libgcc_s), at the
# paths the dynamic loader looks in: cargo builds them against this
# machine's glibc. One layer, an OCI archive for `ctr images import`.
#
#   kai_image.sh TARGET_DIR NAME OUT_TAR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="$1" name="$2" out="$3"
work="$(mktemp -d "${TMPDIR:-/tmp}/kai-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/bin" "$root/artifacts" "$root/tmp" "$root/etc/ssl/certs"
chmod 1777 "$root/tmp"
lib="$target/libkai_fake_vgpu.so"
[ -f "$lib" ] || lib="$target/deps/libkai_fake_vgpu.so"
install -m 0644 "$lib" "$root/artifacts/libvgpu.so"
for b in kai-webhook kai-node kai-csi kai-aggregator; do
  strip -o "$root/bin/$b" "$target/$b"
done
# Every shared object the binaries and the library need, the loader itself
# included (its path is the one written in the binaries).
for f in "$root"/bin/* "$root/artifacts/libvgpu.so"; do
  ldd "$f" | grep -Eo '/[^ ]+\.so[^ ]*'
done | sort -u | while read -r so; do
  mkdir -p "$root$(dirname "$so")"
  cp -L "$so" "$root$so"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
tar --numeric-owner --sort=name --mtime=@0 --owner=0 --group=0 -C "$root" -cf "$work/layer.tar" .
python3 "$here/oci_image.py" "$name" "$work/layer.tar" "$out" --user 65532:65532 \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt >&2
