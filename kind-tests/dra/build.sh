#!/usr/bin/env bash
# DRA consumable capacity in the loop (issue 40, step 1): builds
# kubernetes-sigs/dra-example-driver v0.4.0 (commit bab2dce4) from the source
# tarball in shared/ (its module is not on the Go module proxy; its
# dependencies, k8s.io/* v0.36.2, are), with no Docker and no registry:
#
#   <cache>/dra-example-driver-v0.4.0-<sha12 of tarball>/
#     src/                       the tarball, extracted
#     build-<sha12 of this script + ../lib/from-tarball.sh + oci_image.py>/
#       bin/                     dra-example-kubeletplugin dra-example-controller
#                                dra-example-webhook
#       images/dra-example-driver.oci.tar
#                                registry.k8s.io/dra-example-driver/dra-example-driver:v0.4.0
#                                (the chart's image.repository : appVersion, one image for
#                                the kubelet plugin DaemonSet, the controller and the webhook)
#       chart/dra-example-driver-0.4.0.tgz
#       images.tsv               name, entrypoint/cmd, user, size, file
#       done
#
# <cache> is ${XDG_CACHE_HOME:-~/.cache}/kai-tools. A second run with the same
# tarball and the same scripts prints "cached" and the image table. The image
# is an OCI archive made by kind-tests/node/oci_image.py for
# `ctr -n k8s.io images import` (nothing is imported here). See README.md.
#
#   build.sh            build (or reuse) everything; the last line of stdout is
#                       the build directory
#   KAI_SHARED=DIR      where the tarball is (default: <repo>/../shared)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib/from-tarball.sh"  # repo node shared cache; die log phase go_local extract base_layer

DRA_VERSION=v0.4.0                 # the tag; Chart.yaml's appVersion, so the image tag
DRA_CHART_VERSION=0.4.0            # Chart.yaml says 0.0.0-dev ("set from a Git tag")
DRA_TAR="$shared/dra-example-driver-$DRA_VERSION.tar.zst"
DRA_IMAGE=registry.k8s.io/dra-example-driver/dra-example-driver   # values.yaml image.repository
# Makefile `cmds`: every directory under cmd/. The Dockerfile copies all three
# into /usr/bin of one image; the chart starts dra-example-kubeletplugin
# (DaemonSet, always), dra-example-webhook (Deployment, webhook.enabled,
# default false) and dra-example-controller (Deployment, controller.plugins
# non-empty, default []), each by `command:` from PATH.
DRA_CMDS=(dra-example-kubeletplugin dra-example-controller dra-example-webhook)

t0=$SECONDS

[ -f "$DRA_TAR" ] || die "missing $DRA_TAR (set KAI_SHARED)"
pin="$(cat "$here/build.sh" "$here/../lib/from-tarball.sh" "$node/oci_image.py" | sha256sum | cut -c1-12)"
dra_h="$(sha256sum "$DRA_TAR" | cut -c1-12)"
DRA_SRC="$cache/dra-example-driver-$DRA_VERSION-$dra_h/src"
DRA_OUT="$cache/dra-example-driver-$DRA_VERSION-$dra_h/build-$pin"

if [ -f "$DRA_OUT/done" ]; then
  echo "build.sh: dra-example-driver $DRA_VERSION (tarball $dra_h), script pin $pin: cached" >&2
  cat "$DRA_OUT/images.tsv" >&2
  phase cached
  echo "$DRA_OUT"
  exit 0
fi

# --- tools -----------------------------------------------------------------
go_local dra-example-driver 1.26.0  # its go.mod: go 1.26.0

# --- sources ---------------------------------------------------------------
# The tarball has no top directory (git archive of the tag, entries ./go.mod ...).
extract "$DRA_TAR" "$DRA_SRC"
phase extract

(cd "$DRA_SRC" && nice -n 19 go mod download) || die "go mod download failed for dra-example-driver"
phase "go mod download"

# --- binaries ----------------------------------------------------------------
rm -rf "$DRA_OUT"
mkdir -p "$DRA_OUT/bin" "$DRA_OUT/images" "$DRA_OUT/chart"
(
  cd "$DRA_SRC"
  pkgs=(); for c in "${DRA_CMDS[@]}"; do pkgs+=("./cmd/$c"); done
  # The Makefile's `cmds` (go build -ldflags "-s -w -X main.version=$(VERSION)"),
  # one go build for all three so shared packages compile once. Nothing in the
  # module needs cgo; CGO_ENABLED=0 gives static binaries. nice -n 19: CI may
  # share these cores.
  CGO_ENABLED=0 nice -n 19 go build -ldflags "-s -w -X main.version=$DRA_VERSION" -o "$DRA_OUT/bin/" "${pkgs[@]}"
) || die "dra-example-driver build failed"
for c in "${DRA_CMDS[@]}"; do [ -x "$DRA_OUT/bin/$c" ] || die "no $DRA_OUT/bin/$c"; done
phase "binaries"

# --- image -----------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/dra-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Upstream: FROM docker.io/ubuntu:22.04, the three binaries in /usr/bin, no
# USER (root: the plugin runs privileged and writes /var/run/cdi and the
# kubelet's plugin sockets), no ENTRYPOINT (the chart's `command:` names the
# binary, found on PATH). Here: the Debian 12 rootfs of node/images.sh
# (cached) in place of ubuntu, so the container keeps a shell
# (`kubectl exec … -- cat /var/run/cdi/…` reads the CDI specs it wrote).
node_images="$(bash "$node/images.sh" | tail -n1)"
[ -f "$node_images/debian.oci.tar" ] || die "no $node_images/debian.oci.tar (kind-tests/node/images.sh)"
base_layer "$node_images/debian.oci.tar" "$work/layer.tar"
r="$work/extra"
mkdir -p "$r/usr/bin" "$r/licenses/dra-example-driver"
for c in "${DRA_CMDS[@]}"; do install -m 0755 "$DRA_OUT/bin/$c" "$r/usr/bin/$c"; done
install -m 0644 "$DRA_SRC/LICENSE" "$r/licenses/dra-example-driver/LICENSE"
# Appended to the Debian layer: one layer, later entries win.
files=(./licenses); for c in "${DRA_CMDS[@]}"; do files+=("./usr/bin/$c"); done
tar --numeric-owner --sort=name --mtime=@0 --owner=0 --group=0 -C "$r" -rf "$work/layer.tar" "${files[@]}"
printf 'image\tentrypoint / cmd\tuser\tsize\tarchive\n' > "$DRA_OUT/images.tsv"
out="$DRA_OUT/images/dra-example-driver.oci.tar"
python3 "$node/oci_image.py" "$DRA_IMAGE:$DRA_VERSION" "$work/layer.tar" "$out" --cmd /bin/bash >/dev/null
printf '%s\t%s\t%s\t%s\t%s\n' "$DRA_IMAGE:$DRA_VERSION" \
  "cmd /bin/bash; /usr/bin/{$(IFS=,; echo "${DRA_CMDS[*]}")} (the chart's command:)" \
  "0:0" "$(du -h --apparent-size "$out" | cut -f1)" "$out" >> "$DRA_OUT/images.tsv"
rm -rf "$r" "$work/layer.tar"
phase image

# --- chart -----------------------------------------------------------------
# As demo/scripts/push-driver-chart.sh does (`helm package --version
# $CHART_VERSION`), with the chart version of this tag; appVersion stays
# "v0.4.0", so image.repository:appVersion is the image above with no override.
grep -q '^appVersion: "'"$DRA_VERSION"'"' "$DRA_SRC/deployments/helm/dra-example-driver/Chart.yaml" \
  || die "Chart.yaml's appVersion is not $DRA_VERSION"
grep -q "^  repository: $DRA_IMAGE\$" "$DRA_SRC/deployments/helm/dra-example-driver/values.yaml" \
  || die "values.yaml's image.repository is not $DRA_IMAGE"
"$HELM" package "$DRA_SRC/deployments/helm/dra-example-driver" -d "$DRA_OUT/chart" \
  --version "$DRA_CHART_VERSION" --app-version "$DRA_VERSION" >&2
# What the packaged chart renders, for the README's check: every image it names.
"$HELM" template dra "$DRA_OUT/chart/dra-example-driver-$DRA_CHART_VERSION.tgz" -n dra-example-driver --api-versions resource.k8s.io/v1 \
  --set gpuAllowMultipleAllocations=true --set webhook.enabled=true --set 'controller.plugins={BindingConditions}' \
  | awk '$1 == "image:" {print $2}' | sort -u > "$work/images"
[ "$(cat "$work/images")" = "$DRA_IMAGE:$DRA_VERSION" ] \
  || die "the chart names other images: $(tr '\n' ' ' < "$work/images")"
phase chart

touch "$DRA_OUT/done"
cat "$DRA_OUT/images.tsv" >&2
log "built in $((SECONDS - t0)) s: $DRA_OUT"
echo "$DRA_OUT"
