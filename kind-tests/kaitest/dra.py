"""DRA consumable capacity on node.sh's node (issue 40, test_dra.py):
kubernetes-sigs/dra-example-driver v0.4.0 as kind-tests/dra/build.sh built
it, installed from its chart (kind-tests/dra/README.md, "The install
recipe"); ResourceClaims and pods that name them as users write them; what
the allocation, the ResourceSlice and the driver's CDI spec say.

Nothing here keeps state between calls; the `Node` (kaitest.node) is the
caller's.
"""
import glob
import json
import os
import re
import subprocess

import yaml

from kaitest.poll import poll

KIND_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_SH = os.path.join(KIND_TESTS, "dra", "build.sh")

DRIVER = "gpu.example.com"  # the driver's name, its DeviceClass's and its attributes' domain
CLASS = "gpu.example.com"  # the chart's DeviceClass (CEL: device.driver == 'gpu.example.com')
MEMORY = "memory"  # the devices' memory capacity (internal/profiles/gpu/gpu.go)
DRIVER_RELEASE = DRIVER_NS = "dra-example-driver"  # not `default`: the chart's validation refuses it
CHART_TGZ = "dra-example-driver-0.4.0.tgz"
IMAGE_TAR = "dra-example-driver.oci.tar"
DEVICES = ("gpu-0", "gpu-1")  # kubeletPlugin.numDevices=2
DEVICE_MIB = 80 * 1024  # each device's memory capacity, 80Gi
TEST_IMAGE = "kai.test/debian:bookworm"  # node.sh's Debian, imported into the node's containerd
ERRORS = (subprocess.CalledProcessError, AssertionError, KeyError, ValueError, IndexError, OSError)

MIB = 1 << 20
_SUFFIX = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
           "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15}


def wait(what, fn, timeout=180, show=None):
    return poll(what, fn, timeout, ERRORS, show=show)


def quantity_bytes(q):
    """A Kubernetes quantity of whole units (what the API server stores for
    these capacities: 16Gi, 17Gi, 80Gi, 100) as an int."""
    m = re.fullmatch(r"(\d+)([KMGTP]i|[kMGTP]|)", str(q))
    assert m, f"not a whole quantity: {q!r}"
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def build():
    """build.sh's build directory (cached: it prints `cached` and returns)."""
    r = subprocess.run(["bash", BUILD_SH], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"{BUILD_SH}: rc {r.returncode}: {r.stderr[-3000:]}"
    return r.stdout.strip().splitlines()[-1]


def install(node, build_dir):
    """The README's recipe: the image into the node's containerd, the chart
    with shares on (gpuAllowMultipleAllocations) and two devices, in its own
    namespace; returns once the kubelet plugin runs and the node's
    ResourceSlice has both devices. The slice."""
    node.ctr("images", "import", os.path.join(build_dir, "images", IMAGE_TAR), timeout=600)
    node.helm("upgrade", "-i", DRIVER_RELEASE, os.path.join(build_dir, "chart", CHART_TGZ),
              "-n", DRIVER_NS, "--create-namespace",
              "--set", "gpuAllowMultipleAllocations=true", "--set", "kubeletPlugin.numDevices=2",
              "--wait", "--timeout", "5m")
    node.kubectl("rollout", "status", f"daemonset/{DRIVER_RELEASE}-kubeletplugin", "-n", DRIVER_NS,
                 "--timeout=5m", timeout=330)
    return wait(f"the ResourceSlice of {node.name} with {len(DEVICES)} devices",
                lambda: (lambda s: s if s and len(s["spec"].get("devices") or []) == len(DEVICES) else None)(
                    node_slice(node)),
                show=lambda: node.kubectl("get", "resourceslices,pods", "-A", "-o", "wide", check=False).stdout)


def node_slice(node):
    """The driver's one ResourceSlice of the node (None while there is none)."""
    items = [s for s in node.kjson("get", "resourceslices")["items"]
             if s["spec"].get("driver") == DRIVER and s["spec"].get("nodeName") == node.name]
    assert len(items) <= 1, f"{len(items)} slices of {DRIVER} on {node.name}"
    return items[0] if items else None


def uuids(slice_):
    """{device name: its `uuid` attribute} of a ResourceSlice."""
    return {d["name"]: d["attributes"]["uuid"]["string"] for d in slice_["spec"]["devices"]}


def plugin_pod(node):
    (p,) = [p for p in node.kjson("get", "pods", "-n", DRIVER_NS)["items"]
            if p["metadata"]["name"].startswith(f"{DRIVER_RELEASE}-kubeletplugin-")
            and p["status"].get("phase") == "Running"]
    return p


def plugin_log(node):
    p = plugin_pod(node)
    return node.kubectl("logs", p["metadata"]["name"], "-n", DRIVER_NS, "--all-containers", "--tail=-1").stdout


# --- claims and pods, as a user writes them -------------------------------------

def claim(name, memory=None, compute=None, count=1, index=None, class_name=CLASS, distinct=False,
          request="gpu"):
    """A ResourceClaim of `count` devices of `class_name`, each slice
    `capacity.requests` {memory, compute} (absent: none stated); `index`
    pins the device (CEL on the driver's `index` attribute); `distinct`
    puts each device on a different GPU (distinctAttribute uuid)."""
    exactly = {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": count}
    caps = {k: v for k, v in ((MEMORY, memory), ("compute", compute)) if v is not None}
    if caps:
        exactly["capacity"] = {"requests": caps}
    if index is not None:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == {index}'}}]
    devices = {"requests": [{"name": request, "exactly": exactly}]}
    if distinct:
        devices["constraints"] = [{"requests": [request], "distinctAttribute": f"{DRIVER}/uuid"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def pod(name, claims=(), container="work", env=None, annotations=None, security=None):
    """A pod of one `sleep` container on TEST_IMAGE naming each of
    `claims` (ResourceClaim names; the pod claim has the same name) in
    resources.claims; `env` its own variables; `security` a restricted
    profile's securityContexts ({"pod": ..., "container": ...})."""
    c = {"name": container, "image": TEST_IMAGE, "imagePullPolicy": "Never",
         "command": ["sh", "-c", "exec sleep infinity"]}
    if claims:
        c["resources"] = {"claims": [{"name": n} for n in claims]}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec = {"terminationGracePeriodSeconds": 0, "containers": [c]}
    if claims:
        spec["resourceClaims"] = [{"name": n, "resourceClaimName": n} for n in claims]
    if security:
        spec["securityContext"] = security["pod"]
        c["securityContext"] = security["container"]
    meta = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


RESTRICTED = {  # what Pod Security's `restricted` level asks of a pod
    "pod": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    "container": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
}


def create(node, obj, ns, check=True):
    """The object as stored; with check=False the failed kubectl run when
    the API server (or an admission webhook) refused it."""
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["namespace"] = ns
    r = node.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(obj), check=check)
    return json.loads(r.stdout) if r.returncode == 0 else r


def running(node, name, ns, timeout=180):
    """Pod `name` as stored, once Running with every container ready."""
    def up():
        p = node.kjson("get", "pod", name, "-n", ns)
        cs = p["status"].get("containerStatuses") or []
        return p if p["status"].get("phase") == "Running" and cs and all(c.get("ready") for c in cs) else None
    return wait(f"pod {ns}/{name} Running", up, timeout=timeout,
                show=lambda: node.kubectl("describe", "pod", name, "-n", ns, check=False).stdout[-2500:])


def allocated(node, name, ns, timeout=120):
    """ResourceClaim `name` once allocated: its status.allocation.devices.results."""
    def results():
        c = node.kjson("get", "resourceclaim", name, "-n", ns)
        return ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
    return wait(f"ResourceClaim {ns}/{name} allocated", results, timeout=timeout,
                show=lambda: node.kubectl("get", "resourceclaim", name, "-n", ns, "-o", "yaml", check=False).stdout)


def consumed(result, capacity=MEMORY):
    """A result's consumedCapacity of `capacity`, in bytes (units for compute)."""
    return quantity_bytes(result["consumedCapacity"][capacity])


def env_of(node, name, ns, var, container="work"):
    """`var` in the running container's environment (None when unset)."""
    r = node.kubectl("exec", name, "-n", ns, "-c", container, "--", "printenv", var, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def cdi_env(node, claim_uid):
    """The env edits of the CDI spec the kubelet plugin wrote for a claim
    at NodePrepareResources (this node's containerd 1.6 cannot apply them:
    kind-tests/dra/README.md, "CDI on this node's containerd"): {device:
    {VAR: value}}. Read from the plugin's /var/run/cdi, which is
    NODE_DIR/ns/run/cdi on the host (node.sh binds NODE_DIR/ns/run at /run)."""
    pattern = os.path.join(node.dir, "ns", "run", "cdi", f"k8s.{DRIVER}-gpu_{claim_uid}.*")
    paths = glob.glob(pattern)
    if paths:
        text = open(paths[0]).read()
    else:  # the plugin's own view of the same directory
        p = plugin_pod(node)
        text = node.kubectl("exec", p["metadata"]["name"], "-n", DRIVER_NS, "--", "sh", "-c",
                            f"cat /var/run/cdi/k8s.{DRIVER}-gpu_{claim_uid}.*").stdout
    spec = yaml.safe_load(text)
    return {d["name"]: dict(e.split("=", 1) for e in d["containerEdits"].get("env") or [])
            for d in spec["devices"]}


def delete(node, ns, pods=(), claims=()):
    """The pods gone, then their claims (the shares free for the next test)."""
    if pods:
        node.kubectl("delete", "pod", *pods, "-n", ns, "--ignore-not-found", "--wait=true", "--timeout=120s",
                     timeout=150)
    if claims:
        node.kubectl("delete", "resourceclaim", *claims, "-n", ns, "--ignore-not-found", "--wait=true",
                     "--timeout=120s", timeout=150)


def namespace(node, name, *labels):
    """Namespace `name` (with `labels`), once its default ServiceAccount
    exists (until then every pod is refused)."""
    node.kubectl("create", "namespace", name, check=False)
    if labels:
        node.kubectl("label", "namespace", name, *labels, "--overwrite")
    wait(f"the default ServiceAccount of {name}",
         lambda: node.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0, timeout=60)
