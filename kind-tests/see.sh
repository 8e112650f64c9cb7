#!/usr/bin/env bash
# "See it" with the real things: promtool unit tests of the chart's alerts,
# the chart's dashboard/rule templates, then kind-tests/see.py (the demo
# stack in headless Chromium, kubectl-vgpu, a real Prometheus).
#
# Usage: kind-tests/see.sh [OUT_DIR]   (default target/see; screenshot at OUT_DIR/web-view.png)
# Needs Debian's prometheus (promtool) and chromium; installs them with
# apt-get when missing and run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-target/see}"
HELM="${HELM:-${XDG_CACHE_HOME:-$HOME/.cache}/kai-tools/helm/helm}"

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "see.sh needs ${missing[*]} (Debian packages); install them: apt-get install prometheus chromium" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
prometheus --version 2>&1 | head -1
chromium --version

echo "--- promtool: the alert rules and their unit tests"
promtool check rules chart/kai-resource-isolator/files/alerts.yaml
(cd chart/kai-resource-isolator/files && promtool test rules alerts_test.yaml)

echo "--- chart: dashboard ConfigMap and PrometheusRule templates"
HELM="$HELM" python3 -m pytest chart/kai-resource-isolator/tests/observability_test.py

echo "--- demo stack: web view in Chromium, kubectl-vgpu, Prometheus"
cargo build --locked -q -p kai-demo -p kubectl-vgpu -p kai-fake-nvml
BIN="${CARGO_TARGET_DIR:-target}/debug"
python3 kind-tests/see.py "$BIN" "$OUT"
