#!/usr/bin/env bash
# KAI-Scheduler in the loop (issue 39, step 1): builds KAI-Scheduler v0.17.0
# and run-ai/fake-gpu-operator v0.2.0 from the source tarballs in shared/
# (neither module is on the Go module proxy; their dependencies are), with no
# Docker and no registry:
#
#   <cache>/kai-scheduler-v0.17.0-<sha12 of tarball>/
#     src/                       the tarball, extracted
#     build-<sha12 of this script + ../lib/from-tarball.sh + oci_image.py>/
#       bin/                     operator scheduler binder admission podgrouper
#                                podgroupcontroller queuecontroller resourcereservation
#                                nodescaleadjuster scalingpod numa-placement-exporter
#       e2e/                     hamicore.test, allocate-resources.test (go test -c)
#       images/<name>.oci.tar    ghcr.io/kai-scheduler/kai-scheduler/<name>:v0.17.0
#       chart/kai-scheduler-v0.17.0.tgz   packaged as KAI's on-release.yaml does
#       images.tsv               name, entrypoint/cmd, user, size, file
#   <cache>/fake-gpu-operator-0.2.0-<sha12 of tarball>/
#     src/, build-<pin>/{bin,images,chart}   ghcr.io/run-ai/fake-gpu-operator/<name>:0.2.0
#
# <cache> is ${XDG_CACHE_HOME:-~/.cache}/kai-tools. A second run with the same
# tarballs and the same scripts prints "cached" and the image table. Each image
# is an OCI archive made by kind-tests/node/oci_image.py for
# `ctr -n k8s.io images import` (nothing is imported here). See README.md.
#
#   build.sh            build (or reuse) everything; the last two lines of stdout
#                       are the two build directories (KAI, then fake-gpu-operator)
#   KAI_SHARED=DIR      where the tarballs are (default: <repo>/../shared)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib/from-tarball.sh"  # repo node shared cache; die log phase go_local extract base_layer

KAI_VERSION=v0.17.0
FGO_VERSION=0.2.0
KAI_TAR="$shared/kai-scheduler-$KAI_VERSION.tar.zst"
FGO_TAR="$shared/fake-gpu-operator-$FGO_VERSION.tar.zst"
KAI_REGISTRY=ghcr.io/kai-scheduler/kai-scheduler      # what on-release.yaml puts in values.yaml
FGO_REGISTRY=ghcr.io/run-ai/fake-gpu-operator         # the chart's default repositories

# The services the chart and the operator start (see README.md, "What runs"):
# the operator Deployment (chart), the Deployments the operator reconciles from
# the kai-config Config CR (scheduler per SchedulingShard, binder, admission,
# podgrouper, podgroupcontroller, queuecontroller), the pods the binder creates
# (resourcereservation), and the ones only some values start
# (nodescaleadjuster + scalingpod with global.clusterAutoscaling,
# numa-placement-exporter with the numa scheduler plugin).
KAI_SERVICES=(operator scheduler binder admission podgrouper podgroupcontroller queuecontroller
  nodescaleadjuster scalingpod numa-placement-exporter)
KAI_CGO_SERVICES=(resourcereservation)   # go-nvml (cgo) in pkg/resourcereservation/discovery
KAI_E2E=("hamicore:test/e2e/suites/integrations/third_party/hamicore"
  "allocate-resources:test/e2e/suites/allocate/resources")
# fake-gpu-operator: what its chart runs with KAI's e2e values (hack/fake-gpu-operator-values.yaml).
FGO_CMDS=(device-plugin nvidia-smi status-updater status-exporter status-exporter-kwok
  topology-server mig-faker kwok-gpu-device-plugin)

t0=$SECONDS

for f in "$KAI_TAR" "$FGO_TAR"; do [ -f "$f" ] || die "missing $f (set KAI_SHARED)"; done
pin="$(cat "$here/build.sh" "$here/../lib/from-tarball.sh" "$node/oci_image.py" | sha256sum | cut -c1-12)"
kai_h="$(sha256sum "$KAI_TAR" | cut -c1-12)"
fgo_h="$(sha256sum "$FGO_TAR" | cut -c1-12)"
KAI_SRC="$cache/kai-scheduler-$KAI_VERSION-$kai_h/src"
FGO_SRC="$cache/fake-gpu-operator-$FGO_VERSION-$fgo_h/src"
KAI_OUT="$cache/kai-scheduler-$KAI_VERSION-$kai_h/build-$pin"
FGO_OUT="$cache/fake-gpu-operator-$FGO_VERSION-$fgo_h/build-$pin"

if [ -f "$KAI_OUT/done" ] && [ -f "$FGO_OUT/done" ]; then
  echo "build.sh: KAI-Scheduler $KAI_VERSION (tarball $kai_h) and fake-gpu-operator $FGO_VERSION (tarball $fgo_h), script pin $pin: cached" >&2
  cat "$KAI_OUT/images.tsv" "$FGO_OUT/images.tsv" >&2
  phase cached
  echo "$KAI_OUT"
  echo "$FGO_OUT"
  exit 0
fi

# --- tools -----------------------------------------------------------------
# KAI's go.mod says `go 1.26.3`; fake-gpu-operator's `go 1.24.0`.
go_local KAI-Scheduler 1.26.3

# --- sources ---------------------------------------------------------------
extract "$KAI_TAR" "$KAI_SRC"
extract "$FGO_TAR" "$FGO_SRC"
phase extract

(cd "$KAI_SRC" && go mod download) || die "go mod download failed for KAI-Scheduler"
(cd "$FGO_SRC" && go mod download) || die "go mod download failed for fake-gpu-operator"
phase "go mod download"

# --- binaries ----------------------------------------------------------------
rm -rf "$KAI_OUT" "$FGO_OUT"
mkdir -p "$KAI_OUT/bin" "$KAI_OUT/e2e" "$KAI_OUT/images" "$KAI_OUT/chart" \
  "$FGO_OUT/bin" "$FGO_OUT/images" "$FGO_OUT/chart"
vpkg=github.com/kai-scheduler/KAI-scheduler/pkg/scheduler/version
kai_ldflags="-s -w -X '$vpkg.gitVersion=$KAI_VERSION' -X '$vpkg.gitCommit=$KAI_VERSION' -X '$vpkg.gitTreeState=clean' -X '$vpkg.buildDate=1970-01-01T00:00:00Z'"
(
  cd "$KAI_SRC"
  pkgs=(); for s in "${KAI_SERVICES[@]}"; do pkgs+=("./cmd/$s"); done
  # One go build for all: the packages they share compile once.
  CGO_ENABLED=0 nice go build -ldflags "$kai_ldflags" -o "$KAI_OUT/bin/" "${pkgs[@]}"
  for s in "${KAI_CGO_SERVICES[@]}"; do
    CGO_ENABLED=1 nice go build -ldflags "$kai_ldflags" -o "$KAI_OUT/bin/$s" "./cmd/$s"
  done
) || die "KAI-Scheduler build failed"
phase "KAI binaries"

(
  cd "$FGO_SRC"
  pkgs=(); for c in "${FGO_CMDS[@]}"; do pkgs+=("./cmd/$c"); done
  CGO_ENABLED=0 nice go build -ldflags "-s -w" -o "$FGO_OUT/bin/" "${pkgs[@]}"
  # The preloader the device-plugin image carries (Makefile build-preloader;
  # cmd/preloader/main.c is empty in v0.2.0, so this is an empty shared object).
  cc -fPIC -shared -o "$FGO_OUT/bin/preloader.so" ./cmd/preloader/main.c
) || die "fake-gpu-operator build failed"
phase "fake-gpu-operator binaries"

(
  cd "$KAI_SRC"
  for e in "${KAI_E2E[@]}"; do
    CGO_ENABLED=0 nice go test -c -ldflags "-s -w" -o "$KAI_OUT/e2e/${e%%:*}.test" "./${e#*:}"
  done
) || die "KAI e2e test binaries failed to compile"
phase "KAI e2e test binaries (go test -c)"

# --- images ----------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/kai-loop-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# A distroless-like base (what nvcr.io/nvidia/distroless/go gives KAI's
# binaries): passwd/group with root and nonroot (65532), the CA bundle, /tmp.
base="$work/base"
mkdir -p "$base/etc/ssl/certs" "$base/tmp" "$base/workspace"
chmod 1777 "$base/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$base/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$base/etc/group"
cp -L /etc/ssl/certs/ca-certificates.crt "$base/etc/ssl/certs/ca-certificates.crt"

add_libs() { # rootfs file... : the shared objects (and loader) the files link against
  local root=$1; shift
  for f in "$@"; do ldd "$f" 2>/dev/null | grep -Eo '/[^ ]+\.so[^ ]*' || true; done | sort -u | while read -r so; do
    mkdir -p "$root$(dirname "$so")"
    cp -L "$so" "$root$so"
  done
}

image() { # tsv name out_tar layer_tar describe user [oci_image.py args...]
  local tsv=$1 name=$2 out=$3 layer=$4 desc=$5 user=$6; shift 6
  python3 "$node/oci_image.py" "$name" "$layer" "$out" "$@" >/dev/null
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$desc" "$user" "$(du -h --apparent-size "$out" | cut -f1)" "$out" >> "$tsv"
}
layer() { # rootfs out.tar  (images.sh's way: numeric owners, sorted, mtime 0)
  tar --numeric-owner --sort=name --mtime=@0 -C "$1" -cf "$2" .
}

printf 'image\tentrypoint / cmd\tuser\tsize\tarchive\n' > "$KAI_OUT/images.tsv"
for s in "${KAI_SERVICES[@]}" "${KAI_CGO_SERVICES[@]}"; do
  r="$work/kai-$s"
  cp -a "$base" "$r"
  install -m 0755 "$KAI_OUT/bin/$s" "$r/workspace/app"
  install -m 0644 "$KAI_SRC/NOTICE" "$r/workspace/NOTICE"
  add_libs "$r" "$r/workspace/app"   # only resourcereservation links any
  chown -R 65532:0 "$r/workspace"
  layer "$r" "$work/kai-$s.tar"
  image "$KAI_OUT/images.tsv" "$KAI_REGISTRY/$s:$KAI_VERSION" "$KAI_OUT/images/$s.oci.tar" "$work/kai-$s.tar" \
    "entrypoint /workspace/app" 65532:65532 --entrypoint /workspace/app --user 65532:65532
  rm -rf "$r" "$work/kai-$s.tar"
done

# crd-upgrader (deployments/crd-upgrader/Dockerfile: alpine + bash + kubectl,
# the CRDs at /internal-crds, CMD /apply-crds.sh, user 65532): the chart's four
# hook Jobs run it (crd-upgrader, topology-migration, kai-config-deployer,
# post-delete-cleanup) with /bin/bash or /bin/sh and kubectl. Base: the Debian
# rootfs of kind-tests/node/images.sh (cached), plus the pinned kubectl.
node_images="$(bash "$node/images.sh" | tail -n1)"
kubectl_bin="$(ls -d "$cache"/k8s-v1.37.2-*/kubectl 2>/dev/null | head -n1 || true)"
[ -x "$kubectl_bin" ] || kubectl_bin="$(bash "$repo/kind-tests/k8s/build.sh" | tail -n1)/kubectl"
[ -x "$kubectl_bin" ] || die "no kubectl (kind-tests/k8s/build.sh)"
base_layer "$node_images/debian.oci.tar" "$work/crd.tar"
r="$work/crd-extra"
mkdir -p "$r/usr/bin" "$r/internal-crds"
strip -o "$r/usr/bin/kubectl" "$kubectl_bin"
chmod 0755 "$r/usr/bin/kubectl"
cp "$KAI_SRC"/deployments/kai-scheduler/crds/*.yaml "$r/internal-crds/"   # not crds/embed.go
install -m 0755 "$KAI_SRC/deployments/crd-upgrader/apply-crds.sh" "$r/apply-crds.sh"
install -m 0644 "$KAI_SRC/NOTICE" "$r/NOTICE"
# Appended to the Debian layer: one layer, later entries win.
tar --numeric-owner --sort=name --mtime=@0 --owner=0 --group=0 -C "$r" -rf "$work/crd.tar" ./usr/bin/kubectl ./internal-crds ./apply-crds.sh ./NOTICE
image "$KAI_OUT/images.tsv" "$KAI_REGISTRY/crd-upgrader:$KAI_VERSION" "$KAI_OUT/images/crd-upgrader.oci.tar" "$work/crd.tar" \
  "cmd /apply-crds.sh (bash, kubectl $("$kubectl_bin" version --client 2>/dev/null | awk '/Client Version/ {print $3}'))" 65532:65532 \
  --cmd /apply-crds.sh --user 65532:65532
rm -rf "$r" "$work/crd.tar"
phase "KAI images"

# fake-gpu-operator (its Dockerfile: FROM ubuntu, root, binaries at these paths).
# Static binaries, so the distroless-like base replaces ubuntu; the chart's
# one shell step (status-exporter's hostpath-init, ubuntu.image) gets
# kai.test/debian:bookworm through kind-tests/kai/fake-gpu-operator-values.yaml.
printf 'image\tentrypoint / cmd\tuser\tsize\tarchive\n' > "$FGO_OUT/images.tsv"
fgo_image() { # name entrypoint dest:binary...
  local n=$1 ep=$2; shift 2
  local r="$work/fgo-$n"
  cp -a "$base" "$r"
  rmdir "$r/workspace"
  for m in "$@"; do
    mkdir -p "$r$(dirname "${m%%:*}")"
    install -m 0755 "$FGO_OUT/bin/${m#*:}" "$r${m%%:*}"
  done
  install -m 0644 "$FGO_SRC/LICENSE" "$r/LICENSE"
  layer "$r" "$work/fgo-$n.tar"
  image "$FGO_OUT/images.tsv" "$FGO_REGISTRY/$n:$FGO_VERSION" "$FGO_OUT/images/$n.oci.tar" "$work/fgo-$n.tar" \
    "entrypoint $ep" 0:0 --entrypoint "$ep"
  rm -rf "$r" "$work/fgo-$n.tar"
}
fgo_image device-plugin /bin/device-plugin /bin/device-plugin:device-plugin /bin/nvidia-smi:nvidia-smi \
  /shared/memory/preloader.so:preloader.so /shared/pid/preloader.so:preloader.so
fgo_image status-updater /bin/status-updater /bin/status-updater:status-updater
fgo_image status-exporter /usr/local/bin/status-exporter /usr/local/bin/status-exporter:status-exporter \
  /usr/local/bin/status-exporter-kwok:status-exporter-kwok
fgo_image topology-server /bin/topology-server /bin/topology-server:topology-server
fgo_image mig-faker /bin/mig-faker /bin/mig-faker:mig-faker
fgo_image kwok-gpu-device-plugin /bin/kwok-gpu-device-plugin /bin/kwok-gpu-device-plugin:kwok-gpu-device-plugin
phase "fake-gpu-operator images"

# --- charts ----------------------------------------------------------------
# KAI: as .github/workflows/on-release.yaml does it (registry into values.yaml,
# helm package with app-version = chart version = the tag), so every image the
# chart and the operator name is $KAI_REGISTRY/<name>:$KAI_VERSION as built above.
cp -r "$KAI_SRC/deployments/kai-scheduler" "$work/kai-scheduler"
sed -i "s#registry/local/kai-scheduler#$KAI_REGISTRY#" "$work/kai-scheduler/values.yaml"
"$HELM" package "$work/kai-scheduler" -d "$KAI_OUT/chart" --app-version "$KAI_VERSION" --version "$KAI_VERSION" >&2
# fake-gpu-operator: its Chart.yaml says 0.0.1 ("Replaced during CD") and lists
# two NVIDIA subcharts (gpu-operator, nvidia-dra-driver-gpu, both disabled by
# default) that helm refuses to install without ("found in Chart.yaml, but
# missing in charts/ directory"); their repository is unreachable here. The
# cached copy drops the dependencies block and says 0.2.0 as the released chart does.
cp -r "$FGO_SRC/deploy/fake-gpu-operator" "$work/fake-gpu-operator"
python3 - "$work/fake-gpu-operator/Chart.yaml" "$FGO_VERSION" <<'EOF'
import re, sys
p, v = sys.argv[1], sys.argv[2]
s = open(p).read()
s = re.sub(r"(?m)^dependencies:\n(?:[ -].*\n)*", "", s)
s = re.sub(r"(?m)^version:.*$", f"version: {v}", s)
s = re.sub(r"(?m)^appVersion:.*$", f"appVersion: {v}", s)
assert "dependencies" not in s
open(p, "w").write(s)
EOF
rm -f "$work/fake-gpu-operator/Chart.lock"
"$HELM" package "$work/fake-gpu-operator" -d "$FGO_OUT/chart" >&2
phase charts

touch "$KAI_OUT/done" "$FGO_OUT/done"
cat "$KAI_OUT/images.tsv" "$FGO_OUT/images.tsv" >&2
log "built in $((SECONDS - t0)) s: $KAI_OUT, $FGO_OUT"
echo "$KAI_OUT"
echo "$FGO_OUT"
