#!/usr/bin/env python3
"""The chart and the binaries against a real kube-apiserver (kind-tests/cluster.sh).

  apiserver.py CLUSTER_DIR TARGET_DIR HELM [--only NAME,...]

CLUSTER_DIR is a running cluster.sh cluster, TARGET_DIR holds the built
kai-webhook / kai-node / kai-aggregator. Each line printed is one assertion
against that API server; the exit status is the number of failures (capped).
The webhook, node agent and aggregator run as processes on this host with the
arguments and environment of the chart's own Deployment/DaemonSet (read back
from the API server), each with a token of its own ServiceAccount.
"""
import base64
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import http.client
import http.server
from concurrent.futures import ThreadPoolExecutor

import harness
import migration
from harness import (CHART, FULL, HERE, NS, RELEASE, ROOT, TENANT, apply, bad, built_library, chart_env, check,
                     container_of, create, eventually, failed, grpc_tls_files, helm, http_get, kjson,
                     kubectl, load_env, log_tail, new_namespace, procs, prometheus_token, rewrite, run,
                     sa_kubeconfig, series, start, stop, stop_all, write_kubeconfig)
from kaitest.net import free_port

CORPUS = os.path.join(ROOT, "services", "webhook", "tests", "pods")
RBAC_DIR = os.path.join(HERE, "rbac")

OURS = ("kai-resource-isolator-vgpu", "kai-resource-isolator-containers", "kai-resource-isolator-vgpulock")
# The chart's default library delivery (values.yaml libraryDelivery): what
# every injected pod of the default release must carry; the hostPath checks
# pin hostPath themselves (helm --set libraryDelivery=hostPath).
DELIVERY = "csi"
CSI_DRIVER = "vgpu.kai-resource-isolator.io"


# --- the cluster -------------------------------------------------------------

CLUSTER = os.path.abspath(sys.argv[1])
TARGET = os.path.abspath(sys.argv[2])
HELM = sys.argv[3]
ONLY = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv else None
ENV = load_env(os.path.join(CLUSTER, "env"))
BIN = ENV["BIN"]
NODE_IP = ENV["NODE_IP"]
NODES = ENV["NODES"].split()
ADMIN = os.path.join(CLUSTER, "admin.kubeconfig")
PKI = os.path.join(CLUSTER, "pki")
WORK = tempfile.mkdtemp(prefix="kai-apiserver-test.", dir=CLUSTER)
harness.setup(target=TARGET, helm=HELM, env=ENV, admin=ADMIN, pki=PKI, work=WORK)


def cluster(*args):
    return run("bash", os.path.join(HERE, "cluster.sh"), *args, CLUSTER, timeout=300)


# --- pods ------------------------------------------------------------------

def pod(name, annotations=None, containers=("main",), labels=None, node=None, init=()):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": dict(labels or {})},
         "spec": {"containers": [{"name": c, "image": "registry.k8s.io/pause:3.10"} for c in containers],
                  "terminationGracePeriodSeconds": 0}}
    if init:
        p["spec"]["initContainers"] = [{"name": c, "image": "registry.k8s.io/pause:3.10"} for c in init]
    if node:
        p["spec"]["nodeName"] = node
    return p


def pod_checks(mode, pod_obj, *args, delivery=None):
    """pod_checks.py on the pod; an injected pod must carry `delivery`
    (default: the chart's default, DELIVERY)."""
    path = os.path.join(WORK, "pod.json")
    with open(path, "w") as f:
        json.dump(pod_obj, f)
    if mode == "injected":
        args = (*args, "--delivery", delivery or DELIVERY)
    r = run(sys.executable, os.path.join(HERE, "pod_checks.py"), mode, path, *args, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def ours_in(pod_obj):
    spec = pod_obj["spec"]
    vols = [v["name"] for v in spec.get("volumes", []) if v["name"] in OURS]
    env = [e["name"] for c in spec.get("containers", []) + spec.get("initContainers", []) for e in c.get("env", [])
           if e["name"] in ("POD_UID", "CONTAINER_NAME", "CONTAINER_VGPU_MOUNT")]
    return vols, env


# --- stand-in CRDs -----------------------------------------------------------

def crd(group, kind, plural, scope="Namespaced", version="v1"):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": scope,
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": kind + "List"},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


# ============================================================================
# 0. the cluster is what the other parts assume
# ============================================================================

def cluster_shape():
    def nodes():
        got = {n["metadata"]["name"]: n for n in kjson("get", "nodes")["items"]}
        assert sorted(got) == sorted(NODES), sorted(got)
        for n in got.values():
            assert n["metadata"]["labels"].get("nvidia.com/gpu.memory"), n["metadata"]["labels"]
            assert n["status"]["allocatable"]["nvidia.com/gpu"] == "2"
            assert not n["spec"].get("taints"), n["spec"].get("taints")
        # One node of each kind the chart's default selection knows.
        assert "nvidia.com/gpu.present" in got[NODES[0]]["metadata"]["labels"]
        assert "cloud.google.com/gke-accelerator" in got[NODES[1]]["metadata"]["labels"]
    check("two Ready GPU nodes (KAI's labels, nvidia.com/gpu allocatable, untainted)", nodes)

    def dra():
        # A field of the DRAConsumableCapacity feature is dropped on write
        # when the gate is off: reading it back proves the gate is on.
        apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": "kai-test-shared-gpu"},
               "spec": {"driver": "gpu.kai-test.io", "nodeName": NODES[0],
                        "pool": {"name": NODES[0], "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "gpu-0", "allowMultipleAllocations": True,
                                     "capacity": {"memory": {"value": "80Gi"}}}]}})
        got = kjson("get", "resourceslice", "kai-test-shared-gpu")
        assert got["spec"]["devices"][0].get("allowMultipleAllocations") is True, got["spec"]["devices"][0]
        kubectl("delete", "resourceslice", "kai-test-shared-gpu")
    check("DRA resource.k8s.io/v1 with consumable capacity (a shared device keeps allowMultipleAllocations)", dra)

    def authz():
        out = kubectl("auth", "can-i", "list", "pods", "-A", kubeconfig=os.path.join(CLUSTER, "users", "tenant-a.kubeconfig"), check=False)
        assert out.stdout.strip() == "no", out.stdout + out.stderr
        assert kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    check("RBAC is on: a test user has no rights until bound, the admin has all", authz)


# ============================================================================
# 1. helm install / upgrade / uninstall
# ============================================================================

def scenario_files():
    return sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith("-values.yaml"))


def release_objects(release, ns):
    sel = f"app.kubernetes.io/instance={release}"
    names = kubectl("get", "all,secret,configmap,serviceaccount,role,rolebinding,poddisruptionbudget,resourcequota",
                    "-n", ns, "-l", sel, "-o", "name").stdout.split()
    names += kubectl("get", "clusterrole,clusterrolebinding,mutatingwebhookconfiguration,validatingwebhookconfiguration,csidriver",
                     "-l", sel, "-o", "name").stdout.split()
    return names


def selects(spec, labels):
    """Whether a pod spec's nodeSelector and required node affinity admit a
    node with these labels (the operators the chart uses)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    if not terms:
        return True

    def holds(e):
        op, k, vals = e["operator"], e["key"], e.get("values", [])
        return {"In": k in labels and labels[k] in vals, "NotIn": labels.get(k) not in vals,
                "Exists": k in labels, "DoesNotExist": k not in labels}[op]
    return any(all(holds(e) for e in t.get("matchExpressions", [])) for t in terms)


def workloads_scheduled(ns, release):
    sel = f"app.kubernetes.io/instance={release}"
    dss = kjson("get", "daemonset", "-n", ns, "-l", sel)["items"]
    deps = kjson("get", "deployment", "-n", ns, "-l", sel)["items"]
    pods = kjson("get", "pod", "-n", ns, "-l", sel)["items"]
    assert dss or deps, "no workloads"
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kjson("get", "nodes")["items"]}
    for ds in dss:
        # The nodes the chart's selection admits: at least one of our two
        # GPU node kinds, and exactly those get a pod.
        admitted = sorted(n for n, labels in nodes.items() if selects(ds["spec"]["template"]["spec"], labels))
        assert admitted, f"{ds['metadata']['name']} selects none of the GPU nodes"
        mine = [p for p in pods if any(o["kind"] == "DaemonSet" and o["name"] == ds["metadata"]["name"]
                                       for o in p["metadata"].get("ownerReferences", []))]
        want = ds["status"].get("desiredNumberScheduled", 0)
        assert want == len(admitted), f"{ds['metadata']['name']}: desired {want}, admitted {admitted}"
        assert sorted(p["spec"].get("nodeName", "") for p in mine) == admitted, \
            f"{ds['metadata']['name']}: pods on {[p['spec'].get('nodeName') for p in mine]}, admitted {admitted}"
    for d in deps:
        want = d["spec"].get("replicas", 1)
        prefix = d["metadata"]["name"] + "-"
        mine = [p for p in pods if p["metadata"]["name"].startswith(prefix)]
        assert len(mine) == want and all(p["spec"].get("nodeName") in NODES for p in mine), \
            f"{d['metadata']['name']}: {len(mine)}/{want} pods, on {[p['spec'].get('nodeName') for p in mine]}"
    return True


def rollout_started(ns, release):
    """After an upgrade: every controller observed the new spec and each
    Deployment's newest ReplicaSet has pods scheduled. A rollout cannot
    finish here (no kubelet: old pods never stop, new ones never get Ready)."""
    sel = f"app.kubernetes.io/instance={release}"
    for obj in kjson("get", "daemonset,deployment", "-n", ns, "-l", sel)["items"]:
        name = obj["metadata"]["name"]
        assert obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"], f"{name}: new spec not observed"
        if obj["kind"] == "DaemonSet":
            assert obj["status"].get("desiredNumberScheduled", 0) > 0, name
            continue
        revision = obj["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
        (rs,) = [r for r in kjson("get", "replicaset", "-n", ns, "-l", sel)["items"]
                 if r["metadata"]["annotations"].get("deployment.kubernetes.io/revision") == revision
                 and r["metadata"]["ownerReferences"][0]["name"] == name]
        h = rs["metadata"]["labels"]["pod-template-hash"]
        new = kjson("get", "pod", "-n", ns, "-l", f"pod-template-hash={h}")["items"]
        assert new and all(p["spec"].get("nodeName") in NODES for p in new), f"{name}: new pods {[p['spec'].get('nodeName') for p in new]}"
    return True


def release_delivery(ns, release):
    """The library delivery a release's webhook runs with (its Deployment's
    LIBRARY_DELIVERY), checked against what the API server holds: with csi,
    the CSIDriver and a `csi` container in every node DaemonSet pod; with
    hostPath, neither."""
    sel = f"app.kubernetes.io/instance={release}"
    hooks = [c for d in kjson("get", "deployment", "-n", ns, "-l", sel)["items"]
             for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "webhook"]
    assert len(hooks) == 1, f"{len(hooks)} webhook containers"
    env = {e["name"]: e.get("value") for e in hooks[0].get("env", [])}
    delivery = env.get("LIBRARY_DELIVERY")
    assert delivery in ("csi", "hostPath"), env
    drivers = [d["metadata"]["name"] for d in kjson("get", "csidriver", "-l", sel)["items"]]
    pods = [p for p in kjson("get", "pod", "-n", ns, "-l", sel)["items"] if not p["metadata"].get("deletionTimestamp")]
    # The node DaemonSet (agent and plugin); libsync's is another.
    node_pods = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "node-agent"]
    with_csi = [p["metadata"]["name"] for p in pods if any(c["name"] == "csi" for c in p["spec"]["containers"])]
    if delivery == "csi":
        assert env.get("CSI_DRIVER") == CSI_DRIVER, env
        assert drivers == [CSI_DRIVER], drivers
        assert node_pods and sorted(with_csi) == sorted(p["metadata"]["name"] for p in node_pods), \
            f"csi container in {with_csi}, node pods {[p['metadata']['name'] for p in node_pods]}"
    else:
        assert drivers == [], drivers
        assert with_csi == [], with_csi
    return delivery


def helm_matrix():
    # CRDs the chart's optional objects use (cert-manager, Prometheus
    # Operator): stand-ins with open schemas, so the real API server stores
    # what the chart renders; nothing here runs cert-manager itself.
    for c in (crd("cert-manager.io", "Certificate", "certificates"),
              crd("cert-manager.io", "Issuer", "issuers"),
              crd("cert-manager.io", "ClusterIssuer", "clusterissuers", scope="Cluster"),
              crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
              crd("monitoring.coreos.com", "PrometheusRule", "prometheusrules")):
        apply(c)
    for c in ("certificates.cert-manager.io", "servicemonitors.monitoring.coreos.com"):
        kubectl("wait", "--for=condition=Established", f"crd/{c}", "--timeout=60s")

    cases = [("defaults", [])] + [(f, ["-f", os.path.join(CHART, "ci", f)]) for f in scenario_files()]
    for i, (name, args) in enumerate(cases):
        release, ns = f"m{i}", f"matrix-{i}"

        def installs():
            r = helm("install", release, CHART, "-n", ns, "--create-namespace", *args, check=False)
            assert r.returncode == 0, r.stderr[-800:]
            eventually("DaemonSet and Deployment pods scheduled on the GPU nodes", lambda: workloads_scheduled(ns, release))
            delivery = release_delivery(ns, release)
            want = "hostPath" if name == "hostpath-delivery-values.yaml" else DELIVERY
            assert delivery == want, f"libraryDelivery {delivery}, want {want}"
        check(f"helm install ({name}): accepted by the API server, every DaemonSet/Deployment pod scheduled on the fake GPU nodes; "
              "the CSIDriver and the node pods' csi container exactly when the delivery is csi", installs)

        def upgrades():
            r = helm("upgrade", release, CHART, "-n", ns, *args, "--set", "webhook.replicaCount=2",
                     "--set", "webhook.timeoutSeconds=5", "--set", "monitor.isolation.enforce=evict",
                     "--set", "tls.validityDays=400", check=False)
            assert r.returncode == 0, r.stderr[-800:]
            eventually("the upgraded workloads' rollout started", lambda: rollout_started(ns, release))
        check(f"helm upgrade ({name}) to changed values: no immutable-field error", upgrades)

        def uninstalls():
            r = helm("uninstall", release, "-n", ns, check=False)
            assert r.returncode == 0, r.stderr[-800:]
            # Pods bound to a node end when its kubelet confirms they
            # stopped; there is none here, so the test does its part.
            eventually("the garbage collector marked the release's pods for deletion", lambda: all(
                p["metadata"].get("deletionTimestamp") for p in
                kjson("get", "pod", "-n", ns, "-l", f"app.kubernetes.io/instance={release}")["items"]))
            kubectl("delete", "pod", "-n", ns, "-l", f"app.kubernetes.io/instance={release}",
                    "--force", "--grace-period=0", "--wait=false", check=False)
            eventually("nothing of the release left", lambda: release_objects(release, ns) == [])
            mwcs = [m["metadata"]["name"] for m in kjson("get", "mutatingwebhookconfiguration")["items"]]
            assert not any(m.startswith(release + "-") for m in mwcs), mwcs
        check(f"helm uninstall ({name}) leaves nothing (no webhook configuration to block pods)", uninstalls)
        kubectl("delete", "namespace", ns, "--wait=false")


# ============================================================================
# 2. the release the rest of the suite runs against
# ============================================================================

HOST = os.path.join(WORK, "host")
WEBHOOK = {}


def install_release():
    r = helm("install", RELEASE, CHART, "-n", NS, "--create-namespace", check=False)
    assert r.returncode == 0, r.stderr[-800:]
    kubectl("create", "namespace", TENANT, check=False)


def webhook_port():
    if "port" not in WEBHOOK:
        WEBHOOK["port"] = free_port(NODE_IP)
    return WEBHOOK["port"]


def write_webhook_tls():
    """The chart's Secret, as the kubelet would mount it: an atomic swap of a
    ..data link, which the webhook's reload watches."""
    data = kjson("get", "secret", f"{FULL}-webhook-tls", "-n", NS)["data"]
    tls = os.path.join(WORK, "webhook-tls")
    os.makedirs(tls, exist_ok=True)
    gen = os.path.join(tls, f"..{time.monotonic_ns()}")
    os.makedirs(gen)
    for k in ("tls.crt", "tls.key", "ca.crt"):
        with open(os.path.join(gen, k), "wb") as f:
            f.write(base64.b64decode(data[k]))
        link = os.path.join(tls, k)
        if not os.path.islink(link):
            os.symlink(os.path.join("..data", k), link)
    tmp = os.path.join(tls, "..data_tmp")
    os.symlink(os.path.basename(gen), tmp)
    os.replace(tmp, os.path.join(tls, "..data"))
    return tls


def start_webhook(**env):
    c = container_of("deployment", f"{FULL}-webhook", "webhook")
    tls = write_webhook_tls()
    port = webhook_port()
    args = rewrite(c["args"], [(r"^--listen=.*", f"--listen={NODE_IP}:{port}"),
                               (r"^--tls-cert-file=.*", f"--tls-cert-file={tls}/tls.crt"),
                               (r"^--tls-private-key-file=.*", f"--tls-private-key-file={tls}/tls.key"),
                               (r"^--log-format=.*", "--log-format=plain")])
    # No delay after SIGTERM: this suite stops a webhook only to restart it
    # or once nothing routes to it; the race the delay is for (a real
    # kubelet's SIGTERM against the endpoint's removal) is node.sh's.
    env = {**chart_env(c), "SHUTDOWN_DELAY_SECONDS": "0", **env}
    if env.get("NODE_GUARD") == "true":
        # The node guard looks pods up with the webhook's own ServiceAccount.
        env["KUBECONFIG"] = sa_kubeconfig(f"{FULL}-webhook")
    start("webhook", [os.path.join(TARGET, "kai-webhook"), *args], env=env)
    ctx = ssl.create_default_context(cafile=os.path.join(tls, "ca.crt"))
    ctx.check_hostname = False

    def healthy():
        conn = http.client.HTTPSConnection(NODE_IP, port, context=ctx, timeout=2)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    eventually("webhook serving", healthy, timeout=30)
    WEBHOOK["ctx"] = ctx


def webhook_reviews():
    """kai_webhook_admission_reviews_total summed over decisions."""
    conn = http.client.HTTPSConnection(NODE_IP, webhook_port(), context=WEBHOOK["ctx"], timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    counts = {}
    for line in text.splitlines():
        m = re.match(r'^kai_webhook_admission_reviews_total\{decision="([a-z_]+)"\} ([0-9.e+]+)$', line)
        if m:
            counts[m.group(1)] = float(m.group(2))
    return counts


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after) if after.get(k, 0) != before.get(k, 0)}


def route_service_to_webhook():
    """The chart's Service gets an EndpointSlice to this host's address (the
    API server's --enable-aggregator-routing resolves Services to endpoints;
    loopback is refused there, so NODE_IP)."""
    apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": f"{FULL}-webhook-host", "namespace": NS,
                        "labels": {"kubernetes.io/service-name": f"{FULL}-webhook",
                                   "endpointslice.kubernetes.io/managed-by": "kai-test"}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
           "ports": [{"name": "https", "port": webhook_port(), "protocol": "TCP"}]})


def admission():
    def mutated():
        r = create(pod("probe", {"gpu-memory": "1024"}), dry_run=True)
        return ours_in(r)[0] == [OURS[0]] and "csi" in [v for v in r["spec"]["volumes"] if v["name"] == OURS[0]][0]
    check("the chart's Service resolves to the webhook on this host; its caBundle verifies the chart's certificate",
          lambda: eventually("a dry-run sharing pod comes back mutated", mutated, timeout=60))

    corpus = sorted(os.listdir(CORPUS))
    assert len(corpus) >= 8, corpus
    for fname in corpus:
        case = json.load(open(os.path.join(CORPUS, fname)))
        expect, body = case["expect"], case["pod"]
        body["metadata"]["name"] = fname.removesuffix(".json")
        body["metadata"].pop("namespace", None)
        # An owner that does not exist here would have the garbage collector
        # delete the pod before the test reads it back.
        body["metadata"].pop("ownerReferences", None)
        # The tenant namespace allows no opting out: an opt-out annotation
        # there counts for nothing (see opt_out_gate for where it does).
        decision = "injected" if expect["decision"] == "opted_out" else expect["decision"]

        def one_case():
            sa = body["spec"].get("serviceAccountName")
            if sa:  # the ServiceAccount admission plugin wants it to exist
                kubectl("create", "serviceaccount", sa, "-n", TENANT, check=False)
            pc = body["spec"].get("priorityClassName")
            if pc:  # and the Priority plugin the PriorityClass
                apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                       "metadata": {"name": pc}, "value": 1000})
            before = webhook_reviews()
            r = create(body, check=False)
            after = webhook_reviews()
            if decision == "denied":
                assert not isinstance(r, dict), "admitted"
                assert "vgpu.lib.kai-resource-isolator.io" in r.stderr and "denied the request" in r.stderr, r.stderr
                assert delta(before, after) == {"denied": 1}, delta(before, after)
                return
            assert isinstance(r, dict), r.stderr
            stored = kjson("get", "pod", body["metadata"]["name"], "-n", TENANT)
            if decision == "injected":
                target = stored["spec"][expect.get("list", "containers")][expect.get("index", 0)]["name"]
                pod_checks("injected", stored, target)
                assert delta(before, after) == {"injected": 1}, delta(before, after)
            else:
                pod_checks("untouched", stored)
                # Pods without KAI's annotations never reach us: the chart's
                # matchCondition keeps them on the API server.
                want = {} if decision == "not_gpu_sharing" else {decision: 1}
                assert delta(before, after) == want, delta(before, after)
        check(f"corpus {fname}: {decision}; the stored pod (kubectl get -o json) is exactly what it should be", one_case)

    def cores():
        p = pod("cores", {"gpu-memory": "2048", "kai-resource-isolator.io/gpu-cores": "30"})
        stored = create(p)
        pod_checks("injected", stored, "main")
        env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"]}
        assert env.get("CUDA_DEVICE_SM_LIMIT") == "30", env
        assert env.get("CUDA_DEVICE_MEMORY_LIMIT") == "2048m", env
    check("gpu-cores: CUDA_DEVICE_SM_LIMIT and the fallback memory limit in the stored pod", cores)

    def fraction_named():
        p = pod("named", {"gpu-fraction": "0.5", "gpu-fraction-container-name": "worker"}, containers=("sidecar", "worker"))
        stored = create(p)
        pod_checks("injected", stored, "worker")
    check("gpu-fraction with a named container: only that container is injected", fraction_named)

    def already():
        stored = kjson("get", "pod", "cores", "-n", TENANT)
        again = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "cores-again", "annotations": stored["metadata"]["annotations"]},
                 "spec": {k: stored["spec"][k] for k in ("containers", "volumes")}}
        for c in again["spec"]["containers"]:
            for k in ("terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "resources"):
                c.pop(k, None)
            # The projected token's mount is the API server's own; it adds
            # it again.
            c["volumeMounts"] = [m for m in c["volumeMounts"] if not m["name"].startswith("kube-api-access-")]
        again["spec"]["volumes"] = [v for v in again["spec"]["volumes"] if v["name"] in OURS]
        before = webhook_reviews()
        out = create(again)
        assert delta(before, webhook_reviews()) == {"already_injected": 1}, delta(before, webhook_reviews())
        assert ours_in(out) == ours_in(stored), (ours_in(out), ours_in(stored))
    check("an already injected pod: empty patch, one copy of everything", already)

    def dry_run():
        before = webhook_reviews()
        out = create(pod("dry", {"gpu-memory": "512"}), dry_run=True)
        pod_checks("injected", out, "main")
        assert delta(before, webhook_reviews()) == {"injected": 1}
        r = kubectl("get", "pod", "dry", "-n", TENANT, check=False)
        assert r.returncode != 0 and "NotFound" in r.stderr, "a dry run stored the pod"
    check("server-side dry run: mutated, nothing stored", dry_run)

    def excluded():
        kubectl("create", "namespace", "opted-out-ns", check=False)
        kubectl("label", "namespace", "opted-out-ns", "kai-resource-isolator.io/webhook=ignore", "--overwrite")
        before = webhook_reviews()
        for ns, p in (("kube-system", pod("ks", {"gpu-memory": "1024"})),
                      (NS, pod("own", {"gpu-memory": "1024"})),
                      ("opted-out-ns", pod("ns-ignored", {"gpu-memory": "1024"}))):
            pod_checks("untouched", create(p, ns=ns))
        assert delta(before, webhook_reviews()) == {}, delta(before, webhook_reviews())
    check("kube-system, the release namespace and ignore-labelled namespaces are never sent to the webhook", excluded)

    check("hostile tenant: its own CUDA_DEVICE_MEMORY_LIMIT, _0, SM limit and another pod's POD_UID are replaced in the stored pod", hostile_env)
    check("hostile tenant: a ConfigMap file over libvgpu.so, an emptyDir over the region directory (trailing '/') are denied, nothing stored", hidden_library)
    check("opt-out: the tenant's annotation and pod label count for nothing in a normal namespace, and are honoured in an admin-labelled one", opt_out_gate)
    check("a 586 KiB env value of '<' (a 3.4 MiB review: the API server escapes < as \\u003c) is reviewed and capped; over the webhook's body limit it is denied, never admitted unpatched", big_review)

    library_delivery()

    check("reinvocation: a second mutating webhook after ours, ours runs again and adds nothing twice; where it sets the user, ours rewrites the CSI volume's run-as attributes", reinvocation)


def psa_namespace(name, level):
    """A namespace enforcing Pod Security `level`, its default ServiceAccount
    made (the ServiceAccount admission plugin wants it)."""
    new_namespace(name, f"pod-security.kubernetes.io/enforce={level}")


def restricted_pod(name):
    """A GPU-sharing pod that satisfies Pod Security restricted as written:
    runAsUser on the container, runAsGroup on the pod."""
    p = pod(name, {"gpu-memory": "1024"})
    p["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsGroup": 2000,
                                    "seccompProfile": {"type": "RuntimeDefault"}}
    p["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1000, "allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}
    return p


def webhook_delivery():
    """LIBRARY_DELIVERY of the chart's webhook Deployment as it is stored now."""
    env = {e["name"]: e.get("value") for e in container_of("deployment", f"{FULL}-webhook", "webhook").get("env", [])}
    return env.get("LIBRARY_DELIVERY")


def switch_delivery(delivery):
    """helm upgrade to libraryDelivery=`delivery` (None: the chart's default;
    a bare upgrade would reuse the last values) and the webhook restarted
    with the Deployment's new environment, as a rollout would."""
    stop("webhook")
    try:
        values = ("--set", f"libraryDelivery={delivery}") if delivery else ("--reset-values",)
        r = helm("upgrade", RELEASE, CHART, "-n", NS, *values, check=False)
        assert r.returncode == 0, r.stderr[-600:]
    finally:
        start_webhook()


def library_delivery():
    def csi_driver():
        d = kjson("get", "csidriver", CSI_DRIVER)
        assert d["metadata"]["labels"].get("app.kubernetes.io/instance") == RELEASE, d["metadata"]["labels"]
        spec = d["spec"]
        got = {k: spec.get(k) for k in ("volumeLifecycleModes", "attachRequired", "podInfoOnMount", "fsGroupPolicy")}
        assert got == {"volumeLifecycleModes": ["Ephemeral"], "attachRequired": False, "podInfoOnMount": True,
                       "fsGroupPolicy": "File"}, spec
    check(f"CSIDriver {CSI_DRIVER} as stored: volumeLifecycleModes [Ephemeral], attachRequired false, podInfoOnMount true, fsGroupPolicy File", csi_driver)

    def node_pods_run_the_plugin():
        assert webhook_delivery() == "csi", webhook_delivery()
        kubelet_confirms_terminations(NS)
        pods = [p for p in kjson("get", "pod", "-n", NS, "-l", "app.kubernetes.io/component=node-agent")["items"]
                if not p["metadata"].get("deletionTimestamp")]
        assert pods and all(p["spec"].get("nodeName") in NODES for p in pods), [p["spec"].get("nodeName") for p in pods]
        for p in pods:
            cs = {c["name"]: c for c in p["spec"]["containers"]}
            assert sorted(cs) == ["agent", "csi", "csi-registrar"], sorted(cs)
            # The registrar registers kai-csi with kubelet (node-driver-registrar),
            # unprivileged.
            reg = cs["csi-registrar"]
            assert f"--kubelet-registration-path=/var/lib/kubelet/plugins/{CSI_DRIVER}/csi.sock" in reg["args"], reg["args"]
            assert not reg["securityContext"].get("privileged"), reg["securityContext"]
            c = cs["csi"]
            assert c["command"] == ["/bin/kai-csi"], c["command"]
            assert f"--kubelet-endpoint=/var/lib/kubelet/plugins/{CSI_DRIVER}/csi.sock" in c["args"], c["args"]
            assert c["securityContext"].get("privileged") is True, c["securityContext"]
            # The API server keeps Bidirectional propagation for privileged
            # containers only: the stored pod has it on kubelet's directory.
            (kubelet_dir,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet"]
            assert kubelet_dir.get("mountPropagation") == "Bidirectional", kubelet_dir
            assert not cs["agent"].get("securityContext", {}).get("privileged"), cs["agent"]["securityContext"]
        release_delivery(NS, RELEASE)
    check("the node DaemonSet's pods (scheduled by the controller) carry the privileged csi container (kai-csi, Bidirectional kubelet dir) and its unprivileged csi-registrar sidecar; the agent is not privileged", node_pods_run_the_plugin)

    # (a) csi, the default: restricted admits the sharing pod, mutated.
    def restricted_admits_csi():
        psa_namespace("restricted-ns", "restricted")
        # The namespace enforces restricted: a pod that does not satisfy it
        # is refused (so the admission below means something).
        r = create(pod("not-restricted"), ns="restricted-ns", check=False)
        assert not isinstance(r, dict) and 'violates PodSecurity "restricted' in r.stderr, getattr(r, "stderr", "admitted")
        before = webhook_reviews()
        r = create(restricted_pod("restricted-gpu"), ns="restricted-ns", check=False)
        assert isinstance(r, dict), r.stderr[-600:]
        assert delta(before, webhook_reviews()) == {"injected": 1}, delta(before, webhook_reviews())
        stored = kjson("get", "pod", "restricted-gpu", "-n", "restricted-ns")
        pod_checks("injected", stored, "main", delivery="csi")
        ours = [v for v in stored["spec"]["volumes"] if v["name"] in OURS]
        assert ours == [{"name": OURS[0], "csi": {"driver": CSI_DRIVER, "readOnly": False, "volumeAttributes": {
            "kai-resource-isolator.io/container": "main", "kai-resource-isolator.io/run-as-user": "1000",
            "kai-resource-isolator.io/run-as-group": "2000"}}}], ours
        host = [v["name"] for v in stored["spec"]["volumes"] if "hostPath" in v]
        assert host == [], host
        # And at baseline (hostPath refused there too): admitted, csi.
        psa_namespace("baseline-ns", "baseline")
        pod_checks("injected", create(pod("psa-csi", {"gpu-memory": "1024"}), ns="baseline-ns"), "main", delivery="csi")
    check("csi (the chart's default): a restricted-compliant GPU-sharing pod is admitted in a Pod Security restricted namespace; "
          "stored with exactly the csi volume (container main, run-as-user 1000, run-as-group 2000), no hostPath; baseline admits one too",
          restricted_admits_csi)

    # (b) the webhook in hostPath mode: Pod Security refuses what it adds.
    switched = {}

    def hostpath_refused():
        switch_delivery("hostPath")
        switched["yes"] = True
        assert webhook_delivery() == "hostPath", webhook_delivery()
        eventually("the CSIDriver removed with libraryDelivery=hostPath",
                   lambda: kubectl("get", "csidriver", CSI_DRIVER, check=False).returncode != 0, timeout=60)
        # Mutated as hostPath where nothing refuses it (the tenant namespace).
        pod_checks("injected", create(restricted_pod("restricted-gpu-hostpath")), "main", delivery="hostPath")
        for ns, level in (("restricted-ns", "restricted"), ("baseline-ns", "baseline")):
            before = webhook_reviews()
            r = create(restricted_pod("restricted-gpu-hp"), ns=ns, check=False)
            assert not isinstance(r, dict), f"admitted in {ns}"
            assert f'violates PodSecurity "{level}' in r.stderr and "hostPath" in r.stderr, r.stderr[-600:]
            for v in OURS:
                assert v in r.stderr, f"{v} not named: {r.stderr[-600:]}"
            # Our webhook did mutate it: Pod Security, after us, refused the result.
            assert delta(before, webhook_reviews()) == {"injected": 1}, delta(before, webhook_reviews())
    check("libraryDelivery=hostPath (helm upgrade, webhook restarted from the Deployment): the stored pod carries the hostPath volumes; "
          "the same restricted pod is refused by Pod Security restricted and baseline, the message naming our hostPath volumes", hostpath_refused)

    def back_to_csi():
        assert switched, "hostPath was never switched on"
        switch_delivery(None)
        assert webhook_delivery() == "csi", webhook_delivery()
        eventually("the CSIDriver back", lambda: kubectl("get", "csidriver", CSI_DRIVER, check=False).returncode == 0, timeout=60)
        eventually("the node pods run the plugin again",
                   lambda: kubelet_confirms_terminations(NS) or release_delivery(NS, RELEASE) == "csi", timeout=90)
        r = create(restricted_pod("restricted-gpu-again"), ns="restricted-ns", check=False)
        assert isinstance(r, dict), r.stderr[-600:]
        pod_checks("injected", r, "main", delivery="csi")
    check("back to the default (csi): CSIDriver and plugin back, the restricted namespace admits the sharing pod again", back_to_csi)


class SecondWebhook(http.server.BaseHTTPRequestHandler):
    """A test webhook that adds a volume and an env var to every container."""

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        req = review["request"]
        spec = req["object"]["spec"]
        ops = [{"op": "add", "path": "/spec/volumes/-", "value": {"name": "second-webhook", "emptyDir": {}}}]
        if "volumes" not in spec:
            ops[0] = {"op": "add", "path": "/spec/volumes", "value": [{"name": "second-webhook", "emptyDir": {}}]}
        for i, c in enumerate(spec["containers"]):
            if "env" in c:
                ops.append({"op": "add", "path": f"/spec/containers/{i}/env/-", "value": {"name": "SECOND_WEBHOOK", "value": "1"}})
            else:
                ops.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": [{"name": "SECOND_WEBHOOK", "value": "1"}]})
        if req["object"]["metadata"].get("labels", {}).get("second-webhook-user") == "yes":
            # As a default-securityContext policy (Kyverno, Gatekeeper) would.
            ops.append({"op": "add", "path": "/spec/securityContext", "value": {"runAsUser": 1000, "runAsGroup": 3000}})
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": {"uid": req["uid"], "allowed": True, "patchType": "JSONPatch",
                                        "patch": base64.b64encode(json.dumps(ops).encode()).decode()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def hidden_library():
    """Mounts of the tenant's own at or under our paths, however spelled,
    are denied: none is stored."""
    cases = {
        "hide-lib": ({"name": "cm", "configMap": {"name": "any"}},
                     {"name": "cm", "mountPath": "/usr/local/vgpu/libvgpu.so", "subPath": "x"}),
        "hide-regions": ({"name": "scratch", "emptyDir": {}},
                         {"name": "scratch", "mountPath": "/usr/local/vgpu/containers/"}),
    }
    for name, (volume, mount) in cases.items():
        p = pod(name, {"gpu-memory": "1024"})
        p["spec"]["volumes"] = [volume]
        p["spec"]["containers"][0]["volumeMounts"] = [mount]
        before = webhook_reviews()
        r = create(p, check=False)
        assert not isinstance(r, dict), f"{name}: admitted"
        assert "vgpu.lib.kai-resource-isolator.io" in r.stderr and mount["mountPath"] in r.stderr, r.stderr
        assert delta(before, webhook_reviews()) == {"denied": 1}, delta(before, webhook_reviews())
        assert kubectl("get", "pod", name, "-n", TENANT, check=False).returncode != 0, f"{name}: stored"


def hostile_env():
    victim = create(pod("victim", {"gpu-memory": "1024"}))
    p = pod("greedy", {"gpu-memory": "4096", "kai-resource-isolator.io/gpu-cores": "25"})
    p["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80000m"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
        {"name": "POD_UID", "value": victim["metadata"]["uid"]},
        {"name": "CONTAINER_NAME", "value": "main"},
        {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/tmp/hidden.cache"},
        {"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"},
    ]
    stored = create(p)
    pod_checks("injected", stored, "main")
    env = stored["spec"]["containers"][0]["env"]
    named = lambda n: [e for e in env if e["name"] == n]
    assert named("CUDA_DEVICE_MEMORY_LIMIT") == [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "4096m"}], env
    assert named("CUDA_DEVICE_MEMORY_LIMIT_0") == [], env
    assert named("CUDA_DEVICE_SM_LIMIT") == [{"name": "CUDA_DEVICE_SM_LIMIT", "value": "25"}], env
    assert named("CUDA_DEVICE_MEMORY_SHARED_CACHE") == [], env
    (uid,) = named("POD_UID")
    assert uid.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.uid" and "value" not in uid, uid
    assert named("CONTAINER_NAME") == [{"name": "CONTAINER_NAME", "value": "main"}], env
    assert named("LD_PRELOAD") == [{"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so"}], "the tenant's own business"


def opt_out_gate():
    allowed = "opt-out-allowed"
    kubectl("create", "namespace", allowed, check=False)
    kubectl("label", "namespace", allowed, "kai-resource-isolator.io/allow-opt-out=true", "--overwrite")
    annotation = {"gpu-memory": "1024", "kai-resource-isolator.io/inject": "false"}
    label = {"kai-resource-isolator.io/webhook": "ignore"}
    before = webhook_reviews()
    # A normal namespace: both are the tenant's words, and count for nothing.
    pod_checks("injected", create(pod("annotated-out", annotation)), "main")
    pod_checks("injected", create(pod("labelled-out", {"gpu-memory": "1024"}, labels=label)), "main")
    assert delta(before, webhook_reviews()) == {"injected": 2}, delta(before, webhook_reviews())
    # A namespace the administrator labelled: both are honoured (the label
    # keeps the pod from the webhook; the annotation is answered opted_out).
    before = webhook_reviews()
    pod_checks("untouched", create(pod("annotated-out", annotation), ns=allowed))
    pod_checks("untouched", create(pod("labelled-out", {"gpu-memory": "1024"}, labels=label), ns=allowed))
    pod_checks("injected", create(pod("not-out", {"gpu-memory": "1024"}), ns=allowed), "main")
    assert delta(before, webhook_reviews()) == {"opted_out": 1, "injected": 1}, delta(before, webhook_reviews())


def create_raw(obj, ns=TENANT):
    """POSTs the pod's JSON as written. kubectl create would re-encode it,
    escaping < as \\u003c (six bytes), past the API server's 3 MiB limit."""
    path = os.path.join(WORK, f"{obj['metadata']['name']}.json")
    with open(path, "w") as f:
        json.dump(obj, f)  # Python leaves < as it is
    r = kubectl("create", "--raw", f"/api/v1/namespaces/{ns}/pods", "-f", path, check=False)
    return json.loads(r.stdout) if r.returncode == 0 else r


def big_review():
    def big(name):
        p = pod(name, {"gpu-memory": "2048"})
        p["spec"]["containers"][0]["env"] = [{"name": "PAD", "value": "<" * (586 * 1024)}]
        return p
    before = webhook_reviews()
    stored = create_raw(big("big"))
    assert isinstance(stored, dict), stored.stderr[-400:]
    pod_checks("injected", stored, "main")
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"]}
    assert env.get("CUDA_DEVICE_MEMORY_LIMIT") == "2048m", sorted(env)
    assert delta(before, webhook_reviews()) == {"injected": 1}, delta(before, webhook_reviews())
    # Below the review's size, the webhook denies it (by the uid in its
    # first bytes): never admitted unpatched, whatever the failurePolicy.
    stop("webhook")
    try:
        start_webhook(MAX_BODY_BYTES=str(2 * 1024 * 1024))
        r = create_raw(big("big-denied"))
        assert not isinstance(r, dict), "admitted"
        assert "vgpu.lib.kai-resource-isolator.io" in r.stderr and "exceeds" in r.stderr, r.stderr[-400:]
        assert kubectl("get", "pod", "big-denied", "-n", TENANT, check=False).returncode != 0, "stored"
    finally:
        stop("webhook")
        start_webhook()


def reinvocation():
    key, crt = os.path.join(WORK, "second.key"), os.path.join(WORK, "second.crt")
    run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-subj", "/CN=second",
        "-out", crt + ".csr")
    with open(crt + ".ext", "w") as f:
        f.write(f"subjectAltName=IP:{NODE_IP}\nextendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", crt + ".csr", "-CA", f"{PKI}/ca.crt", "-CAkey", f"{PKI}/ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", crt + ".ext", "-out", crt)
    srv = http.server.ThreadingHTTPServer((NODE_IP, 0), SecondWebhook)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    ca = base64.b64encode(open(f"{PKI}/ca.crt", "rb").read()).decode()
    # Webhooks run in the order of their configurations' names: zz- after ours.
    apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
           "metadata": {"name": "zz-kai-test-second"},
           "webhooks": [{"name": "second.kai-test.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                         "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                         "clientConfig": {"url": f"https://{NODE_IP}:{srv.server_address[1]}/mutate", "caBundle": ca},
                         "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                    "resources": ["pods"]}],
                         "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": TENANT}},
                         "objectSelector": {"matchLabels": {"second-webhook": "yes"}}}]})
    try:
        before = webhook_reviews()
        stored = create(pod("reinvoked", {"gpu-memory": "1024"}, labels={"second-webhook": "yes"}))
        d = delta(before, webhook_reviews())
        assert d == {"injected": 1, "already_injected": 1}, f"our webhook was not called twice: {d}"
        pod_checks("injected", stored, "main")
        names = [v["name"] for v in stored["spec"]["volumes"]]
        assert "second-webhook" in names and [names.count(v) for v in OURS] == [1, 0, 0], names
        env = [e["name"] for e in stored["spec"]["containers"][0]["env"]]
        assert env.count("SECOND_WEBHOOK") == 1 and env.count("POD_UID") == 1, env
        # The second webhook sets the user after our first call: our
        # second call rewrites the CSI volume's run-as attributes.
        before = webhook_reviews()
        stored = create(pod("reinvoked-user", {"gpu-memory": "1024"},
                            labels={"second-webhook": "yes", "second-webhook-user": "yes"}))
        d = delta(before, webhook_reviews())
        assert d == {"injected": 2}, f"our second call rewrote nothing: {d}"
        assert stored["spec"]["securityContext"].get("runAsUser") == 1000, stored["spec"]
        (ours,) = [v for v in stored["spec"]["volumes"] if v["name"] == OURS[0]]
        attrs = ours["csi"]["volumeAttributes"]
        assert attrs.get("kai-resource-isolator.io/run-as-user") == "1000" and \
            attrs.get("kai-resource-isolator.io/run-as-group") == "3000", attrs
        pod_checks("injected", stored, "main")
    finally:
        kubectl("delete", "mutatingwebhookconfiguration", "zz-kai-test-second", check=False)
        srv.shutdown()


# ============================================================================
# 3. fail closed
# ============================================================================

def fail_closed():
    stop("webhook")

    def sharing_rejected():
        r = create(pod("while-down", {"gpu-memory": "1024"}), check=False)
        assert not isinstance(r, dict), "a GPU-sharing pod was admitted while the webhook is down"
        assert "failed calling webhook" in r.stderr and "vgpu.lib.kai-resource-isolator.io" in r.stderr, r.stderr
    check("webhook down, default values: a GPU-sharing pod is rejected with the webhook's name in the error", sharing_rejected)
    check("webhook down: a plain pod is still admitted (matchConditions keep it away from the webhook)",
          lambda: pod_checks("untouched", create(pod("plain-while-down"))))

    def fail_open_switch():
        r = helm("upgrade", RELEASE, CHART, "-n", NS, "--set", "webhook.failurePolicy=Ignore", check=False)
        assert r.returncode == 0, r.stderr[-600:]
        stored = create(pod("while-down-ignore", {"gpu-memory": "1024"}))
        pod_checks("untouched", stored)
    check("webhook.failurePolicy=Ignore (the old behaviour): the sharing pod is admitted unpatched", fail_open_switch)
    # --reset-values: a bare upgrade would keep failurePolicy=Ignore.
    r = helm("upgrade", RELEASE, CHART, "-n", NS, "--reset-values", check=False)
    assert r.returncode == 0, r.stderr
    start_webhook()


# ============================================================================
# 4. RBAC by the real authorizer
# ============================================================================

def rbac_lists():
    """kubectl auth can-i --list for each ServiceAccount of the chart, in the
    release namespace and a tenant namespace, as committed expectations."""
    sas = [s["metadata"]["name"] for s in kjson("get", "serviceaccount", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]]
    assert sorted(sas) == sorted(f"{FULL}-{x}" for x in ("aggregator", "node", "webhook")), sas
    for values, suffix in (((), ""), (("--set", "monitor.isolation.enforce=evict"), "-enforce-evict")):
        r = helm("upgrade", RELEASE, CHART, "-n", NS, *values, check=False)
        assert r.returncode == 0, r.stderr
        for sa in sorted(sas):
            short = sa.removeprefix(FULL + "-")
            if suffix and short != "node":
                continue

            def same():
                got = ""
                for ns in (NS, TENANT):
                    out = kubectl("auth", "can-i", "--list", f"--as=system:serviceaccount:{NS}:{sa}", "-n", ns).stdout
                    got += f"# namespace {ns}\n" + "\n".join(sorted(l.rstrip() for l in out.splitlines()[1:] if l.strip())) + "\n"
                path = os.path.join(RBAC_DIR, f"{short}{suffix}.txt")
                if os.environ.get("KAI_RBAC_UPDATE"):
                    os.makedirs(RBAC_DIR, exist_ok=True)
                    open(path, "w").write(got)
                want = open(path).read()
                assert got == want, f"differs from {os.path.relpath(path, ROOT)} (KAI_RBAC_UPDATE=1 rewrites it):\n" + "\n".join(
                    l for l in got.splitlines() if l not in want.splitlines())
            check(f"RBAC of {short}{' with enforce=evict' if suffix else ''}: can-i --list equals kind-tests/rbac/{short}{suffix}.txt", same)


AGENT = {}
# The GPU processes of the node, as the fake NVML reports them and the fake
# host /proc places them in pods: host PID -> (pod UID, NVML MiB or None).
# The agent evicts only on NVML's measurement of a pod's own process.
MY_PID, OTHER_PID = 4100, 4200
GPU_UUID = "GPU-a0000000-0000-4000-8000-000000000000"


# The container ID of every fake process (the cgroup path's last part).
CONTAINER_ID = "ab" * 32


def node_processes(procs):
    """Writes the fake host /proc and the fake NVML's processes. The agent
    takes a directory for the host's procfs only with what every one has:
    `self`, a link to a PID that is there, and PID 1 in no pod (the host's
    init)."""
    init = os.path.join(AGENT["proc"], "1")
    os.makedirs(init, exist_ok=True)
    with open(os.path.join(init, "cgroup"), "w") as f:
        f.write("0::/init.scope\n")
    if not os.path.islink(os.path.join(AGENT["proc"], "self")):
        os.symlink("1", os.path.join(AGENT["proc"], "self"))
    for pid, (uid, _) in procs.items():
        os.makedirs(os.path.join(AGENT["proc"], str(pid)), exist_ok=True)
        with open(os.path.join(AGENT["proc"], str(pid), "cgroup"), "w") as f:
            f.write(f"0::/kubepods/burstable/pod{uid}/{CONTAINER_ID}\n")
    gpu = {"uuid": GPU_UUID, "name": "NVIDIA H100 80GB HBM3", "total": 80 << 30, "used": 0,
           "processes": [{"pid": pid, "used": mib << 20} for pid, (_, mib) in procs.items() if mib is not None]}
    with open(AGENT["nvml_config"] + ".tmp", "w") as f:
        json.dump({"driver": "550.54.15", "devices": [gpu]}, f)
    os.replace(AGENT["nvml_config"] + ".tmp", AGENT["nvml_config"])


def agent_pod(node):
    """The chart's node-agent pod the DaemonSet controller put on `node`."""
    def on_node():
        # A rollout's old pod stays terminating until the kubelet confirms.
        kubelet_confirms_terminations(NS)
        pods = kjson("get", "pod", "-n", NS, "-l", "app.kubernetes.io/component=node-agent",
                     "--field-selector", f"spec.nodeName={node}")["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return eventually(f"a node-agent pod on {node}", on_node, timeout=60)[0]


def mount_grpc_tls(args, side):
    """`args` with the chart's mount path of the gRPC TLS Secret replaced by
    its files here."""
    if not any("/etc/kai/grpc-tls/" in a for a in args):
        return args
    d = grpc_tls_files(side)
    assert d, f"the release renders gRPC TLS flags but has no {side} Secret"
    return [a.replace("/etc/kai/grpc-tls/", d + "/") for a in args]


def grpcurl_tls(cert_side="aggregator"):
    """grpcurl's flags towards an agent: TLS with `cert_side`'s client
    certificate (the aggregator's is the one agents accept), or plaintext
    where the release has no gRPC TLS."""
    if not AGENT.get("tls"):
        return ["-plaintext"]
    agg, own = grpc_tls_files("aggregator"), grpc_tls_files(cert_side)
    return ["-cacert", os.path.join(agg, "ca.crt"), "-cert", os.path.join(own, "tls.crt"),
            "-key", os.path.join(own, "tls.key"), "-servername", "kai-node-agent"]


def start_agent(node=NODES[0]):
    """The chart's node-agent container, run here as its ServiceAccount,
    with a fake NVML and a fake host /proc (this machine has no GPU)."""
    c = container_of("daemonset", f"{FULL}-node", "agent")
    grpc_port, metrics_port = AGENT.setdefault("grpc", free_port(NODE_IP)), AGENT.setdefault("metrics", free_port())
    containers = os.path.join(HOST, "usr/local/vgpu/containers")
    os.makedirs(containers, exist_ok=True)
    AGENT["proc"] = os.path.join(HOST, "proc")
    AGENT["nvml_config"] = os.path.join(HOST, "nvml.json")
    node_processes({})
    nvml_lib = built_library("libkai_fake_nvml.so", "kai-fake-nvml", hint=", or run the tests first")
    args = rewrite(c["args"], [(r"^--containers-dir=.*", f"--containers-dir={containers}"),
                               (r"^--grpc-listen=.*", f"--grpc-listen={NODE_IP}:{grpc_port}"),
                               (r"^--metrics-listen=.*", f"--metrics-listen=127.0.0.1:{metrics_port}"),
                               (r"^--host-proc=.*", f"--host-proc={AGENT['proc']}"),
                               (r"^--nvml-library=.*", f"--nvml-library={nvml_lib}"),
                               (r"^--log-format=.*", "--log-format=plain")])
    if not any(a.startswith("--nvml-library=") for a in args):
        args.append(f"--nvml-library={nvml_lib}")
    AGENT["tls"] = any(a.startswith("--grpc-tls-cert-file=") for a in args)
    args = mount_grpc_tls(args, "node")
    env = chart_env(c, NODE_NAME=node, POD_NAME=f"{FULL}-node-test")
    # The token of the agent's DaemonSet pod on that node, as the kubelet
    # projects it: it names the node, which the node guard checks.
    env["KUBECONFIG"] = sa_kubeconfig(f"{FULL}-node", pod=agent_pod(node))
    env["FAKE_NVML_CONFIG"] = AGENT["nvml_config"]
    AGENT["metrics_url"] = f"http://127.0.0.1:{metrics_port}"
    AGENT["containers"] = containers
    start("agent", [os.path.join(TARGET, "kai-node"), *args], env=env)
    eventually("agent ready (pod watch synced)", lambda: http_get(AGENT["metrics_url"] + "/readyz")[0] == 200, timeout=60)


def write_region(uid, container, limit_mib, used_mib, pid=MY_PID):
    run(os.path.join(TARGET, "kai-node"), "write-region", "--containers-dir", AGENT["containers"], "--pod-uid", uid,
        "--container", container, "--gpu-uuid", GPU_UUID,
        "--limit-mib", str(limit_mib), "--used-mib", str(used_mib),
        # A live host PID (the fake /proc has it): the slot counts as live
        # usage, not as the stale charge of a dead process.
        "--pid", str(pid))


def grpc_containers(port=None, namespace=TENANT):
    grpcurl = os.environ.get("GRPCURL", "grpcurl")
    r = run(grpcurl, *grpcurl_tls(), "-d", json.dumps({"namespace": namespace}),
            f"{NODE_IP}:{port or AGENT['grpc']}", "vgpu.v1.VgpuNode/ListContainers")
    return json.loads(r.stdout).get("containers", [])


def events_for(name, ns=TENANT):
    return [e for e in kjson("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
            if e.get("reportingComponent", e.get("source", {}).get("component", "")).startswith("kai")]


def components():
    r = helm("upgrade", RELEASE, CHART, "-n", NS, "--set", "monitor.isolation.enforce=evict", check=False)
    assert r.returncode == 0, r.stderr
    start_agent()

    def agent_sees_its_pods():
        mine = create(pod("gpu-job", {"gpu-memory": "1024"}, labels={"app": "gpu-job"}, node=NODES[0]))
        other = create(pod("gpu-job-other-node", {"gpu-memory": "1024"}, node=NODES[1]))
        AGENT["uid"] = mine["metadata"]["uid"]
        kubelet_reports_running("gpu-job", TENANT, container="main")
        node_processes({MY_PID: (mine["metadata"]["uid"], 512), OTHER_PID: (other["metadata"]["uid"], None)})
        write_region(mine["metadata"]["uid"], "main", 1024, 512)
        write_region(other["metadata"]["uid"], "main", 1024, 512, pid=OTHER_PID)
        listed = eventually("the agent names the pod from the API server",
                            lambda: [c for c in grpc_containers() if c["pod"] == "gpu-job"], timeout=60)
        assert listed[0]["isolationState"] == "ISOLATION_STATE_CAPPED", listed
        # The other node's pod is not in this agent's watch (spec.nodeName
        # field selector): its region stays unattributed.
        assert not [c for c in grpc_containers() if c["pod"] == "gpu-job-other-node"]
    check("node agent with its ServiceAccount token: watches its node's pods and names their containers", agent_sees_its_pods)

    def forged_region():
        # A tenant writes a region into gpu-job's directory naming its own
        # process (OTHER_PID, the other pod's by its cgroup), claiming far
        # over the cap: reported as forged, with a Warning Event, and never
        # evicts gpu-job.
        write_region(AGENT["uid"], "forged", 1, 65536, pid=OTHER_PID)
        listed = eventually("the forged region is listed", lambda: [
            c for c in grpc_containers() if c["pod"] == "gpu-job" and c["container"] == "forged"], timeout=60)
        assert listed[0]["isolationState"] == "ISOLATION_STATE_FORGED", listed
        eventually("a GpuRegionForged Event on the pod the region names",
                   lambda: [e for e in events_for("gpu-job") if e["reason"] == "GpuRegionForged"], timeout=60)
        evictions = series(AGENT["metrics_url"] + "/metrics", "kai_isolator_evictions_total")
        assert sum(evictions.values()) == 0, evictions
        shutil.rmtree(os.path.join(AGENT["containers"], f"{AGENT['uid']}_forged"))
    check("a region naming another pod's process is reported forged and evicts nobody", forged_region)

    def pdb_then_evict():
        apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "gpu-job", "namespace": TENANT},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "gpu-job"}}}})
        # The PDB controller must have counted the pod before it protects it.
        def protecting():
            st = kjson("get", "pdb", "gpu-job", "-n", TENANT).get("status", {})
            return st.get("observedGeneration") and st.get("currentHealthy") == 1 and st.get("disruptionsAllowed") == 0
        eventually("the PDB counts the running pod and allows no disruption", protecting)
        refusals = lambda: sum(v for k, v in series(AGENT["metrics_url"] + "/metrics", "kai_isolator_eviction_refusals_total").items())
        before = refusals()
        # Far over cap + margin, in the region and as NVML measures the
        # pod's own process (the evidence an eviction needs).
        node_processes({MY_PID: (AGENT["uid"], 4096)})
        write_region(AGENT["uid"], "main", 1024, 4096)
        eventually("a Warning Event from the agent", lambda: [e for e in events_for("gpu-job") if e["type"] == "Warning"], timeout=60)
        eventually("the Eviction API answered 429 (PDB) and the agent counted it", lambda: refusals() > before, timeout=60)
        assert not kjson("get", "pod", "gpu-job", "-n", TENANT)["metadata"].get("deletionTimestamp"), "evicted through a PDB"
        kubectl("delete", "pdb", "gpu-job", "-n", TENANT)
        def evicted():
            # Grace period 0: the eviction deletes it outright; otherwise it
            # is terminating.
            r = kubectl("get", "pod", "gpu-job", "-n", TENANT, "-o", "json", check=False)
            return "NotFound" in r.stderr if r.returncode else json.loads(r.stdout)["metadata"].get("deletionTimestamp")
        eventually("evicted once the PDB is gone (retried)", evicted, timeout=90)
        evicted = series(AGENT["metrics_url"] + "/metrics", "kai_isolator_evictions_total")
        assert sum(evicted.values()) == 1, evicted
    check("enforce=evict: Warning Event, a PDB makes the Eviction API answer 429 (counted, retried), then evicted", pdb_then_evict)

    def node_guard():
        # The agent's token from another node may not evict a pod on this
        # one; the token of this node's agent may.
        create(pod("guarded", {}, node=NODES[0]))
        eviction = os.path.join(WORK, "eviction.json")
        with open(eviction, "w") as f:
            json.dump({"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": "guarded", "namespace": TENANT}}, f)
        path = f"/api/v1/namespaces/{TENANT}/pods/guarded/eviction"
        # A pod of the release's namespace on the other node holds the
        # agent's token there (the default values run no agent on it).
        holder = pod("agent-token-holder", node=NODES[1])
        holder["spec"]["serviceAccountName"] = f"{FULL}-node"
        elsewhere = create(holder, ns=NS)
        other = sa_kubeconfig(f"{FULL}-node", pod=elsewhere)
        r = kubectl("create", "--raw", path, "-f", eviction, kubeconfig=other, check=False)
        # The denial names the asking node only, never where the pod runs.
        assert r.returncode != 0 and "may not act on pod" in r.stderr and NODES[1] in r.stderr, r.stderr
        assert NODES[0] not in r.stderr, r.stderr
        assert not kjson("get", "pod", "guarded", "-n", TENANT)["metadata"].get("deletionTimestamp")
        mine = sa_kubeconfig(f"{FULL}-node", pod=agent_pod(NODES[0]))
        r = kubectl("create", "--raw", path, "-f", eviction, kubeconfig=mine, check=False)
        assert r.returncode == 0, r.stderr
    check("node guard: an agent's token evicts pods on its own node only", node_guard)

    check("aggregator with its ServiceAccount token discovers the agent pod and serves its containers", aggregator)


AGG = {}


def kubelet_reports_running(name, ns, container=None):
    """The kubelet's status for a started pod: Running and Ready. (The
    Eviction API lets Pending pods go without asking the PDB.) With
    `container`, that container's status too, with the ID node_processes
    writes into its processes' cgroups: the agent counts a region's slots
    only for processes of the GPU container's own ID."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"phase": "Running", "podIP": NODE_IP, "podIPs": [{"ip": NODE_IP}], "hostIP": NODE_IP,
              "startTime": now,
              "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                             for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
    if container:
        status["containerStatuses"] = [{
            "name": container, "containerID": "containerd://" + CONTAINER_ID, "ready": True,
            "restartCount": 0, "state": {"running": {"startedAt": now}},
            "image": "registry.k8s.io/pause:3.10", "imageID": ""}]
    kubectl("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def kubelet_confirms_terminations(ns):
    """What a kubelet does for pods being deleted on its node: confirm they
    stopped (here, with no kubelet, a forced delete). Upgrades roll
    DaemonSet pods, and the controller waits for the old one to go."""
    for p in kjson("get", "pod", "-n", ns)["items"]:
        if p["metadata"].get("deletionTimestamp"):
            kubectl("delete", "pod", p["metadata"]["name"], "-n", ns, "--force", "--grace-period=0", check=False)


def start_aggregator():
    """The chart's aggregator container, run here as its ServiceAccount."""
    c = container_of("deployment", f"{FULL}-aggregator", "aggregator")
    # The chart's HTTP port on this node's address, and the Deployment's
    # (newest) pod Running there: the EndpointSlice controller then points
    # the Service at it, and the API server's service proxy (kubectl vgpu)
    # reaches it.
    http_port, grpc_port = 9394, AGG.get("grpc_port") or free_port(NODE_IP)
    AGG["grpc_port"] = grpc_port
    kubelet_confirms_terminations(NS)
    pods = [p for p in kjson("get", "pod", "-n", NS, "-l", "app.kubernetes.io/component=aggregator")["items"]
            if not p["metadata"].get("deletionTimestamp")]
    agg_pod = max(pods, key=lambda p: p["metadata"]["creationTimestamp"])
    kubelet_reports_running(agg_pod["metadata"]["name"], NS)
    AGG["pod"] = agg_pod["metadata"]["name"]
    args = rewrite(c["args"], [(r"^--listen=.*", f"--listen={NODE_IP}:{http_port}"),
                               (r"^--grpc-listen=.*", f"--grpc-listen={NODE_IP}:{grpc_port}"),
                               (r"^--agent-port=.*", f"--agent-port={AGENT['grpc']}"),
                               (r"^--log-format=.*", "--log-format=plain")])
    env = chart_env(c, POD_NAMESPACE=NS)
    env["KUBECONFIG"] = sa_kubeconfig(f"{FULL}-aggregator")
    args = mount_grpc_tls(args, "aggregator")
    AGG["url"], AGG["grpc"] = f"http://{NODE_IP}:{http_port}", f"{NODE_IP}:{grpc_port}"
    start("aggregator", [os.path.join(TARGET, "kai-aggregator"), *args], env=env)


def aggregator():
    # The DaemonSet's pod on the first node "runs" here: the kubelet's part
    # (status Running, the pod IP) is written by the test.
    pods = [agent_pod(NODES[0])]
    kubelet_reports_running(pods[0]["metadata"]["name"], NS)
    served_pod = create(pod("agg-job", {"gpu-memory": "1024"}, node=NODES[0]))
    write_region(served_pod["metadata"]["uid"], "main", 1024, 256)
    start_aggregator()

    def served():
        status, text = http_get(AGG["url"] + "/metrics", token=prometheus_token())
        assert status == 200, f"{status} {text[:200]}"
        return [l for l in text.splitlines() if l.startswith("hami_vgpu_memory_used_bytes{")
                and 'pod="agg-job"' in l and f'node="{NODES[0]}"' in l and l.endswith(f" {256 << 20}")]
    eventually("the aggregator serves the agent's series with its node label", served, timeout=60)


# ============================================================================
# 4b. who may see what (docs/security.md, "Access control")
# ============================================================================

USERS_NS = "kai-users"
TOKENS = {}


def user_token(name, *extra):
    return kubectl("create", "token", name, "-n", USERS_NS, "--duration=2h", *extra).stdout.strip()


def user_kubeconfig(name, token):
    return write_kubeconfig(os.path.join(WORK, f"user-{name}.kubeconfig"), name, f'{{token: "{token}"}}', TENANT)


def expired(token):
    """`token` with its times moved two hours back, signed again with the
    cluster's ServiceAccount key: a genuine token that has expired."""
    def b64(raw):
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    header, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    # Issued for 2 h: four hours back is well past expiry and any leeway.
    for k in ("exp", "iat", "nbf"):
        if k in claims:
            claims[k] -= 4 * 3600
    signing = f"{header}.{b64(json.dumps(claims).encode())}"
    # The raw signature is binary: no text mode.
    raw = subprocess.run(["openssl", "dgst", "-sha256", "-sign", os.path.join(PKI, "sa.key")],
                         input=signing.encode(), capture_output=True, check=True).stdout
    return f"{signing}.{b64(raw)}"


# Every route of the aggregator's HTTP port (services/aggregator/src/http.rs
# ROUTES) and the ones nobody routed; the open ones carry no data.
GUARDED = ["/metrics", "/api/v1/containers", "/api/v1/nodes", "/api/v1/devices", "/api/v1/view",
           "/api/v1/view/events", "/api/v1/unrouted", "/api/v2/containers"]
OPEN = ["/healthz", "/readyz", "/", "/ui/app.js", "/ui/app.css"]


def grpc_cluster(token, method, body=None, header="authorization"):
    grpcurl = os.environ.get("GRPCURL", "grpcurl")
    auth = ["-H", f"{header}: Bearer {token}"] if token else []
    return run(grpcurl, "-plaintext", *auth, "-d", json.dumps(body or {}), AGG["grpc"],
               f"vgpu.v1.VgpuCluster/{method}", check=False)


def kubectl_vgpu(kubeconfig, *args, check=True):
    return run(os.path.join(TARGET, "kubectl-vgpu"), *args, check=check,
               env={**os.environ, "KUBECONFIG": kubeconfig, "NO_COLOR": "1"})


def access():
    kubectl("create", "namespace", USERS_NS, check=False)
    kubectl("create", "namespace", "team-b", check=False)
    for sa in ("viewer", "alice", "podlister", "nobody"):
        kubectl("create", "serviceaccount", sa, "-n", USERS_NS, check=False)
    # viewer: the built-in view cluster-wide; alice: view in team-a only
    # (our ClusterRole aggregates into view); podlister: list pods in team-a
    # and nothing else; nobody: no binding at all.
    kubectl("create", "clusterrolebinding", "kai-test-viewer", "--clusterrole=view",
            f"--serviceaccount={USERS_NS}:viewer", check=False)
    kubectl("create", "rolebinding", "alice-view", "-n", TENANT, "--clusterrole=view",
            f"--serviceaccount={USERS_NS}:alice", check=False)
    kubectl("create", "role", "pod-lister", "-n", TENANT, "--verb=list", "--resource=pods", check=False)
    kubectl("create", "rolebinding", "podlister", "-n", TENANT, "--role=pod-lister",
            f"--serviceaccount={USERS_NS}:podlister", check=False)
    tok = {u: user_token(u) for u in ("viewer", "alice", "podlister", "nobody")}
    secret = create(pod("b-secret", {"gpu-memory": "2048"}, node=NODES[0]), ns="team-b")
    write_region(secret["metadata"]["uid"], "main", 2048, 300)
    own = "agg-job"

    def listed(token, query="", header="Authorization"):
        status, text = http_get(AGG["url"] + "/api/v1/containers" + query, token=token, header=header)
        assert status == 200, f"{status} {text[:300]}"
        return sorted(c["pod"] for c in json.loads(text).get("containers", []))
    eventually("the aggregator has team-b's pod (viewer's view)", lambda: "b-secret" in listed(tok["viewer"]), timeout=60)

    def unauthenticated():
        for path in GUARDED:
            status, text = http_get(AGG["url"] + path)
            assert status == 401, f"{path} without a token: {status} {text[:200]}"
            status, _ = http_get(AGG["url"] + path, token="not-a-token", stream=path.endswith("/events"))
            assert status == 401, f"{path} with a forged token: {status}"
        for path in OPEN:
            status, text = http_get(AGG["url"] + path)
            assert status == 200, f"{path}: {status}"
            assert "b-secret" not in text and own not in text and "team-b" not in text, f"{path} carries data"
        status, _ = http_get(AGENT["metrics_url"] + "/metrics")
        assert status == 401, f"agent /metrics without a token: {status}"
        assert http_get(AGENT["metrics_url"] + "/readyz")[0] == 200
    check("no aggregator route and no agent /metrics answers without a token (every route; probes and assets open, without data)", unauthenticated)

    def agent_mtls():
        assert AGENT.get("tls"), "the chart's default runs the agents' gRPC with mutual TLS"
        grpcurl = os.environ.get("GRPCURL", "grpcurl")
        target = f"{NODE_IP}:{AGENT['grpc']}"
        ca = os.path.join(grpc_tls_files("aggregator"), "ca.crt")
        for flags, what in ((["-plaintext"], "plaintext"),
                            (["-cacert", ca, "-servername", "kai-node-agent"], "TLS without a client certificate"),
                            (grpcurl_tls("node"), "a certificate of the agents' own CA")):
            r = run(grpcurl, *flags, target, "vgpu.v1.VgpuNode/ListContainers", check=False)
            assert r.returncode != 0, f"{what}: served ({r.stdout[:200]})"
        r = run(grpcurl, *grpcurl_tls(), target, "vgpu.v1.VgpuNode/ListContainers")
        assert "b-secret" in r.stdout, r.stdout[:300]
    check("node agent gRPC (chart default): refuses plaintext, TLS without a certificate and the agents' own certificate; serves the aggregator's", agent_mtls)

    def aggregated():
        def can(sa, namespace=None):
            # A SubjectAccessReview, as the aggregator asks it (kubectl auth
            # can-i cannot name a resource the API server does not serve).
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {"user": f"system:serviceaccount:{USERS_NS}:{sa}",
                               "groups": ["system:serviceaccounts", f"system:serviceaccounts:{USERS_NS}",
                                          "system:authenticated"],
                               "resourceAttributes": {"verb": "list", "group": "vgpu.kai-resource-isolator.io",
                                                      "resource": "containers", "namespace": namespace or ""}}}
            r = kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
            return "yes" if json.loads(r.stdout)["status"].get("allowed") else "no"
        # Our ClusterRole is aggregated into view: view cluster-wide is the
        # cluster view, view in team-a that namespace's, with no binding of ours.
        got = {"viewer (cluster)": can("viewer"), "alice team-a": can("alice", TENANT),
               "alice team-b": can("alice", "team-b"), "podlister team-a": can("podlister", TENANT),
               "nobody team-a": can("nobody", TENANT)}
        want = {"viewer (cluster)": "yes", "alice team-a": "yes", "alice team-b": "no",
                "podlister team-a": "no", "nobody team-a": "no"}
        assert got == want, got
    check("the chart's ClusterRole aggregates into view: view grants list on containers.vgpu.kai-resource-isolator.io where it is bound", aggregated)

    def viewer():
        pods = listed(tok["viewer"])
        assert own in pods and "b-secret" in pods, pods
        status, text = http_get(AGG["url"] + "/api/v1/nodes", token=tok["viewer"])
        assert status == 200 and NODES[0] in text, text[:300]
        status, text = http_get(AGG["url"] + "/api/v1/devices", token=tok["viewer"])
        assert status == 200 and json.loads(text)["devices"], text[:300]
    check("cluster viewer (view through a ClusterRoleBinding): every namespace, nodes and devices", viewer)

    def scoped(user, header="Authorization"):
        def fn():
            assert listed(tok[user], header=header) == [own], listed(tok[user], header=header)
            for path in ("/api/v1/containers", "/api/v1/nodes", "/api/v1/devices", "/api/v1/view"):
                status, text = http_get(AGG["url"] + path, token=tok[user], header=header)
                assert status == 200, f"{path}: {status} {text[:200]}"
                for other in ("b-secret", "team-b"):
                    assert other not in text, f"{path} shows {user} {other}"
            status, text = http_get(AGG["url"] + "/api/v1/containers?namespace=team-b", token=tok[user])
            assert status == 403 and "may not list" in text, f"{status} {text[:200]}"
            status, _ = http_get(AGG["url"] + "/api/v1/view/events", token=tok[user], stream=True)
            assert status == 200, status
            status, _ = http_get(AGG["url"] + "/metrics", token=tok[user])
            assert status == 403, f"a tenant reads /metrics: {status}"
        return fn
    check("team-a user (view in team-a, our ClusterRole aggregated): team-a only in every API, 403 for team-b and /metrics", scoped("alice"))
    check("user who may only list pods in team-a: team-a only, token in X-Kai-Authorization", scoped("podlister", header="X-Kai-Authorization"))

    def nobody():
        assert listed(tok["nobody"]) == []
        status, text = http_get(AGG["url"] + "/api/v1/nodes", token=tok["nobody"])
        assert status == 200 and json.loads(text).get("nodes", []) == [], text[:200]
        status, _ = http_get(AGG["url"] + f"/api/v1/containers?namespace={TENANT}", token=tok["nobody"])
        assert status == 403, status
    check("user with no permission: nothing, 403 for a named namespace", nobody)

    def prometheus():
        for url in (AGG["url"], AGENT["metrics_url"]):
            status, text = http_get(url + "/metrics", token=prometheus_token())
            assert status == 200 and "hami_vgpu_memory_used_bytes" in text, f"{url}: {status} {text[:200]}"
            assert "kai_access_reviews_total" in text, "the checks are counted"
            status, _ = http_get(url + "/metrics", token=tok["viewer"])
            assert status == 403, f"{url}: viewer reads /metrics: {status}"
    check("Prometheus' own ServiceAccount token (get on /metrics) scrapes the aggregator and the agent; others get 403", prometheus)

    def grpc():
        r = grpc_cluster(None, "ListContainers")
        assert r.returncode != 0 and "Unauthenticated" in r.stderr, r.stderr
        r = grpc_cluster(tok["alice"], "ListContainers", header="x-kai-authorization")
        assert r.returncode == 0, r.stderr
        assert sorted(c["pod"] for c in json.loads(r.stdout).get("containers", [])) == [own], r.stdout
        r = grpc_cluster(tok["alice"], "ListContainers", {"namespace": "team-b"})
        assert r.returncode != 0 and "PermissionDenied" in r.stderr, r.stderr
        r = grpc_cluster(tok["viewer"], "ListContainers")
        assert "b-secret" in r.stdout, r.stdout[:300]
        r = grpc_cluster(tok["nobody"], "ListNodes")
        assert r.returncode == 0 and "nodes" not in json.loads(r.stdout), r.stdout
    check("gRPC VgpuCluster: no token Unauthenticated, team-a user team-a only (PermissionDenied for team-b), viewer all", grpc)

    def bad_tokens():
        other = user_token("viewer", "--audience=not-the-api-server")
        status, text = http_get(AGG["url"] + "/api/v1/containers", token=other)
        assert status == 401, f"wrong audience: {status} {text[:200]}"
        old = expired(tok["viewer"])
        status, text = http_get(AGG["url"] + "/api/v1/containers", token=old)
        assert status == 401, f"expired: {status} {text[:200]}"
    check("a token for another audience and an expired token (re-signed with the cluster's key) are refused", bad_tokens)

    def kubectl_plugin():
        alice = user_kubeconfig("alice", tok["alice"])
        # A tenant may not list Services cluster-wide: told to name the
        # namespace, where the chart lets every user find the Service.
        r = kubectl_vgpu(alice, "top", "-A", check=False)
        assert r.returncode == 1 and "--aggregator-namespace" in r.stderr, r.stderr
        r = kubectl_vgpu(alice, "top", "-A", "-o", "json", "--aggregator-namespace", NS)
        assert sorted({x["pod"] for x in json.loads(r.stdout)}) == [own], r.stdout[:300]
        r = kubectl_vgpu(alice, "top", "-n", "team-b", "--aggregator-namespace", NS, check=False)
        assert r.returncode == 1 and "not allowed" in r.stderr, r.stderr
        # An exec credential plugin's token (as GKE's, EKS' and OIDC
        # plugins give one) goes along the same way.
        plugin = os.path.join(WORK, "alice-credential.sh")
        with open(plugin, "w") as f:
            f.write("#!/bin/sh\necho '" + json.dumps({"apiVersion": "client.authentication.k8s.io/v1",
                                                      "kind": "ExecCredential",
                                                      "status": {"token": tok["alice"]}}) + "'\n")
        os.chmod(plugin, 0o755)
        exec_cfg = write_kubeconfig(
            os.path.join(WORK, "alice-exec.kubeconfig"), "alice",
            f'{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: "{plugin}", interactiveMode: Never}}}}',
            TENANT)
        r = kubectl_vgpu(exec_cfg, "top", "-A", "-o", "json", "--aggregator-namespace", NS)
        assert sorted({x["pod"] for x in json.loads(r.stdout)}) == [own], r.stdout[:300]
        viewer_cfg = user_kubeconfig("viewer", tok["viewer"])
        r = kubectl_vgpu(viewer_cfg, "top", "-A", "-o", "json")
        assert "b-secret" in r.stdout, r.stdout[:300]
        # The admin's kubeconfig holds a client certificate: it cannot pass
        # the service proxy; --token can.
        r = kubectl_vgpu(ADMIN, "top", "-A", check=False)
        assert r.returncode == 1 and "--token" in r.stderr, r.stderr
        r = kubectl_vgpu(ADMIN, "top", "-A", "-o", "json", f"--token={tok['viewer']}")
        assert "b-secret" in r.stdout, r.stdout[:300]
    check("kubectl vgpu through the API server's service proxy with each kubeconfig (token, exec plugin): its own view, 403 said, client certificates told to pass --token", kubectl_plugin)

    def webview():
        sys.path.insert(0, HERE)
        import webview_auth
        out = os.path.join(WORK, "webview")
        os.makedirs(out, exist_ok=True)

        def change():
            p = create(pod("a-new", {"gpu-memory": "1024"}, node=NODES[0]))
            write_region(p["metadata"]["uid"], "main", 1024, 64)
        results = webview_auth.check_token_prompt(AGG["url"] + "/", tok["alice"], "not-a-token", [own], ["b-secret"],
                                                  out, change=change, changed_pod="a-new")
        failed_steps = [f"{n}: {d}" for n, good, d in results if not good]
        assert results and not failed_steps, "; ".join(failed_steps)[:800]
    check("web view in headless Chromium: asks for a token on 401, keeps it in the tab's session, shows team-a only, live", webview)

    def webview_proxied():
        import webview_auth
        # kubectl proxy with the tenant's kubeconfig, then the API server's
        # service proxy: the page's relative URLs and its token header
        # (Authorization is the API server's, and stripped) pass both.
        port = free_port()
        start("kubectl-proxy", [os.path.join(BIN, "kubectl"), "--kubeconfig", user_kubeconfig("alice", tok["alice"]),
                                "proxy", f"--port={port}"])
        try:
            base = f"http://127.0.0.1:{port}/api/v1/namespaces/{NS}/services/{FULL}-aggregator:http-metrics/proxy/"
            eventually("kubectl proxy serving", lambda: http_get(base + "healthz")[0] == 200, timeout=30)
            out = os.path.join(WORK, "webview-proxied")
            os.makedirs(out, exist_ok=True)
            results = webview_auth.check_token_prompt(base, tok["alice"], "not-a-token", [own], ["b-secret"], out)
            failed_steps = [f"{n}: {d}" for n, good, d in results if not good]
            assert results and not failed_steps, "; ".join(failed_steps)[:800]
        finally:
            stop("kubectl-proxy")
    check("web view behind kubectl proxy and the API server's service proxy: the same sign-in, team-a only", webview_proxied)

    def client_certificates():
        # A second aggregator with HTTPS on its HTTP port and the cluster CA
        # as client CA (the chart's serving certificate is not needed for
        # this: the API server's, issued by that CA for this address).
        c = container_of("deployment", f"{FULL}-aggregator", "aggregator")
        port, grpc_port = free_port(NODE_IP), free_port(NODE_IP)
        args = rewrite(c["args"], [(r"^--listen=.*", f"--listen={NODE_IP}:{port}"),
                                   (r"^--grpc-listen=.*", f"--grpc-listen={NODE_IP}:{grpc_port}"),
                                   (r"^--agent-port=.*", f"--agent-port={AGENT['grpc']}"),
                                   (r"^--log-format=.*", "--log-format=plain")])
        args = mount_grpc_tls(args, "aggregator") + [
            f"--tls-cert-file={PKI}/apiserver.crt", f"--tls-private-key-file={PKI}/apiserver.key",
            f"--client-ca-file={PKI}/ca.crt"]
        env = {**chart_env(c, POD_NAMESPACE=NS), "KUBECONFIG": sa_kubeconfig(f"{FULL}-aggregator")}
        start("aggregator-tls", [os.path.join(TARGET, "kai-aggregator"), *args], env=env)
        kubectl("create", "rolebinding", "tenant-a-view", "-n", TENANT, "--clusterrole=view", "--user=tenant-a",
                check=False)
        try:
            def get(path, cert=None):
                ctx = ssl.create_default_context(cafile=os.path.join(PKI, "ca.crt"))
                if cert:
                    ctx.load_cert_chain(os.path.join(PKI, f"{cert}.crt"), os.path.join(PKI, f"{cert}.key"))
                conn = http.client.HTTPSConnection(NODE_IP, port, context=ctx, timeout=10)
                conn.request("GET", path)
                r = conn.getresponse()
                return r.status, r.read().decode()
            eventually("the HTTPS aggregator has team-b's pod (the admin's certificate, system:masters)",
                       lambda: "b-secret" in get("/api/v1/containers", "admin")[1], timeout=60)
            team_a = listed(tok["alice"])
            assert own in team_a and "b-secret" not in team_a, team_a
            status, text = get("/api/v1/containers", "user-tenant-a")
            assert status == 200, f"{status} {text[:200]}"
            assert sorted(x["pod"] for x in json.loads(text)["containers"]) == team_a, text[:300]
            status, _ = get("/api/v1/containers")
            assert status == 401, f"no certificate, no token: {status}"
            status, _ = get("/metrics", "user-tenant-a")
            assert status == 403, f"tenant-a reads /metrics: {status}"
            # kubectl vgpu straight to it with a client-certificate kubeconfig.
            r = kubectl_vgpu(os.path.join(CLUSTER, "users", "tenant-a.kubeconfig"), "top", "-A", "-o", "json",
                             f"--aggregator=https://{NODE_IP}:{port}")
            assert sorted({x["pod"] for x in json.loads(r.stdout)}) == team_a, r.stdout[:300]
        finally:
            stop("aggregator-tls")
    check("client certificates of the cluster CA as identities (HTTPS port, --client-ca-file): tenant-a's certificate sees team-a, the admin's the cluster, none 401; kubectl vgpu with a client-certificate kubeconfig", client_certificates)

    def rotation():
        grpcurl = os.environ.get("GRPCURL", "grpcurl")
        target = f"{NODE_IP}:{AGENT['grpc']}"
        old = os.path.join(WORK, "grpc-tls-before-rotation")
        shutil.copytree(grpc_tls_files("aggregator"), old, dirs_exist_ok=True)
        old_ca = open(os.path.join(grpc_tls_files("node"), "ca.crt")).read()
        old_agent, old_agg = agent_pod(NODES[0])["metadata"]["name"], AGG["pod"]
        # The chart's rotation (chart README): delete a Secret and upgrade;
        # both sides get new certificates, the pods restart on the checksum.
        kubectl("delete", "secret", f"{FULL}-node-grpc-tls", "-n", NS)
        r = helm("upgrade", RELEASE, CHART, "-n", NS, check=False)
        assert r.returncode == 0, r.stderr[-600:]
        assert open(os.path.join(grpc_tls_files("node"), "ca.crt")).read() != old_ca, "the agents' CA is new"
        eventually("the DaemonSet replaced the agent pod", lambda: agent_pod(NODES[0])["metadata"]["name"] != old_agent)
        stop("agent")
        start_agent()
        # The kubelet's part: the new agent pod runs (the aggregator finds
        # agents by their Running pods' addresses).
        kubelet_reports_running(agent_pod(NODES[0])["metadata"]["name"], NS)

        def new_aggregator_pod():
            kubelet_confirms_terminations(NS)
            pods = kjson("get", "pod", "-n", NS, "-l", "app.kubernetes.io/component=aggregator")["items"]
            return [p for p in pods if p["metadata"]["name"] != old_agg and not p["metadata"].get("deletionTimestamp")]
        eventually("the Deployment made a new aggregator pod", new_aggregator_pod)
        stop("aggregator")
        start_aggregator()
        r = run(grpcurl, "-cacert", os.path.join(old, "ca.crt"), "-cert", os.path.join(old, "tls.crt"),
                "-key", os.path.join(old, "tls.key"), "-servername", "kai-node-agent", target,
                "vgpu.v1.VgpuNode/ListContainers", check=False)
        assert r.returncode != 0, "the agent still accepts the aggregator's old certificate"
        run(grpcurl, *grpcurl_tls(), target, "vgpu.v1.VgpuNode/ListContainers")
        eventually("the aggregator follows the agent over the new certificates",
                   lambda: "b-secret" in listed(tok["viewer"]), timeout=60)
    check("gRPC certificates rotated the chart's way (Secret deleted, helm upgrade, pods restarted): old ones refused, the aggregator follows the agents again", rotation)

    def outage():
        fresh = user_token("viewer")
        cluster("stop-apiserver")
        try:
            status, text = http_get(AGG["url"] + "/api/v1/containers", token=fresh, timeout=30)
            assert status == 503 and "Kubernetes API server" in text, f"{status} {text[:300]}"
            r = grpc_cluster(fresh, "ListNodes")
            assert "Unavailable" in r.stderr, r.stderr
        finally:
            cluster("start-apiserver")
        eventually("the fresh token works once the API server is back",
                   lambda: http_get(AGG["url"] + "/api/v1/containers", token=fresh)[0] == 200, timeout=60)
    check("API server stopped: a caller not yet known gets 503 (fail closed, no crash); started again: served", outage)


# ============================================================================
# 5. faults with a real server
# ============================================================================

def faults():
    def apiserver_restart():
        events = len(events_for("gpu-job"))
        cluster("restart-apiserver")
        later = create(pod("after-restart", {"gpu-memory": "1024"}, node=NODES[0]))
        write_region(later["metadata"]["uid"], "main", 1024, 100)
        eventually("the agent's watch resumed: a pod created after the restart is named",
                   lambda: [c for c in grpc_containers() if c["pod"] == "after-restart"], timeout=90)
        assert len(events_for("gpu-job")) == events, "an Event was posted again after the restart"
        eventually("the aggregator serves the pod made after the restart", lambda: [
            k for k in series(AGG["url"] + "/metrics", "hami_vgpu_memory_used_bytes") if 'pod="after-restart"' in k], timeout=60)
    check("kube-apiserver restarted under the agent's and aggregator's watches: they resume, no pod lost, no Event posted twice", apiserver_restart)

    def compaction():
        rev = etcd_revision()
        etcd_post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        # The API server's watch cache starts from the compacted store: the
        # clients' resource versions are too old now (410 Gone): they relist.
        cluster("restart-apiserver")
        p = create(pod("after-compaction", {"gpu-memory": "1024"}, node=NODES[0]))
        write_region(p["metadata"]["uid"], "main", 1024, 100)
        eventually("a pod created after compaction is named (watch relisted)",
                   lambda: [c for c in grpc_containers() if c["pod"] == "after-compaction"], timeout=90)
    check("etcd compacted (410 Gone on resume): the agent relists and keeps naming new pods", compaction)

    def etcd_outage():
        cluster("stop-etcd")
        try:
            r = kubectl("get", "--raw", "/readyz/etcd", check=False)
            assert r.returncode != 0, "the API server says etcd is ready while it is stopped"
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:  # the outage itself lasts 10 s
                assert procs["agent"].poll() is None, "the agent died while etcd was down"
                time.sleep(1)
        finally:
            cluster("start-etcd")
        eventually("the API server is ready again", lambda: kubectl("get", "--raw", "/readyz").stdout.strip() == "ok", timeout=90)
        p = create(pod("after-etcd", {"gpu-memory": "1024"}, node=NODES[0]))
        pod_checks("injected", p, "main")
        write_region(p["metadata"]["uid"], "main", 1024, 100)
        eventually("a pod created after the outage is named",
                   lambda: [c for c in grpc_containers() if c["pod"] == "after-etcd"], timeout=90)
        assert procs["aggregator"].poll() is None, "the aggregator died"
    check("etcd stopped for 10 s: the agent, aggregator and webhook carry on once it is back", etcd_outage)

    def rotate():
        old = kjson("get", "secret", f"{FULL}-webhook-tls", "-n", NS)["data"]["ca.crt"]
        # The chart's rotation: a new CA and certificate are generated when
        # the Secret is gone; helm upgrade writes both the Secret and the
        # caBundle. The kubelet then swaps the mounted files.
        kubectl("delete", "secret", f"{FULL}-webhook-tls", "-n", NS)
        r = helm("upgrade", RELEASE, CHART, "-n", NS, "--set", "monitor.isolation.enforce=evict", check=False)
        assert r.returncode == 0, r.stderr
        new = kjson("get", "secret", f"{FULL}-webhook-tls", "-n", NS)["data"]["ca.crt"]
        assert new != old, "no new CA"
        write_webhook_tls()
        ctx = ssl.create_default_context(cafile=os.path.join(WORK, "webhook-tls", "ca.crt"))
        ctx.check_hostname = False
        WEBHOOK["ctx"] = ctx

        def serves_new():
            conn = http.client.HTTPSConnection(NODE_IP, webhook_port(), context=ctx, timeout=2)
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        eventually("the webhook serves the new certificate (hot reload)", serves_new, timeout=60)
        pod_checks("injected", create(pod("after-rotation", {"gpu-memory": "1024"})), "main")
    check("webhook certificate rotated the chart's way (new Secret + caBundle, files swapped): still admitting", rotate)


def etcd_post(path, body):
    r = run("curl", "-sS", "--fail", "--cacert", f"{PKI}/ca.crt", "--cert", f"{PKI}/apiserver-etcd.crt",
            "--key", f"{PKI}/apiserver-etcd.key", "-X", "POST", "-d", json.dumps(body),
            f"https://127.0.0.1:{ENV['ETCD_PORT']}{path}")
    return json.loads(r.stdout)


def etcd_revision():
    out = etcd_post("/v3/kv/range", {"key": base64.b64encode(b"/registry/").decode(),
                                     "range_end": base64.b64encode(b"/registry0").decode(), "count_only": True})
    return int(out["header"]["revision"])


# ============================================================================
# 6. pod-creation latency: no webhook, the floor of calling one, ours
# ============================================================================

LATENCY_LABEL = "kai-test/latency"


def latency():
    """Pods created at a steady rate through the API server, the kinds in
    turn, request by request, so that all see the same machine: in a
    namespace no webhook serves (none), in one served by the floor of
    calling a webhook (services/webhook/examples/floor.rs: the webhook's
    accept path, certificate and exact response, without the review) and
    in one served by the webhook (ours); with KAI_LATENCY_BEFORE (another
    kai-webhook binary, e.g. an older build), in a fourth served by that one
    (before). The servers are fresh processes, the floor and ours from
    KAI_LATENCY_TARGET (default: TARGET, so CI measures debug builds), with
    the chart Deployment's arguments and environment, each registered as a
    copy of the chart's /mutate entry (the chart's Service with a port of
    its own and an EndpointSlice to this host, its caBundle, rules,
    matchConditions, timeout, failurePolicy) differing only in its Service
    port and namespace selector. The API server calls a Service's webhook
    over TLS and HTTP/1.1 keep-alive (it offers no h2 there: k8s.io/apiserver
    util/webhook/client.go). Every namespace here carries
    kai-resource-isolator.io/webhook=ignore, so the chart's own
    configuration, still registered, calls nobody."""
    rate = float(os.environ.get("KAI_LATENCY_RATE", "50"))  # pods/s, all kinds together
    seconds = float(os.environ.get("KAI_LATENCY_SECONDS", "90"))
    target = os.path.abspath(os.environ.get("KAI_LATENCY_TARGET", TARGET))
    binaries = {"floor": os.path.join(target, "examples", "floor"), "ours": os.path.join(target, "kai-webhook")}
    if os.environ.get("KAI_LATENCY_BEFORE"):
        binaries["before"] = os.path.abspath(os.environ["KAI_LATENCY_BEFORE"])
    for b in binaries.values():
        assert os.access(b, os.X_OK), f"{b} is not built (cargo build -p kai-webhook --bins --example floor)"
    served = tuple(binaries)
    kinds = ("none", *served)
    port = {kind: free_port(NODE_IP) for kind in served}
    svc_name, chart_mwc = f"{FULL}-webhook", f"{FULL}-mutating"
    svc_ports = kjson("get", "service", svc_name, "-n", NS)["spec"]["ports"]

    c = container_of("deployment", f"{FULL}-webhook", "webhook")
    tls = write_webhook_tls()
    ctx = ssl.create_default_context(cafile=os.path.join(tls, "ca.crt"))
    ctx.check_hostname = False
    for kind in served:
        args = rewrite(c["args"], [(r"^--listen=.*", f"--listen={NODE_IP}:{port[kind]}"),
                                   (r"^--tls-cert-file=.*", f"--tls-cert-file={tls}/tls.crt"),
                                   (r"^--tls-private-key-file=.*", f"--tls-private-key-file={tls}/tls.key"),
                                   (r"^--log-format=.*", "--log-format=plain")])
        env = {**chart_env(c), "SHUTDOWN_DELAY_SECONDS": "0"}  # as start_webhook
        if env.get("NODE_GUARD") == "true":  # as start_webhook: the guard's lookups need a token
            env["KUBECONFIG"] = sa_kubeconfig(f"{FULL}-webhook")
        start(f"latency-{kind}", [binaries[kind], *args], env=env)

    def healthy(kind):
        assert procs[f"latency-{kind}"].poll() is None, log_tail(f"latency-{kind}")
        conn = http.client.HTTPSConnection(NODE_IP, port[kind], context=ctx, timeout=2)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    for kind in served:
        eventually(f"the {kind} webhook serving", lambda: healthy(kind), timeout=30)

    def registration(kind):
        (entry,) = [w for w in kjson("get", "mutatingwebhookconfiguration", chart_mwc)["webhooks"]
                    if w["clientConfig"]["service"]["path"] == "/mutate"]
        entry["clientConfig"]["service"]["port"] = port[kind]
        selector = entry["namespaceSelector"]
        selector["matchExpressions"] = [{"key": LATENCY_LABEL, "operator": "In", "values": [kind]}] + [
            e for e in selector.get("matchExpressions", []) if e["key"] != "kai-resource-isolator.io/webhook"]
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": f"kai-latency-{kind}"}, "webhooks": [entry]}

    ctx_api = ssl.create_default_context(cafile=f"{PKI}/ca.crt")
    ctx_api.load_cert_chain(f"{PKI}/admin.crt", f"{PKI}/admin.key")
    local = threading.local()

    def post(ns, body):
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPSConnection("127.0.0.1", int(ENV["API_PORT"]), context=ctx_api, timeout=30)
        t0 = time.perf_counter()
        local.conn.request("POST", f"/api/v1/namespaces/{ns}/pods", body, {"Content-Type": "application/json"})
        r = local.conn.getresponse()
        body = r.read()
        assert r.status == 201, (r.status, body[:300])
        return time.perf_counter() - t0

    def burst(prefix, cycles):
        """`cycles` pods of each kind at `rate` in all, the kinds in turn
        (their order rotated every cycle); the create times of each kind."""
        bodies = []
        for i in range(cycles * len(kinds)):
            cycle, at = divmod(i, len(kinds))
            kind = kinds[(at + cycle) % len(kinds)]
            p = pod(f"{prefix}{cycle}", {"gpu-memory": "1024"})
            p["spec"]["schedulerName"] = "not-scheduled"  # measure admission, not binding
            bodies.append((kind, json.dumps(p)))
        times = {kind: [] for kind in kinds}
        with ThreadPoolExecutor(16) as pool:
            t0 = time.perf_counter()
            futures = []
            for i, (kind, body) in enumerate(bodies):
                # A steady rate: request i leaves at t0 + i/rate.
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append((kind, pool.submit(post, f"lat-{kind}", body)))
            for kind, f in futures:
                times[kind].append(f.result())
        return {kind: sorted(xs) for kind, xs in times.items()}

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    def cpu_seconds(kind):
        with open(f"/proc/{procs[f'latency-{kind}'].pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def review_seconds(kind):
        """A webhook's own histogram of the review (decode, plan, encode): sum and count."""
        conn = http.client.HTTPSConnection(NODE_IP, port[kind], context=ctx, timeout=5)
        conn.request("GET", "/metrics")
        page = conn.getresponse().read().decode()
        return [float(re.search(rf"^kai_webhook_admission_review_duration_seconds_{k} (\S+)$", page, re.M).group(1))
                for k in ("sum", "count")]

    try:
        kubectl("patch", "service", svc_name, "-n", NS, "--type=json", "-p", json.dumps([
            {"op": "add", "path": "/spec/ports/-",
             "value": {"name": f"latency-{kind}", "port": port[kind], "targetPort": port[kind], "protocol": "TCP"}}
            for kind in served]))
        apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": f"{FULL}-webhook-latency", "namespace": NS,
                            "labels": {"kubernetes.io/service-name": svc_name,
                                       "endpointslice.kubernetes.io/managed-by": "kai-test"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
               "ports": [{"name": f"latency-{kind}", "port": port[kind], "protocol": "TCP"} for kind in served]})
        for kind in served:
            apply(registration(kind))
        for kind in kinds:
            new_namespace(f"lat-{kind}", "kai-resource-isolator.io/webhook=ignore", f"{LATENCY_LABEL}={kind}",
                          exist_ok=False)

        def effective():
            got = {kind: ours_in(create(pod("probe", {"gpu-memory": "1024"}), ns=f"lat-{kind}", dry_run=True))[0]
                   for kind in kinds}
            return got == {kind: [] if kind == "none" else [OURS[0]] for kind in kinds}
        eventually("each webhook is called for its own namespace, none for the first", effective, timeout=60)

        n = int(rate * seconds / len(kinds))
        burst("w", 20)  # warm every path (connections, caches, the floor's response)
        # KAI_LATENCY_PERF=DIR: `perf record` of each server through the
        # measured burst, into DIR/<kind>.perf.data (docs/benchmarks.md).
        perf_dir = os.environ.get("KAI_LATENCY_PERF")
        perf = {kind: subprocess.Popen(["perf", "record", "-q", "-F", "4999", "--call-graph", "dwarf,16384",
                                        "-p", str(procs[f"latency-{kind}"].pid),
                                        "-o", os.path.join(perf_dir, f"{kind}.perf.data")])
                for kind in served} if perf_dir else {}
        webhooks = [kind for kind in served if kind != "floor"]
        cpu, inside = {kind: cpu_seconds(kind) for kind in served}, {kind: review_seconds(kind) for kind in webhooks}
        times = burst("p", n)
        cpu = {kind: cpu_seconds(kind) - cpu[kind] for kind in served}
        inside = {kind: [after - before for before, after in zip(inside[kind], review_seconds(kind))]
                  for kind in webhooks}
        for recording in perf.values():
            recording.send_signal(signal.SIGINT)
            recording.wait(60)

        p50 = {kind: pct(times[kind], .5) for kind in kinds}
        p99 = {kind: pct(times[kind], .99) for kind in kinds}

        def ratio(p, kind):
            floor, added = p["floor"] - p["none"], p[kind] - p["none"]
            return f"{added / floor:.2f}" if floor > 0 else "n/a (the floor adds nothing here)"
        lines = [
            f"pod creation at {rate:g}/s for {seconds:g} s, {' / '.join(kinds)} in turn ({n} pods each; "
            f"{os.path.basename(target)} builds of the floor and ours)",
            f"none p50 {p50['none']:.1f} ms p99 {p99['none']:.1f} ms",
            *[f"{kind} p50 {p50[kind]:.1f} ms p99 {p99[kind]:.1f} ms, added p50 {p50[kind] - p50['none']:+.1f} ms "
              f"p99 {p99[kind] - p99['none']:+.1f} ms, CPU {cpu[kind] / n * 1e6:.0f} µs per review" for kind in served],
            *[f"{kind}-added / floor-added: p50 {ratio(p50, kind)} p99 {ratio(p99, kind)} (goal <= 1.1); "
              f"its review inside the webhook (its own histogram): mean {inside[kind][0] / max(inside[kind][1], 1) * 1e6:.0f} µs"
              for kind in webhooks],
        ]
        for line in lines:
            print(f"     {line}", flush=True)
        with open(os.path.join(CLUSTER, "latency.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        for kind in kinds:
            for name in ("p0", f"p{n - 1}"):
                stored = kjson("get", "pod", name, "-n", f"lat-{kind}")
                if kind == "none":
                    pod_checks("untouched", stored)
                else:
                    pod_checks("injected", stored, "main")
    finally:
        for kind in served:
            kubectl("delete", "mutatingwebhookconfiguration", f"kai-latency-{kind}", "--ignore-not-found", check=False)
            stop(f"latency-{kind}")
        kubectl("delete", "endpointslice", f"{FULL}-webhook-latency", "-n", NS, "--ignore-not-found", check=False)
        kubectl("patch", "service", svc_name, "-n", NS, "--type=json",
                "-p", json.dumps([{"op": "replace", "path": "/spec/ports", "value": svc_ports}]), check=False)
        for kind in kinds:
            kubectl("delete", "namespace", f"lat-{kind}", "--wait=false", "--ignore-not-found", check=False)


# ============================================================================

# The parts a part builds on (the release they install, the webhook, agent,
# aggregator and pods they start and create): `--only NAME` runs them first,
# so a part run alone has what it needs.
NEEDS = {"admission": ("release",), "fail-closed": ("release",), "rbac": ("release",), "components": ("release",),
         "access": ("release", "components"), "faults": ("release", "components"), "latency": ("release",)}


def main():
    only = set(ONLY or ())
    for name in ONLY or ():
        only.update(NEEDS.get(name, ()))
    if ONLY and only != ONLY:
        print(f"--only {','.join(sorted(ONLY))}: also {', '.join(sorted(only - ONLY))}, which they build on", flush=True)

    def part(name, fn):
        if ONLY and name not in only:
            return
        t0 = time.monotonic()
        try:
            fn()
        except Exception as e:
            bad(f"{name} (setup)", f"{type(e).__name__}: {e}")
        print(f"---- {name}: {time.monotonic() - t0:.0f} s", flush=True)

    try:
        part("cluster", cluster_shape)
        part("helm", helm_matrix)
        part("migration", migration.run)  # a Go chart release moved to this chart and back (migration.py)
        part("release", lambda: (install_release(), start_webhook(), route_service_to_webhook()))
        part("admission", admission)
        part("fail-closed", fail_closed)
        part("rbac", rbac_lists)
        part("components", components)
        part("access", access)
        part("faults", faults)
        part("latency", lambda: check("pod-creation latency through the API server: no webhook, the floor of calling one, ours (recorded)", latency))
    finally:
        stop_all()
        if failed:
            for name in ("webhook", "agent", "aggregator"):
                tail = log_tail(name)
                if tail:
                    print(f"\n--- {name} log (last lines) ---\n{tail}")
    print(f"\n{harness.passed} passed, {len(failed)} failed")
    for f in failed:
        print(f"  FAILED: {f}")
    return min(len(failed), 100)


if __name__ == "__main__":
    sys.exit(main())
