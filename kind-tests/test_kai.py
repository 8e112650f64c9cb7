"""KAI-Scheduler in the loop (issue 39, steps 2-3), on node.sh's real node.

The module brings up node.sh's control plane and real kubelet node
(`node.sh --up`), installs what kind-tests/kai/build.sh built as a cluster
administrator would, from their own charts (kind-tests/kai/README.md):

  1. fake-gpu-operator 0.2.0 (KAI's hack/fake-gpu-operator-values.yaml +
     ours: two fake 11441 MiB GPUs, the node in its pool);
  2. KAI-Scheduler v0.17.0 (global.gpuSharing, binder.plugins.hamicore);
  3. this project's chart as release `kai-resource-isolator` (so its
     MutatingWebhookConfiguration is `kai-resource-isolator-mutating`, the
     name KAI's hamicore suite looks for) with a user's defaults: csi
     delivery, failurePolicy "" = Fail (fail closed). Only what this node
     forces is set: the image node.sh imported, the host directory and the
     kubelet's root under NODE_DIR, node/registrar's image, the stand-in NVML.

and then runs KAI's own e2e binaries, unmodified, against it: the
allocate/resources GPU specs (whole, fraction and gpu-memory; without our
chart first, as the baseline, then with it) and the hamicore specs: "gpu-memory:
CUDA_DEVICE_MEMORY_LIMIT is injected and bounded" must pass; the two that
read nvidia-smi must fail exactly there on the fake GPU (pass on a GPU node,
KAI_E2E_REAL_GPU=1). Each test reads the binary's JUnit report: a spec passes
only when Ginkgo says `passed` (a skipped spec fails here).

  pytest -c kind-tests/pytest.ini -m kai        # root; about 6 min warm

Output (node.sh's log, the suites' output and JUnit reports) goes to
$KAI_E2E_OUT, else target/kai-e2e. The built binaries are $KAI_TARGET's,
else target/debug's (built when missing).
"""
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET

import pytest

from kaitest import node as kainode
from kaitest.chart import CHART
from kaitest.poll import poll

pytestmark = pytest.mark.kai
OUT = ("KAI_E2E_OUT", "kai-e2e")  # out_dir (conftest.py): $KAI_E2E_OUT, else target/kai-e2e

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_SH = os.path.join(HERE, "kai", "build.sh")
RELEASE = NS = "kai-resource-isolator"
WEBHOOK_CONFIG = f"{RELEASE}-mutating"  # what KAI's hamicore suite looks for
KAI_NS = "kai-scheduler"  # the e2e suites' fixed system namespace (testconfig.go)
GPU_MEMORY_MIB = 11441  # each of kai/fake-gpu-operator-values.yaml's GPUs = the node label
GPUS = 2  # kai/fake-gpu-operator-values.yaml's devices
KAI_DEPLOYMENTS = ("binder", "admission", "kai-scheduler-default", "pod-grouper", "podgroup-controller",
                   "queue-controller")
# The images a default install pulls (kind-tests/kai/README.md); the rest of
# build.sh's (nodescaleadjuster, scalingpod, numa-placement-exporter,
# mig-faker) only run with values this install does not set.
KAI_IMAGES = ("operator", "crd-upgrader", "scheduler", "binder", "admission", "podgrouper", "podgroupcontroller",
              "queuecontroller", "resourcereservation")
FGO_IMAGES = ("device-plugin", "status-updater", "status-exporter", "topology-server", "kwok-gpu-device-plugin")
# Names the e2e pods' images have (Docker Hub, unreachable): node.sh's Debian
# under both (they need sh, sleep, echo and uid 1000).
TEST_IMAGE_NAMES = ("docker.io/library/ubuntu:latest", "docker.io/nvidia/cuda:12.6.0-base-ubuntu22.04")
NODE_LABELS = (
    # KAI's GPU workers in its kind config (hack/e2e-kind-config.yaml)
    "run.ai/simulated-gpu-node-pool=default", "nvidia.com/gpu.deploy.device-plugin=true",
    f"nvidia.com/gpu.memory={GPU_MEMORY_MIB}",
    # what GPU feature discovery puts on a GPU node: our chart's DaemonSets
    # (libsync, the agent and kai-csi) run on such nodes
    "nvidia.com/gpu.present=true")
FAKE_GPU_UUIDS = ("GPU-11441000-0000-4000-8000-000000000000", "GPU-11441000-0000-4000-8000-000000000001")
FAKE_GPU_UUID = FAKE_GPU_UUIDS[0]  # where a one-GPU pod's region says it runs
# What the stand-in NVML says the GPU holds: not the label, as on a node
# whose administrator set nvidia.com/gpu.memory below NVML's total. KAI's
# binder reads only the label; the agent's grant must be KAI's.
NVML_TOTAL_MIB = 12288


def fake_nvml(node, processes):
    """The stand-in NVML the agent pod loads: the fake GPUs, NVML_TOTAL_MIB
    each, the first running `processes` ({host PID: MiB}). Its directory."""
    d = os.path.join(node.dir, "kai-nvml")
    kainode.fake_nvml(d, os.path.join(node.target, "libkai_fake_nvml.so"),
                      [{"uuid": uuid, "name": "Tesla-K80", "total": NVML_TOTAL_MIB << 20,
                        "processes": {pid: mib << 20 for pid, mib in processes.items()} if i == 0 else {}}
                       for i, uuid in enumerate(FAKE_GPU_UUIDS)])
    return d


def wait(what, fn, timeout=300, show=None):
    return poll(what, fn, timeout, (subprocess.CalledProcessError, AssertionError, KeyError, ValueError, IndexError),
                show=show)


def junit_specs(path):
    """{spec name: (status, message)} of a Ginkgo JUnit report's specs."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = tc.get("name", "")
        if name.startswith("[It]"):
            why = "".join((e.get("message") or "") + (e.text or "")[:1500]
                          for e in tc if e.tag in ("failure", "error", "skipped"))
            out[name] = (tc.get("status"), why)
    return out


def injected_pods(node):
    """{(namespace, pod)} our webhook reports `injected` in its review log
    lines (JSON) for the e2e suites' namespaces (kai-<queue>)."""
    out = set()
    logs = node.kubectl("logs", f"deployment/{RELEASE}-webhook", "-n", NS, "--tail=-1").stdout
    for line in logs.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        f = {**rec, **rec.get("fields", {})}
        if f.get("decision") == "injected" and f.get("namespace", "").startswith("kai-") \
                and f["namespace"] not in (KAI_NS, "kai-resource-reservation", NS):
            out.add((f["namespace"], f.get("pod")))
    return out


def run_suite(node, binary, name, focus):
    """KAI's e2e test binary, unmodified, against the node's cluster (the
    admin kubeconfig); its output and JUnit report in the output dir."""
    report = os.path.join(node.out, f"{name}.xml")
    log = os.path.join(node.out, f"{name}.log")
    with open(log, "w") as f:
        r = subprocess.run([binary, "--ginkgo.focus", focus, "--ginkgo.trace", "--ginkgo.v",
                            "--ginkgo.junit-report", report], cwd=node.out, stdout=f, stderr=subprocess.STDOUT,
                           env=dict(os.environ, KUBECONFIG=node.admin), timeout=1800)
    text = open(log, errors="replace").read()
    assert os.path.exists(report), f"{name}: no JUnit report (rc {r.returncode}):\n{text[-3000:]}"
    return r.returncode, junit_specs(report), text


# --- the module: node, fake GPU, KAI, this chart -------------------------------

@pytest.fixture(scope="module")
def node(built, out_dir):
    """node.sh --up: the control plane and the real node, taken down at the
    end of the module (node.sh --down)."""
    with kainode.up(built(kainode.PACKAGES, kainode.FILES), out_dir) as n:
        yield n


@pytest.fixture(scope="module")
def kai_build():
    """build.sh's KAI and fake-gpu-operator build directories (cached)."""
    r = subprocess.run(["bash", BUILD_SH], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    kai, fgo = r.stdout.strip().splitlines()[-2:]
    return {"kai": kai, "fgo": fgo, "kai_src": os.path.join(os.path.dirname(kai), "src")}


@pytest.fixture(scope="module")
def kai(node, kai_build):
    """fake-gpu-operator, then KAI-Scheduler, from their charts (README's
    install recipe), on the node in the fake GPU pool."""
    for name in KAI_IMAGES:
        node.ctr("images", "import", os.path.join(kai_build["kai"], "images", f"{name}.oci.tar"))
    for name in FGO_IMAGES:
        node.ctr("images", "import", os.path.join(kai_build["fgo"], "images", f"{name}.oci.tar"))
    for name in TEST_IMAGE_NAMES:
        node.ctr("images", "tag", "--force", "kai.test/debian:bookworm", name)
    node.kubectl("label", "node", node.name, *NODE_LABELS, "--overwrite")
    # cluster.sh makes RuntimeClass nvidia (handler nvidia, as the GPU
    # operator would); fake-gpu-operator's chart makes its own (handler runc,
    # which this node's containerd has), and helm refuses to adopt one it did
    # not make ("RuntimeClass "nvidia" in namespace "" exists and cannot be
    # imported into the current release"): the stand-in goes first.
    node.kubectl("delete", "runtimeclass", "nvidia", "--ignore-not-found")
    node.helm("upgrade", "-i", "gpu-operator", os.path.join(kai_build["fgo"], "chart", "fake-gpu-operator-0.2.0.tgz"),
              "-n", "gpu-operator", "--create-namespace",
              "-f", os.path.join(kai_build["kai_src"], "hack", "fake-gpu-operator-values.yaml"),
              "-f", os.path.join(HERE, "kai", "fake-gpu-operator-values.yaml"), "--wait", "--timeout", "5m")
    wait(f"the fake device plugin registered nvidia.com/gpu: the node's allocatable is {GPUS}",
         lambda: node.kjson("get", "node", node.name)["status"]["allocatable"].get("nvidia.com/gpu") == str(GPUS),
         show=lambda: node.kjson("get", "node", node.name)["status"]["allocatable"])
    node.helm("upgrade", "-i", "kai-scheduler", os.path.join(kai_build["kai"], "chart", "kai-scheduler-v0.17.0.tgz"),
              "-n", KAI_NS, "--create-namespace", "-f", os.path.join(HERE, "kai", "kai-scheduler-values.yaml"),
              "--wait", "--timeout", "10m")
    # The operator makes these from the Config kai-config after helm returned.
    wait("the KAI operator created its Deployments",
         lambda: all(node.kubectl("get", "deployment", d, "-n", KAI_NS, check=False).returncode == 0
                     for d in KAI_DEPLOYMENTS),
         show=lambda: node.kubectl("get", "deployments,pods", "-n", KAI_NS, check=False).stdout)
    for d in KAI_DEPLOYMENTS:
        node.kubectl("rollout", "status", f"deployment/{d}", "-n", KAI_NS, "--timeout=5m", timeout=330)
    return node


@pytest.fixture(scope="module")
def isolator(kai):
    """This chart as release kai-resource-isolator, defaults but for what
    this node forces; its webhook Ready and kai-csi registered."""
    node = kai
    repo, tag = node.env["KAI_IMAGE"].rsplit(":", 1)
    reg_registry, reg_name = node.env["REGISTRAR_IMAGE"].split("/", 1)
    reg_repo, reg_tag = reg_name.rsplit(":", 1)
    nvml = fake_nvml(node, {})
    node.helm("upgrade", "-i", RELEASE, CHART, "-n", NS, "--create-namespace",
              # node.sh's image of the binaries under test (node/kai_image.sh)
              "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
              # the node's host directory and kubelet root live in NODE_DIR
              "--set", f"paths.hostInstallBase={node.env['HOST_BASE']}",
              "--set", f"csi.kubeletDir={node.env['KUBELET_ROOT']}",
              # node-driver-registrar is in no registry here: node/registrar's image
              "--set", f"csi.registrar.image.registry={reg_registry}", "--set", f"csi.registrar.image.repository={reg_repo}",
              "--set", f"csi.registrar.image.tag={reg_tag}", "--set", "csi.registrar.image.pullPolicy=Never",
              "--set", f"monitor.nvml.hostLibraryDir={nvml}", "--set", "monitor.nvml.library=libkai_fake_nvml.so",
              "--set", "monitor.agent.extraEnv[0].name=FAKE_NVML_CONFIG",
              "--set", "monitor.agent.extraEnv[0].value=/run/kai/nvidia-lib/nvml.json",
              "--wait", "--timeout", "5m")

    def csi_registered():
        drivers = node.kjson("get", "csinode", node.name)["spec"].get("drivers") or []
        return any(d["name"] == "vgpu.kai-resource-isolator.io" for d in drivers)
    wait("kai-csi registered with the kubelet (CSINode)", csi_registered,
         show=lambda: node.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False).stdout)
    return node


# --- the stack as installed ----------------------------------------------------

def test_fake_gpu_node(kai):
    """The node is a GPU node as KAI sees it: two nvidia.com/gpu from
    fake-gpu-operator's device plugin through the real kubelet, and the
    memory label KAI's scheduler and binder read."""
    n = kai.kjson("get", "node", kai.name)
    assert n["status"]["capacity"].get("nvidia.com/gpu") == str(GPUS), n["status"]["capacity"]
    assert n["metadata"]["labels"].get("nvidia.com/gpu.memory") == str(GPU_MEMORY_MIB), n["metadata"]["labels"]


def binder_plugins(node):
    """The JSON of each --plugins flag of KAI's binder Deployment (how the
    operator passes binder.plugins)."""
    c = node.kjson("get", "deployment", "binder", "-n", KAI_NS)["spec"]["template"]["spec"]["containers"][0]
    args = c.get("args", []) + c.get("command", [])
    return [json.loads(a.split("=", 1)[1] if a.startswith("--plugins=") else args[i + 1])
            for i, a in enumerate(args) if a == "--plugins" or a.startswith("--plugins=")]


def test_kai_hamicore_configured(kai):
    """KAI runs with the HAMi-core integration on: the binder's --plugins
    enables hamicore, the admission has --hami-core-enabled=true."""
    plugins = binder_plugins(kai)
    assert plugins and plugins[0].get("hamicore", {}).get("enabled") is True, plugins
    admission = kai.kjson("get", "deployment", "admission", "-n", KAI_NS)["spec"]["template"]["spec"]["containers"][0]
    assert "--hami-core-enabled=true" in admission.get("args", []), admission.get("args")


ALLOCATE_SPECS = ("Whole GPU request", "Fraction GPU request", "Fraction GPU request - fill all the GPUs",
                  "GPU memory request - valid", "GPU memory request - too much memory for a single gpu")


def allocate_gpu_specs(node, kai_build, name):
    """KAI's allocate/resources GPU specs (whole, fraction, fill, gpu-memory
    valid and too large), each `passed` in the JUnit report."""
    rc, specs, text = run_suite(node, os.path.join(kai_build["kai"], "e2e", "allocate-resources.test"),
                                name, "Schedule pod with resource request GPU Resources")
    print(json.dumps({n: s for n, (s, _) in specs.items() if " GPU Resources " in n}, indent=1))
    # "[It] Schedule pod with resource request GPU Resources <spec> [labels]"
    by_spec = {re.sub(r"( \[[^\]]*\])+$", "", n).split(" GPU Resources ", 1)[-1]: (n, s) for n, s in specs.items()}
    for spec in ALLOCATE_SPECS:
        assert spec in by_spec, f"spec {spec!r} not in the report: {list(specs)}"
        n, (status, why) = by_spec[spec]
        assert status == "passed", f"{n}: {status}: {why}\n{text[-4000:]}"
    assert rc == 0, text[-4000:]


def test_kai_allocate_gpu_specs_without_isolator(kai, kai_build):
    """The baseline: KAI's GPU allocation specs pass on this node with KAI
    and the fake GPU alone (before this chart is installed)."""
    allocate_gpu_specs(kai, kai_build, "allocate-resources-without-isolator")


def test_isolator_fail_closed(isolator):
    """Our webhook configuration has the name KAI's suite looks for, and
    fails closed (the chart's default on Kubernetes >= 1.28) for the pods it
    scopes: KAI's GPU-sharing pods."""
    cfg = isolator.kjson("get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG)
    assert cfg["webhooks"] and all(w["failurePolicy"] == "Fail" for w in cfg["webhooks"]), \
        [(w["name"], w["failurePolicy"]) for w in cfg["webhooks"]]
    assert all(w.get("matchConditions") for w in cfg["webhooks"]), "fail-closed only for sharing pods"


# --- KAI's own e2e suites, unmodified -----------------------------------------------

def test_kai_allocate_gpu_specs_with_isolator(isolator, kai_build):
    """The same specs with this project installed and failing closed, its
    webhook injecting the GPU-sharing pods they make (one 0.5 fraction, two
    0.7, two gpu-memory): we break nothing of KAI's GPU sharing."""
    before = injected_pods(isolator)
    allocate_gpu_specs(isolator, kai_build, "allocate-resources")
    new = injected_pods(isolator) - before
    print(f"injected by our webhook: {sorted(new)}")
    assert len(new) >= 5, f"our webhook injected {sorted(new)}, want the specs' 5 GPU-sharing pods"


def test_kai_hamicore_injected_and_bounded(isolator, kai_build):
    """KAI's HAMi-core spec "gpu-memory: CUDA_DEVICE_MEMORY_LIMIT is injected
    and bounded" passes (not skipped: its BeforeAll skips without our
    webhook configuration or the binder's hamicore plugin)."""
    before = injected_pods(isolator)
    rc, specs, text = run_suite(isolator, os.path.join(kai_build["kai"], "e2e", "hamicore.test"), "hamicore",
                                "is injected and bounded")
    new = injected_pods(isolator) - before
    (name,) = [n for n in specs if "CUDA_DEVICE_MEMORY_LIMIT is injected and bounded" in n] or [None]
    assert name, f"spec not in the report: {specs}"
    status, why = specs[name]
    # The spec logs it: "msg"="CUDA_DEVICE_MEMORY_LIMIT" "value"="<n>m"
    values = re.findall(r'"msg"="CUDA_DEVICE_MEMORY_LIMIT" "value"="([^"]*)"', text)
    print(f"{name}: {status}; CUDA_DEVICE_MEMORY_LIMIT in the pod: {values}; injected by our webhook: {sorted(new)}")
    assert status == "passed", f"{status}: {why}\n{text[-4000:]}"
    assert rc == 0, text[-4000:]
    assert new, "our webhook injected no pod of the spec's"


# The other two hamicore specs read a real nvidia-smi inside the pod: on a
# GPU node (KAI + this chart with HAMi-core's real libvgpu.so, the NVIDIA
# runtime as RuntimeClass nvidia; KAI_E2E_REAL_GPU=1) they must pass. On
# fake-gpu-operator's node the pod has no nvidia-smi (the fake one is
# mounted only into containers asking for whole nvidia.com/gpu), so each
# must fail exactly there, after its pod ran with the limit: anything else
# (no pod Ready, a skip) fails this test. Each runs alone: the suite's
# Describe is Ordered, so a failing spec skips the ones after it.
NVIDIA_SMI_SPECS = ("nvidia-smi reports limited GPU memory matching CUDA_DEVICE_MEMORY_LIMIT",
                    "CUDA_DEVICE_MEMORY_LIMIT is injected and proportional")


@pytest.mark.parametrize("spec", NVIDIA_SMI_SPECS)
def test_kai_hamicore_nvidia_smi_specs(isolator, kai_build, spec):
    rc, specs, text = run_suite(isolator, os.path.join(kai_build["kai"], "e2e", "hamicore.test"),
                                "hamicore-" + re.sub(r"\W+", "-", spec)[:40], re.escape(spec))
    (name,) = [n for n in specs if spec in n] or [None]
    assert name, f"spec not in the report: {specs}"
    status, why = specs[name]
    print(f"{name}: {status}: {why[:600]}")
    if os.environ.get("KAI_E2E_REAL_GPU") == "1":
        assert status == "passed" and rc == 0, f"{status}: {why}\n{text[-4000:]}"
    else:
        assert status in ("failed", "panicked"), f"{status}: {why}\n{text[-4000:]}"
        assert "ExecInPod failed" in why and "nvidia-smi" in why, why


# --- this project's checks through KAI's chain (issue 39, step 4) -------------------
#
# Pods as a KAI user writes them (schedulerName kai-scheduler, a queue label,
# gpu-memory or gpu-fraction): KAI's admission and ours patch them, KAI's
# scheduler places them and its binder runs the reservation pod and writes
# CUDA_DEVICE_MEMORY_LIMIT into the pod's ConfigMap. The pods never call
# CUDA (no GPU): the region libvgpu would write at cuInit, with the cap the
# container's own environment resolved to, is written on the node by
# `kai-node write-region` (kai-region's writer, as the stand-in libvgpu
# writes it), and the stand-in NVML reports the container's real host PID.

TEAM = "team-kai"
QUEUE, PARENT_QUEUE = "isolation", "isolation-parent"
WORK = "work"  # the sharing container
LABEL = "nvidia.com/gpu.memory"
MIB = 1 << 20


def kai_limit_mib(label, portion):
    """KAI v0.17.0's binder (pkg/binder/plugins/hamicore/hami_core.go):
    int64(float64(label) * ParseFloat(portion)); Python's float is Go's
    float64, so the figure is the binder's to the MiB."""
    return int(float(int(label)) * float(portion))


class Chain:
    """KAI-scheduled sharing pods in TEAM on the node, and what this
    project says of them: kubectl vgpu through the API server's service
    proxy and the aggregator's series, as a cluster-wide viewer."""

    def __init__(self, node, vgpu, token):
        self.node, self.vgpu_bin, self.token = node, vgpu, token

    def pod(self, name, annotations):
        """A sharing pod as KAI's docs write one; as stored, once Running."""
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": TEAM, "labels": {"kai.scheduler/queue": QUEUE},
                            "annotations": annotations},
               "spec": {"schedulerName": "kai-scheduler", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": WORK, "image": TEST_IMAGE_NAMES[0], "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", "exec sleep infinity"]}]}}
        self.node.kubectl("create", "-f", "-", input=json.dumps(obj))
        return self.running(name)

    def running(self, name):
        def up():
            p = self.node.kjson("get", "pod", name, "-n", TEAM)
            cs = p["status"].get("containerStatuses") or []
            return p if p["status"].get("phase") == "Running" and cs and all(c.get("ready") for c in cs) else None
        return wait(f"pod {TEAM}/{name} scheduled by KAI and Running", up, timeout=180,
                    show=lambda: self.node.kubectl("describe", "pod", name, "-n", TEAM, check=False).stdout[-2500:])

    def bind_request(self, p):
        """KAI's BindRequest of pod `p` (the scheduler's decision the binder
        acted on): its receivedGPU portion is what the scheduler granted."""
        items = self.node.kjson("get", "bindrequests.scheduling.run.ai", "-n", TEAM)["items"]
        mine = [b for b in items if b["spec"].get("podName") == p["metadata"]["name"]]
        assert len(mine) == 1, f"BindRequests of {p['metadata']['name']}: {mine}"
        return mine[0]

    def label(self):
        return self.node.kjson("get", "node", self.node.name)["metadata"]["labels"].get(LABEL)

    def env(self, name, var):
        """`var` in the container's environment (kubelet resolved it), None
        when unset ("" when set empty, which libvgpu reads as unset)."""
        r = self.node.kubectl("exec", name, "-n", TEAM, "-c", WORK, "--", "printenv", var, check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    def region(self, p, limit_mib, used_mib, gpus=(FAKE_GPU_UUID,)):
        """The container's region as libvgpu writes it at cuInit: cap
        `limit_mib` (one for all, or a list, one per GPU) on each of `gpus`,
        one live slot of its host PID using `used_mib` on each; in the pod's
        region directory kai-csi published. The host PID."""
        pid = self.node.host_pid(p, WORK)
        limits = limit_mib if isinstance(limit_mib, (list, tuple)) else [limit_mib]
        self.node.write_region(p, WORK, pid, limits, used_mib, gpus)
        return pid

    def vgpu(self, *args):
        # the API server's service proxy, as the admin kubeconfig reaches it
        r = self.node.run(self.vgpu_bin, "--token", self.token, *args, env={"KUBECONFIG": self.node.admin})
        return r.stdout

    def rows(self):
        """kubectl vgpu top -n TEAM -o json: a row per container and GPU."""
        return json.loads(self.vgpu("top", "-n", TEAM, "-o", "json"))

    def top(self):
        """kubectl vgpu top's rows of one-GPU pods: {pod: row}."""
        return {r["pod"]: r for r in self.rows()}

    def row(self, name, what, ok):
        """kubectl vgpu's row of pod `name`, once `ok(row)`."""
        return wait(f"kubectl vgpu top: pod {name} {what}", lambda: (lambda r: r if r and ok(r) else None)(
            self.top().get(name)), timeout=120, show=lambda: self.top().get(name))

    def series(self, family, where=""):
        """The aggregator Service's series `family` of TEAM's pods whose
        labels include `where`: {pod: value}."""
        svc = self.node.kjson("get", "service", f"{RELEASE}-aggregator", "-n", NS)
        (port,) = [x["port"] for x in svc["spec"]["ports"] if x["name"] == "http-metrics"]
        out = self.node.run("curl", "-sf", "-H", f"Authorization: Bearer {self.token}",
                            f"http://{svc['spec']['clusterIP']}:{port}/metrics").stdout
        got = {}
        for line in out.splitlines():
            if line.startswith(family + "{") and f'namespace="{TEAM}"' in line and where in line:
                pod = re.search(r'pod="([^"]*)"', line).group(1)
                got[pod] = float(line.rsplit(" ", 1)[1])
        return got

    def events(self, name, reason):
        return [e for e in self.node.kjson("get", "events", "-n", TEAM, "--field-selector",
                                           f"involvedObject.name={name}")["items"] if e["reason"] == reason]

    def delete(self, *names):
        """The pods gone (their GPU share free for the next test)."""
        self.node.kubectl("delete", "pod", *names, "-n", TEAM, "--ignore-not-found", "--wait=true",
                          "--timeout=120s", timeout=150)
        fake_nvml(self.node, {})


@pytest.fixture(scope="module")
def chain(isolator, built):
    """A KAI queue for TEAM's pods (KAI's quickstart queues, unlimited), and a
    viewer of everything: a ServiceAccount bound to cluster-admin, whose
    token kubectl vgpu and a scrape send."""
    node = isolator
    vgpu = os.path.join(built(["kubectl-vgpu"], ["kubectl-vgpu"]), "kubectl-vgpu")
    unlimited = {r: {"quota": 0, "limit": -1, "overQuotaWeight": 1} for r in ("cpu", "gpu", "memory")}
    for name, parent in ((PARENT_QUEUE, None), (QUEUE, PARENT_QUEUE)):
        spec = {"resources": unlimited, **({"parentQueue": parent} if parent else {})}
        node.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
                                                            "metadata": {"name": name}, "spec": spec}))
    node.kubectl("create", "namespace", TEAM, check=False)
    wait(f"the default ServiceAccount of {TEAM}",
         lambda: node.kubectl("get", "serviceaccount", "default", "-n", TEAM, check=False).returncode == 0)
    node.kubectl("create", "serviceaccount", "vgpu-viewer", "-n", NS, check=False)
    node.kubectl("create", "clusterrolebinding", "kai-e2e-vgpu-viewer", "--clusterrole=cluster-admin",
                 f"--serviceaccount={NS}:vgpu-viewer", check=False)
    token = node.kubectl("create", "token", "vgpu-viewer", "-n", NS, "--duration=2h").stdout.strip()
    return Chain(node, vgpu, token)


def kai_ref(container):
    """KAI's CUDA_DEVICE_MEMORY_LIMIT entry of a stored container: the
    ConfigMap its binder fills."""
    refs = [e["valueFrom"]["configMapKeyRef"] for e in container.get("env") or []
            if e["name"] == "CUDA_DEVICE_MEMORY_LIMIT" and (e.get("valueFrom") or {}).get("configMapKeyRef")]
    assert len(refs) == 1, f"KAI's admission reference, once: {container.get('env')}"
    return refs[0]


def through_the_chain(chain, name, annotations, used_mib):
    """One sharing pod through KAI and this project: both admissions, KAI's
    placement, reservation pod, ConfigMap and cap in the container; the
    region with that cap; the agent's `capped` with headroom against it, in
    kubectl vgpu and in the HAMi series. The pod is deleted after."""
    node = chain.node
    p = chain.pod(name, annotations)
    try:
        assert p["spec"]["nodeName"] == node.name and p["spec"]["schedulerName"] == "kai-scheduler", p["spec"]
        (c,) = p["spec"]["containers"]
        # Ours: kai-csi's inline volume and the region's POD_UID.
        assert any((v.get("csi") or {}).get("driver") == "vgpu.kai-resource-isolator.io"
                   for v in p["spec"]["volumes"]), p["spec"]["volumes"]
        assert any(e["name"] == "POD_UID" for e in c.get("env") or []), c.get("env")
        # KAI's binder: a reservation pod on the node holds the GPU.
        reservation = [r for r in node.kjson("get", "pods", "-n", "kai-resource-reservation")["items"]
                       if r["spec"].get("nodeName") == node.name and r["status"].get("phase") == "Running"]
        assert reservation, "no running reservation pod of KAI's binder"
        for r in reservation:  # KAI's own pod (it holds the whole GPU): never ours to touch
            assert not any("csi" in v for v in r["spec"].get("volumes") or []), r["spec"]["volumes"]
            assert not any(e["name"] in ("POD_UID", "CUDA_DEVICE_MEMORY_LIMIT")
                           for c2 in r["spec"]["containers"] for e in c2.get("env") or []), r["spec"]["containers"]
        portion = chain.bind_request(p)["spec"]["receivedGPU"]["portion"]
        label = chain.label()
        want = kai_limit_mib(label, portion)
        ref = kai_ref(c)
        cm = node.kjson("get", "configmap", ref["name"], "-n", TEAM)
        assert cm["data"].get("CUDA_DEVICE_MEMORY_LIMIT") == f"{want}m", (label, portion, cm["data"])
        # In the container, as kubelet resolved it: KAI's figure, and KAI's
        # other variables as its ConfigMaps say (untouched by us).
        assert chain.env(name, "CUDA_DEVICE_MEMORY_LIMIT") == f"{want}m", (label, portion)
        assert chain.env(name, "GPU_PORTION") == cm["data"].get("GPU_PORTION", portion), cm["data"]
        assert chain.env(name, "NVIDIA_VISIBLE_DEVICES"), "KAI's NVIDIA_VISIBLE_DEVICES reached no container"
        pid = chain.region(p, want, used_mib)
        fake_nvml(node, {pid: used_mib})
        row = chain.row(name, "capped", lambda r: r.get("state") == "capped")
        assert row["limitBytes"] == want * MIB, row
        assert row["headroomBytes"] == (want - used_mib) * MIB, row
        assert chain.series("hami_vgpu_memory_limit_bytes").get(name) == want * MIB
        print(f"{name} {annotations}: label {label}, portion {portion}: CUDA_DEVICE_MEMORY_LIMIT={want}m, capped")
        return want
    finally:
        chain.delete(name)


def test_chain_gpu_memory_pod(chain):
    """gpu-memory 4096 on the 11441 MiB label: KAI's cap is its formula's
    (portion 0.36: 4118m), not the annotation, and the agent calls it capped."""
    want = through_the_chain(chain, "mem", {"gpu-memory": "4096"}, used_mib=1000)
    assert want != 4096


def test_chain_gpu_fraction_pod(chain):
    """gpu-fraction 0.5: KAI's cap is half the label (5720m), not half of
    what NVML counts (NVML_TOTAL_MIB), and the agent calls it capped."""
    want = through_the_chain(chain, "frac", {"gpu-fraction": "0.5"}, used_mib=1000)
    assert want != NVML_TOTAL_MIB // 2


def release_upgrade(node, *sets):
    """helm upgrade --reuse-values of this release; helm waits for the
    rolled agent DaemonSet."""
    node.helm("upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", *[a for s in sets for a in ("--set", s)],
              "--wait", "--timeout", "5m")


def gone(chain, name):
    r = chain.node.kubectl("get", "pod", name, "-n", TEAM, check=False)
    return r.returncode != 0 and "NotFound" in r.stderr


def test_chain_grant_is_kais_under_evict(chain):
    """Under monitor.isolation.enforce=evict the grant is KAI's, to the MiB,
    on a node whose label (11441) is not NVML's total (12288): a gpu-memory
    4096 pod using more than its annotation but no more than KAI's cap is
    capped, neither reported nor evicted; a gpu-fraction 0.5 pod whose cap
    was raised above KAI's (5720) but under half of NVML's total is
    above_grant and, once NVML sees it use more than KAI granted (plus the
    512 MiB margin), evicted: with half of NVML's total as its grant it
    would be neither.
    Both are assessed in the same passes: the eviction is the event the
    test waits on, then the other pod must be there and capped."""
    node = chain.node
    release_upgrade(node, "monitor.isolation.enforce=evict")
    try:
        within = chain.pod("within", {"gpu-memory": "4096"})
        raised = chain.pod("raised", {"gpu-fraction": "0.5"})
        label = chain.label()
        cap_within = kai_limit_mib(label, chain.bind_request(within)["spec"]["receivedGPU"]["portion"])
        cap_raised = kai_limit_mib(label, chain.bind_request(raised)["spec"]["receivedGPU"]["portion"])
        assert chain.env("within", "CUDA_DEVICE_MEMORY_LIMIT") == f"{cap_within}m"
        assert chain.env("raised", "CUDA_DEVICE_MEMORY_LIMIT") == f"{cap_raised}m"
        assert 4096 < cap_within and cap_raised < NVML_TOTAL_MIB // 2, (cap_within, cap_raised)
        used_within = (4096 + cap_within) // 2 + 1  # above the annotation, within KAI's cap
        own_cap = (cap_raised + NVML_TOTAL_MIB // 2) // 2  # the container's own, above KAI's
        used_raised = cap_raised + 100  # above KAI's grant, within its own cap
        # NVML's evidence must pass the grant by monitor.isolation.overCapMarginMiB
        # (512: contexts and driver memory libvgpu does not account); the
        # raised pod's does, and stays under its own cap plus the margin.
        seen_raised = cap_raised + 600
        assert seen_raised < own_cap + 512 < (NVML_TOTAL_MIB // 2) + 512 < seen_raised + 512, \
            (seen_raised, own_cap)
        pw = chain.region(within, cap_within, used_within)
        pr = chain.region(raised, own_cap, used_raised)
        fake_nvml(node, {pw: used_within, pr: seen_raised})
        wait("pod raised evicted (above_grant) and deleted", lambda: gone(chain, "raised"), timeout=120,
             show=lambda: chain.top())
        ev = chain.events("raised", "GpuIsolationEviction")
        assert ev, "no GpuIsolationEviction Event on pod raised"
        print(f"raised: {ev[0]['message']}")
        assert str(cap_raised) in ev[0]["message"], ev[0]["message"]
        assert not gone(chain, "within"), "pod within was evicted"
        assert not chain.events("within", "GpuIsolationEviction")
        # What the agent decided reaches the views through the aggregator's
        # stream: waited for, not read once.
        row = chain.row("within", "capped", lambda r: r.get("state") == "capped")
        assert row["limitBytes"] == cap_within * MIB, row
        wait("the series say within is capped", lambda: chain.series(
            "kai_isolator_container_isolation_state", 'state="capped"').get("within") == 1, timeout=60)
    finally:
        try:
            chain.delete("within", "raised")
        finally:  # the tests after this one run without evictions, whatever failed here
            release_upgrade(node, "monitor.isolation.enforce=none")


def test_chain_node_without_label(chain):
    """The node without nvidia.com/gpu.memory (KAI #2156): KAI's scheduler
    reads 100 MiB per GPU, so it does not place a gpu-memory pod (it stays
    Pending, its spec holding KAI's reference alone); it places a
    gpu-fraction pod, for which its binder writes no limit: the container's
    CUDA_DEVICE_MEMORY_LIMIT is empty (the webhook's envFrom mask, which
    libvgpu reads as unset), libvgpu records limit 0, and the agent says
    uncapped_no_limit, naming the missing label, in kubectl vgpu and in the
    series KaiGpuUncapped fires on."""
    node = chain.node
    node.kubectl("label", "node", node.name, f"{LABEL}-")
    try:
        obj_mem = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "nolabel-mem", "namespace": TEAM, "labels": {"kai.scheduler/queue": QUEUE},
                                "annotations": {"gpu-memory": "2048"}},
                   "spec": {"schedulerName": "kai-scheduler", "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": WORK, "image": TEST_IMAGE_NAMES[0], "imagePullPolicy": "Never",
                                            "command": ["sh", "-c", "exec sleep infinity"]}]}}
        stored = json.loads(node.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(obj_mem)).stdout)
        env = stored["spec"]["containers"][0].get("env") or []
        # KAI's admission (AddEnvVarToContainer) drops every other entry of
        # the name before it appends its reference: the webhook's fallback
        # literal does not survive it (docs/webhook.md).
        limits = [e for e in env if e["name"] == "CUDA_DEVICE_MEMORY_LIMIT"]
        assert len(limits) == 1 and kai_ref(stored["spec"]["containers"][0]), limits

        def unschedulable():
            p = node.kjson("get", "pod", "nolabel-mem", "-n", TEAM)
            return [c for c in p["status"].get("conditions") or []
                    if c["type"] == "PodScheduled" and c["status"] == "False"]
        cond = wait("KAI reports pod nolabel-mem unschedulable", unschedulable, timeout=120)
        print(f"nolabel-mem: {cond[0].get('reason')}: {cond[0].get('message', '')[:300]}")
        frac = chain.pod("nolabel-frac", {"gpu-fraction": "0.25"})
        ref = kai_ref(frac["spec"]["containers"][0])
        cm = node.kjson("get", "configmap", ref["name"], "-n", TEAM)
        assert "CUDA_DEVICE_MEMORY_LIMIT" not in (cm.get("data") or {}), cm.get("data")
        assert not chain.env("nolabel-frac", "CUDA_DEVICE_MEMORY_LIMIT"), frac["spec"]["containers"][0].get("env")
        pid = chain.region(frac, 0, 1000)  # libvgpu without a limit records 0
        fake_nvml(node, {pid: 1000})
        row = chain.row("nolabel-frac", "uncapped_no_limit", lambda r: r.get("state") == "uncapped_no_limit")
        assert LABEL in row["reason"], row
        assert chain.series("kai_isolator_container_isolation_state",
                            'state="uncapped_no_limit"').get("nolabel-frac") == 1
        # KAI placed the fraction pod after it had called the gpu-memory pod
        # unschedulable, and still has not placed that one.
        mem = node.kjson("get", "pod", "nolabel-mem", "-n", TEAM)
        assert not mem["spec"].get("nodeName") and mem["status"].get("phase") == "Pending", mem["status"]
    finally:
        try:
            chain.delete("nolabel-mem", "nolabel-frac")
        finally:  # the label back, whatever failed here (the fake GPUs' size, not what was read)
            node.kubectl("label", "node", node.name, f"{LABEL}={GPU_MEMORY_MIB}", "--overwrite")


def binder_hamicore(node):
    """Whether KAI's binder Deployment runs with the hamicore plugin on."""
    plugins = binder_plugins(node)
    return bool(plugins and plugins[0].get("hamicore", {}).get("enabled"))


def kai_hamicore(node, kai_build, enabled):
    """KAI's chain with the hamicore plugins `enabled` (helm upgrade
    --reuse-values of KAI's release; its operator rolls the binder and the
    admission)."""
    node.helm("upgrade", "kai-scheduler", os.path.join(kai_build["kai"], "chart", "kai-scheduler-v0.17.0.tgz"),
              "-n", KAI_NS, "--reuse-values", "--set", f"binder.plugins.hamicore.enabled={str(enabled).lower()}",
              "--wait", "--timeout", "5m")
    wait(f"KAI's operator rolled the binder with hamicore {'on' if enabled else 'off'}",
         lambda: binder_hamicore(node) == enabled, timeout=180)
    for d in ("binder", "admission"):
        node.kubectl("rollout", "status", f"deployment/{d}", "-n", KAI_NS, "--timeout=5m", timeout=330)


def test_chain_hamicore_off(chain, kai_build):
    """KAI without its hamicore plugins (binder.plugins.hamicore.enabled
    false): KAI adds no CUDA_DEVICE_MEMORY_LIMIT reference and writes no
    limit. As docs/webhook.md says, a gpu-memory pod runs on the webhook's
    fallback (its annotation, 2048m) and is capped by it; a gpu-fraction pod
    gets no limit and is uncapped_no_limit."""
    node = chain.node
    kai_hamicore(node, kai_build, False)
    try:
        mem = chain.pod("nohami-mem", {"gpu-memory": "2048"})
        frac = chain.pod("nohami-frac", {"gpu-fraction": "0.25"})
        for p in (mem, frac):
            env = p["spec"]["containers"][0].get("env") or []
            assert not [e for e in env if (e.get("valueFrom") or {}).get("configMapKeyRef", {}).get("key")
                        == "CUDA_DEVICE_MEMORY_LIMIT"], f"KAI's reference with hamicore off: {env}"
        assert chain.env("nohami-mem", "CUDA_DEVICE_MEMORY_LIMIT") == "2048m"
        # empty (the webhook's envFrom mask; libvgpu reads it as unset) or unset
        assert not chain.env("nohami-frac", "CUDA_DEVICE_MEMORY_LIMIT"), frac["spec"]["containers"][0].get("env")
        pm = chain.region(mem, 2048, 1000)
        pf = chain.region(frac, 0, 1000)
        fake_nvml(node, {pm: 1000, pf: 1000})
        chain.row("nohami-frac", "uncapped_no_limit", lambda r: r.get("state") == "uncapped_no_limit")
        row = chain.row("nohami-mem", "capped", lambda r: r.get("state") == "capped")
        assert row["limitBytes"] == 2048 * MIB and row["headroomBytes"] == 1048 * MIB, row
    finally:
        try:
            chain.delete("nohami-mem", "nohami-frac")
        finally:  # KAI's hamicore back on, whatever failed here
            kai_hamicore(node, kai_build, True)


def test_chain_gpu_fraction_num_devices(chain):
    """gpu-fraction 0.5 on gpu-fraction-num-devices 2: KAI grants half of
    each of the node's two GPUs and its binder writes one limit, which
    libvgpu applies to every device; the agent holds each device's cap to
    it: both at KAI's figure is capped (a row per GPU in kubectl vgpu), one
    device raised above it is above_grant, naming that device."""
    node = chain.node
    p = chain.pod("multi", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": str(GPUS)})
    try:
        received = chain.bind_request(p)["spec"]["receivedGPU"]
        assert received.get("count") == GPUS, received
        want = kai_limit_mib(chain.label(), received["portion"])
        assert chain.env("multi", "CUDA_DEVICE_MEMORY_LIMIT") == f"{want}m"
        pid = chain.region(p, want, 1000, gpus=FAKE_GPU_UUIDS)
        fake_nvml(node, {pid: 1000})

        def capped_on_each():
            mine = [r for r in chain.rows() if r["pod"] == "multi"]
            return mine if sorted(r["gpu"] for r in mine) == sorted(FAKE_GPU_UUIDS) \
                and all(r["state"] == "capped" and r["limitBytes"] == want * MIB for r in mine) else None
        wait("kubectl vgpu top: pod multi capped on each GPU at KAI's limit", capped_on_each, timeout=120,
             show=chain.rows)
        chain.region(p, [want, want + 200], 1000, gpus=FAKE_GPU_UUIDS)

        def raised_row():
            (row,) = [r for r in chain.rows() if r["pod"] == "multi" and r["gpu"] == FAKE_GPU_UUIDS[1]]
            return row if row["state"] == "above_grant" else None
        row = wait("kubectl vgpu top: pod multi above_grant on its second GPU", raised_row, timeout=120,
                   show=chain.rows)
        assert row["limitBytes"] == (want + 200) * MIB, row
        assert FAKE_GPU_UUIDS[1] in row["reason"] and f"{want} MiB" in row["reason"], row["reason"]
    finally:
        chain.delete("multi")


def test_chain_kai_components_untouched(chain):
    """KAI's own components and the GPU operator's pods (and reservation
    pods, where any are left; through_the_chain checks those of its pods)
    are not ours to patch: none carries our volume, preload mount or
    region identity (the webhook's matchConditions leave them out before
    it is called)."""
    seen = 0
    for ns in (KAI_NS, "kai-resource-reservation", "gpu-operator"):
        for p in chain.node.kjson("get", "pods", "-n", ns)["items"]:
            seen += 1
            vols = p["spec"].get("volumes") or []
            assert not [v for v in vols if (v.get("csi") or {}).get("driver") == "vgpu.kai-resource-isolator.io"
                        or v["name"].startswith("kai-resource-isolator")], (ns, p["metadata"]["name"], vols)
            for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]:
                assert not [m for m in c.get("volumeMounts") or [] if m["mountPath"] == "/etc/ld.so.preload"], \
                    (ns, p["metadata"]["name"], c["name"])
                ours = ("POD_UID", "CONTAINER_NAME", "CONTAINER_VGPU_MOUNT", "CUDA_DEVICE_MEMORY_SHARED_CACHE")
                assert not [e for e in c.get("env") or [] if e["name"] in ours], (ns, p["metadata"]["name"], c["name"])
    assert seen >= len(KAI_DEPLOYMENTS), f"only {seen} pods of KAI and the GPU operator"


def test_chain_uninstall_leaves_kai_working(chain):
    """helm uninstall of this project while KAI keeps scheduling: KAI's
    pods are untouched, and a new sharing pod is placed, bound with KAI's
    limit and runs, with nothing of ours (no webhook is left to fail
    closed). Last: the module has no release after it."""
    node = chain.node
    node.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "5m")
    assert node.kubectl("get", "mutatingwebhookconfiguration", WEBHOOK_CONFIG, check=False).returncode != 0
    for d in KAI_DEPLOYMENTS:
        node.kubectl("rollout", "status", f"deployment/{d}", "-n", KAI_NS, "--timeout=60s", timeout=90)
    p = chain.pod("after", {"gpu-memory": "4096"})
    try:
        assert not any((v.get("csi") or {}).get("driver") == "vgpu.kai-resource-isolator.io"
                       for v in p["spec"].get("volumes") or []), p["spec"]["volumes"]
        want = kai_limit_mib(chain.label(), chain.bind_request(p)["spec"]["receivedGPU"]["portion"])
        assert chain.env("after", "CUDA_DEVICE_MEMORY_LIMIT") == f"{want}m"
    finally:
        node.kubectl("delete", "pod", "after", "-n", TEAM, "--wait=true", "--timeout=120s", timeout=150)
