#!/usr/bin/env python3
"""An OCI image archive (oci-layout, index.json, blobs) from one layer tar,
importable with `ctr -n k8s.io images import` (no registry needed).

  oci_image.py NAME LAYER_TAR OUT_TAR [--entrypoint ARG ...] [--cmd ARG ...]
               [--env K=V ...] [--user UID:GID]

NAME (e.g. kai.test/debian:bookworm) goes into the index as
io.containerd.image.name and org.opencontainers.image.ref.name. The layer is
stored uncompressed; created/history are fixed, so the same layer gives the
same image digest. --entrypoint sets config.Entrypoint, which Kubernetes
keeps when a pod gives args (args replace Cmd only); without it the config
has no Entrypoint key."""
import hashlib
import io
import json
import sys
import tarfile


def main(argv):
    name, layer_path, out = argv[:3]
    rest = argv[3:]
    entrypoint, cmd, env, key = [], [], ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], None
    user = None
    for a in rest:
        if a in ("--entrypoint", "--cmd", "--env", "--user"):
            key = a
        elif key == "--user":
            user, key = a, None
        elif key == "--entrypoint":
            entrypoint.append(a)
        elif key == "--cmd":
            cmd.append(a)
        elif key == "--env":
            env.append(a)
        else:
            raise SystemExit(f"oci_image.py: unexpected {a}")
    h = hashlib.sha256()
    size = 0
    with open(layer_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    layer = h.hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Env": env, "Cmd": cmd or None, "WorkingDir": "/", **({"User": user} if user else {}),
                   **({"Entrypoint": entrypoint} if entrypoint else {})},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "kind-tests/node/oci_image.py"}],
    }, sort_keys=True).encode()
    cdig = hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{cdig}", "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{layer}", "size": size}],
    }, sort_keys=True).encode()
    mdig = hashlib.sha256(manifest).hexdigest()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{mdig}",
                       "size": len(manifest), "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}],
    }, sort_keys=True).encode()

    def add(t, path, data):
        info = tarfile.TarInfo(path)
        info.size = len(data)
        info.mode = 0o644
        t.addfile(info, io.BytesIO(data))

    with tarfile.open(out, "w") as t:
        add(t, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add(t, "index.json", index)
        add(t, f"blobs/sha256/{mdig}", manifest)
        add(t, f"blobs/sha256/{cdig}", config)
        t.add(layer_path, f"blobs/sha256/{layer}")
    print(f"{name} sha256:{mdig}")


if __name__ == "__main__":
    main(sys.argv[1:])
