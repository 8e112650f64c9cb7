"""DRA consumable-capacity GPU claims in the loop (issue 40), on node.sh's
real node: a real kube-apiserver, etcd, scheduler, controller-manager and
kubelet on containerd.

The module brings up the node (`node.sh --up`), installs
kubernetes-sigs/dra-example-driver v0.4.0 as kind-tests/dra/build.sh built
it, from its chart, with shares on (gpuAllowMultipleAllocations: every
device `allowMultipleAllocations`, memory 80Gi in 1Gi steps, compute 100
in steps of 1) and two devices (kind-tests/dra/README.md, "The install
recipe"), and then this project's chart with the driver's DeviceClass
declared as GPU memory (`dra.deviceClasses` [{gpu.example.com, memory}]),
CSI delivery, and the stand-in NVML holding the slice's two devices (their
`uuid` attributes, 81920 MiB each).

First the driver alone (the allocation is the API server's and the
scheduler's: shares, shareIDs, consumedCapacity, rounding), then the cap:
the webhook's CUDA_DEVICE_MEMORY_LIMIT from the claim's
`capacity.requests`, the region libvgpu would write (played by `kai-node
write-region`, as in test_kai.py: the pods never call CUDA), and the
agent's grant = the allocation's consumedCapacity, in kubectl vgpu and the
aggregator's API (`draShares`). Containerd 1.6 on this node drops the
driver's CDI edits (README, "CDI on this node's containerd"): the driver's
own GPU_DEVICE_<n>_MEMORY is read from the spec file it wrote, not from the
container.

  flock /tmp/kai-cluster.lock python3 -m pytest -c kind-tests/pytest.ini -m dra   # root

Output (node.sh's log) goes to $KAI_DRA_OUT, else target/kai-dra. The
built binaries are $KAI_TARGET's, else target/debug's (built when missing).
"""
import json
import os
import re
import time

import pytest

from kaitest import dra as d
from kaitest import node as kainode
from kaitest.chart import CHART
from kaitest.dra import MIB, wait

pytestmark = pytest.mark.dra
OUT = ("KAI_DRA_OUT", "kai-dra")  # out_dir (conftest.py)

RELEASE = NS = "kai-resource-isolator"
ALLOC = "dra-alloc"  # the driver-only tests' namespace (before our chart is installed)
TEAM = "team-dra"  # the tenant namespace of the tests with our chart
RESTRICTED_NS = "team-dra-restricted"
UNMANAGED = "gpu-unmanaged.example.com"  # a DeviceClass on the same driver, not declared as GPU memory
NVML_MIB = 81920  # the stand-in NVML's total per device (= the slice's 80Gi)
WORK = "work"
DRA_CLASSES = [{"name": d.CLASS, "memoryCapacity": d.MEMORY}]
CSI_DRIVER = "vgpu.kai-resource-isolator.io"
OURS = ("POD_UID", "CONTAINER_NAME", "CONTAINER_VGPU_MOUNT", "CUDA_DEVICE_MEMORY_LIMIT")
GIB = 1 << 30
ANNOTATION_LIMITS = "kai-resource-isolator.io/dra-limits-configmap"  # where the webhook names the limits ConfigMap


# --- the module: node, driver, this chart -----------------------------------------

@pytest.fixture(scope="module")
def node(built, out_dir):
    """node.sh --up: the control plane and the real node, taken down at the
    end of the module (node.sh --down)."""
    target = built(kainode.PACKAGES, kainode.FILES)
    start = time.monotonic()
    with kainode.up(target, out_dir) as n:
        print(f"\nnode up in {time.monotonic() - start:.0f} s")  # reported, never asserted
        yield n


@pytest.fixture(scope="module")
def dra_build():
    """build.sh's build directory (cached)."""
    return d.build()


@pytest.fixture(scope="module")
def dra(node, dra_build):
    """The driver from its chart (README's recipe), its kubelet plugin
    running and the node's ResourceSlice holding both devices; a namespace
    for the driver-only tests. The node."""
    start = time.monotonic()
    d.install(node, dra_build)
    print(f"\ndriver installed in {time.monotonic() - start:.0f} s")  # reported, never asserted
    d.namespace(node, ALLOC)
    return node


def nvml(node, uuids, processes=None):
    """The stand-in NVML the agent pod loads: the slice's devices (their
    `uuid` attributes), NVML_MIB each, running `processes` ({uuid: {host
    PID: MiB}}). Its directory."""
    directory = os.path.join(node.dir, "kai-nvml")
    procs = processes or {}
    kainode.fake_nvml(directory, os.path.join(node.target, "libkai_fake_nvml.so"),
                      [{"uuid": u, "name": "Example GPU", "total": NVML_MIB * MIB,
                        "processes": {pid: mib * MIB for pid, mib in procs.get(u, {}).items()}}
                       for u in uuids])
    return directory


def isolator_values(node, directory):
    """This chart's values on this node: node.sh's image, host directory
    and kubelet root, node/registrar's image, the stand-in NVML (as
    test_kai.py), CSI delivery, and the driver's class as GPU memory."""
    repo, tag = node.env["KAI_IMAGE"].rsplit(":", 1)
    reg_registry, reg_name = node.env["REGISTRAR_IMAGE"].split("/", 1)
    reg_repo, reg_tag = reg_name.rsplit(":", 1)
    return ["--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
            "--set", f"paths.hostInstallBase={node.env['HOST_BASE']}",
            "--set", f"csi.kubeletDir={node.env['KUBELET_ROOT']}",
            "--set", f"csi.registrar.image.registry={reg_registry}", "--set", f"csi.registrar.image.repository={reg_repo}",
            "--set", f"csi.registrar.image.tag={reg_tag}", "--set", "csi.registrar.image.pullPolicy=Never",
            "--set", "libraryDelivery=csi",
            "--set", f"monitor.nvml.hostLibraryDir={directory}", "--set", "monitor.nvml.library=libkai_fake_nvml.so",
            "--set", "monitor.agent.extraEnv[0].name=FAKE_NVML_CONFIG",
            "--set", "monitor.agent.extraEnv[0].value=/run/kai/nvidia-lib/nvml.json",
            "--set-json", f"dra.deviceClasses={json.dumps(DRA_CLASSES)}"]


class Shares:
    """Claim pods in TEAM and what this project says of them: the
    container's env, the region, kubectl vgpu (through the API server's
    service proxy) and the aggregator's JSON API, as a cluster-wide viewer."""

    def __init__(self, node, uuids, vgpu, token):
        self.node, self.uuids, self.vgpu_bin, self.token = node, uuids, vgpu, token

    def pod(self, name, claims, ns=TEAM, **kw):
        """Pod `name` naming `claims` (ResourceClaim objects, created
        first); as stored, once Running."""
        for c in claims:
            d.create(self.node, c, ns)
        d.create(self.node, d.pod(name, [c["metadata"]["name"] for c in claims], **kw), ns)
        return d.running(self.node, name, ns)

    def refused(self, name, claims, ns=TEAM, **kw):
        """Pod `name` naming `claims` refused at admission: the message."""
        for c in claims:
            d.create(self.node, c, ns)
        r = d.create(self.node, d.pod(name, [c["metadata"]["name"] for c in claims], **kw), ns, check=False)
        assert not isinstance(r, dict), f"pod {name} admitted: {json.dumps(r['spec'])[:1500]}"
        print(f"{name}: {r.stderr.strip()}")
        return r.stderr

    def env(self, name, var, ns=TEAM):
        return d.env_of(self.node, name, ns, var, WORK)

    def region(self, p, limit_mib, used_mib, devices=("gpu-0",), container=WORK):
        """The container's region as libvgpu writes it at cuInit: cap
        `limit_mib` (one for all, or one per device) on each of `devices`
        (their slice UUIDs), one live slot of its host PID using `used_mib`.
        The host PID."""
        pid = self.node.host_pid(p, container)
        limits = limit_mib if isinstance(limit_mib, (list, tuple)) else [limit_mib]
        self.node.write_region(p, container, pid, limits, used_mib, [self.uuids[x] for x in devices])
        return pid

    def nvml(self, processes=None):
        """The stand-in NVML: {device: {host PID: MiB}}."""
        nvml(self.node, self.uuids.values(), {self.uuids[k]: v for k, v in (processes or {}).items()})

    def rows(self, ns=TEAM):
        """kubectl vgpu top -n NS -o json: a row per container and GPU."""
        r = self.node.run(self.vgpu_bin, "--token", self.token, "top", "-n", ns, "-o", "json",
                          env={"KUBECONFIG": self.node.admin})
        return json.loads(r.stdout)

    def row(self, name, device, what, ok, ns=TEAM, container=WORK):
        """kubectl vgpu's row of pod `name`'s `container` on `device`, once
        `ok(row)`."""
        uuid = self.uuids[device]

        def mine():
            rows = [r for r in self.rows(ns) if r["pod"] == name and r["gpu"] == uuid
                    and r["container"] == container]
            return rows[0] if rows and ok(rows[0]) else None
        return wait(f"kubectl vgpu top: pod {name} on {device} {what}", mine, timeout=120,
                    show=lambda: [r for r in self.rows(ns) if r["pod"] == name])

    def containers(self, name, ns=TEAM):
        """The aggregator's /api/v1/containers entries of pod `name` (the
        agent's ContainerUsage, `draShares` among them)."""
        svc = self.node.kjson("get", "service", f"{RELEASE}-aggregator", "-n", NS)
        (port,) = [x["port"] for x in svc["spec"]["ports"] if x["name"] == "http-metrics"]
        out = self.node.run("curl", "-sf", "-H", f"Authorization: Bearer {self.token}",
                            f"http://{svc['spec']['clusterIP']}:{port}/api/v1/containers?namespace={ns}&pod={name}")
        return [c for c in json.loads(out.stdout).get("containers") or [] if c.get("pod") == name]

    def dra_shares(self, name, want, ns=TEAM, container=WORK):
        """The `draShares` of pod `name`'s `container` as the aggregator
        serves them, once there are `want` of them."""
        def shares():
            got = [s for c in self.containers(name, ns) if c.get("container") == container
                   for s in c.get("draShares") or []]
            return got if len(got) == want else None
        return wait(f"the aggregator: {want} draShares of pod {name}", shares, timeout=120,
                    show=lambda: self.containers(name, ns))

    def events(self, name, reason, ns=TEAM):
        return [e for e in self.node.kjson("get", "events", "-n", ns, "--field-selector",
                                           f"involvedObject.name={name}")["items"] if e["reason"] == reason]

    def delete(self, pods=(), claims=(), ns=TEAM):
        try:
            d.delete(self.node, ns, pods, claims)
        finally:
            self.nvml()


@pytest.fixture(scope="module")
def isolator(dra, built):
    """This chart as release kai-resource-isolator with the driver's class
    declared as GPU memory, CSI delivery and the stand-in NVML of the
    slice's devices; its webhook Ready and kai-csi registered. A Shares
    viewer of TEAM."""
    node = dra
    uuids = d.uuids(d.node_slice(node))
    vgpu = os.path.join(built(["kubectl-vgpu"], ["kubectl-vgpu"]), "kubectl-vgpu")
    # the chart's node DaemonSets run where GPU feature discovery says there are GPUs
    node.kubectl("label", "node", node.name, "nvidia.com/gpu.present=true", "--overwrite")
    directory = nvml(node, uuids.values())
    node.helm("upgrade", "-i", RELEASE, CHART, "-n", NS, "--create-namespace", *isolator_values(node, directory),
              "--wait", "--timeout", "5m")

    def csi_registered():
        drivers = node.kjson("get", "csinode", node.name)["spec"].get("drivers") or []
        return any(x["name"] == CSI_DRIVER for x in drivers)
    wait("kai-csi registered with the kubelet (CSINode)", csi_registered,
         show=lambda: node.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False).stdout)
    d.namespace(node, TEAM)
    node.kubectl("create", "serviceaccount", "vgpu-viewer", "-n", NS, check=False)
    node.kubectl("create", "clusterrolebinding", "kai-dra-vgpu-viewer", "--clusterrole=cluster-admin",
                 f"--serviceaccount={NS}:vgpu-viewer", check=False)
    token = node.kubectl("create", "token", "vgpu-viewer", "-n", NS, "--duration=2h").stdout.strip()
    return Shares(node, uuids, vgpu, token)


def release_upgrade(node, *sets):
    node.helm("upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", *[a for s in sets for a in ("--set", s)],
              "--wait", "--timeout", "5m")


def ours(p):
    """What our webhook put into a stored pod: kai-csi's volume, our env."""
    vols = [v["name"] for v in p["spec"].get("volumes") or [] if (v.get("csi") or {}).get("driver") == CSI_DRIVER]
    env = [e["name"] for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]
           for e in c.get("env") or [] if e["name"] in OURS]
    return vols + env


def limit_literals(p):
    (c,) = [c for c in p["spec"]["containers"] if c["name"] == WORK]
    return [e.get("value") for e in c.get("env") or [] if e["name"] == "CUDA_DEVICE_MEMORY_LIMIT"]


# --- the driver alone: slices and the allocation ------------------------------------

def test_driver_slices(dra):
    """The node's ResourceSlice as the plugin published it: pool = the
    node, devices gpu-0 and gpu-1, each allowMultipleAllocations with memory
    80Gi (requestPolicy default 80Gi, validRange 1Gi..80Gi in 1Gi steps) and
    compute 100 (1..100 in steps of 1), and a `uuid` attribute each."""
    s = d.node_slice(dra)
    assert s["spec"]["pool"]["name"] == dra.name, s["spec"]["pool"]
    devices = {x["name"]: x for x in s["spec"]["devices"]}
    assert sorted(devices) == list(d.DEVICES), list(devices)
    for name, dev in devices.items():
        assert dev.get("allowMultipleAllocations") is True, (name, dev)
        mem, comp = dev["capacity"][d.MEMORY], dev["capacity"]["compute"]
        assert d.quantity_bytes(mem["value"]) == 80 * GIB, mem
        pol = mem["requestPolicy"]
        assert d.quantity_bytes(pol["default"]) == 80 * GIB, pol
        r = pol["validRange"]
        assert [d.quantity_bytes(r[k]) for k in ("min", "step", "max")] == [GIB, GIB, 80 * GIB], r
        assert d.quantity_bytes(comp["value"]) == 100, comp
        r = comp["requestPolicy"]["validRange"]
        assert [d.quantity_bytes(r[k]) for k in ("min", "step", "max")] == [1, 1, 100], r
        assert dev["attributes"]["uuid"]["string"].startswith("gpu-"), dev["attributes"]
    assert len(set(d.uuids(s).values())) == 2, d.uuids(s)
    print(f"slice: {d.uuids(s)}")


def test_driver_two_shares_one_gpu(dra):
    """Two pods, each with its own claim {memory: 16Gi, compute: 20} pinned
    to gpu-0: both Running (the kubelet called the plugin's
    NodePrepareResources); both results name gpu-0 of the node's pool, with
    distinct shareIDs and consumedCapacity memory 16Gi, compute 20; the CDI
    spec the plugin wrote for each says GPU_DEVICE_0_MEMORY=16Gi."""
    node = dra
    names = ("share-a", "share-b")
    try:
        for n in names:
            d.create(node, d.claim(n, memory="16Gi", compute="20", index=0), ALLOC)
            d.create(node, d.pod(n, [n]), ALLOC)
        for n in names:
            d.running(node, n, ALLOC)
        results = {n: d.allocated(node, n, ALLOC) for n in names}
        for n, rs in results.items():
            (r,) = rs
            assert (r["driver"], r["pool"], r["device"], r["request"]) == (d.DRIVER, node.name, "gpu-0", "gpu"), r
            assert r.get("shareID"), r
            assert d.consumed(r) == 16 * GIB and d.consumed(r, "compute") == 20, r["consumedCapacity"]
        assert results["share-a"][0]["shareID"] != results["share-b"][0]["shareID"], results
        assert "PrepareResourceClaims is called" in d.plugin_log(node)
        for n in names:
            uid = node.kjson("get", "resourceclaim", n, "-n", ALLOC)["metadata"]["uid"]
            cdi = d.cdi_env(node, uid)
            (dev,) = cdi.values()
            assert dev.get("GPU_DEVICE_0_MEMORY") == "16Gi" and dev.get("GPU_DEVICE_0_COMPUTE") == "20", dev
            # the claim's variable is named after the whole device name
            # (GPU_DEVICE_GPU_0_…, cdi.go), the others after its number
            assert dev.get("GPU_DEVICE_GPU_0_RESOURCE_CLAIM") == uid, dev
            print(f"{n}: share {results[n][0]['shareID']}, CDI {dev}")
        # The container itself got none of it: containerd 1.6 drops CDIDevices.
        assert d.env_of(node, "share-a", ALLOC, "GPU_DEVICE_0_MEMORY") is None
    finally:
        d.delete(node, ALLOC, names, names)


def test_driver_rounded_up(dra):
    """{memory: 16500Mi, compute: 1}: the scheduler rounds the slice up to
    the device's 1Gi step: consumedCapacity memory 17Gi (not 16500Mi),
    compute 1; the CDI spec says GPU_DEVICE_<n>_MEMORY=17Gi."""
    node = dra
    try:
        d.create(node, d.claim("rounded", memory="16500Mi", compute="1"), ALLOC)
        d.create(node, d.pod("rounded", ["rounded"]), ALLOC)
        d.running(node, "rounded", ALLOC)
        (r,) = d.allocated(node, "rounded", ALLOC)
        assert r["consumedCapacity"][d.MEMORY] == "17Gi", r["consumedCapacity"]
        assert d.consumed(r, "compute") == 1, r["consumedCapacity"]
        uid = node.kjson("get", "resourceclaim", "rounded", "-n", ALLOC)["metadata"]["uid"]
        (dev,) = d.cdi_env(node, uid).values()
        n = r["device"].removeprefix("gpu-")
        assert dev.get(f"GPU_DEVICE_{n}_MEMORY") == "17Gi", dev
    finally:
        d.delete(node, ALLOC, ["rounded"], ["rounded"])


def test_driver_two_devices(dra):
    """One request, count 2, {memory: 8Gi, compute: 1} each, distinct
    uuids: two results, gpu-0 and gpu-1, each its own share of 8Gi."""
    node = dra
    try:
        d.create(node, d.claim("pair", memory="8Gi", compute="1", count=2, distinct=True), ALLOC)
        d.create(node, d.pod("pair", ["pair"]), ALLOC)
        d.running(node, "pair", ALLOC)
        rs = d.allocated(node, "pair", ALLOC)
        assert sorted(r["device"] for r in rs) == list(d.DEVICES), rs
        assert all(d.consumed(r) == 8 * GIB and r.get("shareID") for r in rs), rs
        uid = node.kjson("get", "resourceclaim", "pair", "-n", ALLOC)["metadata"]["uid"]
        cdi = d.cdi_env(node, uid)
        assert sorted(v for dev in cdi.values() for k, v in dev.items() if k.endswith("_MEMORY")) == ["8Gi", "8Gi"], cdi
    finally:
        d.delete(node, ALLOC, ["pair"], ["pair"])


def test_driver_no_capacity_request(dra):
    """A claim stating no capacity consumes the policy's default, the whole
    device (memory 80Gi, compute 100): a second share of that device (1Gi,
    compute 1) is not allocated, its pod unschedulable."""
    node = dra
    try:
        d.create(node, d.claim("whole", index=1), ALLOC)
        d.create(node, d.pod("whole", ["whole"]), ALLOC)
        d.running(node, "whole", ALLOC)
        (r,) = d.allocated(node, "whole", ALLOC)
        assert r["device"] == "gpu-1" and d.consumed(r) == 80 * GIB and d.consumed(r, "compute") == 100, r
        d.create(node, d.claim("crowded", memory="1Gi", compute="1", index=1), ALLOC)
        d.create(node, d.pod("crowded", ["crowded"]), ALLOC)

        def unschedulable():
            p = node.kjson("get", "pod", "crowded", "-n", ALLOC)
            return [c for c in p["status"].get("conditions") or []
                    if c["type"] == "PodScheduled" and c["status"] == "False"]
        (cond,) = wait("the scheduler reports pod crowded unschedulable", unschedulable, timeout=120)
        print(f"crowded: {cond.get('reason')}: {cond.get('message', '')[:300]}")
        assert "cannot allocate all claims" in cond.get("message", ""), cond
        c = node.kjson("get", "resourceclaim", "crowded", "-n", ALLOC)
        assert not (c.get("status") or {}).get("allocation"), c["status"]
    finally:
        d.delete(node, ALLOC, ["whole", "crowded"], ["whole", "crowded"])


# --- the cap: this chart with the driver's class declared ------------------------------

def test_isolator_installed(isolator):
    """The chart runs with the class declared: the webhook and the agent
    were given --dra-memory-class gpu.example.com=memory."""
    node = isolator.node
    want = f"{d.CLASS}={d.MEMORY}"
    for kind, name in (("deployment", f"{RELEASE}-webhook"), ("daemonset", f"{RELEASE}-node")):
        spec = node.kjson("get", kind, name, "-n", NS)["spec"]["template"]["spec"]
        text = json.dumps(spec["containers"])
        assert want in text, f"{kind}/{name}: no {want}: {text[:1500]}"


def test_two_shares_one_gpu(isolator):
    """Two pods, each with its own claim {memory: 16Gi, compute: 20} on
    gpu-0: both Running; distinct shares of gpu-0 (16Gi each); each
    container's CUDA_DEVICE_MEMORY_LIMIT=16384m (the request, from the
    webhook), kai-csi's volume; the region at that cap is `capped`, and the
    agent's share says granted bytes = consumedCapacity (16Gi), on the
    slice's UUID of gpu-0; the driver's CDI spec for each claim says
    GPU_DEVICE_0_MEMORY=16Gi, our cap's source."""
    s = isolator
    names = ("two-a", "two-b")
    try:
        pods = {n: s.pod(n, [d.claim(n, memory="16Gi", compute="20", index=0)]) for n in names}
        results = {n: d.allocated(s.node, n, TEAM) for n in names}
        assert results["two-a"][0]["shareID"] != results["two-b"][0]["shareID"], results
        for n in names:
            (r,) = results[n]
            assert r["device"] == "gpu-0" and d.consumed(r) == 16 * GIB, r
            assert limit_literals(pods[n]) == ["16384m"], pods[n]["spec"]["containers"]
            assert s.env(n, "CUDA_DEVICE_MEMORY_LIMIT") == "16384m"
            assert any((v.get("csi") or {}).get("driver") == CSI_DRIVER for v in pods[n]["spec"]["volumes"]), \
                pods[n]["spec"]["volumes"]
            uid = s.node.kjson("get", "resourceclaim", n, "-n", TEAM)["metadata"]["uid"]
            (dev,) = d.cdi_env(s.node, uid).values()
            assert d.quantity_bytes(dev["GPU_DEVICE_0_MEMORY"]) == d.consumed(r), dev
        pids = {n: s.region(pods[n], 16384, 1000) for n in names}
        s.nvml({"gpu-0": {pid: 1000 for pid in pids.values()}})
        for n in names:
            row = s.row(n, "gpu-0", "capped", lambda r: r["state"] == "capped")
            assert row["limitBytes"] == 16 * GIB, row
            (share,) = s.dra_shares(n, 1)
            (r,) = results[n]
            assert share["claim"] == n and share["request"] == "gpu", share
            assert (share["driver"], share["pool"], share["device"]) == (d.DRIVER, s.node.name, "gpu-0"), share
            assert share["shareId"] == r["shareID"] and share["gpuUuid"] == s.uuids["gpu-0"], share
            assert int(share["grantedBytes"]) == d.consumed(r) == 16 * GIB, share
    finally:
        s.delete(names, names)


def test_rounded_up(isolator):
    """{memory: 16500Mi}: the limit is the request (16500m), the slice the
    scheduler rounded up (17Gi) the grant: at 16500 MiB the container is
    capped (under its grant), its share granted 17Gi; a region cap of
    17Gi + 1 MiB is above_grant."""
    s = isolator
    try:
        p = s.pod("round", [d.claim("round", memory="16500Mi", compute="1", index=0)])
        (r,) = d.allocated(s.node, "round", TEAM)
        assert d.consumed(r) == 17 * GIB, r["consumedCapacity"]
        assert s.env("round", "CUDA_DEVICE_MEMORY_LIMIT") == "16500m"
        pid = s.region(p, 16500, 1000)
        s.nvml({"gpu-0": {pid: 1000}})
        row = s.row("round", "gpu-0", "capped", lambda x: x["state"] == "capped")
        assert row["limitBytes"] == 16500 * MIB, row
        (share,) = s.dra_shares("round", 1)
        assert int(share["grantedBytes"]) == 17 * GIB, share
        s.region(p, 17 * 1024 + 1, 1000)
        row = s.row("round", "gpu-0", "above_grant", lambda x: x["state"] == "above_grant")
        assert row["limitBytes"] == (17 * 1024 + 1) * MIB, row
    finally:
        s.delete(["round"], ["round"])


def node_decided(s, name, claim_obj, devices):
    """Pod `name` naming `claim_obj`, whose slice only the allocation tells:
    admitted with the annotation naming its limits ConfigMap and the
    container's CUDA_DEVICE_MEMORY_LIMIT a required reference to its key;
    Running once the agent wrote that ConfigMap (owned by the pod,
    `<MiB>m` of the least consumed memory of its shares), the container's
    env that value, its region at that cap `capped` on each of `devices`
    with the shares granted what the allocation consumed. The results."""
    p = s.pod(name, [claim_obj])
    config_map = p["metadata"]["annotations"][ANNOTATION_LIMITS]
    assert re.fullmatch(rf"{name}-vgpu-dra-[a-z0-9]{{10}}", config_map), config_map
    (c,) = [c for c in p["spec"]["containers"] if c["name"] == WORK]
    (entry,) = [e for e in c.get("env") or [] if e["name"] == "CUDA_DEVICE_MEMORY_LIMIT"]
    assert entry["valueFrom"]["configMapKeyRef"] == {"name": config_map, "key": WORK, "optional": False}, entry
    results = d.allocated(s.node, name, TEAM)
    assert sorted(r["device"] for r in results) == sorted(devices), results
    mib = min(d.consumed(r) for r in results) // MIB
    cm = s.node.kjson("get", "configmap", config_map, "-n", TEAM)
    assert cm["data"] == {WORK: f"{mib}m"}, cm["data"]
    assert [(o["kind"], o["name"], o["uid"]) for o in cm["metadata"]["ownerReferences"]] == \
        [("Pod", name, p["metadata"]["uid"])], cm["metadata"]
    assert s.env(name, "CUDA_DEVICE_MEMORY_LIMIT") == f"{mib}m"
    pid = s.region(p, mib, 1000, devices=devices)
    s.nvml({dev: {pid: 1000} for dev in devices})
    for dev in devices:
        s.row(name, dev, "capped", lambda r: r["state"] == "capped")
    shares = s.dra_shares(name, len(devices))
    assert sorted(int(x["grantedBytes"]) for x in shares) == sorted(d.consumed(r) for r in results), shares
    return config_map


def test_no_capacity_request(isolator):
    """A claim of the declared class stating no memory takes the policy's
    default, here the whole device (80Gi): its limit is decided on the node
    (81920m, from the ConfigMap the agent wrote once the claim was
    allocated); the ConfigMap goes with the pod (garbage collector)."""
    s = isolator
    try:
        config_map = node_decided(s, "nocap", d.claim("nocap", index=1), ["gpu-1"])
    finally:
        s.delete(["nocap"], ["nocap"])

    def collected():
        return s.node.kubectl("get", "configmap", config_map, "-n", TEAM, check=False).returncode != 0
    wait(f"ConfigMap {config_map} deleted with its pod", collected)


def test_allocation_mode_all(isolator):
    """allocationMode All: every device of the class (both GPUs, each whole
    by default); the one limit, decided on the node, is 81920m on each."""
    s = isolator
    claim_obj = d.claim("every")
    exactly = claim_obj["spec"]["devices"]["requests"][0]["exactly"]
    exactly["allocationMode"] = "All"
    del exactly["count"]
    try:
        node_decided(s, "every", claim_obj, ["gpu-0", "gpu-1"])
    finally:
        s.delete(["every"], ["every"])


def test_unequal_requests_denied(isolator):
    """One container, two GPU requests stating different memory (8Gi,
    16Gi): libvgpu has one limit for every device, so the pod is denied,
    the message naming the requests and their sizes."""
    s = isolator
    c = d.claim("unequal", memory="8Gi", compute="1", index=0, request="small")
    big = d.claim("x", memory="16Gi", compute="1", index=1, request="big")["spec"]["devices"]["requests"][0]
    c["spec"]["devices"]["requests"].append(big)
    try:
        msg = s.refused("unequal", [c])
        assert "small" in msg and "big" in msg and "8Gi" in msg and "16Gi" in msg, msg
    finally:
        s.delete(["unequal"], ["unequal"])


def two_container_pod(name, claims, template=None):
    """Pod `name` of containers `work` and `side`; `claims` maps each to
    the pod claims it names. With `template`, the one pod claim `gpu` is
    made from that ResourceClaimTemplate; else each pod claim is the
    ResourceClaim of its name."""
    obj = d.pod(name)
    (first,) = obj["spec"]["containers"]
    second = json.loads(json.dumps(first))
    second["name"] = "side"
    obj["spec"]["containers"].append(second)
    for c in obj["spec"]["containers"]:
        c["resources"] = {"claims": [{"name": n} for n in claims[c["name"]]]}
    if template:
        obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    else:
        names = sorted({n for ns in claims.values() for n in ns})
        obj["spec"]["resourceClaims"] = [{"name": n, "resourceClaimName": n} for n in names]
    return obj


def template(name, **kw):
    """A ResourceClaimTemplate of d.claim(name, **kw)'s spec."""
    c = d.claim(name, **kw)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": c["spec"]}}


def made_claim(s, pod_name):
    """The ResourceClaim the controller made of the pod's template."""
    def made():
        p = s.node.kjson("get", "pod", pod_name, "-n", TEAM)
        names = [x.get("resourceClaimName") for x in (p.get("status") or {}).get("resourceClaimStatuses") or []]
        return names[0] if names and names[0] else None
    return wait(f"the claim made for pod {pod_name}", made)


def library_volumes(p):
    """{container the kai-csi volume is for: the volume's name}."""
    return {v["csi"]["volumeAttributes"]["kai-resource-isolator.io/container"]: v["name"]
            for v in p["spec"]["volumes"] if (v.get("csi") or {}).get("driver") == CSI_DRIVER}


def test_template_shared_by_two_containers(isolator):
    """One ResourceClaimTemplate {memory: 16Gi, compute: 20} on gpu-0, its
    claim named by both containers of a pod: one 16Gi slice, split between
    the two (8192m each, so together they hold to the slice); each
    container has a kai-csi volume of its own and its own region directory;
    both regions at 8192 MiB are capped, each container's share the
    allocation's (grantedBytes 16Gi) split 2; `side` raised to 8193 MiB is
    above_grant while `work` stays capped."""
    s = isolator
    try:
        d.create(s.node, template("pair", memory="16Gi", compute="20", index=0), TEAM)
        d.create(s.node, two_container_pod("pair", {WORK: ["gpu"], "side": ["gpu"]}, template="pair"), TEAM)
        p = d.running(s.node, "pair", TEAM)
        claim_name = made_claim(s, "pair")
        (r,) = d.allocated(s.node, claim_name, TEAM)
        assert d.consumed(r) == 16 * GIB, r
        vols = library_volumes(p)
        assert sorted(vols) == sorted([WORK, "side"]) and len(set(vols.values())) == 2, p["spec"]["volumes"]
        pids = {}
        for c in (WORK, "side"):
            assert d.env_of(s.node, "pair", TEAM, "CUDA_DEVICE_MEMORY_LIMIT", c) == "8192m", c
            assert d.env_of(s.node, "pair", TEAM, "CONTAINER_NAME", c) == c
            pids[c] = s.region(p, 8192, 1000, container=c)
        s.nvml({"gpu-0": {pid: 1000 for pid in pids.values()}})
        for c in (WORK, "side"):
            row = s.row("pair", "gpu-0", "capped", lambda x: x["state"] == "capped", container=c)
            assert row["limitBytes"] == 8 * GIB, row
            (share,) = s.dra_shares("pair", 1, container=c)
            assert share["claim"] == claim_name and share["shareId"] == r["shareID"], share
            # The allocation's slice, held to by the two together: each
            # container's grant is its part, grantedBytes / split.
            assert int(share["split"]) == 2 and int(share["grantedBytes"]) == 16 * GIB, share
        s.region(p, 8193, 1000, container="side")
        s.row("pair", "gpu-0", "above_grant", lambda x: x["state"] == "above_grant", container="side")
        row = s.row("pair", "gpu-0", "capped", lambda x: x["state"] == "capped")
        assert row["limitBytes"] == 8 * GIB, row
    finally:
        s.delete(["pair"])
        s.node.kubectl("delete", "resourceclaimtemplate", "pair", "-n", TEAM, "--ignore-not-found")


def test_template_without_memory_two_containers(isolator):
    """A template stating no memory, named by both containers: one
    ConfigMap, a required reference to its own key in each container, and
    the agent writes half the allocation (the whole 80Gi device: 40960m)
    to each key."""
    s = isolator
    try:
        d.create(s.node, template("pairless", index=1), TEAM)
        d.create(s.node, two_container_pod("pairless", {WORK: ["gpu"], "side": ["gpu"]},
                                           template="pairless"), TEAM)
        p = d.running(s.node, "pairless", TEAM)
        config_map = p["metadata"]["annotations"][ANNOTATION_LIMITS]
        (r,) = d.allocated(s.node, made_claim(s, "pairless"), TEAM)
        half = d.consumed(r) // 2 // MIB
        cm = s.node.kjson("get", "configmap", config_map, "-n", TEAM)
        assert cm["data"] == {WORK: f"{half}m", "side": f"{half}m"}, cm["data"]
        for c in (WORK, "side"):
            (entry,) = [e for x in p["spec"]["containers"] if x["name"] == c
                        for e in x["env"] if e["name"] == "CUDA_DEVICE_MEMORY_LIMIT"]
            assert entry["valueFrom"]["configMapKeyRef"] == {"name": config_map, "key": c, "optional": False}
            assert d.env_of(s.node, "pairless", TEAM, "CUDA_DEVICE_MEMORY_LIMIT", c) == f"{half}m", c
    finally:
        s.delete(["pairless"])
        s.node.kubectl("delete", "resourceclaimtemplate", "pairless", "-n", TEAM, "--ignore-not-found")


def test_two_containers_own_claims(isolator):
    """Two containers, each naming its own claim (8Gi and 4Gi of gpu-0):
    each capped at its own claim's memory, nothing split."""
    s = isolator
    try:
        for n, memory in (("own-a", "8Gi"), ("own-b", "4Gi")):
            d.create(s.node, d.claim(n, memory=memory, compute="1", index=0), TEAM)
        d.create(s.node, two_container_pod("own", {WORK: ["own-a"], "side": ["own-b"]}), TEAM)
        d.running(s.node, "own", TEAM)
        assert d.env_of(s.node, "own", TEAM, "CUDA_DEVICE_MEMORY_LIMIT", WORK) == "8192m"
        assert d.env_of(s.node, "own", TEAM, "CUDA_DEVICE_MEMORY_LIMIT", "side") == "4096m"
    finally:
        s.delete(["own"], ["own-a", "own-b"])


def test_two_devices(isolator):
    """count 2, {memory: 8Gi, compute: 1} each on distinct GPUs: the
    container's one limit is 8192m (libvgpu applies it to every device); a
    row per UUID, each capped with its own share granted 8Gi; one device's
    cap raised in the region is above_grant, naming that device."""
    s = isolator
    try:
        p = s.pod("pair", [d.claim("pair", memory="8Gi", compute="1", count=2, distinct=True)])
        rs = d.allocated(s.node, "pair", TEAM)
        assert sorted(r["device"] for r in rs) == list(d.DEVICES), rs
        assert s.env("pair", "CUDA_DEVICE_MEMORY_LIMIT") == "8192m"
        pid = s.region(p, 8192, 1000, devices=d.DEVICES)
        s.nvml({dev: {pid: 1000} for dev in d.DEVICES})
        for dev in d.DEVICES:
            row = s.row("pair", dev, "capped", lambda x: x["state"] == "capped")
            assert row["limitBytes"] == 8 * GIB, row
        shares = s.dra_shares("pair", 2)
        assert {x["gpuUuid"]: int(x["grantedBytes"]) for x in shares} == \
            {s.uuids[dev]: 8 * GIB for dev in d.DEVICES}, shares
        s.region(p, [8192, 8192 + 200], 1000, devices=d.DEVICES)
        row = s.row("pair", "gpu-1", "above_grant", lambda x: x["state"] == "above_grant")
        assert s.uuids["gpu-1"] in row["reason"], row
    finally:
        s.delete(["pair"], ["pair"])


def test_container_own_limit_replaced(isolator):
    """A claim container setting CUDA_DEVICE_MEMORY_LIMIT (80g) and
    CUDA_DEVICE_MEMORY_LIMIT_0 itself: under the default tenant env policy
    (replace) both are gone and ours (16384m) is the one value."""
    s = isolator
    try:
        p = s.pod("own", [d.claim("own", memory="16Gi", compute="10", index=0)],
                  env={"CUDA_DEVICE_MEMORY_LIMIT": "80g", "CUDA_DEVICE_MEMORY_LIMIT_0": "80g"})
        assert limit_literals(p) == ["16384m"], p["spec"]["containers"]
        assert s.env("own", "CUDA_DEVICE_MEMORY_LIMIT") == "16384m"
        assert not s.env("own", "CUDA_DEVICE_MEMORY_LIMIT_0")
    finally:
        s.delete(["own"], ["own"])


def test_kai_annotations_and_claim_denied(isolator):
    """A pod with KAI's gpu-fraction annotation and a GPU-memory claim is
    denied, the message naming both."""
    s = isolator
    try:
        msg = s.refused("both", [d.claim("kaiboth", memory="8Gi", compute="1")],
                        annotations={"gpu-fraction": "0.5"})
        assert "gpu-fraction" in msg and "kaiboth" in msg, msg
    finally:
        s.delete(["both"], ["kaiboth"])


def test_other_class_untouched(isolator):
    """A claim of a DeviceClass on the same driver that is not declared as
    GPU memory (gpu-unmanaged.example.com, same selector): the pod runs,
    allocated by the driver, with nothing of ours (no volume, no env); a
    plain pod likewise."""
    s = isolator
    node = s.node
    node.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": UNMANAGED},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{d.DRIVER}'"}}]}}))
    try:
        p = s.pod("other", [d.claim("other", memory="8Gi", compute="1", class_name=UNMANAGED)])
        (r,) = d.allocated(node, "other", TEAM)
        assert r["driver"] == d.DRIVER and d.consumed(r) == 8 * GIB, r
        assert not ours(p), ours(p)
        assert s.env("other", "CUDA_DEVICE_MEMORY_LIMIT") is None
        d.create(node, d.pod("plain"), TEAM)
        plain = d.running(node, "plain", TEAM)
        assert not ours(plain), ours(plain)
    finally:
        s.delete(["other", "plain"], ["other"])


def test_one_claim_two_pods(isolator):
    """One ResourceClaim named by two pods (reservedFor both): one share of
    gpu-0, the same shareID in both pods' draShares, the grant the slice's
    16Gi; each container is capped at that whole slice (its request), so
    their caps together are twice it: both above_grant, each reason naming
    the other pod and the sum (32768 MiB). (That the shared-slice state
    never evicts on its own is the agent's unit tests'; enforce is none
    here.) With one pod gone the other is capped again."""
    s = isolator
    names = ("pair-a", "pair-b")
    try:
        d.create(s.node, d.claim("pair", memory="16Gi", compute="20", index=0), TEAM)
        for n in names:
            d.create(s.node, d.pod(n, ["pair"]), TEAM)
        pods = {n: d.running(s.node, n, TEAM) for n in names}
        (r,) = d.allocated(s.node, "pair", TEAM)
        claim = s.node.kjson("get", "resourceclaim", "pair", "-n", TEAM)
        assert sorted(x["name"] for x in claim["status"]["reservedFor"]) == sorted(names), claim["status"]
        pids = {n: s.region(pods[n], 16384, 1000) for n in names}
        s.nvml({"gpu-0": {pid: 1000 for pid in pids.values()}})
        for n in names:
            (other,) = [m for m in names if m != n]
            row = s.row(n, "gpu-0", "above_grant", lambda x: x["state"] == "above_grant")
            assert other in row["reason"] and "32768" in row["reason"], row
            (share,) = s.dra_shares(n, 1)
            assert share["shareId"] == r["shareID"] and int(share["grantedBytes"]) == 16 * GIB, share
        d.delete(s.node, TEAM, ["pair-b"], [])
        s.row("pair-a", "gpu-0", "capped again alone", lambda x: x["state"] == "capped")
    finally:
        s.delete(list(names), ["pair"])


def test_restricted_namespace(isolator):
    """A Pod Security `restricted` namespace (no hostPath), CSI delivery:
    the claim pod is admitted, runs, and is capped."""
    s = isolator
    d.namespace(s.node, RESTRICTED_NS, "pod-security.kubernetes.io/enforce=restricted")
    try:
        p = s.pod("strict", [d.claim("strict", memory="16Gi", compute="10", index=0)], ns=RESTRICTED_NS,
                  security=d.RESTRICTED)
        assert not [v for v in p["spec"]["volumes"] if "hostPath" in v], p["spec"]["volumes"]
        assert d.env_of(s.node, "strict", RESTRICTED_NS, "CUDA_DEVICE_MEMORY_LIMIT", WORK) == "16384m"
        pid = s.region(p, 16384, 1000)
        s.nvml({"gpu-0": {pid: 1000}})
        row = s.row("strict", "gpu-0", "capped", lambda x: x["state"] == "capped", ns=RESTRICTED_NS)
        assert row["limitBytes"] == 16 * GIB, row
    finally:
        s.delete(["strict"], ["strict"], ns=RESTRICTED_NS)


def gone(node, name, ns=TEAM):
    r = node.kubectl("get", "pod", name, "-n", ns, check=False)
    return r.returncode != 0 and "NotFound" in r.stderr


def test_evict_needs_nvml(isolator):
    """monitor.isolation.enforce=evict, two 16Gi shares of gpu-0 whose caps
    were raised above the grant (above_grant both): the one NVML sees use
    more than the grant (plus the 512 MiB margin) is evicted, the one only
    its region says uses more is not."""
    s = isolator
    node = s.node
    release_upgrade(node, "monitor.isolation.enforce=evict")
    try:
        grant = 16384
        own_cap = grant + 4096
        regional = s.pod("regional", [d.claim("regional", memory="16Gi", compute="20", index=0)])
        seen = s.pod("seen", [d.claim("seen", memory="16Gi", compute="20", index=0)])
        (share,) = d.allocated(node, "seen", TEAM)  # read now: the eviction releases it
        p_regional = s.region(regional, own_cap, grant + 1000)  # above the grant per region only
        p_seen = s.region(seen, own_cap, grant + 100)
        s.nvml({"gpu-0": {p_regional: 1000, p_seen: grant + 600}})
        wait("pod seen evicted (NVML above its grant) and deleted", lambda: gone(node, "seen"), timeout=120,
             show=lambda: [r for r in s.rows() if r["pod"] in ("seen", "regional")])
        ev = s.events("seen", "GpuIsolationEviction")
        assert ev, "no GpuIsolationEviction Event on pod seen"
        print(f"seen: {ev[0]['message']}")
        assert str(grant) in ev[0]["message"], ev[0]["message"]
        # it names the claim and the share it was held to
        assert f"{TEAM}/seen" in ev[0]["message"] and share["shareID"] in ev[0]["message"], ev[0]["message"]
        # both were assessed in the passes that evicted seen: regional is
        # there, not being deleted, with no eviction of its own
        assert not gone(node, "regional"), "pod regional was evicted on its region alone"
        meta = node.kjson("get", "pod", "regional", "-n", TEAM)["metadata"]
        assert not meta.get("deletionTimestamp"), meta
        assert not s.events("regional", "GpuIsolationEviction")
        s.row("regional", "gpu-0", "above_grant", lambda x: x["state"] == "above_grant")
    finally:
        try:
            s.delete(["regional", "seen"], ["regional", "seen"])
        finally:
            release_upgrade(node, "monitor.isolation.enforce=none")


def test_uninstall_leaves_dra_working(isolator):
    """helm uninstall of this chart: the driver still allocates and a claim
    pod runs, with nothing of ours. Last: the module has no release after it."""
    s = isolator
    node = s.node
    node.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "5m")
    try:
        d.create(node, d.claim("after", memory="16Gi", compute="20", index=0), TEAM)
        d.create(node, d.pod("after", ["after"]), TEAM)
        p = d.running(node, "after", TEAM)
        (r,) = d.allocated(node, "after", TEAM)
        assert r["device"] == "gpu-0" and d.consumed(r) == 16 * GIB, r
        assert not ours(p), ours(p)
    finally:
        d.delete(node, TEAM, ["after"], ["after"])
