#!/usr/bin/env bash
# An image of node/registrar in the place of the CSI project's
# csi-node-driver-registrar, which is in no registry reachable here: the
# chart's csi-registrar sidecar runs it unchanged (same flags). One layer
# holding only the static binary, at the real image's entrypoint path
# /csi-node-driver-registrar (root-owned, 0755), made the Entrypoint because
# the pod's args replace an image's Cmd. An OCI archive for
# `ctr images import`; the same binary gives the same image digest.
#
#   registrar_image.sh BINARY NAME OUT_TAR
#   (BINARY: CGO_ENABLED=0 go build of node/registrar; NAME e.g.
#    registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -eq 3 ] || { echo "usage: $0 BINARY NAME OUT_TAR" >&2; exit 2; }
bin="$1" name="$2" out="$3"
# The image has no libc: a dynamic binary would not start.
if ldd "$bin" >/dev/null 2>&1; then
  echo "registrar_image.sh: $bin is dynamically linked (build it with CGO_ENABLED=0)" >&2
  exit 1
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/registrar-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir "$work/rootfs"
install -m 0755 "$bin" "$work/rootfs/csi-node-driver-registrar"
tar --numeric-owner --sort=name --mtime=@0 --owner=0 --group=0 -C "$work/rootfs" \
  -cf "$work/layer.tar" csi-node-driver-registrar
python3 "$here/oci_image.py" "$name" "$work/layer.tar" "$out" \
  --entrypoint /csi-node-driver-registrar >&2
