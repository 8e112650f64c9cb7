#!/usr/bin/env bash
# GPU tier on one GPU host, no Kubernetes: builds the real libvgpu.so from the
# pinned HAMi-core source with this host's CUDA toolkit, then proves the cap:
#   1. `kai-node selftest` with caps of 1 GiB and 4 GiB (JSON reports kept);
#   2. PyTorch under the preload with a 4 GiB cap: 2 GiB must fit, 4 GiB more
#      must raise out-of-memory, torch.cuda.mem_get_info() must show the cap;
#   3. the node agent (real NVML) reading the PyTorch region while it holds
#      memory, and the stale slot the selftest's killed process left.
# Every figure lands in $RESULTS_DIR: results.json, results.md, the logs.
# docs/gpu-verification.md says what it records and how to read it.
#
# Inputs (environment):
#   KAI_NODE      release kai-node built elsewhere (default: target/gpu-tier/kai-node,
#                 else target/release/kai-node)
#   HAMI_TAR      HAMi-core source, .tar or .tar.zst (default: target/gpu-tier/hami-core-02279deb.tar[.zst],
#                 else ../shared/hami-core-02279deb.tar.zst)
#   RESULTS_DIR   where results go (default: $OUT when set, else target/gpu-tier/results)
#   CUDA_HOME     toolkit with include/cuda.h and include/nvml.h (default: from nvcc)
#   NVML_LIBRARY  (default libnvidia-ml.so.1)   DEVICE  CUDA ordinal (default 0)
#   PYTHON        interpreter with torch (default python3)
#   CUDA_EXTRA_INCLUDE  a folder with cuda.h/nvml.h for a toolkit that lacks them
#                 (default: target/gpu-tier/cuda-include when it exists)
#   LIBVGPU       an already built libvgpu.so: skips the build (for a rerun, or
#                 to rehearse the script without a GPU against kai-node's test fakes)
# Exit 0 when both selftests pass and PyTorch was refused past the cap (or
# PyTorch is absent: recorded as skipped); 1 otherwise; 2 when libvgpu.so
# could not be built.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
pick() { for f in "$@"; do [ -e "$f" ] && { echo "$f"; return; }; done; echo "$1"; }
KAI_NODE=${KAI_NODE:-$(pick "$ROOT/target/gpu-tier/kai-node" "$ROOT/target/release/kai-node")}
HAMI_TAR=${HAMI_TAR:-$(pick "$ROOT/target/gpu-tier/hami-core-02279deb.tar" "$ROOT/target/gpu-tier/hami-core-02279deb.tar.zst" "$ROOT/../shared/hami-core-02279deb.tar.zst")}
RESULTS_DIR=${RESULTS_DIR:-${OUT:-$ROOT/target/gpu-tier/results}}
NVML_LIBRARY=${NVML_LIBRARY:-libnvidia-ml.so.1}
DEVICE=${DEVICE:-0}
[ -d "$ROOT/target/gpu-tier/cuda-include" ] && CUDA_EXTRA_INCLUDE=${CUDA_EXTRA_INCLUDE:-$ROOT/target/gpu-tier/cuda-include}
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/kai-gpu-tier.XXXXXX)
MOUNT=$WORK/vgpu            # the CONTAINER_VGPU_MOUNT of the PyTorch "container"
mkdir -p "$RESULTS_DIR" "$MOUNT/containers"
chmod 1777 "$MOUNT/containers"
log() { echo "[gpu-node] $*" | tee -a "$RESULTS_DIR/steps.log"; }
AGENT_PID= TORCH_PID=
cleanup() {
  [ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null
  [ -n "$TORCH_PID" ] && kill "$TORCH_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- 0. the host --------------------------------------------------------------
log "host facts"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "kernel: $(uname -r)"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo absent)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1 || echo absent)"
  echo "container: $([ -f /.dockerenv ] || grep -qaE 'docker|containerd|kubepods' /proc/1/cgroup 2>/dev/null && echo yes || echo 'no sign of one')"
  echo "kai-node: $("$KAI_NODE" --version 2>&1)"
} > "$RESULTS_DIR/host.txt"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,memory.used --format=csv \
  > "$RESULTS_DIR/nvidia-smi.csv" 2>&1 || log "nvidia-smi failed (see nvidia-smi.csv)"
cat "$RESULTS_DIR/host.txt" "$RESULTS_DIR/nvidia-smi.csv"

# --- 1. libvgpu.so from the pinned source -------------------------------------
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); else CUDA_HOME=/usr/local/cuda; fi
fi
export CUDA_HOME
SRC=$WORK/hami-core-02279deb BUILD=$WORK/build
if [ -n "${LIBVGPU:-}" ]; then
  LIB=$LIBVGPU BUILD_RC=0
  log "using the given $LIB (no build)"
else
  LIB=$BUILD/libvgpu.so
  log "building libvgpu.so from $(basename "$HAMI_TAR")"
  (
    set -e
    case $HAMI_TAR in *.zst) zstd -dc "$HAMI_TAR" | tar x -C "$WORK" ;; *) tar xf "$HAMI_TAR" -C "$WORK" ;; esac
    # Headers: the toolkit's, else CUDA_EXTRA_INCLUDE (cuda.h/nvml.h of the
    # driver's CUDA major, carried in; an image's toolkit may lack nvml.h).
    INC=
    for h in cuda.h nvml.h; do
      if [ -f "$CUDA_HOME/include/$h" ]; then :
      elif [ -n "${CUDA_EXTRA_INCLUDE:-}" ] && [ -f "$CUDA_EXTRA_INCLUDE/$h" ]; then INC="-I$CUDA_EXTRA_INCLUDE"; echo "$h from $CUDA_EXTRA_INCLUDE"
      else echo "missing $CUDA_HOME/include/$h (and no CUDA_EXTRA_INCLUDE holding it)"; exit 1; fi
    done
    # Only the library is needed; its tests want more of the toolkit.
    sed -i '/add_subdirectory(test)/d' "$SRC/CMakeLists.txt"
    # -lcuda -lnvidia-ml: the toolkit's stubs when it has them, else the
    # driver's own libraries (which ship only as .so.1) through a link folder.
    LINK=$WORK/link; mkdir -p "$LINK"
    for l in cuda nvidia-ml; do
      for d in "$CUDA_HOME/lib64/stubs" "$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib/stubs"; do
        [ -e "$d/lib$l.so" ] && { ln -sf "$d/lib$l.so" "$LINK/lib$l.so"; break; }
      done
      [ -e "$LINK/lib$l.so" ] || { so=$(ldconfig -p | awk -v n="lib$l.so.1" '$1==n {print $NF; exit}'); [ -n "$so" ] && ln -sf "$so" "$LINK/lib$l.so"; }
      echo "lib$l.so -> $(readlink "$LINK/lib$l.so" || echo MISSING)"
    done
    CFLAGS="$INC" LDFLAGS="-L$LINK" cmake -S "$SRC" -B "$BUILD" \
      -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 -DHOOK_NVML_ENABLE=1 \
      -DCMAKE_BUILD_TYPE=Debug -DCMAKE_POLICY_VERSION_MINIMUM=3.5
    make -C "$BUILD" -j"$(nproc)" vgpu
  ) > "$RESULTS_DIR/build.log" 2>&1
  BUILD_RC=$?
fi
if [ "$BUILD_RC" -ne 0 ] || [ ! -f "$LIB" ]; then
  log "libvgpu.so did not build (rc $BUILD_RC); tail of build.log:"; tail -20 "$RESULTS_DIR/build.log"
  exit 2
fi
{ echo "sha256: $(sha256sum "$LIB" | cut -d' ' -f1)"
  echo "glibc versions needed: $(objdump -T "$LIB" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tr '\n' ' ')"
  echo "NEEDED: $(objdump -p "$LIB" 2>/dev/null | awk '/NEEDED/ {print $2}' | tr '\n' ' ')"
} > "$RESULTS_DIR/libvgpu.txt"
cp "$LIB" "$RESULTS_DIR/libvgpu.so"
log "libvgpu.so $(head -1 "$RESULTS_DIR/libvgpu.txt")"

# --- 2. kai-node selftest, 1 GiB and 4 GiB -------------------------------------
SELFTEST_RC=0
for cap in 1Gi 4Gi; do
  log "kai-node selftest --cap $cap"
  mkdir -p "$WORK/selftest-$cap"
  "$KAI_NODE" selftest --library "$LIB" --cap "$cap" --device "$DEVICE" --json --keep \
    --work-dir "$WORK/selftest-$cap" --nvml-library "$NVML_LIBRARY" --host-proc /proc \
    > "$RESULTS_DIR/selftest-$cap.json" 2> "$RESULTS_DIR/selftest-$cap.stderr"
  rc=$?; echo "$rc" > "$RESULTS_DIR/selftest-$cap.rc"
  log "selftest $cap: exit $rc"
  [ "$rc" -eq 0 ] || SELFTEST_RC=1
done
# The killed process's region (a stale slot) joins the agent's directory below.
cp -r "$WORK"/selftest-4Gi/kai-selftest-*/containers/*_killed "$MOUNT/containers/" 2>/dev/null \
  || log "no killed-process region kept by the 4 GiB selftest"

# --- 3. PyTorch under the preload, cap 4 GiB -----------------------------------
TORCH_RC=0
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  log "PyTorch: 2 GiB then 4 GiB more under a 4 GiB cap"
  mkfifo "$WORK/torch.in"
  cat > "$WORK/tier_torch.py" <<'PY'
import json, os, sys, torch
GiB = 1 << 30
r = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "pid": os.getpid()}
r["mem_get_info_before"] = list(torch.cuda.mem_get_info())
held = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
r["hold_2GiB"] = "allocated"
try:
    more = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    r["more_4GiB"] = "allocated"
except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError
    r["more_4GiB"] = "out_of_memory" if "out of memory" in str(e).lower() else "error"
    r["more_4GiB_error"] = str(e).splitlines()[0]
r["mem_get_info_after"] = list(torch.cuda.mem_get_info())
r["memory_allocated"] = torch.cuda.memory_allocated()
print(json.dumps(r), flush=True)
sys.stdin.readline()  # hold the 2 GiB until the agent has read the region
PY
  LD_PRELOAD=$LIB CUDA_DEVICE_MEMORY_LIMIT=4096m CONTAINER_VGPU_MOUNT=$MOUNT POD_UID=gpu-tier CONTAINER_NAME=torch \
  CUDA_VISIBLE_DEVICES=$DEVICE "$PYTHON" "$WORK/tier_torch.py" < "$WORK/torch.in" \
    > "$RESULTS_DIR/torch.json" 2> "$RESULTS_DIR/torch.stderr" &
  TORCH_PID=$!
  exec 7> "$WORK/torch.in"   # keeps the child waiting until fd 7 closes
  for _ in $(seq 120); do [ -s "$RESULTS_DIR/torch.json" ] && break; kill -0 "$TORCH_PID" 2>/dev/null || break; sleep 1; done
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$RESULTS_DIR/nvidia-smi-apps.csv" 2>&1
  grep -q '"more_4GiB": "out_of_memory"' "$RESULTS_DIR/torch.json" || TORCH_RC=1
  log "PyTorch: $(cat "$RESULTS_DIR/torch.json" 2>/dev/null || echo 'no result, see torch.stderr')"
else
  log "PyTorch with CUDA is not available to $PYTHON: skipped"
  echo '{"skipped": "no torch with CUDA"}' > "$RESULTS_DIR/torch.json"
fi

# --- 4. the node agent over those regions, real NVML ---------------------------
log "kai-node agent over $MOUNT/containers with $NVML_LIBRARY"
"$KAI_NODE" --log-format json agent --no-kube --metrics-auth=none --node-name gpu-tier \
  --containers-dir "$MOUNT/containers" --grpc-listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --host-proc /proc --nvml-library "$NVML_LIBRARY" > "$RESULTS_DIR/agent.log" 2>&1 &
AGENT_PID=$!
ADDR=
for _ in $(seq 60); do
  ADDR=$(grep -m1 '"node agent serving"' "$RESULTS_DIR/agent.log" 2>/dev/null \
    | "$PYTHON" -c 'import json,sys; print(json.loads(sys.stdin.readline())["metrics_addr"])' 2>/dev/null)
  [ -n "$ADDR" ] && break; kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 1
done
if [ -n "$ADDR" ]; then
  # The first scan runs at start; one more interval lets NVML figures settle.
  sleep 3
  "$PYTHON" -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
    "http://$ADDR/metrics" | grep -E '^(hami_|kai_isolator_)' > "$RESULTS_DIR/agent-metrics.txt"
  log "agent metrics: $(wc -l < "$RESULTS_DIR/agent-metrics.txt") series"
else
  log "the agent did not start serving (see agent.log)"
fi
kill "$AGENT_PID" 2>/dev/null; wait "$AGENT_PID" 2>/dev/null; AGENT_PID=
if [ -n "$TORCH_PID" ]; then exec 7>&-; wait "$TORCH_PID" 2>/dev/null; TORCH_PID=; fi

# --- 5. one summary ------------------------------------------------------------
"$PYTHON" - "$RESULTS_DIR" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
def read(name, default=""):
    p = d / name
    return p.read_text() if p.exists() else default
def js(name):
    try:
        return json.loads(read(name) or "null")
    except json.JSONDecodeError:
        return {"unparsable": read(name)[:2000]}
out = {
    "host": read("host.txt"), "nvidia_smi": read("nvidia-smi.csv"), "libvgpu": read("libvgpu.txt"),
    "selftest": {cap: js(f"selftest-{cap}.json") for cap in ("1Gi", "4Gi")},
    "torch": js("torch.json"), "nvidia_smi_apps": read("nvidia-smi-apps.csv"),
    "agent_metrics": read("agent-metrics.txt").splitlines(),
}
(d / "results.json").write_text(json.dumps(out, indent=2))
md = ["# GPU tier results", "", "```", out["host"].strip(), out["nvidia_smi"].strip(), out["libvgpu"].strip(), "```", ""]
for cap, rep in out["selftest"].items():
    rep = rep or {}
    md += [f"## selftest --cap {cap}: {rep.get('verdict')} (exit {rep.get('exit_code')})", "", "| check | status | detail |", "|---|---|---|"]
    md += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in rep.get("checks", [])]
    md += ["", "| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rep.get("figures", {}).items()] + [""]
md += ["## PyTorch (cap 4 GiB)", "", "```", json.dumps(out["torch"], indent=1), "```", "",
       "## agent metrics", "", "```", *out["agent_metrics"], "```"]
(d / "results.md").write_text("\n".join(md) + "\n")
PY
log "results in $RESULTS_DIR (results.md, results.json)"
[ "$SELFTEST_RC" -eq 0 ] && [ "$TORCH_RC" -eq 0 ]
