#!/usr/bin/env python3
"""What the webhook must have done to a pod, checked on a Pod object.

Used by run.sh on the live pod (`kubectl get pod -o json`) and by local.sh on
the pod with the webhook's JSON patch applied, so both hold the same shape.

  pod_checks.py apply POD.json REVIEW_RESPONSE.json   print the patched pod
  pod_checks.py injected POD.json CONTAINER [MOUNT]   three volumes, four mounts, three env vars
  pod_checks.py untouched POD.json                    nothing of ours anywhere

Exit status 0 when the check holds; 1 with one line per difference.
"""
import base64
import json
import sys

VOLUMES = ("kai-resource-isolator-vgpu", "kai-resource-isolator-containers", "kai-resource-isolator-vgpulock")


def pointer(path):
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def apply_patch(doc, ops):
    """RFC 6902 add/replace/remove: what the webhook emits."""
    for op in ops:
        *parents, last = pointer(op["path"])
        target = doc
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        kind = op["op"]
        if kind == "add":
            if isinstance(target, list):
                target.insert(len(target) if last == "-" else int(last), op["value"])
            else:
                target[last] = op["value"]
        elif kind == "replace":
            target[int(last) if isinstance(target, list) else last] = op["value"]
        elif kind == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise SystemExit(f"unexpected patch op {kind!r} at {op['path']}")
    return doc


def all_containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", [])


def injected(pod, container, mount):
    spec = pod["spec"]
    problems = []
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    want_volumes = {
        "kai-resource-isolator-vgpu": mount,
        "kai-resource-isolator-containers": mount + "/containers",
        # libvgpu's /tmp/vgpulock, kept under the host directory on the host.
        "kai-resource-isolator-vgpulock": mount + "/vgpulock",
    }
    for name, path in want_volumes.items():
        host = volumes.get(name, {}).get("hostPath")
        if host != {"path": path, "type": "DirectoryOrCreate"}:
            problems.append(f"volume {name}: want hostPath {path} DirectoryOrCreate, got {volumes.get(name)}")
    target = [c for c in all_containers(spec) if c["name"] == container]
    if len(target) != 1:
        return problems + [f"container {container}: found {len(target)}"]
    c = target[0]
    mounts = [m for m in c.get("volumeMounts", []) if m["name"] in VOLUMES]
    want_mounts = [
        # Read-only: a workload must not replace libvgpu.so or ld.so.preload
        # for every pod on the node; only containers/ (below) is writable.
        {"name": "kai-resource-isolator-vgpu", "mountPath": mount, "readOnly": True},
        {"name": "kai-resource-isolator-vgpu", "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload", "readOnly": True},
        {"name": "kai-resource-isolator-containers", "mountPath": mount + "/containers"},
        {"name": "kai-resource-isolator-vgpulock", "mountPath": "/tmp/vgpulock"},
    ]

    def norm(m):  # the API server may spell read-write as readOnly: false
        m = {k: v for k, v in m.items() if k in ("name", "mountPath", "subPath", "readOnly")}
        if m.get("readOnly") is False:
            del m["readOnly"]
        return m

    got = sorted((norm(m) for m in mounts), key=lambda m: m["mountPath"])
    if got != sorted(want_mounts, key=lambda m: m["mountPath"]):
        problems.append(f"mounts of {container}: want {want_mounts}, got {got}")
    paths = [m["mountPath"] for m in mounts]
    if mount in paths and mount + "/containers" in paths and paths.index(mount) > paths.index(mount + "/containers"):
        problems.append(f"mounts of {container}: {mount}/containers must come after {mount} (nested mount)")
    env = {e["name"]: e for e in c.get("env", [])}
    pod_uid = env.get("POD_UID", {}).get("valueFrom", {}).get("fieldRef", {})
    if pod_uid.get("fieldPath") != "metadata.uid" or pod_uid.get("apiVersion", "v1") != "v1":
        problems.append(f"env POD_UID: want fieldRef metadata.uid, got {env.get('POD_UID')}")
    if env.get("CONTAINER_NAME", {}).get("value") != container:
        problems.append(f"env CONTAINER_NAME: want {container}, got {env.get('CONTAINER_NAME')}")
    if env.get("CONTAINER_VGPU_MOUNT", {}).get("value") != mount:
        problems.append(f"env CONTAINER_VGPU_MOUNT: want {mount}, got {env.get('CONTAINER_VGPU_MOUNT')}")
    if "CUDA_DEVICE_MEMORY_SHARED_CACHE" in env:
        problems.append("env CUDA_DEVICE_MEMORY_SHARED_CACHE is set: it disables the per-container cache")
    # Only the target: preloading where there is no driver kills the process.
    for other in all_containers(spec):
        if other["name"] != container:
            problems += [f"container {other['name']} (not the target) was touched: {p}" for p in ours(other)]
    return problems


def ours(container):
    found = [f"mount {m['mountPath']}" for m in container.get("volumeMounts", []) if m["name"] in VOLUMES]
    found += [f"env {e['name']}" for e in container.get("env", []) if e["name"] in ("POD_UID", "CONTAINER_NAME", "CONTAINER_VGPU_MOUNT")]
    return found


def untouched(pod):
    spec = pod["spec"]
    problems = [f"volume {v['name']}" for v in spec.get("volumes", []) if v["name"] in VOLUMES]
    for c in all_containers(spec):
        problems += [f"container {c['name']}: {p}" for p in ours(c)]
    return problems


def load(path):
    with open(path) as f:
        return json.load(f)


def main(argv):
    if len(argv) >= 3 and argv[0] == "apply":
        response = load(argv[2])["response"]
        pod = load(argv[1])
        if "patch" in response:
            if response.get("patchType") != "JSONPatch":
                raise SystemExit(f"patchType {response.get('patchType')!r}")
            pod = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        json.dump(pod, sys.stdout)
        return 0
    if len(argv) >= 3 and argv[0] == "injected":
        problems = injected(load(argv[1]), argv[2], argv[3] if len(argv) > 3 else "/usr/local/vgpu")
    elif len(argv) == 2 and argv[0] == "untouched":
        problems = untouched(load(argv[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
