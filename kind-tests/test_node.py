"""Injected pods in real containers: kubelet + containerd (node.sh's node).

`node.sh --up` brings up the control plane of cluster.sh and a real node on
this machine (kubelet, kube-proxy, containerd) once for the module (`node`,
kaitest.node) and `node.sh --down` takes it down at its end. Needs root.

The chart is installed with libraryDelivery=hostPath and its host directory
under NODE_DIR (paths.hostInstallBase), its image the one node.sh imports
(node/kai_image.sh, from the target directory's binaries): libsync's and the
node agent's DaemonSets and the aggregator's Deployment run as real pods on
the node, and reach the API server through the `kubernetes` Service (node.sh
runs kube-proxy). The agent's NVML is the stand-in libkai_fake_nvml.so
(services/fake-nvml), given through monitor.nvml.hostLibraryDir; its config
names the containers' real host PIDs. With libraryDelivery=csi, the node
DaemonSet's pod adds kai-csi and its registrar sidecar (node/registrar's
image), which the kubelet calls for real. The webhook's Deployment runs on
the node too: the API server calls it at its pod IP, through the chart's
Service (--enable-aggregator-routing). Every component is a pod; this module
runs none as a process (only `kai-node write-region`, to write a region as
libvgpu would, and the Go chart's certgen-sim.sh). The stand-in for
libvgpu.so is libkai_fake_vgpu.so (services/fake-vgpu): loaded, it is in the
process's maps; the pods never call CUDA, so it does nothing else.

The parts, in the order they run (`-k` selects on their names' words; each
test asks fixtures for what it builds on, so any one part, or test, runs
alone: `pytest -c kind-tests/pytest.ini -m node -k csi`):

  node         the node registered Ready (test_node_ready);
  migration    a Go chart release moved to this chart and back on the node
               (TestMigration, with migration.py's prober; before `release`);
  release      `release`: the chart installed (test_install), the webhook's
               pod called by the API server;
  hostpath     TestHostPath: libsync's recovery, the preload, the read-only
               library, the region directory, the agent, the aggregator,
               eviction, opted-out pods;
  csi          TestCsi: helm upgrade to libraryDelivery=csi, kai-csi called
               by the kubelet (alone, it also proves a pod waits for libsync);
  uninstall    test_uninstall: every pod and the release gone, the kubelet
               clean.

(`-k hostpath` also selects the migration's first check, whose name says
hostPath: `-k TestHostPath` is that part alone.)

Each test is one check of the old node.py (and node_migration.py), its id
the `ok` line. A check that others build on is a fixture (its test only asks
for it): when it fails, every test built on it errors at setup with its
failure. When a test of the module failed, the release pods' last log lines
and the kubelet's and containerd's errors are printed before the node goes.
Needs what node.sh needs (root, containerd, ...), helm ($HELM, else the one
.ci/run caches), grpcurl ($GRPCURL, else on PATH), the Go chart
(../shared/go-chart-1.1.0, or KAI_GO_CHART) for the migration part, and the
built binaries of kaitest.node.PACKAGES ($KAI_TARGET, else target/debug;
built when missing). node.sh's log goes to $KAI_NODE_OUT, else
target/node-suite.
"""
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time

import pytest
import yaml

import migration
import pod_checks as shapes
from kaitest import node as kainode
from kaitest.chart import helm_binary
from kaitest.checks import named, uncaptured
from kaitest.kube import CHART, FULL, KIND_TESTS, NS, RELEASE, TENANT, Cluster, Processes, http_get, run

pytestmark = pytest.mark.node
OUT = ("KAI_NODE_OUT", "node-suite")  # out_dir (conftest.py): $KAI_NODE_OUT, else target/node-suite

OPT_OUT_NS = "opt-out-allowed"
# Labelled for the webhook to ignore: no entry of its configuration serves it.
IGNORED_NS = "ignored-ns"
RESTRICTED = "restricted-ns"
IMAGE = "kai.test/debian:bookworm"
MOUNT = "/usr/local/vgpu"  # paths.containerVgpuMount: where containers see the library
LIB = f"{MOUNT}/libvgpu.so"
CSI_DRIVER = "vgpu.kai-resource-isolator.io"
# A node label of the test's: the CSI part alone (-k csi) holds libsync back
# with it (librarySync.nodeSelector) until the pod has waited for libsync.
LIBSYNC_HOLD = ("kai-test.io/libsync", "run")
# The stand-in NVML as the agent pod gets it (monitor.nvml.hostLibraryDir):
# the library and its config in one host directory, mounted read-only at
# /run/kai/nvidia-lib; the config is read again at every call.
NVML_IN_POD = "/run/kai/nvidia-lib"
GPU_UUID = "GPU-a0000000-0000-4000-8000-000000000000"

# Reasons a container waits for that no retry within a test passes.
STUCK = ("ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
         "RunContainerError")

# The container's own process (PID 1, uid 1000) makes its region directory
# from the injected env, as libvgpu would, and says what happened in its log.
GPU_SCRIPT = r'''
d="$CONTAINER_VGPU_MOUNT/containers/${POD_UID}_${CONTAINER_NAME}"
if [ -z "$POD_UID" ] || [ -z "$CONTAINER_NAME" ] || [ -z "$CONTAINER_VGPU_MOUNT" ]; then
  echo "region-dir: no env (POD_UID=$POD_UID CONTAINER_NAME=$CONTAINER_NAME CONTAINER_VGPU_MOUNT=$CONTAINER_VGPU_MOUNT)"
elif err="$(mkdir -p "$d" 2>&1)"; then
  echo "region-dir made $d"
else
  echo "region-dir failed: $err"
fi
exec sleep infinity
'''


# --- the node ---------------------------------------------------------------------

def node_ready_name():
    """The node check's name, as node.py printed it: node.sh's node name and
    the kubelet's version (k8s/go.mod's pin, as cluster.sh reads it)."""
    with open(os.path.join(KIND_TESTS, "k8s", "go.mod")) as f:
        version = re.search(r"k8s\.io/kubernetes (v[0-9]\S*)", f.read()).group(1)
    name = os.environ.get("NODE_NAME") or "kai-node-1"
    return f"node {name}: a real kubelet {version} on containerd registered Ready, the only node"


def pytest_generate_tests(metafunc):
    if "node_check" in metafunc.fixturenames:
        name = node_ready_name()
        metafunc.parametrize("node_check", [name], ids=[name])


class NodeCluster(Cluster):
    """The node's cluster (kaitest.kube.Cluster over node.sh's env files) and
    what the checks do with its pods; `node` is kaitest.node's Node."""

    def __init__(self, node, failed_before):
        work = os.path.join(node.dir, "test")
        os.makedirs(work, exist_ok=True)
        super().__init__(env=node.env, admin=node.admin, pki=os.path.join(node.dir, "cluster", "pki"), work=work,
                         helm_binary=helm_binary(), errors=(IndexError,))
        self.node, self.name, self.target = node, node.name, node.target
        self.processes = Processes(work, tail_lines=30)
        self.failed_before = failed_before
        self.host_vgpu = os.path.join(self.env["HOST_BASE"], "vgpu")  # paths.hostInstallBase + /vgpu
        self.kai_image = self.env["KAI_IMAGE"]  # the project's image, as node.sh imported it
        self.registrar_image = self.env["REGISTRAR_IMAGE"]  # node/registrar's (node/registrar_image.sh)
        self.nvml_dir = os.path.join(work, "nvidia-lib")

    def library(self, name):
        """A library of the target directory (kaitest.node.FILES: `built`
        made sure it is there)."""
        return os.path.join(self.target, name)

    # --- pods ---

    def release_pod(self, component, what, other_than=()):
        """The release's Ready pod of `component` on the node once it is the
        only one: `other_than`, the pods a rollout replaces, gone (they would
        still answer); fails early on a container that is stuck."""
        selector = f"app.kubernetes.io/component={component}"

        def ready():
            all_pods = self.kjson("get", "pods", "-n", NS, "-l", selector, "--field-selector",
                                  f"spec.nodeName={self.name}")["items"]
            if any(p["metadata"]["name"] in other_than for p in all_pods):
                return None
            pods = [p for p in all_pods if not p["metadata"].get("deletionTimestamp")]
            for p in pods:
                if waiting := stuck(p):
                    # Not an AssertionError: eventually() would retry it.
                    raise Stuck(f"{component} pod {p['metadata']['name']}: {waiting}")
            ok = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in p["status"].get("conditions", []))]
            return ok[0] if len(ok) == len(pods) == 1 else None
        try:
            return self.eventually(what, ready, timeout=90,
                                   show=lambda: json.dumps([p["status"] for p in self.kjson(
                                       "get", "pods", "-n", NS, "-l", selector)["items"]])[-1200:])
        except Stuck as e:
            raise AssertionError(str(e))

    def running(self, name, ns=TENANT, timeout=120):
        """The pod once Running with its container started; fails early on a
        container that waits for a reason that does not pass."""
        def show():
            p = self.kjson("get", "pod", name, "-n", ns)
            ev = self.kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
                              "-o", "custom-columns=R:.reason,M:.message", check=False).stdout
            return (f"phase {p['status'].get('phase')}, {json.dumps(p['status'].get('containerStatuses'))[:400]}; "
                    f"events:\n{ev[-800:]}")

        def up():
            p = self.kjson("get", "pod", name, "-n", ns)
            if waiting := stuck(p):
                raise Stuck(f"pod {ns}/{name}: {waiting}")
            if p["status"].get("phase") == "Running" and all(
                    "running" in cs.get("state", {}) for cs in p["status"].get("containerStatuses", [])):
                return p
            return None
        try:
            return self.eventually(f"pod {ns}/{name} Running", up, timeout=timeout, show=show)
        except Stuck as e:
            raise AssertionError(f"{e}; {show()}")

    def exec_(self, name, script, ns=TENANT, check=True):
        return self.kubectl("exec", name, "-n", ns, "-c", "main", "--", "sh", "-c", script, check=check, timeout=30)

    def logs(self, name, ns=TENANT):
        return self.kubectl("logs", name, "-n", ns, "-c", "main").stdout

    def pod_log(self, pod_name, container, lines=30):
        return self.kubectl("logs", pod_name, "-n", NS, "-c", container, f"--tail={lines}", check=False).stdout

    def mountinfo(self, name, ns=TENANT):
        """{mount point: mount options} of the container's PID 1."""
        out = {}
        for line in self.exec_(name, "cat /proc/1/mountinfo", ns).stdout.splitlines():
            f = line.split()
            out[f[4]] = f[5].split(",")
        return out

    def delete_pod(self, name, ns=TENANT):
        self.kubectl("delete", "pod", name, "-n", ns, "--wait=true", "--timeout=60s", check=False)

    def pod_checks(self, mode, pod_obj, delivery=None):
        """pod_checks.py's shape of the pod (container main at MOUNT). Its
        hostPath layout takes the host directory to be the mount path (the
        chart's default); here the host directory is under NODE_DIR
        (paths.hostInstallBase), so the three hostPath paths are checked
        here, exactly, and handed to pod_checks.py as the default layout
        would have them."""
        pod_obj = json.loads(json.dumps(pod_obj))
        if mode == "injected" and delivery == "hostPath":
            got = {v["name"]: v["hostPath"]["path"] for v in pod_obj["spec"].get("volumes", []) if "hostPath" in v}
            want = {"kai-resource-isolator-vgpu": self.host_vgpu,
                    "kai-resource-isolator-containers": f"{self.host_vgpu}/containers",
                    "kai-resource-isolator-vgpulock": f"{self.host_vgpu}/vgpulock"}
            assert got == want, f"hostPath volumes {got}, want {want}"
            for v in pod_obj["spec"]["volumes"]:
                if v["name"] in want:
                    v["hostPath"]["path"] = MOUNT + v["hostPath"]["path"][len(self.host_vgpu):]
        problems = (shapes.injected(pod_obj, "main", MOUNT, delivery) if mode == "injected"
                    else shapes.untouched(pod_obj))
        assert not problems, "\n".join(problems)

    def host_pid(self, pod_obj, container="main"):
        return self.node.host_pid(pod_obj, container)

    def region_events(self, name, reason, ns=TENANT):
        return [e for e in self.kjson("get", "events", "-n", ns, "--field-selector",
                                      f"involvedObject.name={name}")["items"] if e["reason"] == reason]

    # --- the stand-ins for libvgpu and NVML ---

    def write_region(self, pod_obj, pid, limit_mib, used_mib):
        """The region libvgpu would write at cuInit, in the host's containers
        directory the agent pod mounts."""
        self.node.write_region(pod_obj, "main", pid, [limit_mib], used_mib, [GPU_UUID])

    def fake_nvml(self, processes):
        """The GPU the stand-in NVML reports, running `processes` ({host PID:
        bytes})."""
        kainode.fake_nvml(self.nvml_dir, self.library("libkai_fake_nvml.so"),
                          [{"uuid": GPU_UUID, "name": "NVIDIA H100 80GB HBM3", "total": 80 << 30,
                            "processes": processes}])

    # --- on failure ---

    def failed(self, request):
        """Whether a test of this module has failed (so far)."""
        return request.session.testsfailed > self.failed_before

    def release_logs(self, request):
        """The last lines of each release pod's containers (before they go),
        on the terminal."""
        r = self.kubectl("get", "pods", "-n", NS, "-o", "json", check=False)
        with uncaptured(request):
            for p in json.loads(r.stdout)["items"] if r.returncode == 0 else ():
                for c in p["spec"]["containers"]:
                    print(f"\n--- {p['metadata']['name']} {c['name']} (last lines) ---\n"
                          + self.pod_log(p["metadata"]["name"], c["name"], 15), flush=True)

    def node_errors(self, request):
        """The kubelet's and containerd's error lines (last ones), on the
        terminal."""
        with uncaptured(request):
            for log in ("kubelet.log", "containerd.log"):
                try:
                    lines = open(os.path.join(self.node.dir, log), errors="replace").read().splitlines()
                except OSError:
                    continue
                errors = [ln for ln in lines if re.match(r"^E[0-9]{4}", ln) or "level=error" in ln]
                print(f"\n--- {log} (errors, last lines) ---\n" + "\n".join(errors[-15:]), flush=True)


class Stuck(Exception):
    """A container waits for a reason no retry passes (not an
    AssertionError: eventually() would retry it)."""


def stuck(p):
    """The first `waiting` state of the pod's containers whose reason is in
    STUCK, else None."""
    for cs in p["status"].get("containerStatuses", []):
        waiting = cs.get("state", {}).get("waiting", {})
        if waiting.get("reason") in STUCK:
            return waiting
    return None


def restarts(p):
    return sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", []))


def pod(name, annotations=None, script="exec sleep infinity", labels=None):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})},
            "spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", script]}]}}


def gpu_pod(name):
    # The annotation KAI's GPU-memory sharing puts on a pod (the webhook's
    # trigger), as test_apiserver.py's injected pods carry it.
    return pod(name, {"gpu-memory": "1024"}, GPU_SCRIPT)


@pytest.fixture(scope="module")
def node(built, out_dir):
    """node.sh --up: the control plane and the real node, taken down at the
    end of the module (node.sh --down); node.sh's log in out_dir."""
    t0 = time.monotonic()
    with kainode.up(built(kainode.PACKAGES, kainode.FILES), out_dir) as n:
        print(f"node {n.name} up in {time.monotonic() - t0:.0f} s: NODE_DIR={n.dir}")
        yield n


@pytest.fixture(scope="module")
def kc(node, request):
    """The node's cluster; when a test of the module failed, the kubelet's
    and containerd's errors at the end (before the node goes)."""
    kc = NodeCluster(node, request.session.testsfailed)
    try:
        yield kc
    finally:
        kc.processes.stop_all()
        if kc.failed(request):
            kc.node_errors(request)


def test_node_ready(node_check, kc):
    n = kc.kjson("get", "node", kc.name)
    ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", n["status"]["conditions"]
    info = n["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kc.env["K8S_VERSION"], info
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    nodes = [x["metadata"]["name"] for x in kc.kjson("get", "nodes")["items"]]
    assert nodes == [kc.name], f"nodes {nodes}: only the real one"


# ============================================================================
# migration: a Go chart release moved to this chart and back on the node
# ============================================================================

MIG_TENANT = "mig-node-tenant"
GO_IMAGE = "kai.test/go-standin:1.1.0"
CERTGEN_IMAGE = "kai.test/go-certgen-standin:1"
GPU_LABEL = "nvidia.com/gpu.present"
# The Go webhook's stand-in: its arguments, our binary in the Go chart's
# delivery. Go's --listen=:8443 is spelled 0.0.0.0:8443 for it.
GO_WEBHOOK = """#!/bin/sh
# The Go webhook's stand-in: its arguments, our binary in the Go chart's
# delivery. Go's --listen=:8443 is spelled 0.0.0.0:8443 for it.
export LIBRARY_DELIVERY=hostPath
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in --listen=:*) a="--listen=0.0.0.0:${a#--listen=:}" ;; esac
  set -- "$@" "$a"
done
exec /usr/local/bin/kai-webhook "$@"
"""


class Migration:
    """What migration.py does on the API server alone, with the kubelet,
    containerd, kube-proxy and the controllers of node.sh doing their real
    work, so pods really run through the switch and the webhook's endpoints
    are the real EndpointSlice controller's, from the pods' real readiness
    (issue 43).

    The Go chart (../shared/go-chart-1.1.0, or KAI_GO_CHART) is installed
    with a values file as a user would have one, with what cannot be had
    here put in its place:

    - its image (projecthami/kai-resource-isolator) is in no registry here:
      its webhook pods run `kai.test/go-standin`, kai.test/debian with
      kai-webhook whose entrypoint runs it with LIBRARY_DELIVERY=hostPath
      (the Go chart's hostPath volumes and env; our binary's layout of them),
      with the Go Deployment's arguments, probes and the certgen Secret it
      mounts (it serves on for 5 s after SIGTERM as ours does, where the Go
      binary exits at once: docs/migration.md, "No window");
    - its certgen Jobs run `kai.test/go-certgen-standin` (a few seconds of
      sleep), while ../shared/go-chart-1.1.0/certgen-sim.sh makes the Secret
      and patches the caBundle as certgen would;
    - its libsync DaemonSet (privileged, the host's / with Bidirectional
      propagation: the kubelet refuses that here, / is no shared mount in
      the node's mount namespace) is kept off the node
      (librarySync.nodeSelector); the test puts in the host directory what it
      copies (libvgpu.so, the stand-in libkai_fake_vgpu.so; ld.so.preload;
      containers/ 1777);
    - paths.containerVgpuMount is a directory under the node's temp dir (the
      Go chart mounts the same path on the host and in containers), so
      nothing of the machine's /usr/local is used.

    This chart's upgrades add what a user of these values would: its own
    image (the one node.sh imports), paths.hostInstallBase "" (the host
    directory is containerVgpuMount, as in the Go chart) and
    libraryDelivery=hostPath (a pod admitted by this chart keeps working
    after a rollback: the Go revision has no kai-csi to unpublish a CSI
    volume)."""

    def __init__(self, kc):
        self.kc = kc
        self.dir = os.path.join(kc.env["NODE_DIR"], "go-host", "vgpu")
        self.library = kc.library("libkai_fake_vgpu.so")
        self.api = migration.Api(kc.pki, kc.env["API_PORT"])
        self.names = []  # the GPU-sharing pods admitted so far
        self.values = None

    def build_images(self):
        """kai.test/go-standin and kai.test/go-certgen-standin: the Debian
        layer of node/images.sh plus kai-webhook and the stand-in library, as
        OCI archives imported into the node's containerd."""
        images_dir = run("bash", os.path.join(KIND_TESTS, "node", "images.sh"), timeout=900).stdout.strip().splitlines()[-1]
        work = tempfile.mkdtemp(prefix="go-standin.", dir=self.kc.work)
        with tarfile.open(os.path.join(images_dir, "debian.oci.tar")) as oci:
            index = json.load(oci.extractfile("index.json"))
            digest = index["manifests"][0]["digest"].split(":", 1)[1]
            manifest = json.load(oci.extractfile(f"blobs/sha256/{digest}"))
            layer = manifest["layers"][0]["digest"].split(":", 1)[1]
            with open(os.path.join(work, "debian.tar"), "wb") as f:
                shutil.copyfileobj(oci.extractfile(f"blobs/sha256/{layer}"), f)
        script = os.path.join(work, "go-webhook")
        with open(script, "w") as f:
            f.write(GO_WEBHOOK)
        os.chmod(script, 0o755)
        layer_tar = os.path.join(work, "layer.tar")
        with tarfile.open(os.path.join(work, "debian.tar")) as base, tarfile.open(layer_tar, "w") as out:
            for m in base.getmembers():
                out.addfile(m, base.extractfile(m) if m.isfile() else None)
            for src, dst, mode in ((os.path.join(self.kc.target, "kai-webhook"), "usr/local/bin/kai-webhook", 0o755),
                                   (script, "go-webhook", 0o755),
                                   (self.library, "artifacts/libvgpu.so", 0o644)):
                info = out.gettarinfo(src, dst)
                info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime = mode, 0, 0, "", "", 0
                with open(src, "rb") as f:
                    out.addfile(info, f)
        oci_image = os.path.join(KIND_TESTS, "node", "oci_image.py")
        for name, entry in ((GO_IMAGE, ["/go-webhook"]), (CERTGEN_IMAGE, ["/bin/sh", "-c", "sleep 4", "certgen"])):
            archive = os.path.join(work, name.split("/")[1].replace(":", "_") + ".oci.tar")
            run("python3", oci_image, name, layer_tar, archive, "--entrypoint", *entry)
            self.kc.node.ctr("images", "import", archive)
        shutil.rmtree(work)

    def go_values(self):
        """The user's Go values file: the Go chart's defaults and the node's
        stand-ins (the class's docstring)."""
        with open(migration.GO_VALUES) as f:
            values = json.loads(json.dumps(yaml.safe_load(f)))
        reg, rest = GO_IMAGE.split("/", 1)
        repo, tag = rest.split(":")
        values["image"].update(registry=reg, repository=repo, tag=tag, pullPolicy="Never")
        creg, crest = CERTGEN_IMAGE.split("/", 1)
        crepo, ctag = crest.split(":")
        values["tls"]["patch"]["imageNew"].update(registry=creg, repository=crepo, tag=ctag, pullPolicy="Never")
        values["paths"]["containerVgpuMount"] = self.dir
        values["librarySync"]["nodeSelector"] = {"kai-test.io/go-libsync": "off"}
        path = os.path.join(self.kc.work, "go-values.yaml")
        with open(path, "w") as f:
            json.dump(values, f)
        return path

    def ours(self):
        repo, tag = self.kc.kai_image.rsplit(":", 1)
        return ["--set", "image.registry=", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                "--set", "image.pullPolicy=Never", "--set", "paths.hostInstallBase=",
                "--set", "libraryDelivery=hostPath", "--set", "librarySync.nodeSelector=null"]

    def webhook_pods(self):
        return [p for p in self.kc.kjson("get", "pod", "-n", migration.NS)["items"]
                if any(c["name"] == "webhook" for c in p["spec"]["containers"])]

    def rolled_out(self, kind):
        """The webhook Deployment's rollout done on the real node: only pods
        of `kind` (go / ours), all Ready, every endpoint of the Service
        theirs."""
        kc, full, ns = self.kc, migration.FULL, migration.NS
        d = kc.kjson("get", "deployment", f"{full}-webhook", "-n", ns)
        st, want = d.get("status", {}), d["spec"]["replicas"]
        if not (st.get("observedGeneration") == d["metadata"]["generation"] and st.get("updatedReplicas") == want
                and st.get("replicas") == want and st.get("availableReplicas") == want):
            return False
        pods = self.webhook_pods()
        image = GO_IMAGE if kind == "go" else kc.kai_image
        if len(pods) != want or any(c["image"] != image for p in pods for c in p["spec"]["containers"]):
            return False
        ips = {p["status"].get("podIP") for p in pods}
        slices = kc.kjson("get", "endpointslice", "-n", ns, "-l", f"kubernetes.io/service-name={full}-webhook")["items"]
        ready = {e["addresses"][0] for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")}
        return ready == ips

    def admitted(self, name, delivery="hostPath"):
        """A GPU-sharing pod really created: patched `delivery` at the Go
        directory, Running, the preload naming the library and the library
        in its PID 1's maps."""
        p = migration.gpu_pod(name)
        p["spec"]["containers"][0].update(image=IMAGE, imagePullPolicy="Never", command=["sh", "-c", "exec sleep infinity"])
        p["spec"]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000}
        p["metadata"]["namespace"] = MIG_TENANT
        got = json.loads(self.kc.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(p)).stdout)
        self.names.append(name)
        problems = shapes.injected(got, "main", self.dir, delivery)
        assert not problems, problems
        self.kc.running(name, MIG_TENANT)
        self.library_loaded(name)
        return got

    def library_loaded(self, name):
        lib = f"{self.dir}/libvgpu.so"
        out = self.kc.exec_(name, f"cat /etc/ld.so.preload; grep -c '{lib}' /proc/1/maps", MIG_TENANT).stdout.split()
        assert out[0] == lib and int(out[-1]) > 0, f"{name}: preload {out[:1]}, library mapped {out[-1:]}"

    def still_running(self):
        for name in self.names:
            p = self.kc.kjson("get", "pod", name, "-n", MIG_TENANT)
            assert p["status"].get("phase") == "Running", f"{name}: {p['status'].get('phase')}"
            assert sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", [])) == 0, \
                f"{name} restarted"
            self.library_loaded(name)

    def change(self, name, kind, *helm_args):
        """helm_args while GPU-sharing pods are admitted (dry run) through
        the real Service, until the rollout to `kind` is done: none refused,
        none let through unpatched."""
        prober = migration.Prober(self.api, namespaces=(MIG_TENANT,), mount=self.dir)
        prober.start()
        try:
            r = self.kc.helm(*helm_args, check=False)
            assert r.returncode == 0, r.stderr[-1500:]
            self.kc.eventually(f"{name}: the webhook's rollout on the node", lambda: self.rolled_out(kind), timeout=180,
                               show=lambda: [(p["metadata"]["name"], p["status"].get("phase")) for p in self.webhook_pods()])
            # Counted, not timed: a few probes after the rollout (the state
            # it left), and at least all_patched's 10 in all however fast
            # the rollout went.
            after = len(prober.seen) + 3
            self.kc.eventually(f"{name}: probes after the rollout", lambda: len(prober.seen) >= max(after, 10),
                               timeout=60)
        finally:
            seen = prober.stop()
        migration.all_patched(name, seen)

    def libsync_ready(self):
        pods = [p for p in self.kc.kjson("get", "pod", "-n", migration.NS)["items"]
                if any(c["name"] == "libsync" for c in p["spec"]["containers"]) and not p["metadata"].get("deletionTimestamp")]
        return pods and all(any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                            for p in pods) and all(c["image"] == self.kc.kai_image for p in pods for c in p["spec"]["containers"])


class TestMigration:
    """The Go release installed, upgraded to this chart, rolled back and
    upgraded again, in this order, on one `mig` (its release, pods, label
    and host directory gone when the class is done). Runs before `release`
    (this chart's own release would take the node's GPU label for libsync)."""

    @pytest.fixture(scope="class")
    @classmethod
    def mig(cls, kc):
        if not os.path.isfile(os.path.join(migration.GO_CHART, "Chart.yaml")):
            pytest.fail(f"the Go chart is not at {migration.GO_CHART} (../shared/go-chart-1.1.0 beside the checkout, or KAI_GO_CHART)")
        m = Migration(kc)
        try:
            yield m
        finally:
            kc.processes.stop("certgen-sim")
            for name in m.names:
                kc.kubectl("delete", "pod", name, "-n", MIG_TENANT, "--wait=false", check=False)
            kc.helm("uninstall", migration.RELEASE, "-n", migration.NS, "--wait", "--timeout", "120s", check=False)
            kc.kubectl("delete", "secret", migration.CERTGEN_SECRET, "-n", migration.NS, "--ignore-not-found", check=False)
            kc.kubectl("label", "node", kc.name, f"{GPU_LABEL}-", check=False)
            for ns in (MIG_TENANT, migration.NS):
                kc.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)
            shutil.rmtree(os.path.dirname(m.dir), ignore_errors=True)

    @pytest.fixture(scope="class")
    @classmethod
    def go(cls, kc, mig):
        """The Go release, its webhook pod Ready, a pod it admitted running."""
        mig.build_images()
        # What the Go chart's libsync would have put there.
        os.makedirs(os.path.join(mig.dir, "containers"), exist_ok=True)
        os.chmod(os.path.join(mig.dir, "containers"), 0o1777)
        shutil.copy(mig.library, os.path.join(mig.dir, "libvgpu.so"))
        with open(os.path.join(mig.dir, "ld.so.preload"), "w") as f:
            f.write(f"{mig.dir}/libvgpu.so\n")
        mig.values = mig.go_values()
        kc.new_namespace(MIG_TENANT)
        kc.kubectl("create", "namespace", migration.NS, check=False)
        kc.processes.start("certgen-sim", ["bash", os.path.join(migration.GO_CHART_DIR, "certgen-sim.sh")],
                           env={**os.environ, "KUBECONFIG": kc.admin, "KUBECTL": os.path.join(kc.bin, "kubectl"),
                                "PKI_DIR": os.path.join(kc.work, "certgen")})
        # This chart's libsync lands on GPU nodes: labelled as the GPU operator would.
        kc.kubectl("label", "node", kc.name, f"{GPU_LABEL}=true", "--overwrite")
        r = kc.helm("install", migration.RELEASE, migration.GO_CHART, "-n", migration.NS, "-f", mig.values, check=False)
        assert r.returncode == 0, r.stderr[-1500:]
        kc.eventually("the Go webhook's pod Ready and the only endpoint", lambda: mig.rolled_out("go"), timeout=180)
        mig.admitted("go-admitted")
        return mig

    @pytest.fixture(scope="class")
    @classmethod
    def upgraded(cls, kc, go):
        """helm upgrade -f <Go values> to this chart, twice, the pods
        running through it."""
        mig = go
        mig.change("helm upgrade -f <Go values>", "ours", "upgrade", migration.RELEASE, CHART, "-n", migration.NS,
                   "-f", mig.values, *mig.ours())
        mig.still_running()
        mig.admitted("ours-admitted")
        ls = kc.kjson("get", "daemonset", f"{migration.FULL}-libsync", "-n", migration.NS)
        assert ls["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "kai-libsync"
        kc.eventually("this chart's libsync Ready on the node", mig.libsync_ready, timeout=120)
        mig.change("helm upgrade -f <Go values> (again)", "ours", "upgrade", migration.RELEASE, CHART, "-n",
                   migration.NS, "-f", mig.values, *mig.ours())
        mig.still_running()
        return mig

    @named("node migration: the Go chart installed (stand-in images, certgen-sim.sh): its webhook pod Ready on "
           "the node, a GPU-sharing pod it admits runs with the library preloaded (hostPath)")
    def test_go_installed(self, check, go):
        pass

    @named("node migration: helm upgrade -f <Go values> to this chart: the real rollout replaces the Go "
           "webhook pod with no GPU-sharing pod refused or let through; the pod the Go webhook admitted "
           "keeps running with its library, 0 restarts; a new one runs preloaded; our libsync Ready under "
           "the Go selector")
    def test_upgraded(self, check, upgraded):
        pass

    @named("node migration: helm rollback to the Go revision: the Go webhook pod back, no gap; every pod keeps "
           "running with its library; a new one is admitted by the Go webhook and runs preloaded")
    def test_rolled_back(self, check, kc, upgraded):
        mig = upgraded
        mig.change("helm rollback", "go", "rollback", migration.RELEASE, migration.go_revision(kc.helm), "-n",
                   migration.NS)
        mig.still_running()
        mig.admitted("go-again")

    @named("node migration: helm upgrade --reuse-values again: no gap, the pods keep running, a new one runs preloaded")
    def test_again(self, check, upgraded):
        mig = upgraded
        mig.change("helm upgrade --reuse-values", "ours", "upgrade", migration.RELEASE, CHART, "-n", migration.NS,
                   "--reuse-values", *mig.ours())
        mig.still_running()
        mig.admitted("ours-again")


# ============================================================================
# release: this chart installed on the node (hostPath delivery)
# ============================================================================

class Release:
    """The release `kai` on the node: its webhook's pod, and libsync's once
    it ran (`libsync`: the hostpath part labels the node for it; the csi
    part alone after its pod waited for it)."""

    def __init__(self, webhook):
        self.webhook, self.libsync = webhook, None

    def start_libsync(self, kc):
        """The chart's libsync DaemonSet, for real: its pod lands on the node
        once the node carries a GPU label (as the GPU operator labels it),
        runs the project's image (node/kai_image.sh: /artifacts/libvgpu.so is
        the stand-in) with the chart's args, the preload ConfigMap and the
        hostPath host directory, and is Ready after its first full sync. The
        node agent's DaemonSet, placed by the same label, starts with it."""
        kc.kubectl("label", "node", kc.name, "nvidia.com/gpu.present=true", "=".join(LIBSYNC_HOLD), "--overwrite")
        self.libsync = kc.release_pod("libsync", "the libsync DaemonSet's pod Ready on the node (first full sync)")[
            "metadata"]["name"]
        return self.libsync


@pytest.fixture(scope="module")
def release(kc, request):
    """helm install with libraryDelivery=hostPath, the host directory under
    NODE_DIR, the image node.sh imported and the stand-in NVML; the
    webhook's pod Ready and called by the API server through the chart's
    Service. When a test of the module failed, the release pods' last log
    lines at the end (test_uninstall prints them before it uninstalls)."""
    repo, tag = kc.kai_image.rsplit(":", 1)
    kc.fake_nvml({})
    r = kc.helm("install", RELEASE, CHART, "-n", NS, "--create-namespace",
                "--set", "libraryDelivery=hostPath", "--set", f"paths.hostInstallBase={kc.env['HOST_BASE']}",
                # The project's image, imported by node.sh (node/kai_image.sh):
                # libsync's and the agent's DaemonSets and the aggregator run it.
                "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
                "--set", f"monitor.nvml.hostLibraryDir={kc.nvml_dir}", "--set", "monitor.nvml.library=libkai_fake_nvml.so",
                "--set", "monitor.agent.extraEnv[0].name=FAKE_NVML_CONFIG",
                "--set", f"monitor.agent.extraEnv[0].value={NVML_IN_POD}/nvml.json",
                # Short, so no_region shows within the test; long enough that a
                # pod's region is written (region, evicted) first.
                "--set", "monitor.isolation.noRegionGraceSeconds=10",
                check=False)
    assert r.returncode == 0, r.stderr[-800:]
    kc.new_namespace(TENANT)
    kc.new_namespace(OPT_OUT_NS, "kai-resource-isolator.io/allow-opt-out=true")
    kc.new_namespace(IGNORED_NS, "kai-resource-isolator.io/webhook=ignore")
    rel = Release(kc.release_pod("webhook", "the webhook's pod Ready"))

    def mutated():
        p = gpu_pod("probe")
        p["metadata"]["namespace"] = TENANT
        out = json.loads(kc.kubectl("create", "-f", "-", "--dry-run=server", "-o", "json", input=json.dumps(p)).stdout)
        kc.pod_checks("injected", out, delivery="hostPath")
        return True
    kc.eventually("a gpu-memory pod is mutated (server-side dry run) through the chart's webhook configuration",
                  mutated, timeout=60)
    try:
        yield rel
    finally:
        if kc.failed(request):
            kc.release_logs(request)


@named("helm install (libraryDelivery=hostPath, host directory under the test's temp dir); "
       "the webhook's Deployment pod Ready, called by the API server through the chart's Service: "
       "a gpu-memory pod is mutated")
def test_install(check, release):
    pass


# ============================================================================
# hostpath: libsync, the preload, the agent and the aggregator as real pods
# ============================================================================

class Agent:
    """The node agent's pod (the chart's DaemonSet) and the gpu pod's
    process it watches."""

    def __init__(self, kc, pod, gpu_pid):
        self.kc, self.pod, self.gpu_pid = kc, pod, gpu_pid

    def grpc(self, method, body):
        """grpcurl to the agent pod's gRPC port (its pod IP, through the pod
        bridge), with the aggregator's client certificate when TLS is on."""
        tls = self.kc.grpc_tls_files("aggregator")
        assert tls, "no aggregator gRPC certificate: the chart's grpcTls is on by default"
        flags = ["-cacert", os.path.join(tls, "ca.crt"), "-cert", os.path.join(tls, "tls.crt"),
                 "-key", os.path.join(tls, "tls.key"), "-servername", "kai-node-agent"]
        r = run(os.environ.get("GRPCURL", "grpcurl"), *flags, "-d", json.dumps(body),
                f"{self.pod['status']['podIP']}:50051", f"vgpu.v1.VgpuNode/{method}")
        return json.loads(r.stdout)

    def log(self):
        return self.kc.pod_log(self.pod["metadata"]["name"], "agent")


def host_preload(kc):
    return os.path.join(kc.host_vgpu, "ld.so.preload")


class TestHostPath:
    """libraryDelivery=hostPath on the real node, in this order: a pod
    before libsync ran, libsync, a pod after it, the agent and the
    aggregator, enforce=evict, pods left alone."""

    @pytest.fixture(scope="class")
    @classmethod
    def early(cls, kc, release):
        """A GPU-sharing pod on a node where libsync has not run yet."""
        assert not os.path.exists(kc.host_vgpu) or not os.listdir(kc.host_vgpu), os.listdir(kc.host_vgpu)
        kc.running(kc.create(gpu_pod("early"))["metadata"]["name"])
        p = host_preload(kc)
        assert os.path.isdir(p) and not os.listdir(p), \
            f"kubelet made {p} an empty directory for the subPath mount: {os.path.exists(p) and os.stat(p)}"
        inside = kc.exec_("early", "if [ -d /etc/ld.so.preload ]; then echo dir; else echo not-dir; fi; "
                                   "grep -c libvgpu.so /proc/1/maps || true").stdout.split()
        assert inside == ["dir", "0"], f"inside: /etc/ld.so.preload and libvgpu.so maps lines: {inside}"

    @pytest.fixture(scope="class")
    @classmethod
    def libsync(cls, kc, release):
        """libsync's pod Ready on the node (the node labelled a GPU node)."""
        return release.start_libsync(kc)

    @pytest.fixture(scope="class")
    @classmethod
    def installed(cls, kc, early, libsync):
        """libsync replaced the directory the kubelet made with the file
        naming libvgpu.so, installed the library and containers/."""
        p = host_preload(kc)
        assert os.path.isfile(p), f"{p}: not a file after libsync's first sync"
        with open(p) as f:
            assert f.read().strip() == LIB, f"{p} names {open(p).read()!r}, want {LIB}"
        with open(os.path.join(kc.host_vgpu, "libvgpu.so"), "rb") as a, \
                open(kc.library("libkai_fake_vgpu.so"), "rb") as b:
            assert a.read() == b.read(), "the host's libvgpu.so is not the library of the source directory"
        mode = stat.S_IMODE(os.stat(os.path.join(kc.host_vgpu, "containers")).st_mode)
        assert mode == 0o1777, f"containers/ mode {oct(mode)}, want 0o1777"
        log = kc.kubectl("logs", libsync, "-n", NS, "-c", "libsync", check=False).stdout
        assert "removed an empty directory where a file belongs" in log, log[-1500:]
        p = kc.kjson("get", "pod", libsync, "-n", NS)
        assert [c["image"] for c in p["spec"]["containers"]] == [kc.kai_image], p["spec"]["containers"]
        assert restarts(p) == 0, p["status"].get("containerStatuses")

    @named("before libsync ran: the gpu-memory pod runs, kubelet made <host>/ld.so.preload an empty directory, "
           "inside /etc/ld.so.preload is a directory and libvgpu.so is not loaded")
    def test_before_libsync(self, check, early):
        pass

    @named("libsync, the chart's DaemonSet pod (the project's image, scheduled once the node is labelled "
           "a GPU node), replaces that directory with the file naming libvgpu.so, installs the library "
           "and a 1777 containers/, 0 restarts")
    def test_libsync_installs(self, check, installed):
        pass

    @named("the pod started before libsync, restarted, has libvgpu.so in /proc/1/maps")
    def test_recovers(self, check, kc, installed):
        """Documented (docs/node-agent.md): the pod started before libsync
        runs without libvgpu until restarted; restarted, it has it."""
        kc.delete_pod("early")
        kc.running(kc.create(gpu_pod("early"))["metadata"]["name"])
        maps = kc.exec_("early", "cat /proc/1/maps").stdout
        assert LIB in maps, "libvgpu.so not in the restarted pod's /proc/1/maps"
        assert kc.logs("early").startswith("region-dir made "), kc.logs("early")

    @pytest.fixture(scope="class")
    @classmethod
    def gpu(cls, kc, libsync):
        """Pod gpu, running, mutated with the hostPath delivery."""
        p = kc.running(kc.create(gpu_pod("gpu"))["metadata"]["name"])
        kc.pod_checks("injected", p, delivery="hostPath")
        return p

    @named("a gpu-memory pod in a dynamic Debian image as uid 1000 runs, mutated with the hostPath delivery")
    def test_gpu_pod_runs(self, check, gpu):
        pass

    @named(f"inside, /etc/ld.so.preload names {LIB}")
    def test_preload_inside(self, check, kc, gpu):
        out = kc.exec_("gpu", "cat /etc/ld.so.preload").stdout.strip()
        assert out == LIB, f"/etc/ld.so.preload inside holds {out!r}, want {LIB}"

    @named("libvgpu.so (the stand-in) is in /proc/1/maps and in a fresh process's maps")
    def test_library_mapped(self, check, kc, gpu):
        maps = kc.exec_("gpu", "cat /proc/1/maps").stdout
        lines = [ln for ln in maps.splitlines() if ln.endswith(LIB)]
        assert lines, "libvgpu.so is not in PID 1's maps:\n" + maps[-1500:]
        # A fresh process too (ld.so reads the preload at every exec).
        assert LIB in kc.exec_("gpu", "cat /proc/self/maps").stdout

    @named(f"{MOUNT} and /etc/ld.so.preload are read-only mounts (a write fails: Read-only file system); "
           f"{MOUNT}/containers and /tmp/vgpulock are writable")
    def test_mount_read_only(self, check, kc, gpu):
        m = kc.mountinfo("gpu")
        for path in (MOUNT, "/etc/ld.so.preload"):
            assert path in m and "ro" in m[path], f"{path}: mount options {m.get(path)}"
        for path in (f"{MOUNT}/containers", "/tmp/vgpulock"):
            assert path in m and "rw" in m[path], f"{path}: mount options {m.get(path)}"
        r = kc.exec_("gpu", f"touch {MOUNT}/probe", check=False)
        assert r.returncode != 0 and "Read-only file system" in r.stderr, (r.returncode, r.stderr)
        r = kc.exec_("gpu", "touch /tmp/vgpulock/probe-$$ && echo ok", check=False)
        assert r.stdout.strip() == "ok", (r.returncode, r.stderr)

    @pytest.fixture(scope="class")
    @classmethod
    def region(cls, kc, gpu):
        """Pod gpu's region directory, made by its process; then its region
        as libvgpu would write it and the stand-in NVML seeing its process:
        the host PID."""
        uid = gpu["metadata"]["uid"]
        line = kc.eventually("the container's log line", lambda: kc.logs("gpu").strip(), timeout=30)
        want = f"region-dir made {MOUNT}/containers/{uid}_main"
        assert line == want, f"container log {line!r}, want {want!r}"
        host = os.path.join(kc.host_vgpu, "containers", f"{uid}_main")
        st = os.stat(host)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (1000, 1000), \
            f"{host}: uid {st.st_uid} gid {st.st_gid} mode {oct(st.st_mode)}"
        # Now the region libvgpu would write at cuInit, and the stand-in NVML
        # seeing the container's process: the agent (Ready or not yet) must
        # not find the pod without a region past the grace.
        pid = kc.host_pid(gpu)
        kc.fake_nvml({pid: 512 << 20})
        kc.write_region(gpu, pid, 1024, 512)
        return pid

    @named("the container's process (uid 1000) made <mount>/containers/<podUID>_main from the injected env; "
           "the node sees it owned 1000:1000")
    def test_region_dir(self, check, region):
        pass

    @pytest.fixture(scope="class")
    @classmethod
    def agent(cls, kc, gpu, region):
        """The chart's node DaemonSet, for real: its agent container reads
        the host's /proc (the kubelet's cgroupfs v1 path
        /kubepods/<qos>/pod<uid>/<id> names a process's pod) and the stand-in
        NVML, which reports the gpu container's real host PID on one GPU."""
        p = kc.release_pod("node-agent", "the node agent's DaemonSet pod Ready on the node (pod watch synced)")
        agent = Agent(kc, p, region)
        c = [x for x in p["spec"]["containers"] if x["name"] == "agent"][0]
        assert c["image"] == kc.kai_image and f"--nvml-library={NVML_IN_POD}/libkai_fake_nvml.so" in c["args"], c
        # A static binary (the pause image's /pause) never reads
        # /etc/ld.so.preload: injected, it runs without libvgpu and no region.
        static = gpu_pod("static-bin")
        static["spec"]["containers"][0].update(image="kai.test/pause:1", command=["/pause"])
        kc.create(static)
        kc.running("static-bin")
        g = kc.kjson("get", "pod", "gpu", "-n", TENANT)
        with open(f"/proc/{region}/cgroup") as f:
            cg = f.read()
        assert f"pod{g['metadata']['uid']}" in cg, f"/proc/{region}/cgroup names no pod{g['metadata']['uid']}:\n{cg}"

        def listed():
            return [x for x in agent.grpc("ListContainers", {"namespace": TENANT}).get("containers", [])
                    if x.get("pod") == "gpu"]
        got = kc.eventually("the agent pod lists pod gpu over gRPC", listed, timeout=60, show=agent.log)
        assert got[0]["isolationState"] == "ISOLATION_STATE_CAPPED", got
        # docs/isolation.md: no_region, "a static or musl binary".
        kc.eventually("a GpuRegionMissing Event on the static pod (no_region)",
                      lambda: kc.region_events("static-bin", "GpuRegionMissing"), timeout=60, show=agent.log)
        assert not kc.region_events("gpu", "GpuRegionMissing"), kc.region_events("gpu", "GpuRegionMissing")
        kc.delete_pod("static-bin")
        p = kc.kjson("get", "pod", p["metadata"]["name"], "-n", NS)
        assert restarts(p) == 0, p["status"].get("containerStatuses")
        return agent

    @named("the node agent, the chart's DaemonSet pod (the project's image, the host's /proc, the stand-in "
           "NVML through monitor.nvml.hostLibraryDir naming the container's host PID, whose cgroup is the "
           "kubelet's cgroupfs v1 pod<uid> path), serves the pod's region over gRPC at its pod IP, named "
           "from the API server through the kubernetes Service, capped; an injected pod of a static "
           "binary (the pause image) gets a GpuRegionMissing Event (no_region), the gpu pod none; "
           "0 restarts")
    def test_agent_sees_pod(self, check, agent):
        pass

    @named("the aggregator, the chart's Deployment pod, subscribes to the agent pod over mutual TLS and "
           "serves pod gpu's HAMi series with its node label on its Service's :9394 (Prometheus' token; "
           "401 without)")
    def test_aggregator_serves(self, check, kc, agent):
        """The chart's aggregator Deployment, for real: it finds the agent
        pod through the API server, subscribes to it over mutual TLS (pod to
        pod) and serves its series on the Service's :9394 to a token allowed
        `get /metrics` (Prometheus' ServiceAccount)."""
        agg = kc.release_pod("aggregator", "the aggregator's pod Ready")
        svc = kc.kjson("get", "service", f"{FULL}-aggregator", "-n", NS)
        (port,) = [x["port"] for x in svc["spec"]["ports"] if x["name"] == "http-metrics"]
        url = f"http://{svc['spec']['clusterIP']}:{port}/metrics"
        want = 'pod="gpu"'

        def served():
            return {k: v for k, v in kc.series(url, "hami_vgpu_memory_used_bytes").items()
                    if want in k and f'node="{kc.name}"' in k}
        got = kc.eventually(f"the aggregator's Service ({url}) serves pod gpu's series with its node label", served,
                            timeout=60, show=lambda: kc.pod_log(agg["metadata"]["name"], "aggregator"))
        assert list(got.values()) == [512 << 20], got
        status, _ = http_get(url)
        assert status == 401, f"the aggregator's /metrics without a token: {status}"

    @pytest.fixture(scope="class")
    @classmethod
    def evicted(cls, kc, agent):
        """--enforce evict (monitor.isolation.enforce): a pod whose region
        says uncapped (limit 0) while NVML sees its process use memory is
        evicted through the Eviction API, and its container really stops;
        the capped pod stays."""
        kc.delete_pod("early")  # no region of its own: no_region would evict it too
        old = agent.pod["metadata"]["name"]
        r = kc.helm("upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", "--set", "monitor.isolation.enforce=evict",
                    check=False)
        assert r.returncode == 0, r.stderr[-800:]
        agent.pod = kc.release_pod("node-agent", "the agent pod of the rolled DaemonSet Ready", other_than=[old])
        (c,) = [x for x in agent.pod["spec"]["containers"] if x["name"] == "agent"]
        assert "--enforce=evict" in c["args"], c["args"]
        greedy = kc.running(kc.create(gpu_pod("greedy"))["metadata"]["name"])
        pid = kc.host_pid(greedy)
        kc.write_region(greedy, pid, 0, 700)
        kc.fake_nvml({agent.gpu_pid: 512 << 20, pid: 700 << 20})

        def gone():
            r = kc.kubectl("get", "pod", "greedy", "-n", TENANT, "-o", "json", check=False)
            return r.returncode != 0 and "NotFound" in r.stderr
        kc.eventually("pod greedy evicted and deleted", gone, timeout=90, show=agent.log)
        # The kubelet stopped its container: the process is gone from the host.
        kc.eventually(f"the greedy container's process (host PID {pid}) gone", lambda: not os.path.exists(f"/proc/{pid}"),
                      timeout=60)
        ev = kc.region_events("greedy", "GpuIsolationEviction")
        assert ev and "uncapped" in ev[0]["message"].lower(), ev
        assert not kc.region_events("gpu", "GpuIsolationEviction"), kc.region_events("gpu", "GpuIsolationEviction")
        evicted = kc.series(f"http://{agent.pod['status']['podIP']}:9394/metrics", "kai_isolator_evictions_total")
        assert evicted.get('kai_isolator_evictions_total{reason="uncapped_no_limit"}') == 1, evicted
        return agent

    @named("helm upgrade monitor.isolation.enforce=evict: the rolled agent evicts an uncapped pod (limit 0, "
           "NVML sees its process use memory) through the Eviction API, its container's process is gone "
           "from the node, a GpuIsolationEviction Event and kai_isolator_evictions_total"
           "{reason=uncapped_no_limit} 1; the capped gpu pod stays")
    def test_enforce_evicts(self, check, evicted):
        pass

    @named("under enforce=evict, a gpu-memory pod that opted out (its namespace allows it) and one in a "
           "namespace labelled webhook=ignore (the agent reads the webhook's configuration) are neither "
           "no_region nor evicted, while an uninjected pod annotated gpu-memory and inject=false after "
           "admission in a namespace that does not allow it is evicted (no_region)")
    def test_opted_out_kept(self, check, kc, evicted):
        """Under --enforce evict, the pods the webhook leaves uninjected by
        the administrator's choice are neither no_region nor evicted
        (evicted, they would come back as they were, over and over): one
        that opted out where its namespace allows it, and one in a namespace
        labelled for the webhook to ignore (the agent reads the chart's
        MutatingWebhookConfiguration and the namespaces' labels: were either
        refused it, that pod would be evicted). The same opt-out request on
        an uninjected pod of a namespace that does not allow it (created
        plain, annotated after admission, as a tenant could) counts for
        nothing: that pod is evicted (no_region), which is also the event
        the others' absence of one is counted against."""
        agent = evicted
        kept = {OPT_OUT_NS: kc.create(pod("opted-out-2", {"gpu-memory": "1024",
                                                         "kai-resource-isolator.io/inject": "false"}), ns=OPT_OUT_NS),
                IGNORED_NS: kc.create(pod("ignored-0", {"gpu-memory": "1024"}), ns=IGNORED_NS)}
        for p in kept.values():
            assert not any(v["name"] == "kai-resource-isolator-vgpu" for v in p["spec"].get("volumes", [])), p["spec"]
        sneaky = kc.create(pod("no-region"))
        assert not any(v["name"] == "kai-resource-isolator-vgpu" for v in sneaky["spec"].get("volumes", [])), \
            sneaky["spec"]
        kc.kubectl("annotate", "pod", "no-region", "-n", TENANT, "gpu-memory=1024",
                   "kai-resource-isolator.io/inject=false")
        for ns, p in kept.items():
            kc.running(p["metadata"]["name"], ns)
        kc.running("no-region")

        def no_region_evicted():
            return kc.region_events("no-region", "GpuIsolationEviction")
        ev = kc.eventually("the uninjected pod that asked to opt out where it may not evicted (no_region past the "
                           "grace)", no_region_evicted, timeout=90, show=agent.log)
        assert "no_region" in ev[0]["message"], ev[0]["message"]
        for ns, p in kept.items():
            name = p["metadata"]["name"]
            for reason in ("GpuRegionMissing", "GpuIsolationEviction"):
                assert not kc.region_events(name, reason, ns), kc.region_events(name, reason, ns)
            p = kc.kjson("get", "pod", name, "-n", ns)
            assert p["status"]["phase"] == "Running" and not p["metadata"].get("deletionTimestamp") \
                and restarts(p) == 0, p["status"]
            kc.delete_pod(name, ns)

    @named("a plain pod and an opted-out pod run untouched: no /etc/ld.so.preload, no libvgpu.so mapped")
    def test_untouched_pods(self, check, kc, release):
        plain = kc.create(pod("plain"))
        out = kc.create(pod("opted-out", {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "false"}),
                        ns=OPT_OUT_NS)
        for name, ns, stored in (("plain", TENANT, plain), ("opted-out", OPT_OUT_NS, out)):
            kc.pod_checks("untouched", stored)
            kc.running(name, ns)
            inside = kc.exec_(name, "if [ -e /etc/ld.so.preload ]; then echo preload; else echo none; fi; "
                                    "grep -c libvgpu.so /proc/1/maps || true", ns).stdout.split()
            assert inside == ["none", "0"], f"{ns}/{name} inside: {inside}"

    @named("the gpu-memory pod is still Running with 0 restarts")
    def test_no_restarts(self, check, kc, gpu):
        p = kc.kjson("get", "pod", "gpu", "-n", TENANT)
        assert p["status"]["phase"] == "Running" and restarts(p) == 0, \
            f"phase {p['status']['phase']}, restarts {restarts(p)}"


# ============================================================================
# csi: kai-csi, a real pod the kubelet calls
# ============================================================================

def restricted_gpu_pod(name):
    p = gpu_pod(name)
    # runAsUser on the pod too: containerd 1.6.20 cannot start a sandbox
    # whose pod names runAsGroup without runAsUser ("failed to generate
    # sanbdox container spec options: failed to generate user string: user
    # group "2000" is specified without user"), the shape test_apiserver.py's
    # restricted pod has (container runAsUser, pod runAsGroup).
    p["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 2000,
                                    "seccompProfile": {"type": "RuntimeDefault"}}
    p["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1000, "allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}
    return p


class TestCsi:
    """helm upgrade to libraryDelivery=csi, then a pod in a restricted
    namespace through kai-csi, in this order. After the hostpath part, on
    the same release (libsync ran); alone, libsync is held back until the
    pod has waited for it."""

    @pytest.fixture(scope="class")
    @classmethod
    def csi_webhook(cls, kc, release):
        """helm upgrade to libraryDelivery=csi; the rolled webhook's pod
        delivers csi, the CSIDriver exists: the node DaemonSet's pods the
        upgrade replaces."""
        registry, name = kc.registrar_image.split("/", 1)
        repo, tag = name.rsplit(":", 1)
        # The pods the upgrade replaces, as the API server has them now.
        old, old_webhook = ([p["metadata"]["name"] for p in kc.kjson("get", "pods", "-n", NS, "-l",
                                                                   f"app.kubernetes.io/component={component}")["items"]]
                            for component in ("node-agent", "webhook"))
        # Without the hostpath part, libsync has not run: a node selector of
        # the test's holds it back (start_libsync labels the node for it)
        # while the node DaemonSet (agent, kai-csi) runs, so the CSI part
        # starts before libsync ran.
        helm_key = "librarySync.nodeSelector." + LIBSYNC_HOLD[0].replace(".", "\\.")  # --set escapes a key's dots
        hold = [] if release.libsync else ["--set-string", f"{helm_key}={LIBSYNC_HOLD[1]}"]
        r = kc.helm("upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", *hold,
                    "--set", "libraryDelivery=csi", "--set", f"csi.kubeletDir={kc.env['KUBELET_ROOT']}",
                    # node/registrar's image (node.sh) in the place of
                    # csi-node-driver-registrar, which is in no registry here.
                    "--set", f"csi.registrar.image.registry={registry}", "--set", f"csi.registrar.image.repository={repo}",
                    "--set", f"csi.registrar.image.tag={tag}", "--set", "csi.registrar.image.pullPolicy=Never",
                    # The hostpath part left it at evict: the pods here write no
                    # region (no_region would evict them).
                    "--set", "monitor.isolation.enforce=none", check=False)
        assert r.returncode == 0, r.stderr[-800:]
        # The Deployment rolls (its env says csi): the hostPath replica must be
        # gone, or it would still answer some reviews.
        release.webhook = kc.release_pod("webhook", "the rolled webhook's pod Ready, the old one gone",
                                         other_than=old_webhook)
        (c,) = [x for x in release.webhook["spec"]["containers"] if x["name"] == "webhook"]
        assert {"name": "LIBRARY_DELIVERY", "value": "csi"} in c["env"], c["env"]
        kc.kjson("get", "csidriver", CSI_DRIVER)
        if not release.libsync:
            kc.kubectl("label", "node", kc.name, "nvidia.com/gpu.present=true", "--overwrite")
        return old

    @pytest.fixture(scope="class")
    @classmethod
    def csi_node(cls, kc, csi_webhook):
        """The node DaemonSet's pod with the chart's csi and csi-registrar
        containers, for real: kai-csi privileged with the kubelet's directory
        mounted Bidirectional, the registrar (node/registrar's image) asks it
        for its name and registers it in the kubelet's plugins_registry; the
        kubelet lists the driver in CSINode and the pod is Ready (the
        registrar's /healthz says the kubelet registered it)."""
        p = kc.release_pod("node-agent", "the node DaemonSet's pod with kai-csi and its registrar Ready",
                           other_than=csi_webhook)
        names = [c["name"] for c in p["spec"]["containers"]]
        assert {"csi", "csi-registrar"} <= set(names), names
        (reg,) = [c for c in p["spec"]["containers"] if c["name"] == "csi-registrar"]
        assert reg["image"] == kc.registrar_image, reg["image"]

        def listed():
            drivers = kc.kjson("get", "csinode", kc.name)["spec"].get("drivers") or []
            return [d for d in drivers if d["name"] == CSI_DRIVER and d["nodeID"] == kc.name]
        kc.eventually(f"the kubelet lists {CSI_DRIVER} in CSINode {kc.name}", listed, timeout=60,
                      show=lambda: kc.pod_log(p["metadata"]["name"], "csi-registrar"))
        assert "kubelet registered" in kc.pod_log(p["metadata"]["name"], "csi-registrar", 100)
        return p

    @pytest.fixture(scope="class")
    @classmethod
    def csi_pod(cls, kc, release, csi_node):
        """Pod gpu-csi in a Pod Security restricted namespace, mutated with
        the csi volume, running; when libsync had not run, it waited for it
        first (docs/isolation.md: before libsync ran, publishing answers
        Unavailable; the kubelet retries and the pod starts once the library
        is there, instead of starting without it)."""
        kc.new_namespace(RESTRICTED, "pod-security.kubernetes.io/enforce=restricted")
        stored = kc.create(restricted_gpu_pod("gpu-csi"), ns=RESTRICTED)
        kc.pod_checks("injected", stored, delivery="csi")
        if not release.libsync:
            def refused():
                ev = kc.kjson("get", "events", "-n", RESTRICTED, "--field-selector", "involvedObject.name=gpu-csi")["items"]
                return [e for e in ev if e["reason"] == "FailedMount" and "is not installed yet" in e["message"]]
            kc.eventually("a FailedMount event: kai-csi answered Unavailable, libvgpu.so not installed yet", refused,
                          timeout=60)
            p = kc.kjson("get", "pod", "gpu-csi", "-n", RESTRICTED)
            assert p["status"].get("phase") == "Pending", p["status"].get("phase")
            print("gpu-csi waited for libsync (FailedMount: not installed yet) and starts once libsync installed "
                  "the library", flush=True)
            release.start_libsync(kc)
        return kc.running("gpu-csi", RESTRICTED)

    @named("helm upgrade to libraryDelivery=csi (csi.kubeletDir = the kubelet's --root-dir): the webhook "
           "restarted from the Deployment delivers csi, the CSIDriver exists")
    def test_csi_registered(self, check, csi_webhook):
        pass

    # The chart registers kai-csi through its csi-registrar sidecar
    # (node-driver-registrar: kai-csi's own registration socket refuses the
    # kubelet's :authority, hyperium/h2#487). That image is in no registry
    # here: node/registrar (Go) does its job with the same flags, in an image
    # of its own (node.sh).
    @named("kai-csi and its csi-registrar sidecar, containers of the node DaemonSet's pod (kai-csi "
           "privileged, the kubelet's directory Bidirectional; node/registrar's image in "
           "node-driver-registrar's place): the kubelet lists the driver in CSINode, the pod "
           "is Ready")
    def test_csi_pod_registered(self, check, csi_node):
        pass

    # node.py named it with "; before libsync ran it waited (FailedMount: not
    # installed yet) and started once libsync installed the library" when the
    # hostpath part had not run; the test makes that check then (csi_pod) and
    # prints it.
    @named("a gpu-memory pod in a Pod Security restricted namespace (uid 1000, gid 2000) is admitted with "
           "the csi volume and runs: the kubelet called kai-csi")
    def test_csi_pod_runs(self, check, csi_pod):
        pass

    @named("inside: the preload names libvgpu.so, it is mapped, the library and preload are read-only; "
           f"{MOUNT}/containers lists only its own directory, owned 1000:2000 on the node")
    def test_csi_inside(self, check, kc, csi_pod):
        ns, uid = RESTRICTED, csi_pod["metadata"]["uid"]
        out = kc.exec_("gpu-csi", "cat /etc/ld.so.preload", ns).stdout.strip()
        assert out == LIB, f"/etc/ld.so.preload inside holds {out!r}"
        assert LIB in kc.exec_("gpu-csi", "cat /proc/1/maps", ns).stdout, "libvgpu.so not in /proc/1/maps"
        m = kc.mountinfo("gpu-csi", ns)
        for path in (MOUNT, "/etc/ld.so.preload"):
            assert path in m and "ro" in m[path], f"{path}: mount options {m.get(path)}"
        r = kc.exec_("gpu-csi", f"touch {MOUNT}/probe", ns, check=False)
        assert r.returncode != 0 and "Read-only file system" in r.stderr, (r.returncode, r.stderr)
        # Its own region directory only, made by the container's process path
        # (mkdir -p finds it there), writable by uid 1000.
        seen = kc.exec_("gpu-csi", f"ls {MOUNT}/containers", ns).stdout.split()
        assert seen == [f"{uid}_main"], f"{MOUNT}/containers inside lists {seen}, want only {uid}_main"
        line = kc.eventually("the container's log line", lambda: kc.logs("gpu-csi", ns).strip(), timeout=30)
        assert line == f"region-dir made {MOUNT}/containers/{uid}_main", line
        host = os.path.join(kc.host_vgpu, "containers", f"{uid}_main")
        st = os.stat(host)
        assert (st.st_uid, st.st_gid) == (1000, 2000), f"{host}: owner {st.st_uid}:{st.st_gid}, want 1000:2000"
        p = kc.kjson("get", "pod", "gpu-csi", "-n", ns)
        assert restarts(p) == 0, restarts(p)

    # Was read-only while the webhook added a `containers` subPath mount (the
    # kubelet's non-recursive bind of the volume's containers/ covered the
    # region directory); fixed in f1f1de5.
    @named(f"the container (uid 1000) writes into its region directory {MOUNT}/containers/<podUID>_main "
           "and the node sees the file")
    def test_csi_region_writable(self, check, kc, csi_pod):
        ns, uid = RESTRICTED, csi_pod["metadata"]["uid"]
        r = kc.exec_("gpu-csi", f"echo usage > {MOUNT}/containers/{uid}_main/probe", ns, check=False)
        if r.returncode != 0:
            inside = [ln for ln in kc.exec_("gpu-csi", "cat /proc/1/mountinfo", ns).stdout.splitlines() if MOUNT in ln]
            node = [ln for ln in open(f"/proc/{kc.env['HOLDER_PID']}/mountinfo").read().splitlines() if uid in ln]
            raise AssertionError(f"the container cannot write into its region directory: {r.stderr.strip()}\n"
                                 "its mounts:\n  " + "\n  ".join(inside) + "\nthe pod's mounts on the node:\n  "
                                 + "\n  ".join(node))
        with open(os.path.join(kc.host_vgpu, "containers", f"{uid}_main", "probe")) as f:
            assert f.read() == "usage\n"

    @named("a pod declaring the csi volume itself (the webhook's volume and mounts, no `containers` subPath, "
           "the webhook skipped): its region directory reaches it through the volume's mount, writable, "
           "only its own")
    def test_csi_without_containers_subpath(self, check, kc, csi_pod):
        """The webhook's csi volume and mounts less the `containers` subPath
        mount (a pod may declare our volume itself): the region directory,
        which kai-csi binds inside the volume, reaches the container through
        the volume's own (recursive) mount at MOUNT, writable."""
        spec = json.loads(json.dumps(csi_pod["spec"]))
        (vol,) = [v for v in spec["volumes"] if v["name"] == "kai-resource-isolator-vgpu"]
        c = spec["containers"][0]
        mounts = [m for m in c["volumeMounts"] if m["name"] == vol["name"] and m.get("subPath") != "containers"]
        p = pod("csi-no-subpath", script="exec sleep infinity")
        p["metadata"]["labels"] = {"kai-resource-isolator.io/webhook": "ignore"}
        p["spec"]["securityContext"] = spec["securityContext"]
        p["spec"]["volumes"] = [vol]
        p["spec"]["containers"][0].update(securityContext=c["securityContext"], volumeMounts=mounts,
                                          env=[{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}])
        uid = kc.create(p, ns=RESTRICTED)["metadata"]["uid"]
        kc.running("csi-no-subpath", RESTRICTED)
        r = kc.exec_("csi-no-subpath", f"echo usage > {MOUNT}/containers/${{POD_UID}}_main/probe && ls {MOUNT}/containers",
                     RESTRICTED, check=False)
        assert r.returncode == 0 and r.stdout.split() == [f"{uid}_main"], (r.returncode, r.stdout, r.stderr)
        with open(os.path.join(kc.host_vgpu, "containers", f"{uid}_main", "probe")) as f:
            assert f.read() == "usage\n"


# ============================================================================
# uninstall: last
# ============================================================================

@named("all pods deleted and helm uninstall: no pod left on the node, the kubelet removed their directories")
def test_uninstall(check, kc, release, request):
    if kc.failed(request):
        kc.release_logs(request)
    for ns in (TENANT, OPT_OUT_NS, RESTRICTED):
        kc.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=90s", check=False)
    pods_dir = os.path.join(kc.env["KUBELET_ROOT"], "pods")

    def leftover_dirs():
        """Pod directories of pods no longer in the API: the kubelet still
        has to unpublish their volumes (kai-csi's among them)."""
        live = {p["metadata"]["uid"] for p in kc.kjson("get", "pods", "-A", "--field-selector",
                                                          f"spec.nodeName={kc.name}")["items"]}
        return sorted(set(os.listdir(pods_dir)) - live)
    # The kubelet unpublishes a deleted pod's CSI volume after the pod has
    # gone from the API; uninstalling before that leaves the volume mounted
    # on the node (no plugin to call), so the tenants' pod directories must
    # go first (chart README, "Going back to hostPath (or uninstalling)").
    kc.eventually("the kubelet unmounted the deleted pods' volumes and removed their directories",
                  lambda: not leftover_dirs(), timeout=60, show=leftover_dirs)
    r = kc.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "90s", check=False)
    assert r.returncode == 0, r.stderr[-600:]

    # The release's own pods (libsync's DaemonSet) go through the garbage
    # collector once their DaemonSet is deleted, after helm returned.
    def left():
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                for p in kc.kjson("get", "pods", "-A", "--field-selector", f"spec.nodeName={kc.name}")["items"]]
    kc.eventually("no pod left on the node", lambda: not left(), timeout=90, show=left)
    # Nothing of a pod left mounted or running on the node: the kubelet
    # removed every pod directory.
    kc.eventually("the kubelet removed the pods' directories", lambda: not os.listdir(pods_dir), timeout=60,
                  show=lambda: os.listdir(pods_dir))
