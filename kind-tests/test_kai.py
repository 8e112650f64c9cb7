"""KAI-Scheduler in the loop (issue 39, steps 2-3), on node.sh's real node.

The session brings up node.sh's control plane and real kubelet node
(`node.sh --up`), installs what kind-tests/kai/build.sh built as a cluster
administrator would, from their own charts (kind-tests/kai/README.md):

  1. fake-gpu-operator 0.2.0 (KAI's hack/fake-gpu-operator-values.yaml +
     ours: one fake 11441 MiB GPU, the node in its pool);
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

  pytest -c kind-tests/pytest.ini -m kai        # root; about 4.5 min warm

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
from kaitest.chart import CHART, ROOT
from kaitest.poll import poll

pytestmark = pytest.mark.kai

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_SH = os.path.join(HERE, "kai", "build.sh")
RELEASE = NS = "kai-resource-isolator"
WEBHOOK_CONFIG = f"{RELEASE}-mutating"  # what KAI's hamicore suite looks for
KAI_NS = "kai-scheduler"  # the e2e suites' fixed system namespace (testconfig.go)
GPU_MEMORY_MIB = 11441  # kai/fake-gpu-operator-values.yaml's one GPU = the node label
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
FAKE_GPU_UUID = "GPU-11441000-0000-4000-8000-000000000000"


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


# --- the session: node, fake GPU, KAI, this chart -------------------------------

@pytest.fixture(scope="session")
def out_dir():
    d = os.path.abspath(os.environ.get("KAI_E2E_OUT") or os.path.join(ROOT, "target", "kai-e2e"))
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def node(built, out_dir):
    """node.sh --up: the control plane and the real node, taken down at the
    end of the session (node.sh --down)."""
    with kainode.up(built(kainode.PACKAGES, kainode.FILES), out_dir) as n:
        yield n


@pytest.fixture(scope="session")
def kai_build():
    """build.sh's KAI and fake-gpu-operator build directories (cached)."""
    r = subprocess.run(["bash", BUILD_SH], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    kai, fgo = r.stdout.strip().splitlines()[-2:]
    return {"kai": kai, "fgo": fgo, "kai_src": os.path.join(os.path.dirname(kai), "src")}


@pytest.fixture(scope="session")
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
    wait("the fake device plugin registered nvidia.com/gpu: the node's allocatable is 1",
         lambda: node.kjson("get", "node", node.name)["status"]["allocatable"].get("nvidia.com/gpu") == "1",
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


@pytest.fixture(scope="session")
def isolator(kai):
    """This chart as release kai-resource-isolator, defaults but for what
    this node forces; its webhook Ready and kai-csi registered."""
    node = kai
    repo, tag = node.env["KAI_IMAGE"].rsplit(":", 1)
    reg_registry, reg_name = node.env["REGISTRAR_IMAGE"].split("/", 1)
    reg_repo, reg_tag = reg_name.rsplit(":", 1)
    nvml = os.path.join(node.dir, "kai-nvml")
    os.makedirs(nvml, exist_ok=True)
    lib = os.path.join(nvml, "libkai_fake_nvml.so")
    with open(os.path.join(node.target, "libkai_fake_nvml.so"), "rb") as a, open(lib, "wb") as b:
        b.write(a.read())
    # The stand-in NVML sees the fake GPU as fake-gpu-operator describes it.
    with open(os.path.join(nvml, "nvml.json"), "w") as f:
        json.dump({"driver": "550.54.15", "devices": [{"uuid": FAKE_GPU_UUID, "name": "Tesla-K80",
                                                       "total": GPU_MEMORY_MIB << 20, "used": 0, "processes": []}]}, f)
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
    """The node is a GPU node as KAI sees it: one nvidia.com/gpu from
    fake-gpu-operator's device plugin through the real kubelet, and the
    memory label KAI's scheduler and binder read."""
    n = kai.kjson("get", "node", kai.name)
    assert n["status"]["capacity"].get("nvidia.com/gpu") == "1", n["status"]["capacity"]
    assert n["metadata"]["labels"].get("nvidia.com/gpu.memory") == str(GPU_MEMORY_MIB), n["metadata"]["labels"]


def test_kai_hamicore_configured(kai):
    """KAI runs with the HAMi-core integration on: the binder's --plugins
    enables hamicore, the admission has --hami-core-enabled=true."""
    binder = kai.kjson("get", "deployment", "binder", "-n", KAI_NS)["spec"]["template"]["spec"]["containers"][0]
    args = binder.get("args", []) + binder.get("command", [])
    plugins = [json.loads(a.split("=", 1)[1] if a.startswith("--plugins=") else args[i + 1])
               for i, a in enumerate(args) if a == "--plugins" or a.startswith("--plugins=")]
    assert plugins and plugins[0].get("hamicore", {}).get("enabled") is True, args
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
