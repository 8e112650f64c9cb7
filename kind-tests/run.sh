#!/usr/bin/env bash
# End-to-end suite on a kind cluster.
#
# Prerequisites: docker (running), kind, kubectl, helm, grpcurl, curl,
# python3, and either nix (to build the image: `nix build .#image`) or
# IMAGE_TARBALL=path/to/image.tar.gz from a previous build.
#
#   kind-tests/run.sh                  # create the cluster, install, assert, uninstall, delete the cluster
#   KEEP_CLUSTER=1 kind-tests/run.sh   # leave what it created for inspection
#   KIND_CLUSTER=name kind-tests/run.sh  # use that cluster; an existing one is used, never deleted
#
# Safety: every kubectl/helm call names the kind cluster's context; a cluster
# is deleted only when this run created it; an existing release (or another
# install of the chart) stops the run before anything is changed; the test
# pods live in a namespace of their own, unique per run. On failure the
# webhook and agent logs, all pods and the Events are printed.
#
# Tier 2 runs when a node has allocatable nvidia.com/gpu (a GPU runner with
# the NVIDIA device plugin): see the tier-2 section below.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cluster="${KIND_CLUSTER:-kai-e2e}"
ctx="kind-$cluster"
ns="${RELEASE_NAMESPACE:-kai-resource-isolator}"
release="${RELEASE:-kai}"
test_ns="kai-e2e-$(date +%s)-$$"
image_repo=kai-resource-isolator
image_tag=0.1.0
mount=/usr/local/vgpu
# Dynamically linked (glibc's loader reads /etc/ld.so.preload); busybox is
# static and would prove nothing. Its user 1000 is "ubuntu".
test_image="${TEST_IMAGE:-ubuntu:24.04}"
cuda_image="${CUDA_IMAGE:-pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime}"
checks="$root/kind-tests/pod_checks.py"
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "missing prerequisite: $1"; exit 2; }; }
for tool in docker kind kubectl helm grpcurl curl python3; do need "$tool"; done
docker info >/dev/null 2>&1 || { echo "docker is not running"; exit 2; }
k() { kubectl --context "$ctx" "$@"; }
h() { helm --kube-context "$ctx" "$@"; }

created_cluster=no
installed=no
created_test_ns=no
pf_pids=()
work="$(mktemp -d)"
diagnostics() {
  echo "== diagnostics"
  k get pods -A -o wide || true
  for n in "$ns" "$test_ns"; do
    echo "-- Events in $n"
    k -n "$n" get events --sort-by=.lastTimestamp 2>/dev/null | tail -60 || true
  done
  for component in webhook node-agent; do
    echo "-- $component logs"
    k -n "$ns" logs -l app.kubernetes.io/component="$component" --all-containers --prefix --tail=200 2>/dev/null || true
  done
  echo "-- test pods"
  k -n "$test_ns" describe pods 2>/dev/null | tail -120 || true
}
cleanup() {
  local rc=$?
  for p in "${pf_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "$rc" != 0 ] || [ "$failed" != 0 ]; then diagnostics; fi
  if [ -z "${KEEP_CLUSTER:-}" ]; then
    if [ "$created_cluster" = yes ]; then
      kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
    else
      # Someone else's cluster: take back only what this run made.
      [ "$created_test_ns" = no ] || k delete namespace "$test_ns" --wait=false >/dev/null 2>&1 || true
      [ "$installed" = no ] || h uninstall "$release" -n "$ns" >/dev/null 2>&1 || true
    fi
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== image"
if [ -n "${IMAGE_TARBALL:-}" ]; then
  docker load < "$IMAGE_TARBALL"
else
  need nix
  (cd "$root" && nix build .#image --out-link "$root/result-image")
  docker load < "$root/result-image"
fi

echo "== cluster"
if kind get clusters 2>/dev/null | grep -qx "$cluster"; then
  echo "using the existing kind cluster $cluster (it will not be deleted)"
else
  # Recorded before the call: a half-created cluster is ours to delete too.
  created_cluster=yes
  kind create cluster --name "$cluster" --config "$root/kind-tests/kind-config.yaml" --wait 120s
fi
kind load docker-image --name "$cluster" "$image_repo:$image_tag"

echo "== install"
if h status "$release" -n "$ns" >/dev/null 2>&1; then
  echo "release $release already exists in namespace $ns: refusing to touch it (set RELEASE/RELEASE_NAMESPACE)"
  exit 2
fi
others=$(k get mutatingwebhookconfiguration -l app.kubernetes.io/name=kai-resource-isolator -o name 2>/dev/null || true)
if [ -n "$others" ]; then
  echo "the chart is already installed in this cluster ($others): refusing to install a second copy"
  exit 2
fi
installed=yes
h install "$release" "$root/chart/kai-resource-isolator" -n "$ns" --create-namespace \
  --set image.repository="$image_repo" --set image.tag="$image_tag" --set image.pullPolicy=Never \
  --set monitor.aggregator.stalenessSeconds=30 --wait --timeout 5m
k -n "$ns" rollout status ds/"$release"-kai-resource-isolator-libsync --timeout=3m
k -n "$ns" rollout status ds/"$release"-kai-resource-isolator-node --timeout=3m
k -n "$ns" rollout status deploy/"$release"-kai-resource-isolator-webhook --timeout=3m
created_test_ns=yes
k create namespace "$test_ns"

pod_yaml() { # pod_yaml NAME ANNOTATIONS: a dynamically linked pod running as uid 1000
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $test_ns, annotations: {$2}}
spec:
  nodeSelector: {nvidia.com/gpu.present: "true"}
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  containers: [{name: main, image: $test_image, command: ["sleep", "infinity"]}]
YAML
}
pod_json() { k -n "$test_ns" get pod "$1" -o json > "$work/$1.json"; echo "$work/$1.json"; }
# ready_no_restarts POD: Ready, and its container never restarted.
ready_no_restarts() {
  k -n "$test_ns" wait --for=condition=Ready "pod/$1" --timeout=2m >/dev/null \
    && [ "$(k -n "$test_ns" get pod "$1" -o jsonpath='{.status.containerStatuses[0].restartCount}')" = 0 ]
}

echo "== webhook"
# failurePolicy is Ignore: wait until a server-side dry run comes back mutated.
mutated=no
for _ in $(seq 1 60); do
  if pod_yaml probe 'gpu-memory: "1024"' | k create --dry-run=server -o yaml -f - | grep -q 'ld.so.preload'; then
    mutated=yes; break
  fi
  sleep 2
done
[ "$mutated" = yes ] && ok "a gpu-memory pod is mutated (dry-run=server)" || bad "webhook never mutated"

echo "== libsync on the node"
worker=$(k get nodes -l nvidia.com/gpu.present=true -o jsonpath='{.items[0].metadata.name}')
[ "$(docker exec "$worker" cat "$mount/ld.so.preload")" = "$mount/libvgpu.so" ] \
  && docker exec "$worker" test -s "$mount/libvgpu.so" \
  && ok "libsync installed libvgpu.so and ld.so.preload" || bad "libsync files on $worker"
[ "$(docker exec "$worker" stat -c %a "$mount/containers")" = 1777 ] && ok "containers/ is 1777" || bad "containers/ mode"

echo "== the preload, proven in a dynamically linked image as uid 1000"
pod_yaml e2e-gpu 'gpu-memory: "1024"' | k apply -f -
ready_no_restarts e2e-gpu && ok "e2e-gpu ($test_image, libvgpu preloaded) is Ready with 0 restarts" || bad "e2e-gpu not Ready or restarted"
python3 "$checks" injected "$(pod_json e2e-gpu)" main "$mount" \
  && ok "live pod: three volumes, four mounts at their paths, three env vars" || bad "live e2e-gpu pod shape"
uid=$(k -n "$test_ns" get pod e2e-gpu -o jsonpath='{.metadata.uid}')
node=$(k -n "$test_ns" get pod e2e-gpu -o jsonpath='{.spec.nodeName}')
[ "$(k -n "$test_ns" exec e2e-gpu -- id -u)" = 1000 ] && ok "e2e-gpu runs as uid 1000" || bad "e2e-gpu uid"
[ "$(k -n "$test_ns" exec e2e-gpu -- cat /etc/ld.so.preload)" = "$mount/libvgpu.so" ] \
  && ok "/etc/ld.so.preload in the pod names libvgpu.so" || bad "/etc/ld.so.preload in the pod"
k -n "$test_ns" exec e2e-gpu -- grep -qF "$mount/libvgpu.so" /proc/1/maps \
  && ok "libvgpu.so is mapped into the pod's process (/proc/1/maps)" || bad "libvgpu.so is not in /proc/1/maps"
# Without a GPU nothing calls cuInit, where libvgpu makes its cache
# directory; the same non-root process makes it from the injected env, as
# libvgpu would (tier 2 shows libvgpu doing it), and the node must see it.
k -n "$test_ns" exec e2e-gpu -- sh -c 'mkdir -m 0777 "$CONTAINER_VGPU_MOUNT/containers/${POD_UID}_${CONTAINER_NAME}"' \
  && [ "$(docker exec "$node" stat -c %u "$mount/containers/${uid}_main")" = 1000 ] \
  && ok "uid 1000 creates $mount/containers/<podUID>_main, seen on the node" || bad "cache directory of e2e-gpu"

echo "== opt-out and gpu-fraction pods"
# The opt-out annotation counts only in namespaces an administrator labels
# (webhook.optOutNamespaceLabel; docs/webhook.md "Opting out").
k label namespace "$test_ns" kai-resource-isolator.io/allow-opt-out=true --overwrite >/dev/null
pod_yaml e2e-optout 'gpu-memory: "1024", kai-resource-isolator.io/inject: "false"' | k apply -f -
ready_no_restarts e2e-optout && python3 "$checks" untouched "$(pod_json e2e-optout)" \
  && ok "an opted-out pod runs untouched" || bad "opted-out pod"
pod_yaml e2e-plain '' | k apply -f -
ready_no_restarts e2e-plain && python3 "$checks" untouched "$(pod_json e2e-plain)" \
  && ok "a plain pod runs untouched" || bad "plain pod"
pod_yaml e2e-uncapped 'gpu-fraction: "0.5"' | k apply -f -
ready_no_restarts e2e-uncapped && python3 "$checks" injected "$(pod_json e2e-uncapped)" main "$mount" \
  && ok "a gpu-fraction pod is mutated and runs" || bad "gpu-fraction pod"

k -n "$test_ns" exec e2e-gpu -- sh -c "! touch $mount/tampered 2>/dev/null && mkdir $mount/containers/e2e-probe && rmdir $mount/containers/e2e-probe" \
  && ok "the workload cannot write <mount>, only <mount>/containers" || bad "library mount is writable"
[ "$(k -n "$test_ns" exec e2e-gpu -- printenv CUDA_DEVICE_MEMORY_LIMIT)" = 1024m ] \
  && ok "a gpu-memory pod without KAI's limit gets the literal 1024m" || bad "no literal memory limit"

echo "== agent and aggregator"
agent=$(k -n "$ns" get pod -l app.kubernetes.io/component=node-agent --field-selector spec.nodeName="$node" -o jsonpath='{.items[0].metadata.name}')
# No GPU: write the region libvgpu would write, through the agent's own host mount.
k -n "$ns" exec "$agent" -c agent -- /bin/kai-node write-region \
  --containers-dir /host$mount/containers --pod-uid "$uid" --container main --limit-mib 1024 --used-mib 512
k -n "$ns" port-forward "pod/$agent" 15051:50051 >/dev/null 2>&1 & pf_pids+=($!)
k -n "$ns" port-forward "svc/$release-kai-resource-isolator-aggregator" 19394:9394 >/dev/null 2>&1 & pf_pids+=($!)
listed=""
for _ in $(seq 1 30); do
  listed=$(grpcurl -plaintext -d "{\"namespace\":\"$test_ns\"}" 127.0.0.1:15051 vgpu.v1.VgpuNode/ListContainers 2>/dev/null || true)
  echo "$listed" | grep -q '"pod": "e2e-gpu"' && break
  sleep 2
done
echo "$listed" | grep -q '"pod": "e2e-gpu"' && ok "grpcurl VgpuNode/ListContainers shows e2e-gpu" || bad "agent: $listed"
series="hami_vgpu_memory_used_bytes{namespace=\"$test_ns\",pod=\"e2e-gpu\",container=\"main\",vdevice_index=\"0\""
found=no
for _ in $(seq 1 30); do
  if curl -fsS 127.0.0.1:19394/metrics 2>/dev/null | grep -F "$series" | grep -q ' 536870912$'; then found=yes; break; fi
  sleep 2
done
[ "$found" = yes ] && ok "aggregator :9394 shows e2e-gpu's series" || bad "aggregator series"
curl -fsS 127.0.0.1:19394/metrics | grep -F "kai_isolator_container_isolation_state{namespace=\"$test_ns\",pod=\"e2e-gpu\"" | grep -q 'state="capped"' \
  && ok "aggregator: e2e-gpu's cap holds" || bad "isolation state of e2e-gpu"

echo "== isolation assurance: an uncapped region becomes a state, a metric and an Event"
uid2=$(k -n "$test_ns" get pod e2e-uncapped -o jsonpath='{.metadata.uid}')
# Limit 0: what libvgpu records when KAI's binder set no limit (KAI #2156).
k -n "$ns" exec "$agent" -c agent -- /bin/kai-node write-region \
  --containers-dir /host$mount/containers --pod-uid "$uid2" --container main --limit-mib 0 --used-mib 256
event=""
for _ in $(seq 1 30); do
  event=$(k -n "$test_ns" get events --field-selector involvedObject.name=e2e-uncapped,reason=GpuMemoryUncapped -o name 2>/dev/null || true)
  [ -n "$event" ] && break
  sleep 2
done
[ -n "$event" ] && ok "Event GpuMemoryUncapped on the pod" || bad "no GpuMemoryUncapped Event"
curl -fsS 127.0.0.1:19394/metrics | grep -F 'pod="e2e-uncapped"' | grep -q 'state="uncapped_no_limit"} 1' \
  && ok "aggregator: e2e-uncapped is flagged uncapped_no_limit" || bad "uncapped state missing"
[ "$(k -n "$test_ns" get pod e2e-gpu -o jsonpath='{.status.containerStatuses[0].restartCount}')" = 0 ] \
  && ok "e2e-gpu still has 0 restarts at the end" || bad "e2e-gpu restarted"

gpu_node=$(k get nodes -o json | python3 -c '
import json, sys
for n in json.load(sys.stdin)["items"]:
    if int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) > 0:
        print(n["metadata"]["name"]); break')
if [ -n "$gpu_node" ]; then
  echo "== tier 2: the cap holds on a real GPU ($gpu_node)"
  # Two pods share GPU 0 of one node at once, as KAI's binder shares it: no
  # nvidia.com/gpu request, the device named by NVIDIA_VISIBLE_DEVICES and
  # the cap by CUDA_DEVICE_MEMORY_LIMIT (the binder sets both; KAI is not
  # installed here). The node's NVIDIA runtime must honour the variable.
  # Each pod allocates under its cap and holds it, reports, then waits for
  # /tmp/go and allocates past its cap: that must fail with out of memory.
  cat > "$work/alloc.py" <<'PY'
import os, sys, time, torch
cap, keep, more = (int(x) << 20 for x in sys.argv[1:4])
held = torch.empty(keep, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(f"IN_CAP_OK {keep} of {cap}", flush=True)
while not os.path.exists("/tmp/go"):  # the test creates it once both pods hold their share
    time.sleep(0.2)
try:
    extra = torch.empty(more, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print(f"OVER_CAP_ALLOCATED {keep + more} of {cap}", flush=True)
except torch.cuda.OutOfMemoryError as e:
    print("OVER_CAP_OOM", str(e).splitlines()[0], flush=True)
except Exception as e:  # any other CUDA error is not the cap at work
    print("OVER_CAP_OTHER", type(e).__name__, e, flush=True)
while True:
    time.sleep(3600)
PY
  gpu_pod() { # gpu_pod NAME CAP_MIB KEEP_MIB MORE_MIB
    cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $test_ns, annotations: {gpu-memory: "$2"}}
spec:
  nodeSelector: {kubernetes.io/hostname: $gpu_node}
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  containers:
    - name: main
      image: $cuda_image
      env:
        - {name: NVIDIA_VISIBLE_DEVICES, value: "${GPU_DEVICE:-0}"}
        - {name: CUDA_DEVICE_MEMORY_LIMIT, value: "$2m"}
        - {name: HOME, value: /tmp}
      command: ["python3", "-c", $(python3 -c 'import json, sys; print(json.dumps(open(sys.argv[1]).read()))' "$work/alloc.py"), "$2", "$3", "$4"]
YAML
  }
  # small: 768 MiB of a 1 GiB cap, then 512 more. large: 1536 MiB of 2 GiB
  # (beyond small's cap: the caps are per container), then 1 GiB more.
  gpu_pod cap-small 1024 768 512 | k apply -f -
  gpu_pod cap-large 2048 1536 1024 | k apply -f -
  logs_have() { k -n "$test_ns" logs "$1" 2>/dev/null | grep "$2" >/dev/null; }
  for pod in cap-small cap-large; do
    k -n "$test_ns" wait --for=condition=Ready "pod/$pod" --timeout=10m >/dev/null || bad "$pod never Ready"
    for _ in $(seq 1 150); do logs_have "$pod" '^IN_CAP_OK' && break; sleep 2; done
    logs_have "$pod" '^IN_CAP_OK' && ok "$pod: the allocation under its cap succeeds" \
      || bad "$pod: in-cap allocation: $(k -n "$test_ns" logs "$pod" | tail -5)"
  done
  # Both hold their share now; libvgpu itself made each cache directory.
  for pod in cap-small cap-large; do
    puid=$(k -n "$test_ns" get pod "$pod" -o jsonpath='{.metadata.uid}')
    [ "$(docker exec "$gpu_node" stat -c %u "$mount/containers/${puid}_main/usage.cache" 2>/dev/null)" = 1000 ] \
      && ok "$pod: libvgpu (uid 1000) created $mount/containers/<podUID>_main/usage.cache" || bad "$pod: no usage.cache by uid 1000"
  done
  for pod in cap-small cap-large; do k -n "$test_ns" exec "$pod" -- touch /tmp/go; done
  for pod in cap-small cap-large; do
    for _ in $(seq 1 60); do logs_have "$pod" '^OVER_CAP_' && break; sleep 2; done
    if logs_have "$pod" '^OVER_CAP_OOM .*out of memory'; then
      ok "$pod: the allocation past its cap fails with out of memory"
    else
      bad "$pod: over-cap allocation: $(k -n "$test_ns" logs "$pod" | tail -5)"
    fi
  done
  [ "$(k -n "$test_ns" get pod cap-small cap-large -o jsonpath='{.items[*].status.phase}')" = "Running Running" ] \
    && ok "both pods ran on one GPU at once, each held to its own cap" || bad "the two GPU pods did not run together"
fi

echo "== uninstall"
k delete namespace "$test_ns" --wait=true
created_test_ns=no
h uninstall "$release" -n "$ns" --wait
installed=no
left=$(k get all,cm,secret,sa,role,rolebinding,pdb -n "$ns" -l app.kubernetes.io/instance="$release" -o name 2>/dev/null; \
       k get clusterrole,clusterrolebinding,mutatingwebhookconfiguration -l app.kubernetes.io/instance="$release" -o name 2>/dev/null)
[ -z "$left" ] && ok "uninstall leaves nothing behind" || bad "left behind: $left"

echo; echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
