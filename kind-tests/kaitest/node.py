"""node.sh's real node as a suite holds it: `node.sh --up` brings up the
control plane and a real kubelet on containerd and returns; `up()` reads
what it wrote (NODE_DIR/cluster/env, NODE_DIR/node.env) into a `Node`, and
takes the node down again (`node.sh --down`) when the suite is done.
"""
import contextlib
import json
import os
import re
import shutil
import subprocess

from kaitest.chart import helm_binary

NODE_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node.sh")

# What node.sh's image and the node's stand-ins are made of: the packages to
# build and the files they leave in the target directory.
PACKAGES = ("kai-webhook", "kai-node", "kai-csi", "kai-aggregator", "kai-fake-vgpu", "kai-fake-nvml")
FILES = ("kai-webhook", "kai-node", "kai-csi", "kai-aggregator", "libkai_fake_vgpu.so", "libkai_fake_nvml.so")


class Node:
    """A running node.sh node: its env files, kubectl/helm as the cluster's
    admin, ctr in the node's mount namespace."""

    def __init__(self, node_dir, out, target=None):
        self.dir, self.out, self.target = node_dir, out, target
        self.env = {}
        for path in (os.path.join(node_dir, "cluster", "env"), os.path.join(node_dir, "node.env")):
            for line in open(path):
                k, sep, v = line.strip().removeprefix("export ").partition("=")
                if sep:
                    self.env[k] = v.strip('"')
        self.name = self.env["NODE_NAME"]
        self.admin = os.path.join(node_dir, "cluster", "admin.kubeconfig")

    def run(self, *args, check=True, timeout=300, input=None, env=None):
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input,
                           env=None if env is None else {**os.environ, **env})
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, args[:8]))}…: rc {r.returncode}: {(r.stderr or r.stdout)[-1500:]}")
        return r

    def kubectl(self, *args, **kw):
        return self.run(os.path.join(self.env["BIN"], "kubectl"), "--kubeconfig", self.admin, *args, **kw)

    def kjson(self, *args):
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def helm(self, *args, timeout=900):
        return self.run(helm_binary(), "--kubeconfig", self.admin, *args, timeout=timeout)

    def ctr(self, *args, timeout=300):
        return self.run("nsenter", "-t", self.env["HOLDER_PID"], "-m", "--", "ctr", "--address",
                        self.env["CONTAINERD_SOCK"], "-n", "k8s.io", *args, timeout=timeout)

    def host_pid(self, pod, container):
        """`container`'s PID 1 in `pod` (as stored) as the host sees it:
        its containerd task."""
        (cs,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == container]
        cid = cs["containerID"].removeprefix("containerd://")
        out = self.ctr("tasks", "ls").stdout
        (pid,) = [int(ln.split()[1]) for ln in out.splitlines()[1:] if ln.split()[0] == cid]
        return pid

    def write_region(self, pod, container, pid, limits_mib, used_mib, gpus):
        """The region libvgpu writes at cuInit (the pods never call CUDA),
        with `kai-node write-region`, in the host's containers directory
        (paths.hostInstallBase/vgpu): a cap per GPU of `gpus` (one figure
        in `limits_mib` for all, or one each), one live slot of host PID
        `pid` using `used_mib` on each."""
        self.run(os.path.join(self.target, "kai-node"), "write-region", "--containers-dir",
                 os.path.join(self.env["HOST_BASE"], "vgpu", "containers"), "--pod-uid", pod["metadata"]["uid"],
                 "--container", container, *[a for g in gpus for a in ("--gpu-uuid", g)],
                 *[a for m in limits_mib for a in ("--limit-mib", str(m))],
                 "--used-mib", str(used_mib), "--pid", str(pid))


@contextlib.contextmanager
def up(target, out):
    """node.sh --up with the binaries in `target` (node.sh's log in
    out/node.log); the Node, taken down (node.sh --down) on leaving."""
    if os.geteuid() != 0:
        raise AssertionError("needs root: node.sh runs containerd and the kubelet")
    log = os.path.join(out, "node.log")
    with open(log, "w") as f:
        r = subprocess.run(["bash", NODE_SH, "--up", target], stdout=f, stderr=subprocess.STDOUT, timeout=1200)
    text = open(log, errors="replace").read()
    dirs = re.findall(r"^NODE_DIR=(\S+)$", text, re.M)
    assert r.returncode == 0 and dirs, f"node.sh --up: rc {r.returncode}:\n{text[-3000:]}"
    node = Node(dirs[-1], out, target)
    try:
        yield node
    finally:
        with open(log, "a") as f:
            subprocess.run(["bash", NODE_SH, "--down", node.dir], stdout=f, stderr=subprocess.STDOUT, timeout=600)


def fake_nvml(directory, library, devices):
    """The stand-in NVML as the agent pod loads it (chart
    monitor.nvml.hostLibraryDir = `directory`, FAKE_NVML_CONFIG its
    nvml.json): `library` (libkai_fake_nvml.so) copied there once, and
    `devices` ([{uuid, name, total, processes: {host PID: bytes}}]) written
    whole and renamed, so the agent (which re-reads it at every call) never
    reads half."""
    os.makedirs(directory, exist_ok=True)
    lib = os.path.join(directory, "libkai_fake_nvml.so")
    if not os.path.exists(lib):
        shutil.copyfile(library, lib)
    cfg = {"driver": "550.54.15",
           "devices": [{"uuid": d["uuid"], "name": d["name"], "total": d["total"],
                        "used": sum(d["processes"].values()),
                        "processes": [{"pid": pid, "used": used} for pid, used in d["processes"].items()]}
                       for d in devices]}
    with open(os.path.join(directory, "nvml.json.new"), "w") as f:
        json.dump(cfg, f)
    os.rename(os.path.join(directory, "nvml.json.new"), os.path.join(directory, "nvml.json"))
