#!/usr/bin/env python3
"""What the webhook must have done to a pod, checked on a Pod object.

Used by run.sh on the live pod (`kubectl get pod -o json`), by local.sh on
the pod with the webhook's JSON patch applied and by test_apiserver.py on
the stored pod, so all hold the same shape.

  pod_checks.py apply POD.json REVIEW_RESPONSE.json   print the patched pod
  pod_checks.py injected POD.json CONTAINER [MOUNT] [--delivery csi|hostPath]
  pod_checks.py untouched POD.json                    nothing of ours anywhere

`injected` checks the delivery the pod carries (its kai-resource-isolator-vgpu
volume), strictly; --delivery also requires that one.

- csi: exactly one volume of ours, the inline CSI volume of driver
  vgpu.kai-resource-isolator.io (readOnly: false) whose attributes are exactly
  the target container's name and its effective runAsUser / runAsGroup (the
  container's, else the pod's; absent when neither sets it); the three mounts
  all of it (the volume read-only at MOUNT, subPath ld.so.preload read-only at
  /etc/ld.so.preload, subPath vgpulock at /tmp/vgpulock writable).
- hostPath: the three hostPath volumes (MOUNT, MOUNT/containers,
  MOUNT/vgpulock, DirectoryOrCreate) and the four mounts of the Go webhook.

Either way: the three env vars on the target, nothing of ours on any other
container. Exit status 0 when the check holds; 1 with one line per difference.
"""
import base64
import json
import sys

VOLUMES = ("kai-resource-isolator-vgpu", "kai-resource-isolator-containers", "kai-resource-isolator-vgpulock")
CSI_DRIVER = "vgpu.kai-resource-isolator.io"
ATTR = "kai-resource-isolator.io/"


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


def delivery_of(pod):
    """The delivery the pod carries: the source of its kai-resource-isolator-vgpu volume."""
    (vol,) = [v for v in pod["spec"].get("volumes", []) if v["name"] == VOLUMES[0]] or [{}]
    return "csi" if "csi" in vol else "hostPath" if "hostPath" in vol else None


def csi_attributes(spec, c):
    """What the webhook must put in the volume's attributes for container c."""
    want = {ATTR + "container": c["name"]}
    for field, attr in (("runAsUser", "run-as-user"), ("runAsGroup", "run-as-group")):
        v = (c.get("securityContext") or {}).get(field)
        if v is None:
            v = (spec.get("securityContext") or {}).get(field)
        if v is not None:
            want[ATTR + attr] = str(v)
    return want


def want_layout(delivery, spec, c, mount):
    """(volumes of ours by name, mounts of ours) the delivery gives container c."""
    if delivery == "csi":
        v = VOLUMES[0]
        volumes = {v: {"name": v, "csi": {"driver": CSI_DRIVER, "readOnly": False,
                                          "volumeAttributes": csi_attributes(spec, c)}}}
        mounts = [
            {"name": v, "mountPath": mount, "readOnly": True},
            {"name": v, "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload", "readOnly": True},
            # The pod's lock directory (the plugin's). Its own region
            # directory comes with the volume's mount at `mount`: a subPath
            # mount of containers/ would cover it (the kubelet binds a
            # subPath without the mounts beneath it; node.sh saw it).
            {"name": v, "mountPath": "/tmp/vgpulock", "subPath": "vgpulock"},
        ]
        return volumes, mounts
    volumes = {name: {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}} for name, path in (
        (VOLUMES[0], mount),
        (VOLUMES[1], mount + "/containers"),
        # libvgpu's /tmp/vgpulock, kept under the host directory on the host.
        (VOLUMES[2], mount + "/vgpulock"))}
    mounts = [
        # Read-only: a workload must not replace libvgpu.so or ld.so.preload
        # for every pod on the node; only containers/ (below) is writable.
        {"name": VOLUMES[0], "mountPath": mount, "readOnly": True},
        {"name": VOLUMES[0], "mountPath": "/etc/ld.so.preload", "subPath": "ld.so.preload", "readOnly": True},
        {"name": VOLUMES[1], "mountPath": mount + "/containers"},
        {"name": VOLUMES[2], "mountPath": "/tmp/vgpulock"},
    ]
    return volumes, mounts


def injected(pod, container, mount, delivery=None):
    spec = pod["spec"]
    problems = []
    has = delivery_of(pod)
    if has is None:
        return [f"volume {VOLUMES[0]}: missing or neither csi nor hostPath: "
                f"{[v for v in spec.get('volumes', []) if v['name'] == VOLUMES[0]]}"]
    if delivery and has != delivery:
        problems.append(f"delivery: want {delivery}, the pod carries {has}")
    target = [c for c in all_containers(spec) if c["name"] == container]
    if len(target) != 1:
        return problems + [f"container {container}: found {len(target)}"]
    c = target[0]
    want_volumes, want_mounts = want_layout(has, spec, c, mount)
    names = [v["name"] for v in spec.get("volumes", [])]
    for name in VOLUMES:
        if names.count(name) > (1 if name in want_volumes else 0):
            problems.append(f"volume {name}: {names.count(name)} in the pod, want {1 if name in want_volumes else 0}")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for name, want in want_volumes.items():
        if volumes.get(name) != want:
            problems.append(f"volume {name}: want {want}, got {volumes.get(name)}")
    if has == "csi":
        host = [v["name"] for v in spec.get("volumes", []) if v["name"] in VOLUMES and "hostPath" in v]
        if host:
            problems.append(f"csi delivery with hostPath volumes of ours: {host}")
    mounts = [m for m in c.get("volumeMounts", []) if m["name"] in VOLUMES]

    def norm(m):  # the API server may spell read-write as readOnly: false
        m = {k: v for k, v in m.items() if k in ("name", "mountPath", "subPath", "readOnly", "mountPropagation", "subPathExpr")}
        if m.get("readOnly") is False:
            del m["readOnly"]
        return m

    got = sorted((norm(m) for m in mounts), key=lambda m: m["mountPath"])
    if got != sorted(want_mounts, key=lambda m: m["mountPath"]):
        problems.append(f"mounts of {container} ({has}): want {want_mounts}, got {got}")
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
        args, delivery = list(argv[1:]), None
        if "--delivery" in args:
            i = args.index("--delivery")
            delivery = args[i + 1] if i + 1 < len(args) else ""
            del args[i:i + 2]
            if delivery not in ("csi", "hostPath"):
                print(__doc__, file=sys.stderr)
                return 2
        if len(args) not in (2, 3):
            print(__doc__, file=sys.stderr)
            return 2
        problems = injected(load(args[0]), args[1], args[2] if len(args) > 2 else "/usr/local/vgpu", delivery)
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
