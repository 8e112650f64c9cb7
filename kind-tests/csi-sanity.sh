#!/usr/bin/env bash
# The CSI node plugin (kai-csi) against the Kubernetes CSI project's own
# conformance suite, csi-sanity (github.com/kubernetes-csi/csi-test/v5, built
# once by csi/build.sh), on this machine: real mounts, no kubelet.
#
#   kind-tests/csi-sanity.sh [BIN_DIR]        # BIN_DIR holds kai-csi (default target/debug)
#
# Runs as root (NodePublishVolume mounts), inside a private mount namespace of
# its own so that nothing it mounts can outlive it. KEEP=1 keeps the work
# directory (logs, junit.xml) for a look.
#
# kai-csi has no controller service and serves only inline ephemeral volumes,
# for which kubelet names the volume and builds the volume_context itself.
# csi-sanity publishes only volumes it got from CreateVolume, so
# csi/inline-volumes (a stand-in for kubelet's side, on csi-sanity's
# --csi.controllerendpoint) answers CreateVolume with what kubelet would hand
# kai-csi for a fresh pod: volume_id csi-<sha256>, csi.storage.k8s.io/
# ephemeral=true, pod.uid/name/namespace, and the webhook's volume attributes,
# which csi-sanity passes in as CreateVolume parameters from
# --csi.testvolumeparameters. kai-csi itself is the only node and identity
# service under test.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"

if [ "${KAI_CSI_SANITY_NS:-}" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "csi-sanity.sh: must run as root (NodePublishVolume mounts)" >&2; exit 1; }
  command -v unshare >/dev/null || { echo "csi-sanity.sh: 'unshare' (util-linux) is missing" >&2; exit 1; }
  export KAI_CSI_SANITY_NS=1
  exec unshare --mount --propagation private bash "$0" "$@"
fi

bin_dir="$(cd "${1:-$root/target/debug}" && pwd)"
[ -x "$bin_dir/kai-csi" ] || { echo "csi-sanity.sh: $bin_dir/kai-csi is not built (cargo build -p kai-csi)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "csi-sanity.sh: 'python3' is missing" >&2; exit 1; }

t0=$SECONDS
tools="$(bash "$here/csi/build.sh" | tail -n1)"
echo "csi-sanity ready in $((SECONDS - t0)) s: $tools"

work="$(mktemp -d /tmp/kai-csi-sanity.XXXXXX)"
pids=()

# Mount points under $work, deepest first (mountinfo field 5; no spaces in
# mktemp's names, so no \040 escapes to undo).
mounts_under() { awk -v w="$work" '$5 == w || index($5, w "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r; }

cleanup() {
  local rc=$? pid m
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for m in $(mounts_under); do umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  if [ -n "$(mounts_under)" ]; then
    echo "csi-sanity.sh: could not unmount everything under $work; leaving it" >&2
  elif [ "${KEEP:-0}" = 1 ] || [ "$rc" != 0 ]; then
    echo "work directory kept: $work (kai-csi.log, inline-volumes.log, csi-sanity.log, junit.xml)"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# What the plugin sees of the host install directory (libsync fills it on a node).
host="$work/host-vgpu"
mkdir -p "$host/containers" "$work/pods"
printf 'stand-in libvgpu.so for csi-sanity\n' > "$host/libvgpu.so"
printf '/usr/local/vgpu/libvgpu.so\n' > "$host/ld.so.preload"

# csi-sanity mkdirs --csi.mountdir (not its parents) before every test and
# removes it after; NodePublishVolume's target_path is <mountdir>/target, which
# kai-csi must create and NodeUnpublishVolume must remove. The staging dir is
# created and removed the same way even though kai-csi never stages (its
# default, /tmp/csi-staging, would collide with other runs). kai-csi takes a
# target only in the kubelet pod directory of the request's pod UID
# (<target-root>/<uid>/volumes/kubernetes.io~csi/<volume>/…), so every volume
# is one pod's (inline-volumes --pod-uid) and mountdir lies in its directory.
pod_uid="5a1e7c3e-0000-4000-8000-000000005a17"
mkdir -p "$work/pods/$pod_uid/volumes/kubernetes.io~csi"
mountdir="$work/pods/$pod_uid/volumes/kubernetes.io~csi/sanity"
stagingdir="$work/staging"

# The webhook's volume attributes, as csi-sanity's CreateVolume parameters
# (the stand-in copies them into volume_context). run-as-user/-group make
# kai-csi chown the pod's directories, as for a pod that sets them.
params="$work/volume-parameters.yaml"
cat > "$params" <<'EOF'
kai-resource-isolator.io/container: main
kai-resource-isolator.io/run-as-user: "1000"
kai-resource-isolator.io/run-as-group: "2000"
EOF

csi_sock="$work/csi.sock"
ctl_sock="$work/controller.sock"

"$bin_dir/kai-csi" \
  --endpoint "unix://$csi_sock" \
  --node-id csi-sanity-node \
  --host-vgpu-dir "$host" \
  --target-root "$work/pods" \
  --health-listen 127.0.0.1:0 \
  --log-level "${LOG_LEVEL:-info}" > "$work/kai-csi.log" 2>&1 &
pids+=($!)
csi_pid=$!
"$tools/inline-volumes" --endpoint "$ctl_sock" --pod-uid "$pod_uid" > "$work/inline-volumes.log" 2>&1 &
pids+=($!)
ctl_pid=$!

for _ in $(seq 300); do
  [ -S "$csi_sock" ] && [ -S "$ctl_sock" ] && break
  kill -0 "$csi_pid" 2>/dev/null || { echo "kai-csi exited at start:"; cat "$work/kai-csi.log"; exit 1; }
  kill -0 "$ctl_pid" 2>/dev/null || { echo "inline-volumes exited at start:"; cat "$work/inline-volumes.log"; exit 1; }
  sleep 0.1
done
[ -S "$csi_sock" ] || { echo "kai-csi did not create $csi_sock in 30 s:"; cat "$work/kai-csi.log"; exit 1; }
[ -S "$ctl_sock" ] || { echo "inline-volumes did not create $ctl_sock in 30 s"; exit 1; }

# Skipped specs. Every pattern here says why; every spec that csi-sanity
# skips at run time is listed in the summary and must be one the summary
# script below expects, with the reason it expects.
skip=(
  # The "[Controller Server]" suites (Controller Service, ListSnapshots,
  # GetSnapshot, DeleteSnapshot, CreateSnapshot, ExpandVolume, ModifyVolume,
  # Controller{Get,List}VolumeHealth) test the controller service. kai-csi
  # has none (CSIDriver: attachRequired false, volumeLifecycleModes
  # [Ephemeral]), and csi-sanity does not gate these suites on the
  # CONTROLLER_SERVICE plugin capability (pkg/sanity/controller.go:112): here
  # they would test only the inline-volumes stand-in.
  '\[Controller Server\]'
)
skip_re="$(IFS='|'; echo "${skip[*]}")"

t1=$SECONDS
set +e
"$tools/csi-sanity" \
  --csi.endpoint "unix://$csi_sock" \
  --csi.controllerendpoint "unix://$ctl_sock" \
  --csi.mountdir "$mountdir" \
  --csi.stagingdir "$stagingdir" \
  --csi.testvolumeparameters "$params" \
  --ginkgo.skip "$skip_re" \
  --ginkgo.junit-report "$work/junit.xml" \
  --ginkgo.no-color \
  --ginkgo.timeout 5m \
  > "$work/csi-sanity.log" 2>&1
sanity_rc=$?
set -e
echo "csi-sanity ran in $((SECONDS - t1)) s (exit $sanity_rc)"

leaked="$(mounts_under)"

python3 - "$work/junit.xml" "$sanity_rc" "$leaked" <<'PY' || { echo "--- csi-sanity output (tail) ---"; tail -n 80 "$work/csi-sanity.log"; echo "--- kai-csi log (tail) ---"; tail -n 40 "$work/kai-csi.log"; exit 1; }
import sys
import xml.etree.ElementTree as ET

junit, sanity_rc, leaked = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()

# Specs kai-csi must pass: csi-sanity's Identity and Node suites as they apply
# to a node-only inline-volume driver.
must_pass = [
    "Identity Service GetPluginCapabilities should return appropriate capabilities",
    "Identity Service Probe should return appropriate information",
    "Identity Service GetPluginInfo should return appropriate information",
    "Node Service NodeGetCapabilities should return appropriate capabilities",
    "Node Service NodeGetInfo should return appropriate values",
    "Node Service NodePublishVolume should fail when no volume id is provided",
    "Node Service NodePublishVolume should fail when no target path is provided",
    "Node Service NodePublishVolume should fail when no volume capability is provided",
    "Node Service NodeUnpublishVolume should fail when no volume id is provided",
    "Node Service NodeUnpublishVolume should fail when no target path is provided",
    "Node Service NodeUnpublishVolume should remove target path",
]
# Specs csi-sanity itself skips for this driver, and why (the start of the
# spec's name -> the start of csi-sanity's Skip message).
may_skip = {
    # --ginkgo.skip above.
    "[Controller Server]": None,
    # Plugin capability GROUP_CONTROLLER_SERVICE not advertised.
    "GroupController Service": "GroupControllerService not supported",
    # Node capability SINGLE_NODE_MULTI_WRITER not advertised.
    "Node Service NodePublishVolume with single node multi writer capability": "Service does not have single node multi writer capability",
    # No STAGE_UNSTAGE_VOLUME: kai-csi never stages.
    "Node Service NodeStageVolume": "NodeStageVolume not supported",
    "Node Service NodeUnstageVolume": "NodeUnstageVolume not supported",
    # No GET_VOLUME_STATS, EXPAND_VOLUME, GET_VOLUME_HEALTH, GET_STORAGE_HEALTH.
    "Node Service NodeGetVolumeStats": "NodeGetVolume not supported",
    "Node Service NodeExpandVolume": "NodeExpandVolume not supported",
    "Node Service NodeGetVolumeHealth": "NodeGetVolumeHealth not supported",
    "Node Service NodeGetStorageHealth": "NodeGetStorageHealth not supported",
    # "should work" / "should be idempotent" run only when the node endpoint's
    # GetPluginCapabilities has CONTROLLER_SERVICE (pkg/sanity/node.go:300,886),
    # which kai-csi rightly does not advertise.
    "Node Service should work": "Controller Service not provided",
    "Node Service should be idempotent": "Controller Service not provided",
}

try:
    tree = ET.parse(junit)
except (OSError, ET.ParseError) as e:
    print(f"FAIL: no junit report from csi-sanity ({e})")
    sys.exit(1)

bad = []
results = {}
skipped = []
for case in tree.iter("testcase"):
    name = case.get("name", "")
    # ginkgo's junit names are "[It] <container texts> <spec text> [labels]"
    text = name[len("[It] "):] if name.startswith("[It] ") else name
    status = case.get("status", "")
    fail = case.find("failure")
    err = case.find("error")
    skip_el = case.find("skipped")
    if name.startswith("[BeforeSuite]") or name.startswith("[AfterSuite]") or name.startswith("[SynchronizedBeforeSuite]"):
        if fail is not None or err is not None:
            bad.append(f"{name}: {(fail if fail is not None else err).get('message', '')}")
        continue
    if fail is not None or err is not None:
        el = fail if fail is not None else err
        results[text] = "failed"
        bad.append(f"FAILED  {text}\n          {el.get('message', '').strip()[:400]}")
    elif skip_el is not None or status in ("skipped", "pending"):
        msg = (skip_el.get("message", "") if skip_el is not None else status).strip()
        results[text] = "skipped"
        skipped.append((text, msg))
    else:
        results[text] = "passed"

for spec in must_pass:
    got = results.get(spec)
    if got != "passed":
        bad.append(f"REQUIRED spec {got or 'missing'}: {spec}")

print("skipped specs (each with the reason this run expects):")
for text, msg in sorted(skipped):
    why = None
    for prefix, want in may_skip.items():
        if text.startswith(prefix) or prefix in text:
            why = (prefix, want)
            break
    if why is None:
        bad.append(f"UNEXPECTED SKIP {text}: {msg}")
        continue
    prefix, want = why
    if want is not None and want not in msg:
        bad.append(f"SKIP FOR ANOTHER REASON {text}: {msg!r} (expected {want!r})")
        continue
    print(f"  skip  {text}  [{msg or 'filtered by --ginkgo.skip'}]")

passed = sorted(t for t, r in results.items() if r == "passed")
print("passed specs:")
for t in passed:
    print(f"  ok    {t}")
if leaked:
    bad.append("mounts left under the work directory after csi-sanity: " + " ".join(leaked))
if sanity_rc != 0 and not bad:
    bad.append(f"csi-sanity exited {sanity_rc} without a failed spec in its report")

n_fail = sum(1 for r in results.values() if r == "failed")
print(f"csi-sanity summary: {len(passed)} passed, {n_fail} failed, {len(skipped)} skipped, "
      f"{len(must_pass)} required")
if bad:
    print("FAIL:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print("PASS: kai-csi passes csi-sanity's Identity and Node suites")
PY
