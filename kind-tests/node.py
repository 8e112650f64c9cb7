#!/usr/bin/env python3
"""Injected pods in real containers: kubelet + containerd (node.sh).

  node.py NODE_DIR TARGET_DIR HELM [--only NAME,...]

NODE_DIR is a running node.sh node (its cluster in NODE_DIR/cluster, the
node's facts in NODE_DIR/node.env); TARGET_DIR holds the built kai-webhook,
kai-node, kai-csi, kai-aggregator and libkai_fake_vgpu.so. Each line printed
is one assertion; the exit status is the number of failures (capped).

The chart is installed with libraryDelivery=hostPath and its host directory
under NODE_DIR (paths.hostInstallBase), its image the one node.sh imports
(node/kai_image.sh, from TARGET_DIR): libsync's and the node agent's
DaemonSets and the aggregator's Deployment run as real pods on the node, and
reach the API server through the `kubernetes` Service (node.sh runs
kube-proxy). The agent's NVML is the stand-in libkai_fake_nvml.so
(services/fake-nvml), given through monitor.nvml.hostLibraryDir; its config
names the containers' real host PIDs. With libraryDelivery=csi, the node
DaemonSet's pod adds kai-csi and its registrar sidecar (node/registrar's
image), which the kubelet calls for real. The webhook's Deployment runs on
the node too: the API server calls it at its pod IP, through the chart's
Service (--enable-aggregator-routing). Every component is a pod; node.py
runs none as a process (only `kai-node write-region`, to write a region as
libvgpu would). The stand-in for libvgpu.so is
libkai_fake_vgpu.so (services/fake-vgpu): loaded, it is in the process's
maps; the pods never call CUDA, so it does nothing else.
"""
import json
import os
import stat
import sys
import time

import harness
import node_migration
from harness import (CHART, FULL, HERE, NS, RELEASE, TENANT, built_library, check, create, eventually, failed,
                     grpc_tls_files, helm, http_get, kjson, kubectl, load_env, new_namespace, run, series)

OPT_OUT_NS = "opt-out-allowed"
# Labelled for the webhook to ignore: no entry of its configuration serves it.
IGNORED_NS = "ignored-ns"
IMAGE = "kai.test/debian:bookworm"
MOUNT = "/usr/local/vgpu"  # paths.containerVgpuMount: where containers see the library
LIB = f"{MOUNT}/libvgpu.so"

NODE_DIR = os.path.abspath(sys.argv[1])
TARGET = os.path.abspath(sys.argv[2])
HELM = sys.argv[3]
ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
CLUSTER = os.path.join(NODE_DIR, "cluster")
ENV = {**load_env(os.path.join(CLUSTER, "env")), **load_env(os.path.join(NODE_DIR, "node.env"))}
BIN, NODE_IP, NODE = ENV["BIN"], ENV["NODE_IP"], ENV["NODE_NAME"]
ADMIN = os.path.join(CLUSTER, "admin.kubeconfig")
WORK = os.path.join(NODE_DIR, "test")
os.makedirs(WORK, exist_ok=True)
HOST_VGPU = os.path.join(ENV["HOST_BASE"], "vgpu")  # paths.hostInstallBase + /vgpu
KAI_IMAGE = ENV["KAI_IMAGE"]  # the project's image, as node.sh imported it (node/kai_image.sh)
REGISTRAR_IMAGE = ENV["REGISTRAR_IMAGE"]  # node/registrar's (node/registrar_image.sh)
harness.setup(target=TARGET, helm=HELM, env=ENV, admin=ADMIN, pki=os.path.join(CLUSTER, "pki"), work=WORK,
              log_tail_lines=30, eventually_errors=(IndexError,))



# Reasons a container waits for that no retry within a test passes.
STUCK = ("ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
         "RunContainerError")


def stuck(p):
    """The first `waiting` state of the pod's containers whose reason is in
    STUCK, else None."""
    for cs in p["status"].get("containerStatuses", []):
        waiting = cs.get("state", {}).get("waiting", {})
        if waiting.get("reason") in STUCK:
            return waiting
    return None


def release_pod(component, what, other_than=()):
    """The release's Ready pod of `component` on the node once it is the
    only one: `other_than`, the pods a rollout replaces, gone (they would still
    answer); fails early on a container that is stuck."""
    selector = f"app.kubernetes.io/component={component}"

    def ready():
        all_pods = kjson("get", "pods", "-n", NS, "-l", selector, "--field-selector", f"spec.nodeName={NODE}")["items"]
        if any(p["metadata"]["name"] in other_than for p in all_pods):
            return None
        pods = [p for p in all_pods if not p["metadata"].get("deletionTimestamp")]
        for p in pods:
            if waiting := stuck(p):
                # Not an AssertionError: eventually() would retry it.
                raise SystemExit(f"{component} pod {p['metadata']['name']}: {waiting}")
        ok = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in p["status"].get("conditions", []))]
        return ok[0] if len(ok) == len(pods) == 1 else None
    try:
        return eventually(what, ready, timeout=90,
                          show=lambda: json.dumps([p["status"] for p in kjson("get", "pods", "-n", NS, "-l", selector)
                                                   ["items"]])[-1200:])
    except SystemExit as e:
        raise AssertionError(str(e))


LIBSYNC = {}
# A node label of the test's: the CSI part alone (--only csi) holds libsync
# back with it (librarySync.nodeSelector) until start_libsync adds it.
LIBSYNC_HOLD = ("kai-test.io/libsync", "run")


def start_libsync():
    """The chart's libsync DaemonSet, for real: its pod lands on the node once
    the node carries a GPU label (as the GPU operator labels it), runs the
    project's image (node/kai_image.sh: /artifacts/libvgpu.so is the
    stand-in) with the chart's args, the preload ConfigMap and the hostPath
    host directory, and is Ready after its first full sync. The node agent's
    DaemonSet, placed by the same label, starts with it."""
    kubectl("label", "node", NODE, "nvidia.com/gpu.present=true", "=".join(LIBSYNC_HOLD),
            "--overwrite")
    LIBSYNC["pod"] = release_pod("libsync", "the libsync DaemonSet's pod Ready on the node (first full sync)")[
        "metadata"]["name"]


def libsync_log():
    return kubectl("logs", LIBSYNC["pod"], "-n", NS, "-c", "libsync", check=False).stdout


def pod_log(pod_name, container, lines=30):
    return kubectl("logs", pod_name, "-n", NS, "-c", container, f"--tail={lines}", check=False).stdout


# --- pods ----------------------------------------------------------------------

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


def running(name, ns=TENANT, timeout=120):
    """The pod once Running with its container started; fails early on a
    container that waits for a reason that does not pass."""
    def show():
        p = kjson("get", "pod", name, "-n", ns)
        ev = kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}",
                     "-o", "custom-columns=R:.reason,M:.message", check=False).stdout
        return f"phase {p['status'].get('phase')}, {json.dumps(p['status'].get('containerStatuses'))[:400]}; events:\n{ev[-800:]}"

    def up():
        p = kjson("get", "pod", name, "-n", ns)
        if waiting := stuck(p):
            raise SystemExit(f"pod {ns}/{name}: {waiting}")
        if p["status"].get("phase") == "Running" and all(
                "running" in cs.get("state", {}) for cs in p["status"].get("containerStatuses", [])):
            return p
        return None
    try:
        return eventually(f"pod {ns}/{name} Running", up, timeout=timeout, show=show)
    except SystemExit as e:
        raise AssertionError(f"{e}; {show()}")


def exec_(name, script, ns=TENANT, check=True):
    return kubectl("exec", name, "-n", ns, "-c", "main", "--", "sh", "-c", script, check=check, timeout=30)


def logs(name, ns=TENANT):
    return kubectl("logs", name, "-n", ns, "-c", "main").stdout


def pod_checks(mode, pod_obj, *args):
    """pod_checks.py on the pod. Its hostPath layout takes the host directory
    to be the mount path (the chart's default); here the host directory is
    under the test's temp dir (paths.hostInstallBase), so the three hostPath
    paths are checked here, exactly, and handed to pod_checks.py as the
    default layout would have them."""
    pod_obj = json.loads(json.dumps(pod_obj))
    if mode == "injected" and "hostPath" in args:
        got = {v["name"]: v["hostPath"]["path"] for v in pod_obj["spec"].get("volumes", []) if "hostPath" in v}
        want = {"kai-resource-isolator-vgpu": HOST_VGPU, "kai-resource-isolator-containers": f"{HOST_VGPU}/containers",
                "kai-resource-isolator-vgpulock": f"{HOST_VGPU}/vgpulock"}
        assert got == want, f"hostPath volumes {got}, want {want}"
        for v in pod_obj["spec"]["volumes"]:
            if v["name"] in want:
                v["hostPath"]["path"] = MOUNT + v["hostPath"]["path"][len(HOST_VGPU):]
    path = os.path.join(WORK, "pod.json")
    with open(path, "w") as f:
        json.dump(pod_obj, f)
    r = run(sys.executable, os.path.join(HERE, "pod_checks.py"), mode, path, *args, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def mountinfo(name, ns=TENANT):
    """{mount point: mount options} of the container's PID 1."""
    out = {}
    for line in exec_(name, "cat /proc/1/mountinfo", ns).stdout.splitlines():
        f = line.split()
        out[f[4]] = f[5].split(",")
    return out


def delete_pod(name, ns=TENANT):
    kubectl("delete", "pod", name, "-n", ns, "--wait=true", "--timeout=60s", check=False)


def restarts(p):
    return sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", []))


# ============================================================================

def wanted(part):
    return ONLY is None or part in ONLY


def node_ready():
    n = kjson("get", "node", NODE)
    ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", n["status"]["conditions"]
    info = n["status"]["nodeInfo"]
    assert info["kubeletVersion"] == ENV["K8S_VERSION"], info
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    nodes = [x["metadata"]["name"] for x in kjson("get", "nodes")["items"]]
    assert nodes == [NODE], f"nodes {nodes}: only the real one"


# The stand-in NVML as the agent pod gets it (monitor.nvml.hostLibraryDir):
# the library and its config in one host directory, mounted read-only at
# /run/kai/nvidia-lib; the config is read again at every call.
NVML_DIR = os.path.join(WORK, "nvidia-lib")
NVML_IN_POD = "/run/kai/nvidia-lib"
GPU_UUID = "GPU-a0000000-0000-4000-8000-000000000000"


def fake_nvml(processes):
    """The GPU the stand-in NVML reports, running `processes` ({host PID:
    bytes}); written whole and renamed, so the agent never reads half."""
    os.makedirs(NVML_DIR, exist_ok=True)
    lib = os.path.join(NVML_DIR, "libkai_fake_nvml.so")
    if not os.path.exists(lib):
        with open(built_library("libkai_fake_nvml.so", "kai-fake-nvml", AssertionError), "rb") as a, \
                open(lib, "wb") as b:
            b.write(a.read())
    cfg = {"driver": "550.54.15",
           "devices": [{"uuid": GPU_UUID, "name": "NVIDIA H100 80GB HBM3", "total": 80 << 30,
                        "used": sum(processes.values()),
                        "processes": [{"pid": pid, "used": used} for pid, used in processes.items()]}]}
    with open(os.path.join(NVML_DIR, "nvml.json.new"), "w") as f:
        json.dump(cfg, f)
    os.rename(os.path.join(NVML_DIR, "nvml.json.new"), os.path.join(NVML_DIR, "nvml.json"))


def install_release():
    repo, tag = KAI_IMAGE.rsplit(":", 1)
    fake_nvml({})
    r = helm("install", RELEASE, CHART, "-n", NS, "--create-namespace",
             "--set", "libraryDelivery=hostPath", "--set", f"paths.hostInstallBase={ENV['HOST_BASE']}",
             # The project's image, imported by node.sh (node/kai_image.sh):
             # libsync's and the agent's DaemonSets and the aggregator run it.
             "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
             "--set", f"monitor.nvml.hostLibraryDir={NVML_DIR}", "--set", "monitor.nvml.library=libkai_fake_nvml.so",
             "--set", "monitor.agent.extraEnv[0].name=FAKE_NVML_CONFIG",
             "--set", f"monitor.agent.extraEnv[0].value={NVML_IN_POD}/nvml.json",
             # Short, so no_region shows within the test; long enough that a
             # pod's region is written (region_dir, enforce_evicts) first.
             "--set", "monitor.isolation.noRegionGraceSeconds=10",
             check=False)
    assert r.returncode == 0, r.stderr[-800:]
    new_namespace(TENANT)
    new_namespace(OPT_OUT_NS, "kai-resource-isolator.io/allow-opt-out=true")
    new_namespace(IGNORED_NS, "kai-resource-isolator.io/webhook=ignore")
    WEBHOOK["pod"] = release_pod("webhook", "the webhook's pod Ready")

    def mutated():
        p = gpu_pod("probe")
        p["metadata"]["namespace"] = TENANT
        out = json.loads(kubectl("create", "-f", "-", "--dry-run=server", "-o", "json", input=json.dumps(p)).stdout)
        pod_checks("injected", out, "main", MOUNT, "--delivery", "hostPath")
        return True
    eventually("a gpu-memory pod is mutated (server-side dry run) through the chart's webhook configuration", mutated, timeout=60)


def host_preload():
    return os.path.join(HOST_VGPU, "ld.so.preload")


def before_libsync():
    """A GPU-sharing pod on a node where libsync has not run yet."""
    assert not os.path.exists(HOST_VGPU) or not os.listdir(HOST_VGPU), os.listdir(HOST_VGPU)
    running(create(gpu_pod("early"))["metadata"]["name"])
    p = host_preload()
    assert os.path.isdir(p) and not os.listdir(p), \
        f"kubelet made {p} an empty directory for the subPath mount: {os.path.exists(p) and os.stat(p)}"
    inside = exec_("early", "if [ -d /etc/ld.so.preload ]; then echo dir; else echo not-dir; fi; "
                            "grep -c libvgpu.so /proc/1/maps || true").stdout.split()
    assert inside == ["dir", "0"], f"inside: /etc/ld.so.preload and libvgpu.so maps lines: {inside}"


def libsync_installs():
    start_libsync()
    p = host_preload()
    assert os.path.isfile(p), f"{p}: not a file after libsync's first sync"
    with open(p) as f:
        assert f.read().strip() == LIB, f"{p} names {open(p).read()!r}, want {LIB}"
    with open(os.path.join(HOST_VGPU, "libvgpu.so"), "rb") as a, open(built_library("libkai_fake_vgpu.so", "kai-fake-vgpu"), "rb") as b:
        assert a.read() == b.read(), "the host's libvgpu.so is not the library of the source directory"
    mode = stat.S_IMODE(os.stat(os.path.join(HOST_VGPU, "containers")).st_mode)
    assert mode == 0o1777, f"containers/ mode {oct(mode)}, want 0o1777"
    assert "removed an empty directory where a file belongs" in libsync_log(), libsync_log()[-1500:]
    p = kjson("get", "pod", LIBSYNC["pod"], "-n", NS)
    assert [c["image"] for c in p["spec"]["containers"]] == [KAI_IMAGE], p["spec"]["containers"]
    assert restarts(p) == 0, p["status"].get("containerStatuses")


def recovers():
    """Documented (docs/node-agent.md): the pod started before libsync runs
    without libvgpu until restarted; restarted, it has it."""
    delete_pod("early")
    running(create(gpu_pod("early"))["metadata"]["name"])
    maps = exec_("early", "cat /proc/1/maps").stdout
    assert LIB in maps, "libvgpu.so not in the restarted pod's /proc/1/maps"
    assert logs("early").startswith("region-dir made "), logs("early")


GPU = {}


def gpu_pod_runs():
    GPU["pod"] = running(create(gpu_pod("gpu"))["metadata"]["name"])
    pod_checks("injected", GPU["pod"], "main", MOUNT, "--delivery", "hostPath")


def preload_inside():
    out = exec_("gpu", "cat /etc/ld.so.preload").stdout.strip()
    assert out == LIB, f"/etc/ld.so.preload inside holds {out!r}, want {LIB}"


def library_mapped():
    maps = exec_("gpu", "cat /proc/1/maps").stdout
    lines = [ln for ln in maps.splitlines() if ln.endswith(LIB)]
    assert lines, "libvgpu.so is not in PID 1's maps:\n" + maps[-1500:]
    # A fresh process too (ld.so reads the preload at every exec).
    assert LIB in exec_("gpu", "cat /proc/self/maps").stdout


def mount_read_only():
    m = mountinfo("gpu")
    for path in (MOUNT, "/etc/ld.so.preload"):
        assert path in m and "ro" in m[path], f"{path}: mount options {m.get(path)}"
    for path in (f"{MOUNT}/containers", "/tmp/vgpulock"):
        assert path in m and "rw" in m[path], f"{path}: mount options {m.get(path)}"
    r = exec_("gpu", f"touch {MOUNT}/probe", check=False)
    assert r.returncode != 0 and "Read-only file system" in r.stderr, (r.returncode, r.stderr)
    r = exec_("gpu", "touch /tmp/vgpulock/probe-$$ && echo ok", check=False)
    assert r.stdout.strip() == "ok", (r.returncode, r.stderr)


def region_dir():
    p = GPU["pod"]
    uid = p["metadata"]["uid"]
    line = eventually("the container's log line", lambda: logs("gpu").strip(), timeout=30)
    want = f"region-dir made {MOUNT}/containers/{uid}_main"
    assert line == want, f"container log {line!r}, want {want!r}"
    host = os.path.join(HOST_VGPU, "containers", f"{uid}_main")
    st = os.stat(host)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (1000, 1000), \
        f"{host}: uid {st.st_uid} gid {st.st_gid} mode {oct(st.st_mode)}"
    # Now the region libvgpu would write at cuInit, and the stand-in NVML
    # seeing the container's process: the agent (Ready or not yet) must not
    # find the pod without a region past the grace.
    pid = host_pid(p)
    AGENT["gpu_pid"] = pid
    fake_nvml({pid: 512 << 20})
    write_region(p, pid, 1024, 512)


def untouched_pods():
    plain = create(pod("plain"))
    out = create(pod("opted-out", {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "false"}), ns=OPT_OUT_NS)
    for name, ns, stored in (("plain", TENANT, plain), ("opted-out", OPT_OUT_NS, out)):
        pod_checks("untouched", stored)
        running(name, ns)
        inside = exec_(name, "if [ -e /etc/ld.so.preload ]; then echo preload; else echo none; fi; "
                             "grep -c libvgpu.so /proc/1/maps || true", ns).stdout.split()
        assert inside == ["none", "0"], f"{ns}/{name} inside: {inside}"


def no_restarts():
    p = kjson("get", "pod", "gpu", "-n", TENANT)
    assert p["status"]["phase"] == "Running" and restarts(p) == 0, \
        f"phase {p['status']['phase']}, restarts {restarts(p)}"


# --- the node agent and the aggregator as real pods ------------------------------

AGENT = {}
WEBHOOK = {}


def host_pid(pod_obj, container="main"):
    """The container's PID 1 as the host sees it (containerd's task)."""
    (cs,) = [c for c in pod_obj["status"]["containerStatuses"] if c["name"] == container]
    cid = cs["containerID"].removeprefix("containerd://")
    out = run("nsenter", "-t", ENV["HOLDER_PID"], "-m", "--", "ctr", "--address", ENV["CONTAINERD_SOCK"],
              "-n", "k8s.io", "tasks", "ls").stdout
    (pid,) = [int(ln.split()[1]) for ln in out.splitlines()[1:] if ln.split()[0] == cid]
    return pid


def write_region(pod_obj, pid, limit_mib, used_mib):
    """The region libvgpu would write at cuInit (the pods never call CUDA),
    in the host's containers directory the agent pod mounts."""
    run(os.path.join(TARGET, "kai-node"), "write-region", "--containers-dir", os.path.join(HOST_VGPU, "containers"),
        "--pod-uid", pod_obj["metadata"]["uid"], "--container", "main", "--gpu-uuid", GPU_UUID,
        "--limit-mib", str(limit_mib), "--used-mib", str(used_mib), "--pid", str(pid))


def agent_grpc(method, body):
    """grpcurl to the agent pod's gRPC port (its pod IP, through the pod
    bridge), with the aggregator's client certificate when TLS is on."""
    p = AGENT["pod"]
    tls = grpc_tls_files("aggregator")
    assert tls, "no aggregator gRPC certificate: the chart's grpcTls is on by default"
    flags = ["-cacert", os.path.join(tls, "ca.crt"), "-cert", os.path.join(tls, "tls.crt"),
             "-key", os.path.join(tls, "tls.key"), "-servername", "kai-node-agent"]
    r = run(os.environ.get("GRPCURL", "grpcurl"), *flags, "-d", json.dumps(body),
            f"{p['status']['podIP']}:50051", f"vgpu.v1.VgpuNode/{method}")
    return json.loads(r.stdout)


def agent_log():
    return pod_log(AGENT["pod"]["metadata"]["name"], "agent") if "pod" in AGENT else ""


def region_events(name, reason, ns=TENANT):
    return [e for e in kjson("get", "events", "-n", ns, "--field-selector",
                             f"involvedObject.name={name}")["items"] if e["reason"] == reason]


def agent_sees_pod():
    """The chart's node DaemonSet, for real: its agent container reads the
    host's /proc (the kubelet's cgroupfs v1 path /kubepods/<qos>/pod<uid>/<id>
    names a process's pod) and the stand-in NVML, which reports the gpu
    container's real host PID on one GPU."""
    agent = release_pod("node-agent", "the node agent's DaemonSet pod Ready on the node (pod watch synced)")
    AGENT["pod"] = agent
    c = [x for x in agent["spec"]["containers"] if x["name"] == "agent"][0]
    assert c["image"] == KAI_IMAGE and f"--nvml-library={NVML_IN_POD}/libkai_fake_nvml.so" in c["args"], c
    # A static binary (the pause image's /pause) never reads
    # /etc/ld.so.preload: injected, it runs without libvgpu and no region.
    static = gpu_pod("static-bin")
    static["spec"]["containers"][0].update(image="kai.test/pause:1", command=["/pause"])
    create(static)
    running("static-bin")
    p = kjson("get", "pod", "gpu", "-n", TENANT)
    pid = AGENT["gpu_pid"]  # region_dir wrote its region
    with open(f"/proc/{pid}/cgroup") as f:
        cg = f.read()
    assert f"pod{p['metadata']['uid']}" in cg, f"/proc/{pid}/cgroup names no pod{p['metadata']['uid']}:\n{cg}"

    def listed():
        return [x for x in agent_grpc("ListContainers", {"namespace": TENANT}).get("containers", [])
                if x.get("pod") == "gpu"]
    got = eventually("the agent pod lists pod gpu over gRPC", listed, timeout=60, show=agent_log)
    assert got[0]["isolationState"] == "ISOLATION_STATE_CAPPED", got
    # docs/isolation.md: no_region, "a static or musl binary".
    eventually("a GpuRegionMissing Event on the static pod (no_region)",
               lambda: region_events("static-bin", "GpuRegionMissing"), timeout=60, show=agent_log)
    assert not region_events("gpu", "GpuRegionMissing"), region_events("gpu", "GpuRegionMissing")
    delete_pod("static-bin")
    agent = kjson("get", "pod", agent["metadata"]["name"], "-n", NS)
    assert restarts(agent) == 0, agent["status"].get("containerStatuses")


def aggregator_serves():
    """The chart's aggregator Deployment, for real: it finds the agent pod
    through the API server, subscribes to it over mutual TLS (pod to pod) and
    serves its series on the Service's :9394 to a token allowed `get
    /metrics` (Prometheus' ServiceAccount)."""
    agg = release_pod("aggregator", "the aggregator's pod Ready")
    svc = kjson("get", "service", f"{FULL}-aggregator", "-n", NS)
    (port,) = [x["port"] for x in svc["spec"]["ports"] if x["name"] == "http-metrics"]
    url = f"http://{svc['spec']['clusterIP']}:{port}/metrics"
    want = 'pod="gpu"'

    def served():
        return {k: v for k, v in series(url, "hami_vgpu_memory_used_bytes").items()
                if want in k and f'node="{NODE}"' in k}
    got = eventually(f"the aggregator's Service ({url}) serves pod gpu's series with its node label", served,
                     timeout=60, show=lambda: pod_log(agg["metadata"]["name"], "aggregator"))
    assert list(got.values()) == [512 << 20], got
    status, _ = http_get(url)
    assert status == 401, f"the aggregator's /metrics without a token: {status}"


def enforce_evicts():
    """--enforce evict (monitor.isolation.enforce): a pod whose region says
    uncapped (limit 0) while NVML sees its process use memory is evicted
    through the Eviction API, and its container really stops; the capped pod
    stays."""
    delete_pod("early")  # no region of its own: no_region would evict it too
    old = AGENT["pod"]["metadata"]["name"]
    r = helm("upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", "--set", "monitor.isolation.enforce=evict",
             check=False)
    assert r.returncode == 0, r.stderr[-800:]
    AGENT["pod"] = release_pod("node-agent", "the agent pod of the rolled DaemonSet Ready", other_than=[old])
    (c,) = [x for x in AGENT["pod"]["spec"]["containers"] if x["name"] == "agent"]
    assert "--enforce=evict" in c["args"], c["args"]
    greedy = running(create(gpu_pod("greedy"))["metadata"]["name"])
    pid = host_pid(greedy)
    write_region(greedy, pid, 0, 700)
    fake_nvml({AGENT["gpu_pid"]: 512 << 20, pid: 700 << 20})

    def gone():
        r = kubectl("get", "pod", "greedy", "-n", TENANT, "-o", "json", check=False)
        return r.returncode != 0 and "NotFound" in r.stderr
    eventually("pod greedy evicted and deleted", gone, timeout=90, show=agent_log)
    # The kubelet stopped its container: the process is gone from the host.
    eventually(f"the greedy container's process (host PID {pid}) gone", lambda: not os.path.exists(f"/proc/{pid}"),
               timeout=60)
    ev = region_events("greedy", "GpuIsolationEviction")
    assert ev and "uncapped" in ev[0]["message"].lower(), ev
    assert not region_events("gpu", "GpuIsolationEviction"), region_events("gpu", "GpuIsolationEviction")
    evicted = series(f"http://{AGENT['pod']['status']['podIP']}:9394/metrics", "kai_isolator_evictions_total")
    assert evicted.get('kai_isolator_evictions_total{reason="uncapped_no_limit"}') == 1, evicted


def opted_out_kept():
    """Under --enforce evict, the pods the webhook leaves uninjected by the
    administrator's choice are neither no_region nor evicted (evicted, they
    would come back as they were, over and over): one that opted out where
    its namespace allows it, and one in a namespace labelled for the
    webhook to ignore (the agent reads the chart's MutatingWebhookConfiguration
    and the namespaces' labels: were either refused it, that pod would be
    evicted). The same opt-out request on an uninjected pod of a namespace
    that does not allow it (created plain, annotated after admission, as a
    tenant could) counts for nothing: that pod is evicted (no_region),
    which is also the event the others' absence of one is counted against."""
    kept = {OPT_OUT_NS: create(pod("opted-out-2", {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "false"}),
                               ns=OPT_OUT_NS),
            IGNORED_NS: create(pod("ignored-0", {"gpu-memory": "1024"}), ns=IGNORED_NS)}
    for p in kept.values():
        assert not any(v["name"] == "kai-resource-isolator-vgpu" for v in p["spec"].get("volumes", [])), p["spec"]
    sneaky = create(pod("no-region"))
    assert not any(v["name"] == "kai-resource-isolator-vgpu" for v in sneaky["spec"].get("volumes", [])), sneaky["spec"]
    kubectl("annotate", "pod", "no-region", "-n", TENANT, "gpu-memory=1024", "kai-resource-isolator.io/inject=false")
    for ns, p in kept.items():
        running(p["metadata"]["name"], ns)
    running("no-region")

    def evicted():
        return region_events("no-region", "GpuIsolationEviction")
    ev = eventually("the uninjected pod that asked to opt out where it may not evicted (no_region past the grace)",
                    evicted, timeout=90, show=agent_log)
    assert "no_region" in ev[0]["message"], ev[0]["message"]
    for ns, p in kept.items():
        name = p["metadata"]["name"]
        for reason in ("GpuRegionMissing", "GpuIsolationEviction"):
            assert not region_events(name, reason, ns), region_events(name, reason, ns)
        p = kjson("get", "pod", name, "-n", ns)
        assert p["status"]["phase"] == "Running" and not p["metadata"].get("deletionTimestamp") and restarts(p) == 0, \
            p["status"]
        delete_pod(name, ns)


# --- the CSI delivery: kai-csi, a real pod the kubelet calls ----------------------

CSI_DRIVER = "vgpu.kai-resource-isolator.io"
RESTRICTED = "restricted-ns"
CSI = {}


def csi_listed():
    drivers = kjson("get", "csinode", NODE)["spec"].get("drivers") or []
    return [d for d in drivers if d["name"] == CSI_DRIVER and d["nodeID"] == NODE]


def csi_registered():
    registry, name = REGISTRAR_IMAGE.split("/", 1)
    repo, tag = name.rsplit(":", 1)
    # The pods the upgrade replaces, as the API server has them now.
    old, old_webhook = ([p["metadata"]["name"] for p in kjson("get", "pods", "-n", NS, "-l",
                                                            f"app.kubernetes.io/component={component}")["items"]]
                        for component in ("node-agent", "webhook"))
    # Without the hostpath part, libsync has not run: a node selector of
    # the test's holds it back (start_libsync labels the node for it) while
    # the node DaemonSet (agent, kai-csi) runs, so the CSI part starts
    # before libsync ran.
    helm_key = "librarySync.nodeSelector." + LIBSYNC_HOLD[0].replace(".", "\\.")  # --set escapes a key's dots
    hold = [] if "pod" in LIBSYNC else ["--set-string", f"{helm_key}={LIBSYNC_HOLD[1]}"]
    r = helm("upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", *hold,
             "--set", "libraryDelivery=csi", "--set", f"csi.kubeletDir={ENV['KUBELET_ROOT']}",
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
    WEBHOOK["pod"] = release_pod("webhook", "the rolled webhook's pod Ready, the old one gone", other_than=old_webhook)
    (c,) = [x for x in WEBHOOK["pod"]["spec"]["containers"] if x["name"] == "webhook"]
    assert {"name": "LIBRARY_DELIVERY", "value": "csi"} in c["env"], c["env"]
    kjson("get", "csidriver", CSI_DRIVER)
    if "pod" not in LIBSYNC:
        kubectl("label", "node", NODE, "nvidia.com/gpu.present=true", "--overwrite")
    CSI["old"] = old


def csi_pod_registered():
    """The node DaemonSet's pod with the chart's csi and csi-registrar
    containers, for real: kai-csi privileged with the kubelet's directory
    mounted Bidirectional, the registrar (node/registrar's image) asks it
    for its name and registers it in the kubelet's plugins_registry; the
    kubelet lists the driver in CSINode and the pod is Ready (the
    registrar's /healthz says the kubelet registered it)."""
    p = release_pod("node-agent", "the node DaemonSet's pod with kai-csi and its registrar Ready",
                    other_than=CSI.get("old", []))
    CSI["node_pod"] = p
    names = [c["name"] for c in p["spec"]["containers"]]
    assert {"csi", "csi-registrar"} <= set(names), names
    (reg,) = [c for c in p["spec"]["containers"] if c["name"] == "csi-registrar"]
    assert reg["image"] == REGISTRAR_IMAGE, reg["image"]
    eventually(f"the kubelet lists {CSI_DRIVER} in CSINode {NODE}", csi_listed, timeout=60,
               show=lambda: pod_log(p["metadata"]["name"], "csi-registrar"))
    assert "kubelet registered" in pod_log(p["metadata"]["name"], "csi-registrar", 100)


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


def csi_pod_runs():
    new_namespace(RESTRICTED, "pod-security.kubernetes.io/enforce=restricted")
    stored = create(restricted_gpu_pod("gpu-csi"), ns=RESTRICTED)
    pod_checks("injected", stored, "main", MOUNT, "--delivery", "csi")
    if "pod" not in LIBSYNC:
        # docs/isolation.md: before libsync ran, publishing answers
        # Unavailable; the kubelet retries and the pod starts once the
        # library is there, instead of starting without it.
        def refused():
            ev = kjson("get", "events", "-n", RESTRICTED, "--field-selector", "involvedObject.name=gpu-csi")["items"]
            return [e for e in ev if e["reason"] == "FailedMount" and "is not installed yet" in e["message"]]
        eventually("a FailedMount event: kai-csi answered Unavailable, libvgpu.so not installed yet", refused, timeout=60)
        p = kjson("get", "pod", "gpu-csi", "-n", RESTRICTED)
        assert p["status"].get("phase") == "Pending", p["status"].get("phase")
        CSI["waited_for_libsync"] = True
        start_libsync()
    CSI["pod"] = running("gpu-csi", RESTRICTED)


def csi_inside():
    ns, uid = RESTRICTED, CSI["pod"]["metadata"]["uid"]
    out = exec_("gpu-csi", "cat /etc/ld.so.preload", ns).stdout.strip()
    assert out == LIB, f"/etc/ld.so.preload inside holds {out!r}"
    assert LIB in exec_("gpu-csi", "cat /proc/1/maps", ns).stdout, "libvgpu.so not in /proc/1/maps"
    m = mountinfo("gpu-csi", ns)
    for path in (MOUNT, "/etc/ld.so.preload"):
        assert path in m and "ro" in m[path], f"{path}: mount options {m.get(path)}"
    r = exec_("gpu-csi", f"touch {MOUNT}/probe", ns, check=False)
    assert r.returncode != 0 and "Read-only file system" in r.stderr, (r.returncode, r.stderr)
    # Its own region directory only, made by the container's process path
    # (mkdir -p finds it there), writable by uid 1000.
    seen = exec_("gpu-csi", f"ls {MOUNT}/containers", ns).stdout.split()
    assert seen == [f"{uid}_main"], f"{MOUNT}/containers inside lists {seen}, want only {uid}_main"
    line = eventually("the container's log line", lambda: logs("gpu-csi", ns).strip(), timeout=30)
    assert line == f"region-dir made {MOUNT}/containers/{uid}_main", line
    host = os.path.join(HOST_VGPU, "containers", f"{uid}_main")
    st = os.stat(host)
    assert (st.st_uid, st.st_gid) == (1000, 2000), f"{host}: owner {st.st_uid}:{st.st_gid}, want 1000:2000"
    p = kjson("get", "pod", "gpu-csi", "-n", ns)
    assert restarts(p) == 0, restarts(p)


def csi_region_writable():
    ns, uid = RESTRICTED, CSI["pod"]["metadata"]["uid"]
    r = exec_("gpu-csi", f"echo usage > {MOUNT}/containers/{uid}_main/probe", ns, check=False)
    if r.returncode != 0:
        inside = [ln for ln in exec_("gpu-csi", "cat /proc/1/mountinfo", ns).stdout.splitlines() if MOUNT in ln]
        node = [ln for ln in open(f"/proc/{ENV['HOLDER_PID']}/mountinfo").read().splitlines() if uid in ln]
        raise AssertionError(f"the container cannot write into its region directory: {r.stderr.strip()}\n"
                             "its mounts:\n  " + "\n  ".join(inside) + "\nthe pod's mounts on the node:\n  "
                             + "\n  ".join(node))
    with open(os.path.join(HOST_VGPU, "containers", f"{uid}_main", "probe")) as f:
        assert f.read() == "usage\n"


def csi_without_containers_subpath():
    """The webhook's csi volume and mounts less the `containers` subPath
    mount (a pod may declare our volume itself): the region directory, which
    kai-csi binds inside the volume, reaches the container through the
    volume's own (recursive) mount at MOUNT, writable."""
    stored = CSI["pod"]
    spec = json.loads(json.dumps(stored["spec"]))
    (vol,) = [v for v in spec["volumes"] if v["name"] == "kai-resource-isolator-vgpu"]
    c = spec["containers"][0]
    mounts = [m for m in c["volumeMounts"] if m["name"] == vol["name"] and m.get("subPath") != "containers"]
    p = pod("csi-no-subpath", script="exec sleep infinity")
    p["metadata"]["labels"] = {"kai-resource-isolator.io/webhook": "ignore"}
    p["spec"]["securityContext"] = spec["securityContext"]
    p["spec"]["volumes"] = [vol]
    p["spec"]["containers"][0].update(securityContext=c["securityContext"], volumeMounts=mounts,
                                      env=[{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}])
    uid = create(p, ns=RESTRICTED)["metadata"]["uid"]
    running("csi-no-subpath", RESTRICTED)
    r = exec_("csi-no-subpath", f"echo usage > {MOUNT}/containers/${{POD_UID}}_main/probe && ls {MOUNT}/containers",
              RESTRICTED, check=False)
    assert r.returncode == 0 and r.stdout.split() == [f"{uid}_main"], (r.returncode, r.stdout, r.stderr)
    with open(os.path.join(HOST_VGPU, "containers", f"{uid}_main", "probe")) as f:
        assert f.read() == "usage\n"


def release_logs():
    """The last lines of each release pod's containers (before they go)."""
    for p in kjson("get", "pods", "-n", NS)["items"]:
        for c in p["spec"]["containers"]:
            print(f"--- {p['metadata']['name']} {c['name']} (last lines) ---\n"
                  + pod_log(p["metadata"]["name"], c["name"], 15), flush=True)


def uninstall():
    for ns in (TENANT, OPT_OUT_NS, RESTRICTED):
        kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=90s", check=False)
    pods_dir = os.path.join(ENV["KUBELET_ROOT"], "pods")

    def leftover_dirs():
        """Pod directories of pods no longer in the API: the kubelet still
        has to unpublish their volumes (kai-csi's among them)."""
        live = {p["metadata"]["uid"] for p in kjson("get", "pods", "-A", "--field-selector",
                                                       f"spec.nodeName={NODE}")["items"]}
        return sorted(set(os.listdir(pods_dir)) - live)
    # The kubelet unpublishes a deleted pod's CSI volume after the pod has
    # gone from the API; uninstalling before that leaves the volume mounted
    # on the node (no plugin to call), so the tenants' pod directories must
    # go first (chart README, "Going back to hostPath (or uninstalling)").
    eventually("the kubelet unmounted the deleted pods' volumes and removed their directories",
               lambda: not leftover_dirs(), timeout=60, show=leftover_dirs)
    r = helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "90s", check=False)
    assert r.returncode == 0, r.stderr[-600:]
    # The release's own pods (libsync's DaemonSet) go through the garbage
    # collector once their DaemonSet is deleted, after helm returned.
    def left():
        return [f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                for p in kjson("get", "pods", "-A", "--field-selector", f"spec.nodeName={NODE}")["items"]]
    eventually("no pod left on the node", lambda: not left(), timeout=90, show=left)
    # Nothing of a pod left mounted or running on the node: the kubelet
    # removed every pod directory.
    eventually("the kubelet removed the pods' directories", lambda: not os.listdir(pods_dir), timeout=60,
               show=lambda: os.listdir(pods_dir))


def main():
    t0 = time.monotonic()
    check(f"node {NODE}: a real kubelet {ENV['K8S_VERSION']} on containerd registered Ready, the only node", node_ready)
    if wanted("migration"):  # a Go chart release moved to this chart and back (node_migration.py)
        node_migration.run_migration(running, exec_)
    if not check("helm install (libraryDelivery=hostPath, host directory under the test's temp dir); "
                 "the webhook's Deployment pod Ready, called by the API server through the chart's Service: "
                 "a gpu-memory pod is mutated", install_release):
        return
    if wanted("hostpath"):
        if check("before libsync ran: the gpu-memory pod runs, kubelet made <host>/ld.so.preload an empty directory, "
                 "inside /etc/ld.so.preload is a directory and libvgpu.so is not loaded", before_libsync):
            if check("libsync, the chart's DaemonSet pod (the project's image, scheduled once the node is labelled "
                     "a GPU node), replaces that directory with the file naming libvgpu.so, installs the library "
                     "and a 1777 containers/, 0 restarts", libsync_installs):
                check("the pod started before libsync, restarted, has libvgpu.so in /proc/1/maps", recovers)
        else:
            check("libsync, the chart's DaemonSet pod, installs", libsync_installs)
        if check("a gpu-memory pod in a dynamic Debian image as uid 1000 runs, mutated with the hostPath delivery",
                 gpu_pod_runs):
            check(f"inside, /etc/ld.so.preload names {LIB}", preload_inside)
            check("libvgpu.so (the stand-in) is in /proc/1/maps and in a fresh process's maps", library_mapped)
            check(f"{MOUNT} and /etc/ld.so.preload are read-only mounts (a write fails: Read-only file system); "
                  f"{MOUNT}/containers and /tmp/vgpulock are writable", mount_read_only)
            check("the container's process (uid 1000) made <mount>/containers/<podUID>_main from the injected env; "
                  "the node sees it owned 1000:1000", region_dir)
            if check("the node agent, the chart's DaemonSet pod (the project's image, the host's /proc, the stand-in "
                     "NVML through monitor.nvml.hostLibraryDir naming the container's host PID, whose cgroup is the "
                     "kubelet's cgroupfs v1 pod<uid> path), serves the pod's region over gRPC at its pod IP, named "
                     "from the API server through the kubernetes Service, capped; an injected pod of a static "
                     "binary (the pause image) gets a GpuRegionMissing Event (no_region), the gpu pod none; "
                     "0 restarts", agent_sees_pod):
                check("the aggregator, the chart's Deployment pod, subscribes to the agent pod over mutual TLS and "
                      "serves pod gpu's HAMi series with its node label on its Service's :9394 (Prometheus' token; "
                      "401 without)", aggregator_serves)
                check("helm upgrade monitor.isolation.enforce=evict: the rolled agent evicts an uncapped pod (limit 0, "
                      "NVML sees its process use memory) through the Eviction API, its container's process is gone "
                      "from the node, a GpuIsolationEviction Event and kai_isolator_evictions_total"
                      "{reason=uncapped_no_limit} 1; the capped gpu pod stays", enforce_evicts)
                check("under enforce=evict, a gpu-memory pod that opted out (its namespace allows it) and one in a "
                      "namespace labelled webhook=ignore (the agent reads the webhook's configuration) are neither "
                      "no_region nor evicted, while an uninjected pod annotated gpu-memory and inject=false after "
                      "admission in a namespace that does not allow it is evicted (no_region)", opted_out_kept)
        check("a plain pod and an opted-out pod run untouched: no /etc/ld.so.preload, no libvgpu.so mapped", untouched_pods)
        check("the gpu-memory pod is still Running with 0 restarts", no_restarts)
    if wanted("csi"):
        if check("helm upgrade to libraryDelivery=csi (csi.kubeletDir = the kubelet's --root-dir): the webhook "
                 "restarted from the Deployment delivers csi, the CSIDriver exists", csi_registered):
            # The chart registers kai-csi through its csi-registrar sidecar
            # (node-driver-registrar: kai-csi's own registration socket
            # refuses the kubelet's :authority, hyperium/h2#487). That image
            # is in no registry here: node/registrar (Go) does its job with
            # the same flags, in an image of its own (node.sh).
            registered = check("kai-csi and its csi-registrar sidecar, containers of the node DaemonSet's pod (kai-csi "
                               "privileged, the kubelet's directory Bidirectional; node/registrar's image in "
                               "node-driver-registrar's place): the kubelet lists the driver in CSINode, the pod "
                               "is Ready", csi_pod_registered)
            if registered and check("a gpu-memory pod in a Pod Security restricted namespace (uid 1000, gid 2000) is admitted with "
                                    "the csi volume and runs: the kubelet called kai-csi"
                                    + ("" if "pod" in LIBSYNC else "; before libsync ran it waited (FailedMount: "
                                       "not installed yet) and started once libsync installed the library"),
                                    csi_pod_runs):
                check("inside: the preload names libvgpu.so, it is mapped, the library and preload are read-only; "
                      f"{MOUNT}/containers lists only its own directory, owned 1000:2000 on the node", csi_inside)
                # Was read-only while the webhook added a `containers` subPath
                # mount (the kubelet's non-recursive bind of the volume's
                # containers/ covered the region directory); fixed in f1f1de5.
                check(f"the container (uid 1000) writes into its region directory {MOUNT}/containers/<podUID>_main "
                      "and the node sees the file", csi_region_writable)
                check("a pod declaring the csi volume itself (the webhook's volume and mounts, no `containers` subPath, "
                      "the webhook skipped): its region directory reaches it through the volume's mount, writable, "
                      "only its own", csi_without_containers_subpath)
    if failed:
        release_logs()
    check("all pods deleted and helm uninstall: no pod left on the node, the kubelet removed their directories", uninstall)
    print(f"node.py: {harness.passed} passed, {len(failed)} failed "
          f"in {time.monotonic() - t0:.0f} s", flush=True)
    for name in failed:
        print(f"  failed: {name}")


if __name__ == "__main__":
    main()
    sys.exit(min(len(failed), 100))
