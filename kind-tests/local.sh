#!/usr/bin/env bash
# The kind suite's assertions against the real binaries started locally, as
# separate processes on 127.0.0.1, without Kubernetes (run by .ci/run):
#   libsync installs into a temp "host"; the webhook (TLS, openssl-made
#   certificate) mutates a GPU-sharing pod and leaves a plain one alone, with
#   its default library delivery (one inline CSI volume) and, as a second
#   process, with LIBRARY_DELIVERY=hostPath (the Go webhook's three hostPath
#   volumes); a region written like libvgpu's is served by the agent
#   (grpcurl) and by the aggregator's :9394 metrics. The host starts with the empty directory
#   kubelet leaves at ld.so.preload when a pod mounted it before libsync ran.
# Usage: kind-tests/local.sh [BIN_DIR]   (default target/debug; needs
# curl, openssl, python3, grpcurl on PATH or $GRPCURL)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug}"
grpcurl="${GRPCURL:-grpcurl}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_for URL [curl args]: bounded poll until the URL answers 200.
wait_for() {
  local url="$1"; shift
  for _ in $(seq 1 100); do
    curl -fsS "$@" "$url" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "timed out waiting for $url"; return 1
}

# --- libsync into a temp host ------------------------------------------------
mkdir -p "$work/artifacts" "$work/host/usr/local/vgpu"
# What kubelet creates for a subPath mount of a file that does not exist yet.
mkdir "$work/host/usr/local/vgpu/ld.so.preload"
printf 'stand-in for HAMi-core libvgpu.so\n' > "$work/artifacts/libvgpu.so"
ls_port=$(free_port)
"$bin/kai-node" --log-level warn libsync --source-dir "$work/artifacts" \
  --host-vgpu-dir "$work/host/usr/local/vgpu" \
  --health-listen "127.0.0.1:$ls_port" & pids+=($!)
wait_for "http://127.0.0.1:$ls_port/readyz"
[ "$(cat "$work/host/usr/local/vgpu/ld.so.preload")" = "/usr/local/vgpu/libvgpu.so" ] \
  && cmp -s "$work/artifacts/libvgpu.so" "$work/host/usr/local/vgpu/libvgpu.so" \
  && ok "libsync installed libvgpu.so and ld.so.preload (replacing kubelet's empty directory)" || bad "libsync files"
[ "$(stat -c %a "$work/host/usr/local/vgpu/containers")" = 1777 ] && [ "$(stat -c %a "$work/host/usr/local/vgpu/vgpulock")" = 1777 ] \
  && ok "containers/ and the lock directory (<host dir>/vgpulock) are 1777" || bad "directory modes"

# --- webhook over TLS ----------------------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout "$work/tls.key" -out "$work/tls.crt" >/dev/null 2>&1
# The default delivery (csi): no LIBRARY_DELIVERY in the environment.
wh_port=$(free_port)
env -u LIBRARY_DELIVERY -u CSI_DRIVER "$bin/kai-webhook" --listen "127.0.0.1:$wh_port" --tls-cert-file "$work/tls.crt" \
  --tls-private-key-file "$work/tls.key" --log-level warn & pids+=($!)
# The same webhook pinned to hostPath delivery (chart: libraryDelivery: hostPath).
hp_port=$(free_port)
LIBRARY_DELIVERY=hostPath "$bin/kai-webhook" --listen "127.0.0.1:$hp_port" --tls-cert-file "$work/tls.crt" \
  --tls-private-key-file "$work/tls.key" --log-level warn & pids+=($!)
wait_for "https://localhost:$wh_port/readyz" --cacert "$work/tls.crt"
wait_for "https://localhost:$hp_port/readyz" --cacert "$work/tls.crt"
review() { # review NAME ANNOTATIONS-JSON
  python3 - "$1" "$2" <<'PY'
import json, sys
name, annotations = sys.argv[1], json.loads(sys.argv[2])
print(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
  "uid": "uid-" + name, "kind": {"group": "", "version": "v1", "kind": "Pod"},
  "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": name, "namespace": "e2e",
  "operation": "CREATE", "userInfo": {"username": "e2e"},
  "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "e2e", "annotations": annotations},
             "spec": {"containers": [{"name": "main", "image": "cuda"}]}}}}))
PY
}
# mutate BODY [PATH]: /mutate, or /mutate/allow-opt-out (where the chart
# sends pods of namespaces that may opt out); to the csi webhook, or to the
# one on $port when set (port=$hp_port mutate ...: the hostPath one).
mutate() { curl -fsS --cacert "$work/tls.crt" -H 'Content-Type: application/json' --data "$1" "https://localhost:${port:-$wh_port}${2:-/mutate}"; }
gpu=$(mutate "$(review e2e-gpu '{"gpu-memory":"1024"}')")
echo "$gpu" | python3 -c '
import base64, json, sys
r = json.load(sys.stdin)["response"]
ops = json.loads(base64.b64decode(r["patch"]))
mounts = [m for o in ops if o["path"].endswith("volumeMounts") for m in o["value"]]
paths = [m["mountPath"] for m in mounts]
assert r["allowed"] and r["uid"] == "uid-e2e-gpu" and "/etc/ld.so.preload" in paths, (r, mounts)
writable = sorted(m["mountPath"] for m in mounts if not m.get("readOnly"))
# The region directory comes with the volume mounted at <mount> (no
# containers subPath: it would cover the region directory, node.sh).
assert writable == ["/tmp/vgpulock"], mounts
assert "/usr/local/vgpu/containers" not in paths, mounts
assert any(m["mountPath"] == "/usr/local/vgpu" and m.get("readOnly") for m in mounts), mounts
assert {m["name"] for m in mounts} == {"kai-resource-isolator-vgpu"}, mounts
vols = [v for o in ops if o["path"].startswith("/spec/volumes") for v in (o["value"] if isinstance(o["value"], list) else [o["value"]])]
assert vols == [{"name": "kai-resource-isolator-vgpu", "csi": {"driver": "vgpu.kai-resource-isolator.io", "readOnly": False,
                 "volumeAttributes": {"kai-resource-isolator.io/container": "main"}}}], vols
env = [e for o in ops if "/env" in o["path"] for e in (o["value"] if isinstance(o["value"], list) else [o["value"]])]
assert {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1024m"} in env, env
' && ok "webhook (default delivery) mutates a gpu-memory pod: one csi volume, no hostPath; ld.so.preload, <mount> read-only (the region directory comes with it), only the lock dir a writable mount, no containers subPath, literal 1024m limit" || bad "webhook mutation: $gpu"
cores=$(mutate "$(review e2e-cores '{"gpu-fraction":"0.5","kai-resource-isolator.io/gpu-cores":"30"}')")
echo "$cores" | python3 -c '
import base64, json, sys
r = json.load(sys.stdin)["response"]
ops = json.loads(base64.b64decode(r["patch"]))
env = [e for o in ops if "/env" in o["path"] for e in (o["value"] if isinstance(o["value"], list) else [o["value"]])]
assert {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"} in env, env
assert not any(e["name"] == "CUDA_DEVICE_MEMORY_LIMIT" for e in env), env
' && ok "webhook sets CUDA_DEVICE_SM_LIMIT from gpu-cores (no memory literal for gpu-fraction)" || bad "gpu-cores: $cores"
badcores=$(mutate "$(review e2e-badcores '{"gpu-fraction":"0.5","kai-resource-isolator.io/gpu-cores":"150"}')")
echo "$badcores" | python3 -c '
import json, sys
r = json.load(sys.stdin)["response"]
assert not r["allowed"] and "1 to 100" in r["status"]["message"], r
' && ok "webhook denies gpu-cores outside 1-100" || bad "bad gpu-cores: $badcores"
plain=$(mutate "$(review e2e-plain '{}')")
echo "$plain" | python3 -c '
import json, sys
r = json.load(sys.stdin)["response"]
assert r["allowed"] and "patch" not in r, r
' && ok "webhook leaves a plain pod untouched" || bad "plain pod"
# The patch applied to the pod as the API server would store it, checked with
# kind-tests/pod_checks.py: the same checks run.sh makes on the live pods.
checks="$root/kind-tests/pod_checks.py"
admit() { # admit NAME ANNOTATIONS-JSON SPEC-JSON [PATH]: the patched pod in $work/NAME.patched.json
  python3 - "$work" "$1" "$2" "$3" <<'PY'
import json, sys
work, name, annotations, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "e2e", "annotations": annotations}, "spec": spec}
json.dump(pod, open(f"{work}/{name}.pod.json", "w"))
json.dump({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
  "uid": "uid-" + name, "kind": {"group": "", "version": "v1", "kind": "Pod"},
  "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": name, "namespace": "e2e",
  "operation": "CREATE", "userInfo": {"username": "e2e"}, "object": pod}}, open(f"{work}/{name}.review.json", "w"))
PY
  mutate "@$work/$1.review.json" "${4:-/mutate}" > "$work/$1.response.json"
  python3 "$checks" apply "$work/$1.pod.json" "$work/$1.response.json" > "$work/$1.patched.json"
}
two='{"containers":[{"name":"main","image":"ubuntu:24.04"},{"name":"sidecar","image":"ubuntu:24.04"}]}'
admit e2e-fraction '{"gpu-fraction":"0.5"}' "$two"
python3 "$checks" injected "$work/e2e-fraction.patched.json" main --delivery csi \
  && ok "gpu-fraction pod (csi): one csi volume naming main, three mounts at their paths, three env vars on main only" \
  || bad "gpu-fraction pod as patched"
admit e2e-named '{"gpu-memory":"1024","gpu-fraction-container-name":"sidecar"}' "$two"
python3 "$checks" injected "$work/e2e-named.patched.json" sidecar --delivery csi \
  && ok "gpu-fraction-container-name: only the named container is injected" || bad "named container as patched"
admit e2e-append '{"gpu-memory":"1024"}' '{"volumes":[{"name":"data","emptyDir":{}}],"containers":[{"name":"main","image":"ubuntu:24.04","env":[{"name":"FOO","value":"bar"}],"volumeMounts":[{"name":"data","mountPath":"/data"}]}]}'
python3 "$checks" injected "$work/e2e-append.patched.json" main --delivery csi \
  && python3 -c '
import json, sys
spec = json.load(open(sys.argv[1]))["spec"]; main = spec["containers"][0]
assert spec["volumes"][0] == {"name": "data", "emptyDir": {}}, spec["volumes"]
assert main["env"][0] == {"name": "FOO", "value": "bar"} and main["volumeMounts"][0]["mountPath"] == "/data", main
' "$work/e2e-append.patched.json" \
  && ok "a pod with volumes, env and mounts of its own keeps them and gains ours" || bad "appending to existing arrays"
admit e2e-optout-ignored '{"gpu-memory":"1024","kai-resource-isolator.io/inject":"false"}' "$two"
python3 "$checks" injected "$work/e2e-optout-ignored.patched.json" main --delivery csi \
  && ok "on /mutate the tenant's opt-out annotation counts for nothing" || bad "opt-out honoured on /mutate"
admit e2e-optout '{"gpu-memory":"1024","kai-resource-isolator.io/inject":"false"}' "$two" /mutate/allow-opt-out
python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["response"]; assert r["allowed"] and "patch" not in r, r' \
    "$work/e2e-optout.response.json" \
  && python3 "$checks" untouched "$work/e2e-optout.patched.json" \
  && ok "an opted-out pod (inject: \"false\") is untouched" || bad "opted-out pod"
admit e2e-again '{"gpu-fraction":"0.5"}' "$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["spec"]))' "$work/e2e-fraction.patched.json")"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["response"]; assert r["allowed"] and "patch" not in r, r' \
    "$work/e2e-again.response.json" \
  && ok "reinvocation on the injected pod adds nothing" || bad "reinvocation patched again"
# Pod Security restricted: the effective runAsUser / runAsGroup become the
# volume's attributes (the container's over the pod's), for kai-csi.
restricted='{"securityContext":{"runAsNonRoot":true,"runAsUser":1000,"runAsGroup":3000,"fsGroup":2000,"seccompProfile":{"type":"RuntimeDefault"}},"containers":[{"name":"main","image":"ubuntu:24.04","securityContext":{"runAsUser":1001,"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}}]}'
admit e2e-restricted '{"gpu-memory":"1024"}' "$restricted"
python3 "$checks" injected "$work/e2e-restricted.patched.json" main --delivery csi \
  && python3 -c '
import json, sys
(v,) = [v for v in json.load(open(sys.argv[1]))["spec"]["volumes"] if v["name"] == "kai-resource-isolator-vgpu"]
assert v["csi"]["volumeAttributes"] == {"kai-resource-isolator.io/container": "main",
    "kai-resource-isolator.io/run-as-user": "1001", "kai-resource-isolator.io/run-as-group": "3000"}, v
' "$work/e2e-restricted.patched.json" \
  && ok "restricted pod (csi): the volume carries the container's runAsUser 1001 and the pod's runAsGroup 3000" || bad "run-as attributes"

# --- the same webhook pinned to hostPath delivery -----------------------------
port=$hp_port admit e2e-hp-fraction '{"gpu-fraction":"0.5"}' "$two"
python3 "$checks" injected "$work/e2e-hp-fraction.patched.json" main --delivery hostPath \
  && ok "LIBRARY_DELIVERY=hostPath: three hostPath volumes, four mounts at their paths, three env vars on main only" \
  || bad "gpu-fraction pod as patched by the hostPath webhook"
port=$hp_port admit e2e-hp-restricted '{"gpu-memory":"1024"}' "$restricted"
python3 "$checks" injected "$work/e2e-hp-restricted.patched.json" main --delivery hostPath \
  && ok "LIBRARY_DELIVERY=hostPath: a restricted pod gets the hostPath volumes too (no csi volume)" \
  || bad "restricted pod as patched by the hostPath webhook"
# A pod carrying hostPath delivery's volumes, reviewed by a csi webhook: a
# tenant can declare them as well as a hostPath replica can have added
# them, and under csi they would keep the node's shared containers/ and lock
# directory writable, so it is denied (its controller's retry is admitted
# with the CSI volume).
admit e2e-hp-again '{"gpu-fraction":"0.5"}' "$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["spec"]))' "$work/e2e-hp-fraction.patched.json")"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["response"]; assert not r["allowed"] and "hostPath" in r["status"]["message"], r' \
    "$work/e2e-hp-again.response.json" \
  && ok "a pod carrying hostPath delivery's volumes is denied by the csi webhook" || bad "hostPath volumes admitted under csi delivery"
if timeout 10 "$bin/kai-webhook" --library-delivery hostpath --tls-cert-file "$work/tls.crt" --tls-private-key-file "$work/tls.key" \
    --listen "127.0.0.1:$(free_port)" >"$work/bad-delivery.log" 2>&1; then
  bad "the webhook started with --library-delivery hostpath"
else
  grep -q "possible values: csi, hostPath" "$work/bad-delivery.log" \
    && ok "an unknown delivery (hostpath) stops the webhook at start-up" || bad "bad delivery: $(cat "$work/bad-delivery.log")"
fi
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$wh_port/healthz" || true)
[ "$code" = 400 ] && ok "plain HTTP to the webhook is refused (400)" || bad "plain HTTP got $code"

# --- a region, the agent and the aggregator -----------------------------------
uid=6f1c2d3e-0000-4000-8000-0000000000e2
"$bin/kai-node" write-region --containers-dir "$work/host/usr/local/vgpu/containers" \
  --pod-uid "$uid" --container main --gpu-uuid GPU-e2e00000-0000-4000-8000-000000000000 \
  --limit-mib 1024 --used-mib 512 >/dev/null
# A second container on the same GPU, preloaded but without a limit (what
# KAI issue #2156 looks like): libvgpu records 0 and enforces nothing.
uncapped=6f1c2d3e-0000-4000-8000-0000000000f3
"$bin/kai-node" write-region --containers-dir "$work/host/usr/local/vgpu/containers" \
  --pod-uid "$uncapped" --container main --gpu-uuid GPU-e2e00000-0000-4000-8000-000000000000 \
  --limit-mib 0 --used-mib 256 >/dev/null
printf '[{"uid":"%s","namespace":"e2e","name":"e2e-gpu"},{"uid":"%s","namespace":"e2e-uncapped","name":"e2e-nolimit"}]' \
  "$uid" "$uncapped" > "$work/pods.json"
ag_grpc=$(free_port); ag_metrics=$(free_port)
"$bin/kai-node" --log-level warn agent --no-kube --no-nvml --static-pods "$work/pods.json" --metrics-auth=none \
  --containers-dir "$work/host/usr/local/vgpu/containers" \
  --grpc-listen "127.0.0.1:$ag_grpc" --metrics-listen "127.0.0.1:$ag_metrics" --node-name e2e-node & pids+=($!)
wait_for "http://127.0.0.1:$ag_metrics/readyz"
preload_state=unchecked
for _ in $(seq 1 100); do
  preload_state=$(curl -fsS "http://127.0.0.1:$ag_metrics/metrics" | sed -n 's/^kai_node_agent_preload_path{state="\([a-z]*\)"} 1$/\1/p')
  [ "$preload_state" != unchecked ] && break
  sleep 0.1
done
[ "$preload_state" = file ] && ok "agent: ld.so.preload on the node is a file" || bad "agent preload path: $preload_state"
listed=$("$grpcurl" -plaintext -d '{"namespace":"e2e"}' "127.0.0.1:$ag_grpc" vgpu.v1.VgpuNode/ListContainers)
echo "$listed" | python3 -c '
import json, sys
c = json.load(sys.stdin)["containers"]
assert [x["pod"] for x in c] == ["e2e-gpu"] and c[0]["devices"][0]["usedBytes"] == str(512 << 20), c
assert c[0]["isolationState"] == "ISOLATION_STATE_CAPPED", c
' && ok "grpcurl VgpuNode/ListContainers shows the container, capped" || bad "agent ListContainers: $listed"
listed=$("$grpcurl" -plaintext -d '{"namespace":"e2e-uncapped"}' "127.0.0.1:$ag_grpc" vgpu.v1.VgpuNode/ListContainers)
echo "$listed" | python3 -c '
import json, sys
c = json.load(sys.stdin)["containers"]
assert [x["pod"] for x in c] == ["e2e-nolimit"], c
assert c[0]["isolationState"] == "ISOLATION_STATE_UNCAPPED_NO_LIMIT", c
' && ok "the container without a limit is flagged uncapped_no_limit" || bad "agent ListContainers (uncapped): $listed"

agg_http=$(free_port); agg_grpc=$(free_port)
"$bin/kai-aggregator" --node-agent "127.0.0.1:$ag_grpc" --listen "127.0.0.1:$agg_http" \
  --grpc-listen "127.0.0.1:$agg_grpc" --auth=none --log-level warn & pids+=($!)
wait_for "http://127.0.0.1:$agg_http/readyz"
series='hami_vgpu_memory_used_bytes{namespace="e2e",pod="e2e-gpu",container="main",vdevice_index="0",device_uuid="GPU-e2e00000-0000-4000-8000-000000000000",node="e2e-node",zone="vGPU"} 536870912'
found=no
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$agg_http/metrics" | grep -F "$series" >/dev/null; then found=yes; break; fi
  sleep 0.1
done
[ "$found" = yes ] && ok "aggregator :9394 shows the container's series" || bad "aggregator series missing"
curl -fsS "http://127.0.0.1:$agg_http/metrics" \
  | grep -F 'kai_isolator_container_isolation_state{namespace="e2e",pod="e2e-gpu",container="main",node="e2e-node",state="capped"} 1' >/dev/null \
  && ok "aggregator :9394 says the container's cap holds" || bad "isolation state series missing"
curl -fsS "http://127.0.0.1:$agg_http/metrics" \
  | grep -F 'kai_isolator_container_isolation_state{namespace="e2e-uncapped",pod="e2e-nolimit",container="main",node="e2e-node",state="uncapped_no_limit"} 1' >/dev/null \
  && ok "aggregator :9394 says the other container runs uncapped" || bad "uncapped state series missing"
devices=$(curl -fsS "http://127.0.0.1:$agg_http/api/v1/devices" | python3 -c 'import json,sys; d = json.load(sys.stdin)["devices"][0]; print(d["allocatedBytes"], d["uncappedContainers"])')
[ "$devices" = "$((1024 << 20)) 1" ] && ok "aggregator /api/v1/devices: 1 GiB allocated, one container uncapped" || bad "devices: $devices"

echo; echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
