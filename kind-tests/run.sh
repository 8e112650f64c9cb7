#!/usr/bin/env bash
# End-to-end suite on a kind cluster.
#
# Prerequisites: docker (running), kind, kubectl, helm, grpcurl, curl,
# python3, and either nix (to build the image: `nix build .#image`) or
# IMAGE_TARBALL=path/to/image.tar.gz from a previous build.
#
#   kind-tests/run.sh            # create cluster, install, assert, uninstall, delete cluster
#   KEEP_CLUSTER=1 kind-tests/run.sh   # leave the cluster for inspection
#
# Tier 2 runs when a node has allocatable nvidia.com/gpu (a GPU runner with
# the NVIDIA device plugin): a CUDA allocation beyond the cap must fail.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cluster="${KIND_CLUSTER:-kai-e2e}"
ns=kai-resource-isolator
release=kai
image_repo=kai-resource-isolator
image_tag=0.1.0
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "missing prerequisite: $1"; exit 2; }; }
for tool in docker kind kubectl helm grpcurl curl python3; do need "$tool"; done
docker info >/dev/null 2>&1 || { echo "docker is not running"; exit 2; }

pf_pids=()
cleanup() {
  for p in "${pf_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -z "${KEEP_CLUSTER:-}" ]; then kind delete cluster --name "$cluster" >/dev/null 2>&1 || true; fi
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
kind create cluster --name "$cluster" --config "$root/kind-tests/kind-config.yaml" --wait 120s
kind load docker-image --name "$cluster" "$image_repo:$image_tag"
worker="$cluster-worker"

echo "== install"
helm install "$release" "$root/chart/kai-resource-isolator" -n "$ns" --create-namespace \
  --set image.repository="$image_repo" --set image.tag="$image_tag" --set image.pullPolicy=Never \
  --set monitor.aggregator.stalenessSeconds=30 --wait --timeout 5m
kubectl -n "$ns" rollout status ds/"$release"-kai-resource-isolator-node --timeout=3m
kubectl -n "$ns" rollout status deploy/"$release"-kai-resource-isolator-webhook --timeout=3m
kubectl create namespace e2e

pod_yaml() { # pod_yaml NAME ANNOTATIONS
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: e2e, annotations: {$2}}
spec:
  nodeSelector: {nvidia.com/gpu.present: "true"}
  containers: [{name: main, image: busybox:1.36, command: ["sleep", "3600"]}]
YAML
}

echo "== webhook"
# failurePolicy is Ignore: wait until a server-side dry run comes back mutated.
mutated=no
for _ in $(seq 1 60); do
  if pod_yaml probe 'gpu-memory: "1024"' | kubectl create --dry-run=server -o yaml -f - | grep -q 'ld.so.preload'; then
    mutated=yes; break
  fi
  sleep 2
done
[ "$mutated" = yes ] && ok "a gpu-memory pod is mutated (dry-run=server)" || bad "webhook never mutated"
if pod_yaml plain '' | kubectl create --dry-run=server -o yaml -f - | grep -q 'kai-resource-isolator'; then
  bad "a plain pod was mutated"
else
  ok "a plain pod is left untouched"
fi

echo "== libsync on the node"
[ "$(docker exec "$worker" cat /usr/local/vgpu/ld.so.preload)" = /usr/local/vgpu/libvgpu.so ] \
  && docker exec "$worker" test -s /usr/local/vgpu/libvgpu.so \
  && ok "libsync installed libvgpu.so and ld.so.preload" || bad "libsync files on $worker"
[ "$(docker exec "$worker" stat -c %a /usr/local/vgpu/containers)" = 1777 ] && ok "containers/ is 1777" || bad "containers/ mode"

echo "== agent and aggregator"
pod_yaml e2e-gpu 'gpu-memory: "1024"' | kubectl apply -f -
kubectl -n e2e wait --for=condition=Ready pod/e2e-gpu --timeout=2m
kubectl -n e2e exec e2e-gpu -- sh -c '! touch /usr/local/vgpu/tampered 2>/dev/null && mkdir /usr/local/vgpu/containers/e2e-probe && rmdir /usr/local/vgpu/containers/e2e-probe' \
  && ok "the workload cannot write <mount>, only <mount>/containers" || bad "library mount is writable"
[ "$(kubectl -n e2e exec e2e-gpu -- printenv CUDA_DEVICE_MEMORY_LIMIT)" = 1024m ] \
  && ok "a gpu-memory pod without KAI's limit gets the literal 1024m" || bad "no literal memory limit"
uid=$(kubectl -n e2e get pod e2e-gpu -o jsonpath='{.metadata.uid}')
agent=$(kubectl -n "$ns" get pod -l app.kubernetes.io/component=node-agent -o jsonpath='{.items[0].metadata.name}')
# No GPU: write the region libvgpu would write, through the agent's own host mount.
kubectl -n "$ns" exec "$agent" -c agent -- /bin/kai-node write-region \
  --containers-dir /host/usr/local/vgpu/containers --pod-uid "$uid" --container main --limit-mib 1024 --used-mib 512
kubectl -n "$ns" port-forward "pod/$agent" 15051:50051 >/dev/null 2>&1 & pf_pids+=($!)
kubectl -n "$ns" port-forward "svc/$release-kai-resource-isolator-aggregator" 19394:9394 >/dev/null 2>&1 & pf_pids+=($!)
listed=""
for _ in $(seq 1 30); do
  listed=$(grpcurl -plaintext -d '{"namespace":"e2e"}' 127.0.0.1:15051 vgpu.v1.VgpuNode/ListContainers 2>/dev/null || true)
  echo "$listed" | grep -q '"pod": "e2e-gpu"' && break
  sleep 2
done
echo "$listed" | grep -q '"pod": "e2e-gpu"' && ok "grpcurl VgpuNode/ListContainers shows e2e-gpu" || bad "agent: $listed"
series='hami_vgpu_memory_used_bytes{namespace="e2e",pod="e2e-gpu",container="main",vdevice_index="0"'
found=no
for _ in $(seq 1 30); do
  if curl -fsS 127.0.0.1:19394/metrics 2>/dev/null | grep -F "$series" | grep -q ' 536870912$'; then found=yes; break; fi
  sleep 2
done
[ "$found" = yes ] && ok "aggregator :9394 shows e2e-gpu's series" || bad "aggregator series"
curl -fsS 127.0.0.1:19394/metrics | grep -F 'kai_isolator_container_isolation_state{namespace="e2e",pod="e2e-gpu"' | grep -q 'state="capped"' \
  && ok "aggregator: e2e-gpu's cap holds" || bad "isolation state of e2e-gpu"

echo "== isolation assurance: an uncapped region becomes a state, a metric and an Event"
pod_yaml e2e-uncapped 'gpu-fraction: "0.5"' | kubectl apply -f -
kubectl -n e2e wait --for=condition=Ready pod/e2e-uncapped --timeout=2m
uid2=$(kubectl -n e2e get pod e2e-uncapped -o jsonpath='{.metadata.uid}')
# Limit 0: what libvgpu records when KAI's binder set no limit (KAI #2156).
kubectl -n "$ns" exec "$agent" -c agent -- /bin/kai-node write-region \
  --containers-dir /host/usr/local/vgpu/containers --pod-uid "$uid2" --container main --limit-mib 0 --used-mib 256
event=""
for _ in $(seq 1 30); do
  event=$(kubectl -n e2e get events --field-selector involvedObject.name=e2e-uncapped,reason=GpuMemoryUncapped -o name 2>/dev/null || true)
  [ -n "$event" ] && break
  sleep 2
done
[ -n "$event" ] && ok "Event GpuMemoryUncapped on the pod" || bad "no GpuMemoryUncapped Event"
curl -fsS 127.0.0.1:19394/metrics | grep -F 'pod="e2e-uncapped"' | grep -q 'state="uncapped_no_limit"} 1' \
  && ok "aggregator: e2e-uncapped is flagged uncapped_no_limit" || bad "uncapped state missing"

if kubectl get nodes -o jsonpath='{.items[*].status.allocatable.nvidia\.com/gpu}' | grep -q '[1-9]'; then
  echo "== tier 2: the cap holds on a real GPU"
  kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: over-cap, namespace: e2e, annotations: {gpu-memory: "1024"}}
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime
      env: [{name: CUDA_DEVICE_MEMORY_LIMIT, value: 1024m}]
      resources: {limits: {nvidia.com/gpu: 1}}
      command: ["python3", "-c", "import torch; torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); print('ALLOCATED')"]
YAML
  kubectl -n e2e wait --for=jsonpath='{.status.phase}'=Failed pod/over-cap --timeout=5m \
    && ! kubectl -n e2e logs over-cap | grep -q ALLOCATED \
    && ok "a 2 GiB allocation under a 1 GiB cap fails" || bad "the cap did not hold: $(kubectl -n e2e logs over-cap | tail -3)"
fi

echo "== uninstall"
kubectl delete namespace e2e --wait=true
helm uninstall "$release" -n "$ns" --wait
left=$(kubectl get all,cm,secret,sa,role,rolebinding,pdb -n "$ns" -l app.kubernetes.io/instance="$release" -o name 2>/dev/null; \
       kubectl get clusterrole,clusterrolebinding,mutatingwebhookconfiguration -l app.kubernetes.io/instance="$release" -o name 2>/dev/null)
[ -z "$left" ] && ok "uninstall leaves nothing behind" || bad "left behind: $left"

echo; echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
