"""A Go chart release moved to this chart and back on the real node (issue 43).

The `migration` part of node.py (`node.sh … --only migration`): what
migration.py does on the API server alone, with the kubelet, containerd,
kube-proxy and the controllers of node.sh doing their real work, so pods
really run through the switch and the webhook's endpoints are the real
EndpointSlice controller's, from the pods' real readiness.

The Go chart (../shared/go-chart-1.1.0, or KAI_GO_CHART) is installed with
a values file as a user would have one, with what cannot be had here put in
its place:

- its image (projecthami/kai-resource-isolator) is in no registry here: its
  webhook pods run `kai.test/go-standin`, kai.test/debian with kai-webhook
  whose entrypoint runs it with LIBRARY_DELIVERY=hostPath (the Go chart's
  hostPath volumes and env; our binary's layout of them), with the Go
  Deployment's arguments, probes and the certgen Secret it mounts (it
  serves on for 5 s after SIGTERM as ours does, where the Go binary exits
  at once: docs/migration.md, "No window");
- its certgen Jobs run `kai.test/go-certgen-standin` (a few seconds of
  sleep), while ../shared/go-chart-1.1.0/certgen-sim.sh makes the Secret and
  patches the caBundle as certgen would;
- its libsync DaemonSet (privileged, the host's / with Bidirectional
  propagation: the kubelet refuses that here, / is no shared mount in the
  node's mount namespace) is kept off the node (librarySync.nodeSelector);
  the test puts in the host directory what it copies (libvgpu.so, the
  stand-in libkai_fake_vgpu.so; ld.so.preload; containers/ 1777);
- paths.containerVgpuMount is a directory under the node's temp dir (the Go
  chart mounts the same path on the host and in containers), so nothing of
  the machine's /usr/local is used.

This chart's upgrades add what a user of these values would: its own image
(the one node.sh imports), paths.hostInstallBase "" (the host directory is
containerVgpuMount, as in the Go chart) and libraryDelivery=hostPath (a pod
admitted by this chart keeps working after a rollback: the Go revision has
no kai-csi to unpublish a CSI volume).
"""
import json
import os
import shutil
import tarfile
import tempfile
import time

import harness
import migration
from harness import CHART, HERE, check, eventually, helm, kjson, kubectl, new_namespace, run, start, stop

RELEASE = NS = FULL = migration.RELEASE
TENANT = "mig-node-tenant"
GO_IMAGE = "kai.test/go-standin:1.1.0"
CERTGEN_IMAGE = "kai.test/go-certgen-standin:1"
IMAGE = "kai.test/debian:bookworm"
GPU_LABEL = "nvidia.com/gpu.present"

N = {}  # the node's facts and the run's state


def ctr(*args):
    env = harness.ENV
    return run("nsenter", "-t", env["HOLDER_PID"], "-m", "--", "ctr", "--address", env["CONTAINERD_SOCK"],
               "-n", "k8s.io", *args, timeout=300)


def build_images():
    """kai.test/go-standin and kai.test/go-certgen-standin: the Debian layer of
    node/images.sh plus kai-webhook and the stand-in library, as OCI
    archives imported into the node's containerd."""
    images_dir = run("bash", os.path.join(HERE, "node", "images.sh"), timeout=900).stdout.strip().splitlines()[-1]
    work = tempfile.mkdtemp(prefix="go-standin.", dir=harness.WORK)
    with tarfile.open(os.path.join(images_dir, "debian.oci.tar")) as oci:
        index = json.load(oci.extractfile("index.json"))
        digest = index["manifests"][0]["digest"].split(":", 1)[1]
        manifest = json.load(oci.extractfile(f"blobs/sha256/{digest}"))
        layer = manifest["layers"][0]["digest"].split(":", 1)[1]
        with open(os.path.join(work, "debian.tar"), "wb") as f:
            shutil.copyfileobj(oci.extractfile(f"blobs/sha256/{layer}"), f)
    script = os.path.join(work, "go-webhook")
    with open(script, "w") as f:
        f.write("""#!/bin/sh
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
""")
    os.chmod(script, 0o755)
    layer_tar = os.path.join(work, "layer.tar")
    with tarfile.open(os.path.join(work, "debian.tar")) as base, tarfile.open(layer_tar, "w") as out:
        for m in base.getmembers():
            out.addfile(m, base.extractfile(m) if m.isfile() else None)
        for src, dst, mode in ((os.path.join(harness.TARGET, "kai-webhook"), "usr/local/bin/kai-webhook", 0o755),
                               (script, "go-webhook", 0o755),
                               (N["library"], "artifacts/libvgpu.so", 0o644)):
            info = out.gettarinfo(src, dst)
            info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime = mode, 0, 0, "", "", 0
            with open(src, "rb") as f:
                out.addfile(info, f)
    oci_image = os.path.join(HERE, "node", "oci_image.py")
    for name, entry in ((GO_IMAGE, ["/go-webhook"]), (CERTGEN_IMAGE, ["/bin/sh", "-c", "sleep 4", "certgen"])):
        archive = os.path.join(work, name.split("/")[1].replace(":", "_") + ".oci.tar")
        run("python3", oci_image, name, layer_tar, archive, "--entrypoint", *entry)
        ctr("images", "import", archive)
    shutil.rmtree(work)


def go_values():
    """The user's Go values file: the Go chart's defaults and the node's
    stand-ins (module docstring)."""
    with open(migration.GO_VALUES) as f:
        values = json.loads(json.dumps(__import__("yaml").safe_load(f)))
    reg, rest = GO_IMAGE.split("/", 1)
    repo, tag = rest.split(":")
    values["image"].update(registry=reg, repository=repo, tag=tag, pullPolicy="Never")
    creg, crest = CERTGEN_IMAGE.split("/", 1)
    crepo, ctag = crest.split(":")
    values["tls"]["patch"]["imageNew"].update(registry=creg, repository=crepo, tag=ctag, pullPolicy="Never")
    values["paths"]["containerVgpuMount"] = N["dir"]
    values["librarySync"]["nodeSelector"] = {"kai-test.io/go-libsync": "off"}
    path = os.path.join(harness.WORK, "go-values.yaml")
    with open(path, "w") as f:
        json.dump(values, f)
    return path


def ours():
    repo, tag = harness.ENV["KAI_IMAGE"].rsplit(":", 1)
    return ["--set", "image.registry=", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never", "--set", "paths.hostInstallBase=",
            "--set", "libraryDelivery=hostPath", "--set", "librarySync.nodeSelector=null"]


def webhook_pods(ns=NS):
    return [p for p in kjson("get", "pod", "-n", ns)["items"]
            if any(c["name"] == "webhook" for c in p["spec"]["containers"])]


def rolled_out(kind):
    """The webhook Deployment's rollout done on the real node: only pods of
    `kind` (go / ours), all Ready, every endpoint of the Service theirs."""
    d = kjson("get", "deployment", f"{FULL}-webhook", "-n", NS)
    st, want = d.get("status", {}), d["spec"]["replicas"]
    if not (st.get("observedGeneration") == d["metadata"]["generation"] and st.get("updatedReplicas") == want
            and st.get("replicas") == want and st.get("availableReplicas") == want):
        return False
    pods = webhook_pods()
    image = GO_IMAGE if kind == "go" else harness.ENV["KAI_IMAGE"]
    if len(pods) != want or any(c["image"] != image for p in pods for c in p["spec"]["containers"]):
        return False
    ips = {p["status"].get("podIP") for p in pods}
    slices = kjson("get", "endpointslice", "-n", NS, "-l", f"kubernetes.io/service-name={FULL}-webhook")["items"]
    ready = {e["addresses"][0] for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")}
    return ready == ips


def admitted(name, delivery="hostPath"):
    """A GPU-sharing pod really created: patched `delivery` at the Go
    directory, Running, the preload naming the library and the library in
    its PID 1's maps."""
    pod = migration.gpu_pod(name)
    pod["spec"]["containers"][0].update(image=IMAGE, imagePullPolicy="Never", command=["sh", "-c", "exec sleep infinity"])
    pod["spec"]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000}
    pod["metadata"]["namespace"] = TENANT
    got = json.loads(kubectl("create", "-f", "-", "-o", "json", input=json.dumps(pod)).stdout)
    problems = migration.pod_checks.injected(got, "main", N["dir"], delivery)
    assert not problems, problems
    N["running"](name, TENANT)
    library_loaded(name)
    return got


def library_loaded(name):
    lib = f"{N['dir']}/libvgpu.so"
    out = N["exec"](name, f"cat /etc/ld.so.preload; grep -c '{lib}' /proc/1/maps", TENANT).stdout.split()
    assert out[0] == lib and int(out[-1]) > 0, f"{name}: preload {out[:1]}, library mapped {out[-1:]}"


def still_running(names):
    for name in names:
        p = kjson("get", "pod", name, "-n", TENANT)
        assert p["status"].get("phase") == "Running", f"{name}: {p['status'].get('phase')}"
        assert sum(cs.get("restartCount", 0) for cs in p["status"].get("containerStatuses", [])) == 0, f"{name} restarted"
        library_loaded(name)


def change(name, kind, *helm_args):
    """helm_args while GPU-sharing pods are admitted (dry run) through the
    real Service, until the rollout to `kind` is done: none refused, none
    let through unpatched."""
    prober = migration.Prober(N["api"], namespaces=(TENANT,), mount=N["dir"])
    prober.start()
    try:
        r = helm(*helm_args, check=False)
        assert r.returncode == 0, r.stderr[-1500:]
        eventually(f"{name}: the webhook's rollout on the node", lambda: rolled_out(kind), timeout=180,
                   show=lambda: [(p["metadata"]["name"], p["status"].get("phase")) for p in webhook_pods()])
        time.sleep(1)
    finally:
        seen = prober.stop()
    migration.all_patched(name, seen)


def run_migration(running, exec_):
    """Called by node.py; `running` and `exec_` are its pod helpers."""
    env = harness.ENV
    if not os.path.isfile(os.path.join(migration.GO_CHART, "Chart.yaml")):
        raise AssertionError(f"the Go chart is not at {migration.GO_CHART}")
    N.update(running=running, exec=exec_, dir=os.path.join(env["NODE_DIR"], "go-host", "vgpu"),
             library=harness.built_library("libkai_fake_vgpu.so", "kai-fake-vgpu", AssertionError))
    N["api"] = migration.Api(harness.PKI, env["API_PORT"])
    node = env["NODE_NAME"]
    names = []
    try:
        def go_installed():
            build_images()
            # What the Go chart's libsync would have put there.
            os.makedirs(os.path.join(N["dir"], "containers"), exist_ok=True)
            os.chmod(os.path.join(N["dir"], "containers"), 0o1777)
            shutil.copy(N["library"], os.path.join(N["dir"], "libvgpu.so"))
            with open(os.path.join(N["dir"], "ld.so.preload"), "w") as f:
                f.write(f"{N['dir']}/libvgpu.so\n")
            N["values"] = go_values()
            new_namespace(TENANT)
            kubectl("create", "namespace", NS, check=False)
            start("certgen-sim", ["bash", os.path.join(migration.GO_CHART_DIR, "certgen-sim.sh")],
                  env={**os.environ, "KUBECONFIG": harness.ADMIN, "KUBECTL": os.path.join(harness.BIN, "kubectl"),
                       "PKI_DIR": os.path.join(harness.WORK, "certgen")})
            # This chart's libsync lands on GPU nodes: labelled as the GPU operator would.
            kubectl("label", "node", node, f"{GPU_LABEL}=true", "--overwrite")
            r = helm("install", RELEASE, migration.GO_CHART, "-n", NS, "-f", N["values"], check=False)
            assert r.returncode == 0, r.stderr[-1500:]
            eventually("the Go webhook's pod Ready and the only endpoint", lambda: rolled_out("go"), timeout=180)
            names.append("go-admitted")
            admitted("go-admitted")
        if not check("node migration: the Go chart installed (stand-in images, certgen-sim.sh): its webhook pod Ready on "
                     "the node, a GPU-sharing pod it admits runs with the library preloaded (hostPath)", go_installed):
            return

        def upgraded():
            change("helm upgrade -f <Go values>", "ours", "upgrade", RELEASE, CHART, "-n", NS, "-f", N["values"], *ours())
            still_running(names)
            names.append("ours-admitted")
            admitted("ours-admitted")
            ls = kjson("get", "daemonset", f"{FULL}-libsync", "-n", NS)
            assert ls["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "kai-libsync"
            eventually("this chart's libsync Ready on the node", lambda: ls_ready(), timeout=120)
            change("helm upgrade -f <Go values> (again)", "ours", "upgrade", RELEASE, CHART, "-n", NS, "-f", N["values"], *ours())
            still_running(names)
        if not check("node migration: helm upgrade -f <Go values> to this chart: the real rollout replaces the Go "
                     "webhook pod with no GPU-sharing pod refused or let through; the pod the Go webhook admitted "
                     "keeps running with its library, 0 restarts; a new one runs preloaded; our libsync Ready under "
                     "the Go selector", upgraded):
            return

        def rolled_back():
            change("helm rollback", "go", "rollback", RELEASE, migration.go_revision(helm), "-n", NS)
            still_running(names)
            names.append("go-again")
            admitted("go-again")
        check("node migration: helm rollback to the Go revision: the Go webhook pod back, no gap; every pod keeps "
              "running with its library; a new one is admitted by the Go webhook and runs preloaded", rolled_back)

        def again():
            change("helm upgrade --reuse-values", "ours", "upgrade", RELEASE, CHART, "-n", NS, "--reuse-values", *ours())
            still_running(names)
            names.append("ours-again")
            admitted("ours-again")
        check("node migration: helm upgrade --reuse-values again: no gap, the pods keep running, a new one runs preloaded", again)
    finally:
        stop("certgen-sim")
        for name in names:
            kubectl("delete", "pod", name, "-n", TENANT, "--wait=false", check=False)
        helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s", check=False)
        kubectl("delete", "secret", migration.CERTGEN_SECRET, "-n", NS, "--ignore-not-found", check=False)
        kubectl("label", "node", node, f"{GPU_LABEL}-", check=False)
        for ns in (TENANT, NS):
            kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)
        shutil.rmtree(os.path.dirname(N["dir"]), ignore_errors=True)


def ls_ready():
    pods = [p for p in kjson("get", "pod", "-n", NS)["items"]
            if any(c["name"] == "libsync" for c in p["spec"]["containers"]) and not p["metadata"].get("deletionTimestamp")]
    return pods and all(any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                        for p in pods) and all(c["image"] == harness.ENV["KAI_IMAGE"] for p in pods for c in p["spec"]["containers"])
