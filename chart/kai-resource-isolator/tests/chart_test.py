"""Renders the chart for every scenario in ci/, validates each object
against the Kubernetes OpenAPI schemas offline (kubernetes-validate), and
asserts on the rendered objects: one pytest test per check, named as the
check.

Usage: pytest -c kind-tests/pytest.ini chart/kai-resource-isolator/tests/chart_test.py [-k WORDS]
(helm: $HELM, else the one .ci/run caches; see kind-tests/kaitest/chart.py)
"""
import base64
import hashlib
import json
import os
import re
import socket
import ssl
import subprocess
import tempfile
import threading

import pytest
import yaml

from kaitest.chart import helm, template
from kaitest.checks import generate

pytestmark = pytest.mark.chart

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = "kai-system"
RELEASE = "kai"
K8S = "1.33.0"
CRDS = {"ServiceMonitor", "Issuer", "ClusterIssuer", "Certificate"}
# The API a cluster with the Prometheus Operator advertises.
PROM_API = ("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor")


def scenarios():
    """The scenario values files under ci/."""
    return sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith("-values.yaml"))


def skip_schema():
    """The Nix check has no kubernetes-validate: it sets CHART_TEST_SKIP_SCHEMA_VALIDATION=1."""
    return os.environ.get("CHART_TEST_SKIP_SCHEMA_VALIDATION") == "1"


def render(values_file=None, extra=()):
    return template(*extra, *(["-f", os.path.join(CHART, "ci", values_file)] if values_file else []))


def one(docs, kind, name_suffix=""):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def kinds(docs):
    return sorted(d["kind"] for d in docs)


def pod_spec(obj):
    return obj["spec"]["template"]["spec"]


def containers(obj):
    return {c["name"]: c for c in pod_spec(obj)["containers"]}


def arg(container, flag):
    for a in container.get("args", []):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def sets(*pairs):
    return tuple(x for p in pairs for x in ("--set", p))


# --- lint, render and validate every scenario ----------------------------

def lint(scenario):
    def t():
        r = helm("lint", "--strict", CHART, "-f", os.path.join(CHART, "ci", scenario))
        assert r.returncode == 0, r.stdout + r.stderr
    return t


def validates(scenario, extra=()):
    def t():
        docs = [d for d in render(scenario, extra) if d["kind"] not in CRDS]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(docs, f)
        r = subprocess.run(["kubernetes-validate", "--strict", "-k", K8S, "--quiet", f.name], capture_output=True, text=True)
        os.unlink(f.name)
        assert r.returncode == 0, (r.stdout + r.stderr)[:2000]
    return t


# --- the webhook selects what it should ----------------------------------

KAI_PODS = ("has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations"
            " || 'gpu-memory' in object.metadata.annotations)")
# With DRA on (the default where resource.k8s.io/v1 is served), pods with
# claims are sent too: only the webhook, reading the claims, can tell a
# GPU-memory claim from any other (docs/dra.md).
SHARING_PODS = {
    "name": "kai-gpu-sharing-pods",
    "expression": f"({KAI_PODS}) || (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)",
}
KAI_ONLY_PODS = {"name": "kai-gpu-sharing-pods", "expression": KAI_PODS}
NO_DRA = ("--set-json", "dra.deviceClasses=[]")


def webhook_selection():
    docs = render()
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["name"] == f"{RELEASE}-kai-resource-isolator-mutating"
    (w, _opt_out) = mwc["webhooks"]
    assert w["name"] == "vgpu.lib.kai-resource-isolator.io"
    assert w["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]
    # Fail closed by default, scoped by the chart's own CEL condition so only
    # GPU-sharing pods are ever sent (and wait when the webhook is down).
    assert (w["failurePolicy"], w["sideEffects"], w["reinvocationPolicy"], w["timeoutSeconds"]) == ("Fail", "None", "IfNeeded", 10)
    assert w["matchConditions"] == [SHARING_PODS]
    assert w["admissionReviewVersions"] == ["v1"]
    # The tenant's own pod label opts nothing out here (webhook_opt_out_gate).
    assert w["objectSelector"] == {}
    ns = w["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NS]} in ns
    assert {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]} in ns
    svc = one(docs, "Service", "-webhook")
    assert w["clientConfig"]["service"] == {"name": svc["metadata"]["name"], "namespace": NS, "path": "/mutate", "port": 443}
    # The Service reaches the webhook pods, on the port they serve.
    dep = one(docs, "Deployment", "-webhook")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert containers(dep)["webhook"]["ports"][0]["name"] == svc["spec"]["ports"][0]["targetPort"]
    # Our own pods are never mutated by ourselves.
    for kind, suffix in [("Deployment", "-webhook"), ("DaemonSet", "-node"), ("DaemonSet", "-libsync"), ("Deployment", "-aggregator")]:
        labels = one(docs, kind, suffix)["spec"]["template"]["metadata"]["labels"]
        assert labels.get("kai-resource-isolator.io/webhook") == "ignore", f"{kind}{suffix}"


def ca_bundle_matches_secret():
    docs = render()
    secret = one(docs, "Secret", "-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    for w in one(docs, "MutatingWebhookConfiguration")["webhooks"]:
        assert w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"], w["name"]
    vol = {v["name"]: v for v in pod_spec(one(docs, "Deployment", "-webhook"))["volumes"]}["tls"]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]


def cert_manager_injects_the_ca():
    docs = render("certmanager-values.yaml")
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-webhook-tls")], "cert-manager owns the Secret"
    cert = one(docs, "Certificate")
    issuer = one(docs, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert cert["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "Issuer"}
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/{cert['metadata']['name']}"
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    vol = {v["name"]: v for v in pod_spec(one(docs, "Deployment", "-webhook"))["volumes"]}["tls"]
    assert vol["secret"]["secretName"] == cert["spec"]["secretName"]
    svc = one(docs, "Service", "-webhook")["metadata"]["name"]
    assert f"{svc}.{NS}.svc" in cert["spec"]["dnsNames"]
    custom = render("certmanager-issuer-values.yaml")
    assert "Issuer" not in kinds(custom)
    assert one(custom, "Certificate")["spec"]["issuerRef"] == {"name": "cluster-ca", "kind": "ClusterIssuer"}


# --- paths agree across webhook, libsync and agent -------------------------

def paths_agree(scenario, mount, host=None, agent_extra=()):
    """Webhook, libsync, agent and ld.so.preload agree: libsync installs into
    the host directory, the agent reads it, the webhook mounts it into
    workloads at the container path, and ld.so.preload names the container
    path of libvgpu.so."""
    host = host or mount

    def t():
        docs = render(scenario)
        webhook = containers(one(docs, "Deployment", "-webhook"))["webhook"]
        env = {e["name"]: e.get("value") for e in webhook["env"]}
        assert env["CONTAINER_VGPU_MOUNT"] == mount
        assert env["HOST_VGPU_DIR"] == host, env
        ls = one(docs, "DaemonSet", "-libsync")
        vols = {v["name"]: v for v in pod_spec(ls)["volumes"]}
        assert vols["host-vgpu"]["hostPath"] == {"path": host, "type": "DirectoryOrCreate"}
        # libvgpu's lock directory is <host>/vgpulock, inside that mount:
        # nothing of the node's /tmp (issue #25).
        host_paths = sorted(v["hostPath"]["path"] for v in vols.values() if "hostPath" in v)
        assert host_paths == [host], f"libsync mounts only the host directory: {host_paths}"
        libsync = containers(ls)["libsync"]
        assert arg(libsync, "--host-vgpu-dir") == "/host" + host
        assert arg(libsync, "--container-vgpu-mount") == mount
        mounts = {m["name"]: m["mountPath"] for m in libsync["volumeMounts"]}
        assert mounts["host-vgpu"] == "/host" + host and "host-vgpulock" not in mounts
        assert arg(libsync, "--host-vgpulock-dir") is None, "the default: <host-vgpu-dir>/vgpulock"
        cm = one(docs, "ConfigMap", "-preload")
        assert cm["data"]["ld.so.preload"].strip() == mount + "/libvgpu.so", "ld.so.preload holds the container path"
        assert vols["preload"]["configMap"]["name"] == cm["metadata"]["name"]
        assert arg(libsync, "--preload-file") == "/etc/kai/preload/ld.so.preload"
        agents = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-node")]
        for ds in agents:
            if "csi" in containers(ds):
                # The CSI plugin binds the library from the directory libsync fills.
                plugin = containers(ds)["csi"]
                (m,) = [m for m in plugin["volumeMounts"] if m["name"] == "host-vgpu"]
                assert m["mountPath"] == "/host/vgpu" and not m.get("readOnly"), m
                assert arg(plugin, "--host-vgpu-dir") == "/host/vgpu"
                assert {v["name"]: v for v in pod_spec(ds)["volumes"]}["host-vgpu"]["hostPath"] == {"path": host, "type": "DirectoryOrCreate"}
            if "agent" not in containers(ds):
                continue
            agent = containers(ds)["agent"]
            mounted = {m["name"] for m in agent["volumeMounts"]}
            avols = {v["name"]: v for v in pod_spec(ds)["volumes"] if v["name"] in mounted}
            assert avols["host-vgpu"]["hostPath"] == {"path": host, "type": "DirectoryOrCreate"}
            assert arg(agent, "--containers-dir") == "/host" + host + "/containers"
            amounts = {m["name"]: m for m in agent["volumeMounts"]}
            assert amounts["host-vgpu"] == {"name": "host-vgpu", "mountPath": "/host" + host, "readOnly": True}
            # Only containers/ is writable to the agent (#25).
            assert amounts["host-vgpu-containers"] == {"name": "host-vgpu-containers", "mountPath": "/host" + host + "/containers"}
            assert avols["host-vgpu-containers"]["hostPath"] == {"path": host + "/containers", "type": "DirectoryOrCreate"}
            # The agent's host paths: the vgpu directory, its containers/, (read-only) /proc, and what the scenario adds.
            assert sorted(v["hostPath"]["path"] for v in avols.values() if "hostPath" in v) == sorted([host, host + "/containers", "/proc", *agent_extra])
            assert "host-proc" not in {m["name"] for m in libsync["volumeMounts"]}, "libsync does not see /proc"
    return t


# --- RBAC grants nothing beyond what each binary uses ----------------------

def rbac_least_privilege():
    docs = render()
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert sorted((r["kind"], r["metadata"]["name"]) for r in roles) == [
        ("ClusterRole", f"{RELEASE}-kai-resource-isolator-metrics-reader"),
        ("ClusterRole", f"{RELEASE}-kai-resource-isolator-node"),
        ("ClusterRole", f"{RELEASE}-kai-resource-isolator-vgpu-view"),
        ("ClusterRole", f"{RELEASE}-kai-resource-isolator-webhook"),
        ("Role", f"{RELEASE}-kai-resource-isolator-aggregator"),
        ("Role", f"{RELEASE}-kai-resource-isolator-aggregator-proxy"),
    ]
    # What the access-control roles grant is asserted in access_* below.
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
    events = {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
    # The webhook's own configuration and the namespaces' labels: which
    # pods it leaves alone by the administrator's choice.
    configuration = {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                     "resourceNames": [f"{RELEASE}-kai-resource-isolator-mutating"], "verbs": ["get", "list", "watch"]}
    namespaces = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}
    # Its Node's nvidia.com/gpu.memory: KAI's limit for each pod.
    nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
    # DRA shares: the claims of its pods (any namespace) and its node's slices.
    dra = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceslices"], "verbs": ["list", "watch"]}
    # ... and the ConfigMap of a claim's node-decided limit (the node guard
    # allows only that pod's, on its own node).
    limits = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}
    assert one(docs, "ClusterRole", "-node")["rules"] == [pods, events, configuration, namespaces, nodes, dra, limits]
    no_dra = render(extra=NO_DRA)
    assert one(no_dra, "ClusterRole", "-node")["rules"] == [pods, events, configuration, namespaces, nodes]
    role = one(docs, "Role", "-aggregator")
    assert role["rules"] == [pods], role["rules"]
    assert role["metadata"]["namespace"] == NS
    bindings = {b["roleRef"]["name"]: b["subjects"] for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert bindings[f"{RELEASE}-kai-resource-isolator-node"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-kai-resource-isolator-node", "namespace": NS}]
    assert bindings[f"{RELEASE}-kai-resource-isolator-aggregator"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-kai-resource-isolator-aggregator", "namespace": NS}]
    # The webhook reads pods for the node guard only (get, no list), and the
    # claims and claim templates a pod names with DRA on (get, no list).
    guard_pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    claims = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": ["get"]}
    assert one(docs, "ClusterRole", "-webhook")["rules"] == [guard_pods, claims]
    assert pod_spec(one(docs, "Deployment", "-webhook"))["automountServiceAccountToken"] is True
    assert one(no_dra, "ClusterRole", "-webhook")["rules"] == [guard_pods]
    dra_only = render(extra=("--set", "monitor.isolation.nodeGuard=false"))
    assert one(dra_only, "ClusterRole", "-webhook")["rules"] == [claims]
    assert pod_spec(one(dra_only, "Deployment", "-webhook"))["automountServiceAccountToken"] is True
    # Without either it has no API access at all.
    off = render(extra=("--set", "monitor.isolation.nodeGuard=false", *NO_DRA))
    assert not [d for d in off if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-webhook")]
    assert pod_spec(one(off, "Deployment", "-webhook"))["automountServiceAccountToken"] is False
    assert one(off, "ServiceAccount", "-webhook")["automountServiceAccountToken"] is False


# --- every container runs with least privilege ----------------------------

def hardened(scenario):
    def t():
        docs = render(scenario)
        workloads = [d for d in docs if d["kind"] in ("Deployment", "DaemonSet")]
        assert workloads
        for w in workloads:
            spec = pod_spec(w)
            for key in ("hostNetwork", "hostPID", "hostIPC"):
                assert not spec.get(key), f"{w['metadata']['name']}: {key}"
            for c in spec["containers"]:
                sc = c["securityContext"]
                who = f"{w['metadata']['name']}/{c['name']}"
                assert "resources" in c and c["resources"]["limits"]["memory"], who
                assert c.get("readinessProbe") and c.get("livenessProbe"), who
                if who == f"{RELEASE}-kai-resource-isolator-node/csi":
                    # The one privileged container: kai-csi mounts into
                    # kubelet's directory with Bidirectional propagation.
                    assert sc.get("privileged") is True and sc.get("readOnlyRootFilesystem") is True, who
                    continue
                assert not sc.get("privileged"), who
                assert sc["allowPrivilegeEscalation"] is False, who
                assert sc["readOnlyRootFilesystem"] is True, who
                assert sc["capabilities"]["drop"] == ["ALL"], who
                assert set(sc["capabilities"].get("add", [])) <= {"FOWNER"}, who
                assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, who
                assert "resources" in c and c["resources"]["limits"]["memory"], who
                if c["name"] in ("webhook", "aggregator"):
                    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, who
                assert c.get("readinessProbe") and c.get("livenessProbe"), who
    return t


# --- toggles ----------------------------------------------------------------

def ha_webhook():
    docs = render("ha-webhook-values.yaml")
    dep = one(docs, "Deployment", "-webhook")
    assert dep["spec"]["replicas"] == 3
    anti = pod_spec(dep)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    w = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert (w["failurePolicy"], w["timeoutSeconds"]) == ("Fail", 5)
    single = render()
    assert "PodDisruptionBudget" not in kinds(single)
    assert "affinity" not in pod_spec(one(single, "Deployment", "-webhook"))


def monitor_disabled():
    docs = render("monitor-disabled-values.yaml", ("--set", "libraryDelivery=hostPath"))
    names = [d["metadata"]["name"] for d in docs]
    assert not any(n.endswith("-aggregator") for n in names), names
    # No API right at all: DRA needs the agent (docs/dra.md), so it is off too.
    assert "ClusterRole" not in kinds(docs)
    assert not [a for a in containers(one(docs, "Deployment", "-webhook"))["webhook"]["args"] if "dra" in a]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"] == [f"{RELEASE}-kai-resource-isolator-libsync"]
    # With CSI delivery the node DaemonSet still runs, for the plugin alone:
    # no agent, its Service, volumes or API token.
    csi_only = render("monitor-disabled-values.yaml")
    assert sorted(d["metadata"]["name"] for d in csi_only if d["kind"] == "DaemonSet") == [
        f"{RELEASE}-kai-resource-isolator-libsync", f"{RELEASE}-kai-resource-isolator-node"]
    node = one(csi_only, "DaemonSet", "-node")
    assert list(containers(node)) == ["csi", "csi-registrar"]
    assert pod_spec(node)["automountServiceAccountToken"] is False
    assert sorted(v["name"] for v in pod_spec(node)["volumes"]) == ["csi-socket", "host-vgpu", "kubelet-dir", "plugins-registry"]
    assert not [d for d in csi_only if d["kind"] == "Service" and d["metadata"]["name"].endswith("-node")]
    assert "ClusterRole" not in kinds(csi_only)
    # The API token is the agent's alone: never in the privileged plugin.
    full = one(render(), "DaemonSet", "-node")
    assert pod_spec(full)["automountServiceAccountToken"] is False
    token = "/var/run/secrets/kubernetes.io/serviceaccount"
    by_name = containers(full)
    assert [m["name"] for m in by_name["agent"]["volumeMounts"] if m["mountPath"] == token] == ["kube-api-access"]
    assert not [m for m in by_name["csi"]["volumeMounts"] if m["mountPath"] == token], by_name["csi"]
    projected = next(v for v in pod_spec(full)["volumes"] if v["name"] == "kube-api-access")["projected"]
    assert [next(iter(s)) for s in projected["sources"]] == ["serviceAccountToken", "configMap", "downwardAPI"]
    ds = one(docs, "DaemonSet", "-libsync")
    assert list(containers(ds)) == ["libsync"]
    assert pod_spec(ds)["automountServiceAccountToken"] is False
    assert "nodeSelector" not in pod_spec(ds) and "affinity" not in pod_spec(ds), "libsync on every node"
    # By default libsync goes to GPU nodes by any of the common labels, GKE's included.
    spec = pod_spec(one(render(), "DaemonSet", "-libsync"))
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert {"nvidia.com/gpu.present", "cloud.google.com/gke-accelerator"} <= keys, keys
    assert spec["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]


def service_monitor_and_flags():
    docs = render("servicemonitor-values.yaml", PROM_API)
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service", "-aggregator")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True, "namespace/pod/container must not become exported_*"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["http-metrics"] == 9394
    ds = one(docs, "DaemonSet", "-node")
    assert pod_spec(ds)["runtimeClassName"] == "nvidia"
    assert "--legacy-metrics" in containers(ds)["agent"]["args"]
    assert "--legacy-metrics" in containers(one(docs, "Deployment", "-aggregator"))["aggregator"]["args"]
    assert "ServiceMonitor" not in kinds(render())


def aggregator_malloc_tuned():
    agg = containers(one(render(), "Deployment", "-aggregator"))["aggregator"]
    env = {e["name"]: e.get("value") for e in agg["env"]}
    assert env["MALLOC_ARENA_MAX"] == "2" and env["MALLOC_MMAP_THRESHOLD_"] == "1048576", env


def aggregator_finds_agents():
    docs = render()
    ds = one(docs, "DaemonSet", "-node")
    agg = containers(one(docs, "Deployment", "-aggregator"))["aggregator"]
    selector = dict(kv.split("=") for kv in arg(agg, "--agent-selector").split(","))
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items(), selector
    assert arg(agg, "--agent-port") == str(containers(ds)["agent"]["ports"][0]["containerPort"])
    assert pod_spec(ds)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    env = {e["name"]: e for e in containers(ds)["agent"]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def images():
    docs = render("custom-mount-values.yaml")
    for w in (d for d in docs if d["kind"] in ("Deployment", "DaemonSet")):
        for c in pod_spec(w)["containers"]:
            want = "registry.example.com/ghcr.io/kai-resource-isolator/kai-resource-isolator:0.1.0-rc1"
            if c["name"] == "csi-registrar":
                # The CSI project's node-driver-registrar, from the same
                # mirror when global.imageRegistry names one.
                want = "registry.example.com/sig-storage/csi-node-driver-registrar:v2.13.0"
            assert c["image"] == want, c["image"]
        assert pod_spec(w)["imagePullSecrets"] == [{"name": "regcred"}]
    default = one(render(), "Deployment", "-webhook")
    assert containers(default)["webhook"]["image"].endswith(":0.1.0"), "tag defaults to appVersion"


def grpc_tls_material(docs):
    """The two gRPC Secrets' PEMs: {"node": {...}, "aggregator": {...}}."""
    return {side: {k: base64.b64decode(v).decode() for k, v in one(docs, "Secret", f"-{side}-grpc-tls")["data"].items()}
            for side in ("node", "aggregator")}


def tls_handshake(server, client, server_name="kai-node-agent"):
    """A TLS handshake (and one byte each way) between a server holding
    `server` (tls.crt, tls.key, and ca.crt: the clients it accepts) and a
    client holding `client` (its certificate, and ca.crt: the servers it
    trusts), as the agent (rustls, client certificate required) and the
    aggregator do. Returns (server error, client error), None for success."""
    with tempfile.TemporaryDirectory() as d:
        def files(name, pems):
            crt, key = os.path.join(d, name + ".crt"), os.path.join(d, name + ".key")
            open(crt, "w").write(pems["tls.crt"])
            open(key, "w").write(pems["tls.key"])
            return crt, key
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.load_cert_chain(*files("server", server))
        sctx.verify_mode = ssl.CERT_REQUIRED
        sctx.load_verify_locations(cadata=server["ca.crt"])
        cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        cctx.load_verify_locations(cadata=client["ca.crt"])
        cctx.load_cert_chain(*files("client", client))
        a, b = socket.socketpair()
        a.settimeout(10)
        b.settimeout(10)
        errors = {}

        def serve():
            try:
                with sctx.wrap_socket(a, server_side=True) as s:
                    s.sendall(s.recv(1))
            except (ssl.SSLError, OSError) as e:
                errors["server"] = e
        t = threading.Thread(target=serve)
        t.start()
        try:
            with cctx.wrap_socket(b, server_hostname=server_name) as c:
                c.sendall(b"x")
                assert c.recv(1) == b"x"
        except (ssl.SSLError, OSError, AssertionError) as e:
            errors["client"] = e
        t.join(15)
        a.close()
        b.close()
        return errors.get("server"), errors.get("client")


def grpc_mutual_tls():
    # On by default: each side its own Secret, certificate and CA.
    docs = render()
    ds = one(docs, "DaemonSet", "-node")
    agent = containers(ds)["agent"]
    dep = one(docs, "Deployment", "-aggregator")
    agg = containers(dep)["aggregator"]
    for side, spec, c in (("node", pod_spec(ds), agent), ("aggregator", pod_spec(dep), agg)):
        secret = one(docs, "Secret", f"-{side}-grpc-tls")
        assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["grpc-tls"]["secret"]["secretName"] == secret["metadata"]["name"], side
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["grpc-tls"]["mountPath"] == "/etc/kai/grpc-tls" and mounts["grpc-tls"]["readOnly"] is True
    assert not [d for d in docs if d["metadata"]["name"].endswith("-kai-resource-isolator-grpc-tls")], "the single-certificate Secret is gone"
    assert arg(agent, "--grpc-tls-cert-file") == "/etc/kai/grpc-tls/tls.crt"
    assert arg(agent, "--grpc-tls-key-file") == "/etc/kai/grpc-tls/tls.key"
    assert arg(agent, "--grpc-tls-client-ca-file") == "/etc/kai/grpc-tls/ca.crt", "agents require client certificates"
    assert "--grpc-insecure" not in agent["args"], "plaintext is never asked for with TLS on"
    assert arg(agg, "--agent-tls-ca-file") == "/etc/kai/grpc-tls/ca.crt"
    assert arg(agg, "--agent-tls-cert-file") == "/etc/kai/grpc-tls/tls.crt"
    assert arg(agg, "--agent-tls-key-file") == "/etc/kai/grpc-tls/tls.key"
    assert arg(agg, "--agent-tls-server-name") == "kai-node-agent"
    assert "httpGet" in agent["livenessProbe"], "kubelet gRPC probes cannot speak TLS"
    # The certificates work for what each side does with them, and only that.
    pem = grpc_tls_material(docs)
    assert pem["node"]["ca.crt"] != pem["aggregator"]["ca.crt"], "two CAs"
    assert tls_handshake(pem["node"], pem["aggregator"]) == (None, None), "the aggregator subscribes to an agent"
    server_err, _ = tls_handshake(pem["node"], dict(pem["aggregator"], **{k: pem["node"][k] for k in ("tls.crt", "tls.key")}))
    assert server_err is not None, "an agent's own certificate is no client certificate to another agent"
    _, client_err = tls_handshake(dict(pem["node"], **{k: pem["aggregator"][k] for k in ("tls.crt", "tls.key")}), pem["aggregator"])
    assert client_err is not None, "the aggregator's certificate cannot serve as an agent"
    _, client_err = tls_handshake(pem["node"], pem["aggregator"], server_name="kai-aggregator")
    assert client_err is not None, "the agents' certificate names kai-node-agent only"
    # A rotation rolls both: their pods carry a checksum of both Secrets.
    digest = hashlib.sha256(json.dumps({side: one(docs, "Secret", f"-{side}-grpc-tls")["data"] for side in ("node", "aggregator")},
                                       sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    for w in (ds, dep):
        assert w["spec"]["template"]["metadata"]["annotations"]["checksum/grpc-tls"] == digest, w["metadata"]["name"]
    # monitor.podAnnotations still reach the agents beside it.
    ann = one(render(extra=sets("monitor.podAnnotations.team=ml")), "DaemonSet", "-node")["spec"]["template"]["metadata"]["annotations"]
    assert ann["team"] == "ml" and "checksum/grpc-tls" in ann
    assert grpc_tls_material(render("grpc-tls-values.yaml")).keys() == {"node", "aggregator"}
    # Off: plaintext, no Secret, no checksum.
    plain = render(extra=sets("monitor.grpcTls.enabled=false"))
    assert not [d for d in plain if "grpc-tls" in d["metadata"]["name"]]
    pds, pdep = one(plain, "DaemonSet", "-node"), one(plain, "Deployment", "-aggregator")
    assert arg(containers(pds)["agent"], "--grpc-tls-cert-file") is None
    assert "--grpc-insecure" in containers(pds)["agent"]["args"], "the agent refuses plaintext off loopback unless told"
    assert arg(containers(pdep)["aggregator"], "--agent-tls-ca-file") is None
    for w in (pds, pdep):
        assert "annotations" not in w["spec"]["template"]["metadata"], w["metadata"]["name"]
    # Nothing of it without the monitor.
    assert not [d for d in render("monitor-disabled-values.yaml") if "grpc-tls" in d["metadata"]["name"]]


def isolation_settings():
    ds = one(render(), "DaemonSet", "-node")
    agent = containers(ds)["agent"]
    vols = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    assert vols["host-proc"]["hostPath"] == {"path": "/proc", "type": "Directory"}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert arg(agent, "--host-proc") == "/host/proc"
    assert arg(agent, "--near-cap-percent") == "95"
    assert arg(agent, "--no-region-grace-seconds") == "60"
    assert "--no-events" not in agent["args"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    off = render(extra=("--set", "monitor.isolation.hostProc=false", "--set", "monitor.isolation.events=false",
                        "--set", "monitor.isolation.nearCapPercent=90"))
    ds = one(off, "DaemonSet", "-node")
    agent = containers(ds)["agent"]
    assert "host-proc" not in {v["name"] for v in pod_spec(ds)["volumes"]}
    assert "host-proc" not in {m["name"] for m in agent["volumeMounts"]}
    assert arg(agent, "--host-proc") is None
    assert "--no-events" in agent["args"]
    assert arg(agent, "--near-cap-percent") == "90"
    rules = one(off, "ClusterRole", "-node")["rules"]
    assert all("events.k8s.io" not in r["apiGroups"] for r in rules), "no Events, no Events RBAC"


def agent_extra_env():
    base = containers(one(render(), "DaemonSet", "-node"))["agent"]["env"]
    ds = one(render(extra=("--set", "monitor.agent.extraEnv[0].name=HTTPS_PROXY",
                           "--set", "monitor.agent.extraEnv[0].value=http://proxy:3128",
                           "--set", "monitor.agent.extraEnv[1].name=FROM_FIELD",
                           "--set", "monitor.agent.extraEnv[1].valueFrom.fieldRef.fieldPath=spec.nodeName")),
             "DaemonSet", "-node")
    env = containers(ds)["agent"]["env"]
    # The chart's own first, unchanged; the extra ones after, as given.
    assert env[:len(base)] == base, env
    assert env[len(base):] == [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                               {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}], env
    assert all("HTTPS_PROXY" not in {e["name"] for e in c.get("env", [])}
               for name, c in containers(ds).items() if name != "agent")


def agent_reads_the_webhook_configuration():
    """The agent leaves alone the pods the webhook leaves alone by the
    administrator's choice: it is named the chart's own
    MutatingWebhookConfiguration, and may read that one object and the
    namespaces' labels its selectors match."""
    def check_release(docs):
        (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-node")]
        (mwc,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        name = mwc["metadata"]["name"]
        args = containers(one(docs, "DaemonSet", "-node"))["agent"]["args"]
        assert f"--webhook-configuration={name}" in args, args
        assert {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": [name], "verbs": ["get", "list", "watch"]} in role["rules"], role["rules"]
        assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in role["rules"], role["rules"]
        # Nothing else of admissionregistration: the agent cannot read or
        # change other webhooks.
        others = [r for r in role["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]
        assert len(others) == 1, others
        return name
    assert check_release(render()) != check_release(render(extra=("--set", "fullnameOverride=gpu-iso")))
    assert check_release(render(extra=("--set", "fullnameOverride=gpu-iso"))) == "gpu-iso-mutating"


# --- drop-in for the Go chart's users -----------------------------------------

def validate_docs(docs):
    if skip_schema():
        return
    docs = [d for d in docs if d["kind"] not in CRDS]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
    r = subprocess.run(["kubernetes-validate", "--strict", "-k", K8S, "--quiet", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    assert r.returncode == 0, (r.stdout + r.stderr)[:2000]


def go_chart_values_mean_what_they_meant():
    docs = render("go-chart-values.yaml")
    # The Go chart's image (its default, so in every Go values file) has none
    # of our binaries: ours instead, whatever registry and tag came with it.
    for w in (d for d in docs if d["kind"] in ("Deployment", "DaemonSet")):
        for c in pod_spec(w)["containers"]:
            if c["name"] == "csi-registrar":
                continue  # the CSI project's image, not ours (images())
            assert c["image"] == "ghcr.io/kai-resource-isolator/kai-resource-isolator:0.1.0", c["image"]
    mirrored = render("go-chart-values.yaml", sets("global.imageRegistry=mirror.example.com"))
    assert containers(one(mirrored, "Deployment", "-webhook"))["webhook"]["image"] == \
        "mirror.example.com/ghcr.io/kai-resource-isolator/kai-resource-isolator:0.1.0"
    # monitor.enabled: false (the Go default): libsync, the webhook, and the
    # CSI plugin (and its registrar) alone in the node DaemonSet; with the Go chart's hostPath
    # delivery, libsync and the webhook only.
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet") == [
        f"{RELEASE}-kai-resource-isolator-libsync", f"{RELEASE}-kai-resource-isolator-node"]
    assert list(containers(one(docs, "DaemonSet", "-node"))) == ["csi", "csi-registrar"]
    go_host_path = render("go-chart-values.yaml", sets("libraryDelivery=hostPath"))
    assert [d["metadata"]["name"] for d in go_host_path if d["kind"] == "DaemonSet"] == [f"{RELEASE}-kai-resource-isolator-libsync"]
    ls = pod_spec(one(docs, "DaemonSet", "-libsync"))
    assert ls["priorityClassName"] == "system-node-critical"
    assert ls["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    svc = one(docs, "Service", "-webhook")
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["ports"][0]["port"] == 443
    quota = one(docs, "ResourceQuota")
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}]
    # The seed's command on top of Go values: the monitor answers on 9394.
    docs = render("go-chart-values.yaml", sets("monitor.enabled=true"))
    validate_docs(docs)
    ds = one(docs, "DaemonSet", "-node")
    agent = containers(ds)["agent"]
    assert arg(agent, "--metrics-listen") == "0.0.0.0:9394"
    assert {p["name"]: p["containerPort"] for p in agent["ports"]}["node-metrics"] == 9394
    assert arg(agent, "--scan-interval-ms") == "5000", "monitor.updateInterval 5s"
    assert pod_spec(ds)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod_spec(ds)["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    node_svc = one(docs, "Service", "-node")
    assert node_svc["spec"]["ports"][0]["port"] == 9394 and node_svc["spec"]["ports"][0]["targetPort"] == "node-metrics"
    assert node_svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert agent["resources"]["limits"]["memory"], "monitor.resources {} keeps the agent's defaults"


def go_gke_paths_warn():
    # A Go values file moved containerVgpuMount for GKE and kept Go's
    # hostInstallBase default, which Go never read: ours would install into
    # the read-only /usr/local, so the NOTES say so (and only then).
    moved = sets("paths.hostInstallBase=/usr/local", "paths.containerVgpuMount=/home/kubernetes/bin/nvidia/vgpu")
    r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *moved)
    assert r.returncode == 0, r.stderr
    assert "libsync installs into\n/usr/local/vgpu" in r.stdout.replace("\r", ""), r.stdout[-1500:]
    for quiet in (sets("paths.hostInstallBase=/usr/local"),
                  sets("paths.hostInstallBase=/home/kubernetes/bin/nvidia",
                       "paths.containerVgpuMount=/home/kubernetes/bin/nvidia/vgpu"), ()):
        r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *quiet)
        assert r.returncode == 0, r.stderr
        assert "Warning: paths.containerVgpuMount" not in r.stdout, quiet


def seed_install_commands():
    seed = sets("monitor.enabled=true", "monitor.serviceMonitor.enabled=true")
    # No Prometheus Operator: the install must not fail on a missing CRD.
    docs = render(extra=seed)
    assert "ServiceMonitor" not in kinds(docs)
    validate_docs(docs)
    r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *seed)
    assert r.returncode == 0, r.stderr
    assert "ServiceMonitor" in r.stdout, "NOTES say why there is no ServiceMonitor"
    docs = render(extra=seed + PROM_API)
    validate_docs(docs)
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["metadata"]["name"].endswith("-aggregator")
    assert all(e["honorLabels"] is True for e in sm["spec"]["endpoints"])
    # Per-node monitors too, on request.
    docs = render(extra=seed + PROM_API + sets("monitor.serviceMonitor.targets.nodeAgents=true"))
    sms = {d["metadata"]["name"].rsplit("-", 1)[-1]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(sms) == {"aggregator", "node"}, list(sms)
    node_svc = one(docs, "Service", "-node")
    assert sms["node"]["spec"]["selector"]["matchLabels"].items() <= node_svc["metadata"]["labels"].items()
    assert sms["node"]["spec"]["endpoints"][0]["port"] == node_svc["spec"]["ports"][0]["name"]
    assert sms["node"]["spec"]["endpoints"][0]["honorLabels"] is True


def go_overrides():
    docs = render(extra=sets(
        "nameOverride=isolator", "namespaceOverride=gpu-system", "global.imagePullSecrets[0].name=global-cred",
        "image.pullSecrets[0].name=regcred", "image.registry=quay.example.com", "rbac.create=false",
        "service.port=8443", "webhook.podLabels.team=ml", "monitor.podLabels.team=ml", "librarySync.podLabels.team=ml",
        "librarySync.podAnnotations.note=x", "monitor.resources.limits.memory=1Gi"))
    validate_docs(docs)
    for d in docs:
        if d["kind"] == "CSIDriver":
            # Cluster-scoped, and named as the webhook's volumes and the plugin name it.
            assert d["metadata"]["name"] == "vgpu.kai-resource-isolator.io" and "namespace" not in d["metadata"]
            continue
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                             "ValidatingWebhookConfiguration"):
            assert d["metadata"]["namespace"] == "gpu-system", d["metadata"]
        assert d["metadata"]["name"].startswith(f"{RELEASE}-isolator"), d["metadata"]["name"]
    # rbac.create=false: the ServiceAccounts stay, the user binds them.
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"} == {
        f"{RELEASE}-isolator-node", f"{RELEASE}-isolator-aggregator", f"{RELEASE}-isolator-webhook"}
    for kind, suffix in [("Deployment", "-webhook"), ("DaemonSet", "-node"), ("DaemonSet", "-libsync")]:
        w = one(docs, kind, suffix)
        assert w["spec"]["template"]["metadata"]["labels"]["team"] == "ml", suffix
        assert pod_spec(w)["imagePullSecrets"] == [{"name": "global-cred"}, {"name": "regcred"}]
        assert containers(w)[list(containers(w))[0]]["image"].startswith("quay.example.com/ghcr.io/")
    assert one(docs, "DaemonSet", "-libsync")["spec"]["template"]["metadata"]["annotations"]["note"] == "x"
    assert containers(one(docs, "DaemonSet", "-node"))["agent"]["resources"]["limits"]["memory"] == "1Gi"
    w = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert w["clientConfig"]["service"]["namespace"] == "gpu-system" and w["clientConfig"]["service"]["port"] == 8443
    assert one(docs, "Service", "-webhook")["spec"]["ports"][0]["port"] == 8443
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "gpu-system"]} in w["namespaceSelector"]["matchExpressions"]
    # global.imageRegistry wins over image.registry (Go precedence).
    img = containers(one(render(extra=sets("image.registry=quay.example.com", "global.imageRegistry=mirror.example.com")), "Deployment", "-webhook"))["webhook"]["image"]
    assert img.startswith("mirror.example.com/ghcr.io/"), img
    full = render(extra=sets("fullnameOverride=kai-iso"))
    assert one(full, "Deployment", "-webhook")["metadata"]["name"] == "kai-iso-webhook"


def pdb_precedence():
    def pdb(*extra):
        docs = render(extra=sets("webhook.replicaCount=3", *extra))
        validate_docs(docs)
        spec = one(docs, "PodDisruptionBudget")["spec"]
        return {k: v for k, v in spec.items() if k != "selector"}
    assert pdb() == {"minAvailable": 1}
    assert pdb("webhook.podDisruptionBudget.maxUnavailable=1") == {"maxUnavailable": 1}
    assert pdb("webhook.podDisruptionBudget.maxUnavailable=25%") == {"maxUnavailable": "25%"}
    assert pdb("webhook.podDisruptionBudget.maxUnavailable=-1") == {"minAvailable": 1}, "unusable: fall back"
    assert pdb("webhook.podDisruptionBudget.minAvailable=2") == {"minAvailable": 2}
    assert pdb("webhook.podDisruptionBudget.minAvailable=null") == {"minAvailable": 1}


def cert_manager_cluster_issuer():
    docs = render(extra=sets("tls.certManager.enabled=true", "tls.certManager.createSelfSignedClusterIssuer=true"))
    issuer = one(docs, "ClusterIssuer")
    assert "namespace" not in issuer["metadata"] and "Issuer" not in kinds(docs)
    assert one(docs, "Certificate")["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "ClusterIssuer"}
    # tls.patch.enabled=false with cert-manager off: the chart's own certificate.
    docs = render(extra=sets("tls.patch.enabled=false"))
    w = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert w["clientConfig"]["caBundle"] == one(docs, "Secret", "-webhook-tls")["data"]["ca.crt"]


def webhook_scoping():
    docs = render(extra=(
        "--set", "webhook.namespaceSelector.matchLabels.gpu=shared",
        "--set-json", 'webhook.objectSelector.matchExpressions=[{"key":"team","operator":"In","values":["ml"]}]',
        "--set-json", 'webhook.matchConditions=[{"name":"kai-only","expression":"object.spec.schedulerName == \'kai-scheduler\'"}]'))
    validate_docs(docs)
    (w, opt_out) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    for entry in (w, opt_out):
        assert entry["namespaceSelector"]["matchLabels"] == {"gpu": "shared"}
        ns = entry["namespaceSelector"]["matchExpressions"]
        assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NS]} in ns, "ours stay"
        obj = entry["objectSelector"]["matchExpressions"]
        assert {"key": "team", "operator": "In", "values": ["ml"]} in obj
        assert entry["matchConditions"] == [SHARING_PODS, {"name": "kai-only", "expression": "object.spec.schedulerName == 'kai-scheduler'"}]
    ignore = {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    assert ignore in opt_out["objectSelector"]["matchExpressions"], "ours stay where opting out is allowed"
    assert ignore not in w["objectSelector"]["matchExpressions"], "and only there"


def webhook_opt_out_gate():
    ignore = {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    docs = render()
    validate_docs(docs)
    (w, opt_out) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert (w["name"], w["clientConfig"]["service"]["path"]) == ("vgpu.lib.kai-resource-isolator.io", "/mutate")
    assert (opt_out["name"], opt_out["clientConfig"]["service"]["path"]) == ("opt-out.vgpu.lib.kai-resource-isolator.io", "/mutate/allow-opt-out")
    # Complementary on the admin-only namespace label: a namespace matches one.
    gate = "kai-resource-isolator.io/allow-opt-out"
    assert {"key": gate, "operator": "NotIn", "values": ["true"]} in w["namespaceSelector"]["matchExpressions"]
    assert {"key": gate, "operator": "In", "values": ["true"]} in opt_out["namespaceSelector"]["matchExpressions"]
    assert w["objectSelector"] == {} and ignore in opt_out["objectSelector"]["matchExpressions"]
    for key in ("failurePolicy", "matchConditions", "rules", "timeoutSeconds", "reinvocationPolicy"):
        assert w[key] == opt_out[key], key
    # Another label; or none at all: then nobody opts out.
    (w, opt_out) = one(render(extra=("--set", "webhook.optOutNamespaceLabel=team/gpu-admin=yes")), "MutatingWebhookConfiguration")["webhooks"]
    assert {"key": "team/gpu-admin", "operator": "In", "values": ["yes"]} in opt_out["namespaceSelector"]["matchExpressions"]
    (only,) = one(render(extra=("--set", "webhook.optOutNamespaceLabel=")), "MutatingWebhookConfiguration")["webhooks"]
    assert only["clientConfig"]["service"]["path"] == "/mutate" and only["objectSelector"] == {}
    assert all(e["key"] != gate for e in only["namespaceSelector"]["matchExpressions"])


def webhook_hostile_tenant_settings():
    env = {e["name"]: e.get("value") for e in containers(one(render(), "Deployment", "-webhook"))["webhook"]["env"]}
    assert env["TENANT_ENV"] == "replace"
    assert (env["MAX_BODY_BYTES"], env["MAX_IN_FLIGHT_BYTES"], env["MAX_CONNECTIONS"]) == ("33554432", "50331648", "256")
    assert (env["BODY_READ_TIMEOUT_SECONDS"], env["HEADER_READ_TIMEOUT_SECONDS"], env["MAX_CONCURRENT_STREAMS"]) == ("10", "10", "32")
    assert (env["MAX_CONNECTIONS_PER_CLIENT"], env["KEEP_ALIVE_TIMEOUT_SECONDS"]) == ("64", "120")
    # Values stored by a release from before these keys (--reuse-values) still render the defaults.
    env = {e["name"]: e.get("value") for e in containers(one(render(extra=(
        "--set", "webhook.limits.maxConnectionsPerClient=null", "--set", "webhook.limits.keepAliveTimeoutSeconds=null")),
        "Deployment", "-webhook"))["webhook"]["env"]}
    assert (env["MAX_CONNECTIONS_PER_CLIENT"], env["KEEP_ALIVE_TIMEOUT_SECONDS"]) == ("64", "120")
    # Above 6x the API server's 3 MiB request limit (its reviews escape < as \u003c).
    assert int(env["MAX_BODY_BYTES"]) > 6 * 3 * 1024 * 1024
    env = {e["name"]: e.get("value") for e in containers(one(render(extra=(
        "--set", "webhook.tenantEnv=deny", "--set", "webhook.limits.maxBodyBytes=67108864")), "Deployment", "-webhook"))["webhook"]["env"]}
    assert (env["TENANT_ENV"], env["MAX_BODY_BYTES"]) == ("deny", "67108864")
    docs = render("strict-tenant-values.yaml")
    env = {e["name"]: e.get("value") for e in containers(one(docs, "Deployment", "-webhook"))["webhook"]["env"]}
    assert (env["TENANT_ENV"], env["MAX_CONNECTIONS"], env["MAX_CONCURRENT_STREAMS"]) == ("deny", "128", "16")
    (only,) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert only["clientConfig"]["service"]["path"] == "/mutate"


def failure_policy():
    def webhook(*extra):
        w = one(render(extra=extra), "MutatingWebhookConfiguration")["webhooks"][0]
        return w["failurePolicy"], w.get("matchConditions")
    # An API server without matchConditions (< 1.28) would send every pod the
    # selectors match: the default falls back to fail-open there.
    assert webhook("--kube-version", "1.27.3") == ("Ignore", None)
    assert webhook("--kube-version", "1.28.0") == ("Fail", [KAI_ONLY_PODS]), "no resource.k8s.io/v1 before 1.34"
    assert webhook("--kube-version", "1.34.0") == ("Fail", [SHARING_PODS])
    assert webhook(*NO_DRA) == ("Fail", [KAI_ONLY_PODS])
    # The old behaviour on request; an explicit Fail holds even without scope.
    assert webhook("--set", "webhook.failurePolicy=Ignore") == ("Ignore", [SHARING_PODS])
    assert webhook("--set", "webhook.scopeToSharingPods=false") == ("Ignore", None)
    assert webhook("--set", "webhook.scopeToSharingPods=false", "--set", "webhook.failurePolicy=Fail") == ("Fail", None)
    assert webhook("--kube-version", "1.27.3", "--set", "webhook.failurePolicy=Fail") == ("Fail", None)
    # The user's conditions are dropped with ours where the API lacks them.
    assert webhook("--kube-version", "1.27.3", "--set-json", 'webhook.matchConditions=[{"name":"a","expression":"true"}]') == ("Ignore", None)


def node_guard():
    def guard(*extra):
        docs = render(extra=extra)
        hooks = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
        webhook = pod_spec(one(docs, "Deployment", "-webhook"))
        env = {e["name"]: e.get("value") for e in webhook["containers"][0]["env"]}
        roles = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-webhook")]
        gets_pods = any(r.get("resources") == ["pods"] for role in roles for r in role["rules"])
        on = bool(hooks)
        # The webhook gets a token, the NODE_GUARD switch and `get pods`
        # together (the token also with DRA on: NO_DRA keeps that apart).
        assert on == (env.get("NODE_GUARD") == "true") == webhook["automountServiceAccountToken"] == gets_pods, extra
        return hooks[0]["webhooks"][0] if on else None
    w = guard("--kube-version", "1.30.0", *NO_DRA)
    assert w["failurePolicy"] == "Fail" and w["clientConfig"]["service"]["path"] == "/validate-node-agent"
    assert w["matchConditions"] == [{"name": "kai-node-agent",
                                     "expression": f"request.userInfo.username == 'system:serviceaccount:{NS}:{RELEASE}-kai-resource-isolator-node'"}]
    assert {tuple(r["resources"]) for r in w["rules"]} == {("pods/eviction",), ("events",)}
    # No node name in tokens before 1.30; nothing to guard without Events or evictions; off on request.
    assert guard("--kube-version", "1.29.9") is None
    assert guard("--set", "monitor.isolation.events=false", *NO_DRA) is None
    assert guard("--set", "monitor.isolation.events=false", "--set", "monitor.isolation.enforce=evict", *NO_DRA) is not None
    assert guard("--set", "monitor.isolation.nodeGuard=false", *NO_DRA) is None
    # With DRA (1.34+) the agent writes ConfigMaps of node-decided limits:
    # guarded too, even without Events or evictions.
    dra = guard("--set", "monitor.isolation.events=false")
    assert {tuple(r["resources"]) for r in dra["rules"]} == {("pods/eviction",), ("events",), ("configmaps",)}
    (cm,) = [r for r in dra["rules"] if r["resources"] == ["configmaps"]]
    assert (cm["apiGroups"], cm["operations"]) == ([""], ["CREATE"])


def dra_classes():
    def flags(docs):
        agent = containers(one(docs, "DaemonSet", "-node"))["agent"]["args"]
        webhook = containers(one(docs, "Deployment", "-webhook"))["webhook"]["args"]
        pick = lambda args: [a for a in args if a.startswith("--dra-memory-class")]
        assert pick(agent) == pick(webhook), "the webhook and the agent read the same classes"
        return pick(agent)
    # The NVIDIA DRA driver's consumable shares by default.
    assert flags(render()) == ["--dra-memory-class=gpu.nvidia.com=memory"]
    two = render(extra=("--set-json", 'dra.deviceClasses=[{"name":"gpu.example.com","memoryCapacity":"memory"},'
                                      '{"name":"vgpu.example.com","memoryCapacity":"example.com/mem"}]'))
    validate_docs(two)
    assert flags(two) == ["--dra-memory-class=gpu.example.com=memory", "--dra-memory-class=vgpu.example.com=example.com/mem"]
    # Off: on request, where the API server has no resource.k8s.io/v1, and
    # without the agent (which holds the caps and writes node-decided limits).
    for extra in (NO_DRA, ("--kube-version", "1.33.4"), ("--set", "monitor.enabled=false")):
        docs = render(extra=extra)
        webhook = containers(one(docs, "Deployment", "-webhook"))["webhook"]["args"]
        assert not [a for a in webhook if a.startswith("--dra-memory-class")], extra
        if "monitor.enabled=false" not in extra:
            assert flags(docs) == [], extra
        assert not [r for d in docs if d["kind"] == "ClusterRole" for r in d.get("rules", []) if "resource.k8s.io" in r.get("apiGroups", [])], extra


def gke():
    docs = render("gke-values.yaml")
    host = "/home/kubernetes/bin/nvidia/vgpu"
    paths_agree("gke-values.yaml", "/usr/local/vgpu", host, ["/home/kubernetes/bin/nvidia/lib64"])()
    for suffix in ("-libsync", "-node"):
        spec = pod_spec(one(docs, "DaemonSet", suffix))
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "Exists"}]}], suffix
        assert "nodeSelector" not in spec, f"{suffix}: GKE nodes lack nvidia.com/gpu.present"
        assert spec["priorityClassName"] == "system-node-critical"
    # system-node-critical outside kube-system: admitted by the quota.
    quota = one(docs, "ResourceQuota")
    assert quota["metadata"]["namespace"] == NS
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}]
    # NVML from the host's driver directory (CDI, no runtime hook).
    ds = one(docs, "DaemonSet", "-node")
    agent = containers(ds)["agent"]
    vols = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    assert vols["nvidia-lib"]["hostPath"] == {"path": "/home/kubernetes/bin/nvidia/lib64", "type": "Directory"}
    mount = {m["name"]: m for m in agent["volumeMounts"]}["nvidia-lib"]
    assert mount["readOnly"] is True
    assert arg(agent, "--nvml-library") == mount["mountPath"] + "/libnvidia-ml.so.1"
    assert arg(containers(one(render(), "DaemonSet", "-node"))["agent"], "--nvml-library") is None


def priority_quota_only_where_needed():
    assert "ResourceQuota" not in kinds(render(extra=sets("priorityClassQuota.create=false")))
    r = helm("template", RELEASE, CHART, "-n", "kube-system")
    assert r.returncode == 0, r.stderr
    assert "kind: ResourceQuota" not in r.stdout, "kube-system admits critical pods already"
    none = render(extra=sets("librarySync.priorityClassName=", "monitor.priorityClassName="))
    assert "ResourceQuota" not in kinds(none)
    both = one(render(extra=sets("monitor.aggregator.priorityClassName=system-cluster-critical")), "ResourceQuota")
    assert both["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["system-cluster-critical", "system-node-critical"]


def webhook_shutdown_delay():
    def rendered(*extra):
        d = one(render(extra=extra), "Deployment", "-webhook")
        env = {e["name"]: e.get("value") for e in containers(d)["webhook"]["env"]}
        return env["SHUTDOWN_DELAY_SECONDS"], d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # The delay, then the 15 s drain of reviews in flight, within the grace period.
    assert rendered() == ("5", 30)
    assert rendered("--set", "webhook.shutdownDelaySeconds=20") == ("20", 45)
    assert rendered("--set", "webhook.shutdownDelaySeconds=0") == ("0", 25)
    # Values stored by a release from before the key (--reuse-values).
    assert rendered("--set", "webhook.shutdownDelaySeconds=null") == ("5", 30)


def enforcement():
    docs = render()
    agent = containers(one(docs, "DaemonSet", "-node"))["agent"]
    assert arg(agent, "--enforce") == "none"
    assert "--reclaim-stale-slots" not in agent["args"]
    rules = one(docs, "ClusterRole", "-node")["rules"]
    assert all("pods/eviction" not in r["resources"] for r in rules), "no eviction RBAC by default"
    for mode in ("dry-run", "evict"):
        docs = render(extra=("--set", f"monitor.isolation.enforce={mode}",
                             "--set", "monitor.isolation.reclaimStaleSlots=true"))
        agent = containers(one(docs, "DaemonSet", "-node"))["agent"]
        assert arg(agent, "--enforce") == mode
        assert "--reclaim-stale-slots" in agent["args"]
        rules = one(docs, "ClusterRole", "-node")["rules"]
        evict = [r for r in rules if "pods/eviction" in r["resources"]]
        if mode == "evict":
            assert evict == [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}], rules
        else:
            assert evict == [], "dry-run evicts nothing and gets no eviction RBAC"


def stream_limits():
    # Defaults render as flags (the binaries' defaults, written out).
    docs = render()
    agent = containers(one(docs, "DaemonSet", "-node"))["agent"]
    agg = containers(one(docs, "Deployment", "-aggregator"))["aggregator"]
    assert [arg(agent, f) for f in ("--max-watch-streams", "--max-concurrent-scrapes",
                                    "--http-idle-timeout-seconds", "--grpc-max-concurrent-streams")] \
        == ["64", "4", "60", "32"], agent["args"]
    assert [arg(agg, f) for f in ("--max-event-streams", "--max-concurrent-scrapes",
                                  "--http-idle-timeout-seconds", "--grpc-max-concurrent-streams")] \
        == ["256", "8", "60", "32"], agg["args"]
    # And follow the values.
    docs = render(extra=sets(
        "monitor.agent.limits.maxWatchStreams=5",
        "monitor.agent.limits.maxConcurrentScrapes=2",
        "monitor.agent.limits.httpIdleTimeoutSeconds=30",
        "monitor.agent.limits.grpcMaxConcurrentStreams=8",
        "monitor.aggregator.limits.maxEventStreams=16",
        "monitor.aggregator.limits.maxConcurrentScrapes=3",
        "monitor.aggregator.limits.httpIdleTimeoutSeconds=90",
        "monitor.aggregator.limits.grpcMaxConcurrentStreams=4",
    ))
    agent = containers(one(docs, "DaemonSet", "-node"))["agent"]
    agg = containers(one(docs, "Deployment", "-aggregator"))["aggregator"]
    assert (arg(agent, "--max-watch-streams"), arg(agent, "--max-concurrent-scrapes"),
            arg(agent, "--http-idle-timeout-seconds"), arg(agent, "--grpc-max-concurrent-streams")) \
        == ("5", "2", "30", "8"), agent["args"]
    assert (arg(agg, "--max-event-streams"), arg(agg, "--max-concurrent-scrapes"),
            arg(agg, "--http-idle-timeout-seconds"), arg(agg, "--grpc-max-concurrent-streams")) \
        == ("16", "3", "90", "4"), agg["args"]


# --- library delivery ---------------------------------------------------------

DRIVER = "vgpu.kai-resource-isolator.io"


def webhook_env(docs):
    return {e["name"]: e.get("value") for e in containers(one(docs, "Deployment", "-webhook"))["webhook"]["env"]}


def privileged(docs):
    return sorted(f"{w['metadata']['name']}/{c['name']}"
                  for w in docs if w["kind"] in ("Deployment", "DaemonSet")
                  for c in pod_spec(w)["containers"] if c.get("securityContext", {}).get("privileged"))


def csi_delivery_by_default():
    docs = render()
    driver = one(docs, "CSIDriver")
    assert driver["metadata"]["name"] == DRIVER and "namespace" not in driver["metadata"]
    assert driver["spec"] == {"volumeLifecycleModes": ["Ephemeral"], "attachRequired": False,
                              "podInfoOnMount": True, "fsGroupPolicy": "File"}, driver["spec"]
    env = webhook_env(docs)
    assert (env["LIBRARY_DELIVERY"], env["CSI_DRIVER"]) == ("csi", DRIVER)

    ds = one(docs, "DaemonSet", "-node")
    assert list(containers(ds)) == ["agent", "csi", "csi-registrar"]
    plugin = containers(ds)["csi"]
    assert plugin["image"] == containers(ds)["agent"]["image"] and plugin["command"] == ["/bin/kai-csi"]
    assert arg(plugin, "--endpoint") == "unix:///csi/csi.sock"
    assert arg(plugin, "--kubelet-endpoint") == f"/var/lib/kubelet/plugins/{DRIVER}/csi.sock"
    # kubelet cannot reach a registration socket kai-csi serves itself (h2
    # refuses kubelet's :authority): node-driver-registrar registers it.
    assert arg(plugin, "--registration-dir") is None
    assert arg(plugin, "--target-root") == "/var/lib/kubelet/pods"
    assert arg(plugin, "--health-listen") == "0.0.0.0:9809"
    assert {e["name"]: e for e in plugin["env"]}["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # Privileged (mounts, Bidirectional propagation) and still root-owned,
    # read-only root filesystem; the only privileged container of the chart.
    assert plugin["securityContext"].get("privileged") is True
    assert plugin["securityContext"].get("readOnlyRootFilesystem") is True
    assert privileged(docs) == [f"{RELEASE}-kai-resource-isolator-node/csi"]
    # Probed on its named health port.
    ports = {p["name"]: p["containerPort"] for p in plugin["ports"]}
    assert ports == {"csi-health": 9809}
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "csi-health"}
    assert plugin["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "csi-health"}
    assert plugin["resources"]["limits"]["memory"] == "64Mi"

    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    vols = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    assert {n: (vols[n]["hostPath"]["path"], vols[n]["hostPath"]["type"], m["mountPath"], m.get("mountPropagation"), m.get("readOnly"))
            for n, m in mounts.items()} == {
        "kubelet-dir": ("/var/lib/kubelet", "Directory", "/var/lib/kubelet", "Bidirectional", None),
        "csi-socket": (f"/var/lib/kubelet/plugins/{DRIVER}", "DirectoryOrCreate", "/csi", None, None),
        "host-vgpu": ("/usr/local/vgpu", "DirectoryOrCreate", "/host/vgpu", None, None),
    }, mounts
    registrar = containers(ds)["csi-registrar"]
    assert registrar["image"] == "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0"
    assert arg(registrar, "--csi-address") == "/csi/csi.sock"
    assert arg(registrar, "--kubelet-registration-path") == f"/var/lib/kubelet/plugins/{DRIVER}/csi.sock"
    assert arg(registrar, "--http-endpoint") == ":9810"
    assert registrar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "registrar-hz"}
    assert registrar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert registrar["securityContext"]["allowPrivilegeEscalation"] is False
    assert {m["name"]: (vols[m["name"]]["hostPath"]["path"], m["mountPath"]) for m in registrar["volumeMounts"]} == {
        "csi-socket": (f"/var/lib/kubelet/plugins/{DRIVER}", "/csi"),
        "plugins-registry": ("/var/lib/kubelet/plugins_registry", "/registration"),
    }
    # Only the plugin sees kubelet's directory; the agent's mounts are as before.
    assert not {"kubelet-dir", "csi-socket", "plugins-registry"} & {m["name"] for m in containers(ds)["agent"]["volumeMounts"]}


def csi_kubelet_dir():
    docs = render(extra=sets("csi.kubeletDir=/var/lib/k0s/kubelet", "csi.healthPort=19809", "csi.logLevel=debug"))
    validate_docs(docs)
    ds = one(docs, "DaemonSet", "-node")
    plugin = containers(ds)["csi"]
    vols = {v["name"]: v["hostPath"]["path"] for v in pod_spec(ds)["volumes"] if "hostPath" in v}
    assert (vols["kubelet-dir"], vols["csi-socket"], vols["plugins-registry"]) == (
        "/var/lib/k0s/kubelet", f"/var/lib/k0s/kubelet/plugins/{DRIVER}", "/var/lib/k0s/kubelet/plugins_registry")
    assert {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}["kubelet-dir"] == "/var/lib/k0s/kubelet"
    registrar = containers(ds)["csi-registrar"]
    assert arg(registrar, "--kubelet-registration-path") == f"/var/lib/k0s/kubelet/plugins/{DRIVER}/csi.sock"
    assert arg(plugin, "--kubelet-endpoint") == f"/var/lib/k0s/kubelet/plugins/{DRIVER}/csi.sock"
    assert arg(plugin, "--target-root") == "/var/lib/k0s/kubelet/pods"
    assert arg(plugin, "--health-listen") == "0.0.0.0:19809" and arg(plugin, "--log-level") == "debug"
    assert {p["name"]: p["containerPort"] for p in plugin["ports"]} == {"csi-health": 19809}


def host_path_delivery():
    docs = render(extra=sets("libraryDelivery=hostPath"))
    validate_docs(docs)
    assert "CSIDriver" not in kinds(docs)
    assert list(containers(one(docs, "DaemonSet", "-node"))) == ["agent"]
    vols = [v["name"] for v in pod_spec(one(docs, "DaemonSet", "-node"))["volumes"]]
    assert not {"kubelet-dir", "csi-socket", "plugins-registry"} & set(vols), vols
    assert privileged(docs) == []
    env = webhook_env(docs)
    assert env["LIBRARY_DELIVERY"] == "hostPath"
    assert env["HOST_VGPU_DIR"] == "/usr/local/vgpu"


def notes_name_the_delivery():
    for delivery, says in (("csi", 'may enforce Pod Security "restricted"'), ("hostPath", 'need Pod Security "privileged"')):
        r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *sets(f"libraryDelivery={delivery}"))
        assert r.returncode == 0, r.stderr
        notes = r.stdout.split("NOTES:", 1)[-1]
        assert f"Library delivery: {delivery}." in notes and says in notes, notes[:1200]


# --- access control: who may see what (#27) ----------------------------------

FULL = f"{RELEASE}-kai-resource-isolator"
VGPU = "vgpu.kai-resource-isolator.io"
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
AUTH_FLAGS = ("--metrics-auth", "--auth-audiences", "--auth-cache-ttl-seconds", "--auth-denied-cache-ttl-seconds", "--auth-cache-entries")


def agg_container(docs):
    return containers(one(docs, "Deployment", "-aggregator"))["aggregator"]


def agent_container(docs):
    return containers(one(docs, "DaemonSet", "-node"))["agent"]


def named(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) <= 1, name
    return found[0] if found else None


def auth_delegator(docs, who):
    b = named(docs, "ClusterRoleBinding", f"{FULL}-{who}-auth-delegator")
    if b is None:
        return None
    assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"}
    return b["subjects"]


def access_defaults():
    docs = render()
    validate_docs(docs)
    agg, agent = agg_container(docs), agent_container(docs)
    # The aggregator: Kubernetes authentication and authorization, /metrics
    # included, the binaries' defaults written out; no audiences flag (the
    # API server's own).
    assert [arg(agg, f) for f in ("--auth",) + AUTH_FLAGS] == ["kubernetes", "rbac", None, "60", "10", "4096"], agg["args"]
    # The agent: its /metrics checked too.
    assert arg(agent, "--metrics-auth") == "rbac" and arg(agent, "--auth-audiences") is None
    assert agent["args"].index("--metrics-auth=rbac") > agent["args"].index("agent"), "a flag of the agent subcommand"
    # Both may create TokenReviews and SubjectAccessReviews (system:auth-delegator).
    assert auth_delegator(docs, "aggregator") == [{"kind": "ServiceAccount", "name": f"{FULL}-aggregator", "namespace": NS}]
    assert auth_delegator(docs, "node") == [{"kind": "ServiceAccount", "name": f"{FULL}-node", "namespace": NS}]
    # ...with a token: the aggregator's automounted, the agent's projected.
    assert pod_spec(one(docs, "Deployment", "-aggregator")).get("automountServiceAccountToken") is not False
    assert one(docs, "ServiceAccount", "-aggregator").get("automountServiceAccountToken") is not False
    assert TOKEN_FILE in [m["mountPath"] + "/token" for m in agent["volumeMounts"]]
    # Tenants: containers' GPU use as a resource RBAC can grant, aggregated
    # into view, edit and admin.
    view = named(docs, "ClusterRole", f"{FULL}-vgpu-view")
    assert view["rules"] == [{"apiGroups": [VGPU], "resources": ["containers"], "verbs": ["get", "list", "watch"]}]
    labels = view["metadata"]["labels"]
    for role in ("view", "edit", "admin"):
        assert labels[f"rbac.authorization.k8s.io/aggregate-to-{role}"] == "true", role
    # Scrapers: get on /metrics; no binding until someone is named.
    reader = named(docs, "ClusterRole", f"{FULL}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert named(docs, "ClusterRoleBinding", f"{FULL}-metrics-reader") is None
    # Nothing else is granted to anyone: the new bindings are exactly these.
    bindings = sorted(d["metadata"]["name"] for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding"))
    assert bindings == sorted([f"{FULL}-aggregator", f"{FULL}-aggregator-auth-delegator", f"{FULL}-aggregator-proxy",
                               f"{FULL}-node", f"{FULL}-node-auth-delegator", f"{FULL}-webhook"]), bindings


def access_service_proxy():
    docs = render()
    svc = one(docs, "Service", "-aggregator")
    name = svc["metadata"]["name"]
    port = svc["spec"]["ports"][0]
    assert port["name"] == "http-metrics" and port["targetPort"] == "http-metrics"
    role = named(docs, "Role", f"{FULL}-aggregator-proxy")
    assert role["metadata"]["namespace"] == NS == svc["metadata"]["namespace"]
    # GET through /api/v1/namespaces/NS/services/<name>[:<port>]/proxy/…, on
    # this Service's HTTP port only (kubectl vgpu uses <name>:http-metrics).
    # And list Services here: kubectl vgpu finds the Service by its labels.
    assert role["rules"] == [{"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"],
                              "resourceNames": [name, f"{name}:{port['name']}", f"http:{name}:{port['name']}"]},
                             {"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}], role["rules"]
    binding = named(docs, "RoleBinding", f"{FULL}-aggregator-proxy")
    assert binding["metadata"]["namespace"] == NS
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]
    # Off on request, and never when the aggregator checks nobody.
    for extra in (sets("monitor.aggregator.auth.serviceProxyForAllUsers=false"), sets("monitor.aggregator.auth.mode=none"),
                  sets("rbac.create=false")):
        off = render(extra=extra)
        assert named(off, "Role", f"{FULL}-aggregator-proxy") is None and named(off, "RoleBinding", f"{FULL}-aggregator-proxy") is None, extra
    # namespaceOverride moves it with the Service.
    moved = render(extra=sets("namespaceOverride=gpu-system"))
    assert named(moved, "Role", f"{FULL}-aggregator-proxy")["metadata"]["namespace"] == "gpu-system"


def access_modes():
    # The aggregator's mode none: one flag, no review rights, no proxy grant.
    docs = render(extra=sets("monitor.aggregator.auth.mode=none"))
    agg = agg_container(docs)
    assert arg(agg, "--auth") == "none" and all(arg(agg, f) is None for f in AUTH_FLAGS), agg["args"]
    assert auth_delegator(docs, "aggregator") is None
    assert auth_delegator(docs, "node") is not None, "the agents still check /metrics"
    # /metrics open on the aggregator only: its other checks stay.
    docs = render(extra=sets("monitor.aggregator.auth.metrics=none"))
    agg = agg_container(docs)
    assert (arg(agg, "--auth"), arg(agg, "--metrics-auth")) == ("kubernetes", "none")
    assert auth_delegator(docs, "aggregator") is not None
    # The agents' /metrics open: no review rights for them.
    docs = render(extra=sets("monitor.agent.auth.metrics=none"))
    assert arg(agent_container(docs), "--metrics-auth") == "none"
    assert auth_delegator(docs, "node") is None
    # Both open (ci/open-metrics-values.yaml): as before #27.
    docs = render("open-metrics-values.yaml", PROM_API)
    assert arg(agg_container(docs), "--auth") == "none" and arg(agent_container(docs), "--metrics-auth") == "none"
    assert auth_delegator(docs, "aggregator") is None and auth_delegator(docs, "node") is None
    assert named(docs, "Role", f"{FULL}-aggregator-proxy") is None
    # The settings follow the values; audiences joined, also for the agent.
    docs = render(extra=(
        "--set-json", 'monitor.aggregator.auth.audiences=["kai-aggregator","https://kubernetes.default.svc"]',
        "--set-json", 'monitor.agent.auth.audiences=["kai-node"]',
        *sets("monitor.aggregator.auth.cacheTTLSeconds=30", "monitor.aggregator.auth.deniedCacheTTLSeconds=0",
              "monitor.aggregator.auth.cacheEntries=100000")))
    validate_docs(docs)
    agg, agent = agg_container(docs), agent_container(docs)
    assert [arg(agg, f) for f in AUTH_FLAGS] == ["rbac", "kai-aggregator,https://kubernetes.default.svc", "30", "0", "100000"], agg["args"]
    assert arg(agent, "--auth-audiences") == "kai-node"
    # No audiences flag where nothing is checked.
    docs = render(extra=("--set-json", 'monitor.agent.auth.audiences=["kai-node"]', *sets("monitor.agent.auth.metrics=none")))
    assert arg(agent_container(docs), "--auth-audiences") is None
    # rbac.create=false: the ServiceAccounts need system:auth-delegator from you (values.yaml says so).
    docs = render(extra=sets("rbac.create=false"))
    assert auth_delegator(docs, "aggregator") is None and auth_delegator(docs, "node") is None
    assert arg(agg_container(docs), "--auth") == "kubernetes"


def access_roles_and_readers():
    # Not aggregated on request: the ClusterRole stays, for your own bindings.
    docs = render(extra=sets("rbac.aggregateToDefaultRoles=false"))
    view = named(docs, "ClusterRole", f"{FULL}-vgpu-view")
    assert not [k for k in view["metadata"]["labels"] if k.startswith("rbac.authorization.k8s.io/aggregate-to-")]
    # Readers of /metrics (ci/network-policy-values.yaml names two).
    docs = render("network-policy-values.yaml")
    b = named(docs, "ClusterRoleBinding", f"{FULL}-metrics-reader")
    assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{FULL}-metrics-reader"}
    assert b["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "kube-prometheus-stack"},
                             {"kind": "Group", "name": "gpu-operators", "apiGroup": "rbac.authorization.k8s.io"}], b["subjects"]
    # No monitor, no aggregator to see through: none of it.
    off = render("monitor-disabled-values.yaml")
    assert not [d for d in off if d["metadata"]["name"] in (f"{FULL}-vgpu-view", f"{FULL}-metrics-reader")]
    assert auth_delegator(off, "node") is None


def service_monitor_sends_tokens():
    both = sets("monitor.serviceMonitor.enabled=true", "monitor.serviceMonitor.targets.nodeAgents=true")

    def endpoints(*extra):
        docs = render(extra=both + PROM_API + extra)
        return {d["metadata"]["name"].rsplit("-", 1)[-1]: d["spec"]["endpoints"] for d in docs if d["kind"] == "ServiceMonitor"}
    # Default: both targets check tokens, so Prometheus sends its own.
    eps = endpoints()
    assert set(eps) == {"aggregator", "node"}
    for target, (ep,) in eps.items():
        assert ep["bearerTokenFile"] == TOKEN_FILE and "authorization" not in ep, target
        assert ep["port"] == "http-metrics" and ep["honorLabels"] is True
    # Only where the target checks it.
    eps = endpoints(*sets("monitor.aggregator.auth.metrics=none"))
    assert "bearerTokenFile" not in eps["aggregator"][0] and eps["node"][0]["bearerTokenFile"] == TOKEN_FILE
    eps = endpoints(*sets("monitor.aggregator.auth.mode=none"))
    assert "bearerTokenFile" not in eps["aggregator"][0], "mode none checks nothing"
    eps = endpoints(*sets("monitor.agent.auth.metrics=none"))
    assert eps["aggregator"][0]["bearerTokenFile"] == TOKEN_FILE and "bearerTokenFile" not in eps["node"][0]
    # The operator's authorization (a token from a Secret) instead.
    eps = endpoints(*sets("monitor.serviceMonitor.authorization.type=Bearer",
                          "monitor.serviceMonitor.authorization.credentials.name=kai-metrics-token",
                          "monitor.serviceMonitor.authorization.credentials.key=token"))
    for target, (ep,) in eps.items():
        assert ep["authorization"] == {"type": "Bearer", "credentials": {"name": "kai-metrics-token", "key": "token"}}, target
        assert "bearerTokenFile" not in ep, target
    # ci/open-metrics-values.yaml: anonymous scrapes, as HAMi's were.
    docs = render("open-metrics-values.yaml", PROM_API)
    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        assert not {"bearerTokenFile", "authorization"} & set(sm["spec"]["endpoints"][0]), sm["metadata"]["name"]
    # ci/servicemonitor-values.yaml (the aggregator only, by default).
    (sm,) = [d for d in render("servicemonitor-values.yaml", PROM_API) if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["bearerTokenFile"] == TOKEN_FILE


def notes_say_how_to_authenticate():
    def notes(*extra):
        r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *extra)
        assert r.returncode == 0, r.stderr
        return r.stdout.split("NOTES:", 1)[-1]
    on = notes()
    assert 'curl -s -H "Authorization: Bearer $TOKEN" localhost:9394/api/v1/devices' in on, on[:2500]
    assert 'curl -s -H "Authorization: Bearer $TOKEN" <node-agent-pod-ip>:9394/metrics' in on
    assert f"{FULL}-metrics-reader" in on and f"{FULL}-aggregator-proxy" in on
    off = notes(*sets("monitor.aggregator.auth.mode=none", "monitor.agent.auth.metrics=none"))
    assert "Bearer" not in off and "curl -s localhost:9394/metrics" in off
    assert "Access control is off" in off


# --- NetworkPolicies (opt-in) --------------------------------------------------

def policies(docs):
    return {d["metadata"]["name"].rsplit("-", 1)[-1]: d for d in docs if d["kind"] == "NetworkPolicy"}


def selects(policy, workload):
    return policy["spec"]["podSelector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def network_policies_default():
    for s in scenarios():
        if s != "network-policy-values.yaml":
            assert not policies(render(s)), f"{s}: NetworkPolicies are opt-in"
    docs = render(extra=sets("networkPolicy.enabled=true"))
    validate_docs(docs)
    nps = policies(docs)
    assert set(nps) == {"webhook", "node", "aggregator"}, list(nps)
    for name, np in nps.items():
        # Ingress only: the agents' and aggregator's API server, the
        # aggregator's agents are never cut.
        assert np["spec"]["policyTypes"] == ["Ingress"] and "egress" not in np["spec"], name
        assert np["metadata"]["namespace"] == NS
    webhook, node, agg = one(docs, "Deployment", "-webhook"), one(docs, "DaemonSet", "-node"), one(docs, "Deployment", "-aggregator")
    assert selects(nps["webhook"], webhook) and selects(nps["node"], node) and selects(nps["aggregator"], agg)
    assert not selects(nps["node"], agg) and not selects(nps["aggregator"], node) and not selects(nps["webhook"], agg)
    # The webhook: its port only, any source (the API server's address is the cluster's).
    (rule,) = nps["webhook"]["spec"]["ingress"]
    assert rule == {"ports": [{"protocol": "TCP", "port": containers(webhook)["webhook"]["ports"][0]["containerPort"]}]}, rule
    # The agents: gRPC from the aggregator's pods only, metrics from Prometheus' namespace.
    ports = {p["name"]: p["containerPort"] for p in containers(node)["agent"]["ports"]}
    grpc, metrics = nps["node"]["spec"]["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": ports["grpc"]}]
    (peer,) = grpc["from"]
    assert list(peer) == ["podSelector"] and peer["podSelector"]["matchLabels"].items() <= agg["spec"]["template"]["metadata"]["labels"].items()
    assert metrics["ports"] == [{"protocol": "TCP", "port": ports["node-metrics"]}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    # The CSI plugin's health port is kubelet's (always allowed from the node): no rule.
    assert 9809 not in [p["port"] for r in nps["node"]["spec"]["ingress"] for p in r["ports"]]
    # The aggregator: HTTP and gRPC from anywhere (the API server's service
    # proxy, users; it checks tokens itself).
    (rule,) = nps["aggregator"]["spec"]["ingress"]
    aports = {p["name"]: p["containerPort"] for p in containers(agg)["aggregator"]["ports"]}
    assert rule == {"ports": [{"protocol": "TCP", "port": aports["http-metrics"]}, {"protocol": "TCP", "port": aports["grpc"]}]}, rule


def network_policies_narrowed():
    docs = render("network-policy-values.yaml")
    nps = policies(docs)
    assert nps["webhook"]["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    prom = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-prometheus-stack"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    grpc, metrics = nps["node"]["spec"]["ingress"]
    assert grpc["from"][1:] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpu-admin"}}}]
    assert "podSelector" in grpc["from"][0], "the aggregator stays first"
    assert metrics["from"] == prom
    # Prometheus, then the users' peers.
    assert nps["aggregator"]["spec"]["ingress"][0]["from"] == prom + [
        {"ipBlock": {"cidr": "10.0.0.0/24"}}, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpu-dashboards"}}}]
    # Ports follow the values.
    moved = policies(render(extra=sets("networkPolicy.enabled=true", "webhook.port=9443", "monitor.grpcPort=50061",
                                       "monitor.nodeMetricsPort=9395", "monitor.aggregator.httpPort=9396", "monitor.aggregator.grpcPort=50062")))
    assert moved["webhook"]["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9443}]
    assert [r["ports"][0]["port"] for r in moved["node"]["spec"]["ingress"]] == [50061, 9395]
    assert [p["port"] for p in moved["aggregator"]["spec"]["ingress"][0]["ports"]] == [9396, 50062]
    # No monitor: the webhook's, and with CSI delivery the plugin's pods take no traffic at all.
    off = render("monitor-disabled-values.yaml", sets("networkPolicy.enabled=true"))
    validate_docs(off)
    nps = policies(off)
    assert set(nps) == {"webhook", "node"} and nps["node"]["spec"]["ingress"] == []
    assert set(policies(render("monitor-disabled-values.yaml", sets("networkPolicy.enabled=true", "libraryDelivery=hostPath")))) == {"webhook"}


# --- docs and kubectl vgpu agree with what the chart renders ------------------

REPO = os.path.dirname(os.path.dirname(CHART))
MIGRATION = os.path.join(REPO, "docs", "migration.md")


def doc_section(path, heading):
    """The lines under `heading` up to the next heading of its level or above."""
    lines = open(path).read().splitlines()
    start = lines.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith("#") and len(lines[i]) - len(lines[i].lstrip("#")) <= level), len(lines))
    return lines[start + 1:end]


def doc_grants(lines):
    """{subject line: [rule items]} from the two-level bullet list of a section."""
    grants, subject, item = {}, None, None
    for line in lines:
        if line.startswith("- "):
            subject, item = line, None
            grants[subject] = []
        elif line.startswith("  - ") and subject:
            grants[subject].append(line[4:])
            item = len(grants[subject]) - 1
        elif line.startswith("    ") and item is not None:
            grants[subject][item] += " " + line.strip()
        elif not line.strip():
            subject, item = None, None
    return grants


def rendered_grants(docs):
    """[(subject as the docs name it, binding kind, rule or built-in role name)]."""
    roles = {(d["kind"], d["metadata"]["name"]): d.get("rules", []) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = []
    for b in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = (b["roleRef"]["kind"], b["roleRef"]["name"])
        for subj in b["subjects"]:
            who = subj["name"].replace(FULL, "<fullname>")
            if ref in roles:
                out += [(who, b["kind"], rule) for rule in roles[ref]]
            else:
                assert ref[1].startswith("system:"), f"{ref} is neither rendered nor built in"
                out.append((who, b["kind"], ref[1]))
    return out


def rbac_false_documented():
    # Everything rbac.create=true can grant a ServiceAccount of ours or the
    # proxy's group: node guard on (1.33, Events on), the opt-out label set,
    # eviction on, both auth modes on, DRA on (1.34: resource.k8s.io/v1). An
    # RBAC change in a template without the matching line in
    # docs/migration.md fails here.
    docs = render(extra=("--kube-version", "1.34.0") + sets(
        "rbac.create=true", "monitor.isolation.nodeGuard=true", "monitor.isolation.events=true",
        "monitor.isolation.enforce=evict", "webhook.optOutNamespaceLabel=kai-resource-isolator.io/allow-opt-out=true",
        "monitor.agent.auth.metrics=rbac", "monitor.aggregator.auth.mode=kubernetes"))
    assert named(docs, "ClusterRole", f"{FULL}-webhook"), "node guard rendered"
    granted = rendered_grants(docs)
    subjects = {who for who, _, _ in granted}
    assert subjects == {"<fullname>-node", "<fullname>-aggregator", "<fullname>-webhook", "system:authenticated"}, subjects
    documented = doc_grants(doc_section(MIGRATION, "### `rbac.create: false`"))
    by_subject = {}
    for who in subjects:
        (line,) = [k for k in documented if re.search(r"`([^`]+)`", k).group(1) == who]
        by_subject[who] = documented[line]
    for who, binding, rule in granted:
        items = by_subject[who]
        scope = "in the release namespace" if binding == "RoleBinding" else "cluster-wide"
        if isinstance(rule, str):
            assert any(i.startswith(scope) and f"`{rule}`" in i for i in items), f"{who}: {scope} {rule}"
            continue
        for res in rule.get("resources", []):
            words = [f"`{res}`"] + [f"`{v}`" for v in rule["verbs"]]
            words += [f"`{g}`" for g in rule.get("apiGroups", []) if g]
            words += [f"`{n.replace(FULL, '<fullname>')}`" for n in rule.get("resourceNames", [])]
            assert any(i.startswith(scope) and all(w in i for w in words) for i in items), f"{who}: {scope} {words}"
    # The short forms in values.yaml and the chart README name every resource too.
    resources = {r for _, _, rule in granted if not isinstance(rule, str) for r in rule["resources"]}
    values_rbac = open(os.path.join(CHART, "values.yaml")).read().split("\nrbac:\n", 1)[1].split("\n  create:", 1)[0]
    readme_rbac = next(line for line in open(os.path.join(CHART, "README.md")) if line.startswith("| RBAC (`rbac.create`)"))
    for text, where in ((values_rbac, "values.yaml"), (readme_rbac, "README.md")):
        for word in resources | {"system:auth-delegator", "<fullname>-node", "<fullname>-aggregator", "<fullname>-webhook"}:
            assert word in text, f"{where} omits {word}"


def kubectl_vgpu_selectors():
    src = open(os.path.join(REPO, "services", "kubectl-vgpu", "src", "source.rs")).read()
    def const(name):
        m = re.search(rf'pub const {name}: &str =\s*"([^"]+)";', src)
        assert m, f"{name} not found in source.rs"
        return dict(kv.split("=", 1) for kv in m.group(1).split(","))
    return const("AGGREGATOR_SELECTOR"), const("LEGACY_AGGREGATOR_SELECTOR")


def kubectl_vgpu_finds_the_aggregator():
    selector, legacy = kubectl_vgpu_selectors()
    for overrides in ((), ("nameOverride=foo",), ("fullnameOverride=bar",), ("nameOverride=foo", "fullnameOverride=bar")):
        docs = render(extra=sets(*overrides))
        found = [d["metadata"]["name"] for d in docs
                 if d["kind"] == "Service" and selector.items() <= d["metadata"].get("labels", {}).items()]
        assert found == [one(docs, "Service", "-aggregator")["metadata"]["name"]], (overrides, found)
    # Why the selector changed: with nameOverride the older one finds nothing.
    docs = render(extra=sets("nameOverride=foo"))
    assert not [d for d in docs if d["kind"] == "Service" and legacy.items() <= d["metadata"].get("labels", {}).items()]
    # Without overrides a release also answers the older selector, as
    # releases from before part-of did (the plugin's fallback).
    docs = render()
    assert [d for d in docs if d["kind"] == "Service" and legacy.items() <= d["metadata"].get("labels", {}).items()]


def metrics_port_means_what_it_meant():
    # The Go chart's monitor.metricsPort was its monitor DaemonSet's port
    # (--metrics-bind-address, containerPort): the node agent's here.
    def ports(*values):
        docs = render("go-chart-values.yaml", sets("monitor.enabled=true", "networkPolicy.enabled=true", *values))
        agent, agg = agent_container(docs), agg_container(docs)
        nps = policies(docs)
        return ((arg(agent, "--metrics-listen"), {p["name"]: p["containerPort"] for p in agent["ports"]}["node-metrics"],
                 nps["node"]["spec"]["ingress"][1]["ports"][0]["port"]),
                (arg(agg, "--listen"), one(docs, "Service", "-aggregator")["spec"]["ports"][0]["port"],
                 nps["aggregator"]["spec"]["ingress"][0]["ports"][0]["port"]))
    got = ports("monitor.metricsPort=9500")
    assert got == (("0.0.0.0:9500", 9500, 9500), ("0.0.0.0:9394", 9394, 9394)), got
    # Our own key wins for the agent; the aggregator has its own.
    got = ports("monitor.metricsPort=9500", "monitor.nodeMetricsPort=9501", "monitor.aggregator.httpPort=9502")
    assert got == (("0.0.0.0:9501", 9501, 9501), ("0.0.0.0:9502", 9502, 9502)), got
    def notes(*values):
        r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *sets(*values))
        assert r.returncode == 0, r.stderr
        return r.stdout
    assert "Warning: monitor.metricsPort is 9500 but has no effect" in notes("monitor.metricsPort=9500", "monitor.nodeMetricsPort=9501")
    for quiet in (("monitor.metricsPort=9500",), ("monitor.nodeMetricsPort=9501",), ()):
        assert "Warning: monitor.metricsPort" not in notes(*quiet), quiet
    # The docs say so.
    (row,) = [line for line in open(MIGRATION) if line.startswith("| `monitor.metricsPort`")]
    assert "node agent" in row and "`monitor.aggregator.httpPort`" in row, row


def aggregator_port_survives_reuse_values():
    # `helm upgrade --reuse-values` renders with the old release's values in
    # place of values.yaml's, so a key newer than that release is missing:
    # simulated with today's values lacking monitor.aggregator.httpPort, and
    # null removing the chart's own default (older releases also stored
    # nodeMetricsPort: 9394).
    with open(os.path.join(CHART, "values.yaml")) as f:
        old = yaml.safe_load(f)
    del old["monitor"]["aggregator"]["httpPort"]
    old["monitor"].update(enabled=True, nodeMetricsPort=9394)
    old["networkPolicy"]["enabled"] = True
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(old, f)
    try:
        reused = ("-f", f.name, "--set", "monitor.aggregator.httpPort=null")
        docs = render(extra=reused)
        validate_docs(docs)
        agg = agg_container(docs)
        assert arg(agg, "--listen") == "0.0.0.0:9394", arg(agg, "--listen")
        assert {p["name"]: p["containerPort"] for p in agg["ports"]}["http-metrics"] == 9394, agg["ports"]
        svc = {p["name"]: p["port"] for p in one(docs, "Service", "-aggregator")["spec"]["ports"]}
        assert svc["http-metrics"] == 9394, svc
        np_ports = [p["port"] for p in policies(docs)["aggregator"]["spec"]["ingress"][0]["ports"]]
        assert 9394 in np_ports and None not in np_ports, np_ports
        assert arg(agent_container(docs), "--metrics-listen") == "0.0.0.0:9394"
        r = helm("install", RELEASE, CHART, "-n", NS, "--dry-run=client", *reused)
        assert r.returncode == 0, r.stderr
        assert f"port-forward svc/{RELEASE}-kai-resource-isolator-aggregator 9394\n" in r.stdout, r.stdout[-2500:]
        assert "localhost:/" not in r.stdout, r.stdout[-2500:]
    finally:
        os.unlink(f.name)


def masked(docs):
    """Objects by kind and name, generated certificates and their checksums masked."""
    out = {}
    for d in docs:
        text = json.dumps(d, sort_keys=True)
        text = re.sub(r'"(tls\.crt|tls\.key|ca\.crt|caBundle|checksum/[a-z-]+)": "[^"]*"', r'"\1": "X"', text)
        out[(d["kind"], d["metadata"]["name"])] = json.loads(text)
    return out


def go_release_reuse_values():
    # `helm upgrade --reuse-values` of a Go chart release renders with the Go
    # chart's values in place of values.yaml (Helm reuses the old chart's
    # defaults): simulated with a copy of the chart whose values.yaml is the
    # Go chart's. Every key only this chart has comes from
    # files/values-defaults.yaml (a link to values.yaml): the same objects
    # as `-f <Go values>` on the chart as it is, with our image.
    assert os.path.islink(os.path.join(CHART, "files", "values-defaults.yaml"))
    assert os.path.realpath(os.path.join(CHART, "files", "values-defaults.yaml")) == os.path.join(CHART, "values.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        # The packaged chart, as a repository serves it: the link's content is in it.
        r = helm("package", CHART, "-d", tmp)
        assert r.returncode == 0, r.stderr
        (tgz,) = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
        subprocess.run(["tar", "-xzf", os.path.join(tmp, tgz), "-C", tmp], check=True)
        copy = os.path.join(tmp, "kai-resource-isolator")
        packaged = os.path.join(copy, "files", "values-defaults.yaml")
        assert not os.path.islink(packaged) and open(packaged).read() == open(os.path.join(CHART, "values.yaml")).read()
        with open(os.path.join(CHART, "ci", "go-chart-values.yaml")) as src, open(os.path.join(copy, "values.yaml"), "w") as dst:
            dst.write(src.read())
        r = helm("template", RELEASE, copy, "-n", NS)
        assert r.returncode == 0, r.stderr[-1500:]
        reused = [d for d in yaml.safe_load_all(r.stdout) if d]
        # --set of a key only this chart has still gets the others' defaults.
        r = helm("template", RELEASE, copy, "-n", NS, "--set", "monitor.enabled=true", "--set", "webhook.failurePolicy=Fail",
                 "--set", "libraryDelivery=hostPath")
        assert r.returncode == 0, r.stderr[-1500:]
        overridden = [d for d in yaml.safe_load_all(r.stdout) if d]
    validate_docs(reused)
    assert masked(reused) == masked(render("go-chart-values.yaml")), "--reuse-values from Go renders otherwise than -f <Go values>"
    for w in (d for d in reused if d["kind"] in ("Deployment", "DaemonSet")):
        for c in pod_spec(w)["containers"]:
            assert c["image"].startswith(("ghcr.io/kai-resource-isolator/", "registry.k8s.io/sig-storage/")), c["image"]
    # The Go values' own keys keep their meaning (Ignore, monitor off), --set still wins.
    assert one(reused, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"
    assert not [d for d in reused if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-aggregator")]
    assert one(overridden, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    one(overridden, "Deployment", "-aggregator")
    assert {e["name"]: e.get("value") for e in containers(one(overridden, "Deployment", "-webhook"))["webhook"]["env"]}[
        "LIBRARY_DELIVERY"] == "hostPath"
    validate_docs(overridden)


def webhook_rollout_never_empty():
    # Without a cluster (lookup finds nothing): this chart's selectors and
    # Secret. The webhook's Deployment replaces a pod only once the new one
    # has been Ready 5 s, and its Service, PDB, anti-affinity and
    # NetworkPolicy select exactly the Deployment's pods.
    docs = render(extra=sets("webhook.replicaCount=2", "networkPolicy.enabled=true"))
    dep = one(docs, "Deployment", "-webhook")
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert dep["spec"]["minReadySeconds"] == 5
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel == {"app.kubernetes.io/name": "kai-resource-isolator", "app.kubernetes.io/instance": RELEASE,
                   "app.kubernetes.io/component": "webhook"}, sel
    assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert one(docs, "Service", "-webhook")["spec"]["selector"] == sel
    assert one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == sel
    anti = pod_spec(dep)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == sel
    assert policies(docs)["webhook"]["spec"]["podSelector"]["matchLabels"] == sel
    ls = one(docs, "DaemonSet", "-libsync")
    assert ls["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "libsync"
    assert ls["spec"]["selector"]["matchLabels"].items() <= ls["spec"]["template"]["metadata"]["labels"].items()
    # A pod label of the user's cannot take the pods out of the selector.
    docs = render(extra=sets("webhook.podLabels.app\\.kubernetes\\.io/component=mine", "webhook.podLabels.team=gpu"))
    dep = one(docs, "Deployment", "-webhook")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items() and labels["team"] == "gpu", labels
    # Fresh install: this chart's names, Secret and caBundle.
    docs = render()
    secret = one(docs, "Secret", "-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert pod_spec(one(docs, "Deployment", "-webhook"))["volumes"][0]["secret"]["secretName"] == secret["metadata"]["name"]
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert [w["name"] for w in mwc["webhooks"]] == ["vgpu.lib.kai-resource-isolator.io", "opt-out.vgpu.lib.kai-resource-isolator.io"]
    assert all(w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"] for w in mwc["webhooks"])


def migration_documents_the_move():
    text = open(MIGRATION).read()
    section = text.split("\n## Moving a Go chart release in place", 1)[1].split("\n## ", 1)[0]
    for needed in ("helm upgrade kai-resource-isolator", "--reuse-values", "--reset-then-reuse-values",
                   "helm rollback kai-resource-isolator", "-webhook-cert", "kai-resource-isolator-webhook-tls",
                   "rollout status", "scrape", "Do not"):
        assert needed in section, needed


def migration_says_metrics_need_a_token():
    # The Go monitor answered anyone; ours answers 401 without a token by
    # default, so the migration guide must not promise the Go README's curl.
    assert arg(agent_container(render()), "--metrics-auth") == "rbac"
    intro = open(MIGRATION).read().split("\n## ", 1)[0]
    (curl,) = [p for p in intro.split("\n\n") if "`curl <pod-ip>:9394/metrics`" in p]
    # The sentence that names the Go README's curl says what it now gets.
    assert "401" in curl.split("`curl <pod-ip>:9394/metrics`", 1)[1].split(".", 1)[0], curl
    assert "unchanged" not in curl, curl
    for needed in ("monitor.agent.auth.metrics: none", "monitor.aggregator.auth.metrics: none",
                   "Authorization: Bearer", "monitor.metricsReaders"):
        assert needed in intro, needed


# --- the schema rejects bad values ------------------------------------------

def rejects(*sets):
    def t():
        r = helm("template", RELEASE, CHART, *[x for s in sets for x in ("--set", s)])
        assert r.returncode != 0, f"accepted {sets}"
        assert "schema" in r.stderr.lower() or "values don't meet" in r.stderr.lower(), r.stderr[:400]
    return t


def rejects_json(key, value):
    def t():
        r = helm("template", RELEASE, CHART, "--set-json", f"{key}={value}")
        assert r.returncode != 0, f"accepted {key}={value}"
        assert "schema" in r.stderr.lower() or "values don't meet" in r.stderr.lower(), r.stderr[:400]
    return t


# --- the cases, in the order they ran as a script --------------------------

def cases(check):
    """check(name, function) of every check, in the order they ran as a script."""
    for s in scenarios():
        check(f"lint --strict {s}", lint(s))
        if not skip_schema():  # the Nix check has no kubernetes-validate
            check(f"objects valid against Kubernetes {K8S} ({s})", validates(s))
            check(f"objects valid against Kubernetes {K8S} with the Prometheus Operator API ({s})", validates(s, PROM_API))
    check("webhook selects GPU pods' CREATE, never kube-system, the release namespace or our pods", webhook_selection)
    check("default TLS: caBundle is the CA of the mounted Secret", ca_bundle_matches_secret)
    check("cert-manager: Certificate, Issuer and CA injection", cert_manager_injects_the_ca)
    check("paths agree: default mount", paths_agree(None, "/usr/local/vgpu"))
    check("paths agree: paths.containerVgpuMount=/opt/hami/vgpu", paths_agree("custom-mount-values.yaml", "/opt/hami/vgpu"))
    check("paths agree: split host /var/lib/kai/vgpu, container /opt/hami/vgpu", paths_agree("split-paths-values.yaml", "/opt/hami/vgpu", "/var/lib/kai/vgpu"))
    check("paths agree: the Go chart's defaults (hostInstallBase /usr/local)", paths_agree("go-chart-values.yaml", "/usr/local/vgpu"))
    check("RBAC: pods list/watch (+ Events create/patch, its webhook configuration and namespaces for the agent, get for the node guard) only",
          rbac_least_privilege)
    for s in scenarios():
        check(f"containers hardened ({s})", hardened(s))
    check("aggregator: glibc malloc tuned so scrape buffers are returned (soak-measured)", aggregator_malloc_tuned)
    check("replicaCount > 1: PDB and anti-affinity; failurePolicy/timeout from values", ha_webhook)
    check("monitor.enabled=false: libsync only, no RBAC, every node", monitor_disabled)
    check("ServiceMonitor, runtimeClassName and --legacy-metrics", service_monitor_and_flags)
    check("aggregator discovers the DaemonSet's agent pods on their port", aggregator_finds_agents)
    check("global.imageRegistry, image.tag and pullSecrets", images)
    check("monitor.grpcTls (default on): agents serve kai-node-agent and accept only the aggregator's CA, the aggregator trusts only the agents' CA; a checksum rolls both", grpc_mutual_tls)
    check("monitor.isolation: host /proc read-only, Events RBAC and thresholds follow the values", isolation_settings)
    check("monitor.agent.extraEnv: appended to the agent container's env after the chart's own", agent_extra_env)
    check("the agent reads the chart's MutatingWebhookConfiguration (flag, RBAC for that one object) and namespaces",
          agent_reads_the_webhook_configuration)
    check("Go chart defaults: accepted, with their meaning (image, libsync, Service, quota, monitor on 9394)", go_chart_values_mean_what_they_meant)
    check("seed install: --set monitor.enabled=true --set monitor.serviceMonitor.enabled=true, with and without the Prometheus Operator", seed_install_commands)
    check("Go keys: name/namespace overrides, pull secrets, registry precedence, rbac.create=false, service, podLabels", go_overrides)
    check("webhook PDB: maxUnavailable, then minAvailable, then 1 (Go precedence)", pdb_precedence)
    check("cert-manager ClusterIssuer; tls.patch accepted", cert_manager_cluster_issuer)
    check("webhook scoping values add to ours, never replace them", webhook_scoping)
    check("opt-out only in admin-labelled namespaces: two webhooks, complementary on the label; none without it", webhook_opt_out_gate)
    check("hostile-tenant settings reach the webhook: tenantEnv and the size/load limits", webhook_hostile_tenant_settings)
    check("webhook pods go on serving, unready, for shutdownDelaySeconds after SIGTERM, within their grace period", webhook_shutdown_delay)
    check("failurePolicy: Fail where matchConditions scope it to sharing pods, Ignore where the API lacks them, explicit values win", failure_policy)
    check("node guard: a fail-closed validating webhook for the agent's evictions and Events on 1.30+, with the webhook's token and get pods", node_guard)
    check("dra.deviceClasses: the same --dra-memory-class flags for the webhook and the agent; none on request or before resource.k8s.io/v1 (1.34)", dra_classes)
    check("GKE: host paths, affinity, ResourceQuota for system-node-critical, NVML from the host", gke)
    check("priority-class ResourceQuota only outside kube-system and only for critical classes", priority_quota_only_where_needed)
    check("monitor.isolation.enforce: flag follows the value, eviction RBAC only with evict", enforcement)
    check("stream and connection limits render as the agent's and aggregator's flags", stream_limits)
    check("libraryDelivery=csi (default): CSIDriver, the node DaemonSet's privileged csi container, its mounts and probes, the webhook's env", csi_delivery_by_default)
    check("csi.kubeletDir, healthPort and logLevel reach the plugin's mounts and flags", csi_kubelet_dir)
    check("libraryDelivery=hostPath: no CSIDriver, no csi container, nothing privileged, the webhook told so", host_path_delivery)
    check("NOTES name the delivery and the Pod Security level it needs", notes_name_the_delivery)
    check("access control by default: --auth=kubernetes, /metrics by RBAC on agents and aggregator, system:auth-delegator for both, vgpu-view aggregated into view/edit/admin, metrics-reader", access_defaults)
    check("service proxy: every authenticated user may GET the aggregator's HTTP port through the API server (it checks tokens itself); not with mode none", access_service_proxy)
    check("auth modes: none / metrics none / agent metrics none render their flags and drop the review rights; audiences and cache settings follow the values", access_modes)
    check("rbac.aggregateToDefaultRoles=false keeps an unaggregated vgpu-view; monitor.metricsReaders bind metrics-reader", access_roles_and_readers)
    check("ServiceMonitors send Prometheus' token (bearerTokenFile, or monitor.serviceMonitor.authorization) exactly where the target checks it", service_monitor_sends_tokens)
    check("NOTES show the token on every curl while access control is on, none when off", notes_say_how_to_authenticate)
    check("networkPolicy.enabled: ingress-only policies selecting the webhook, the agents (gRPC from the aggregator only, metrics from Prometheus) and the aggregator (open by default); none unless enabled", network_policies_default)
    check("networkPolicy from-lists narrow each port (ci/network-policy-values.yaml); ports follow the values; without the monitor only what runs", network_policies_narrowed)
    check("rbac.create=false: docs/migration.md names every rule rbac.create=true grants, per ServiceAccount (and the proxy's group)", rbac_false_documented)
    check("kubectl vgpu's selector finds the aggregator Service, and only it, whatever nameOverride/fullnameOverride", kubectl_vgpu_finds_the_aggregator)
    check("monitor.metricsPort moves the node agent's port as in the Go chart; nodeMetricsPort wins; aggregator.httpPort moves the aggregator", metrics_port_means_what_it_meant)
    check("helm upgrade --reuse-values from a release without monitor.aggregator.httpPort: the aggregator, its Service and NetworkPolicy stay on 9394", aggregator_port_survives_reuse_values)
    check("docs/migration.md says /metrics needs a token by default and how to restore anonymous reads", migration_says_metrics_need_a_token)
    check("helm upgrade --reuse-values from a Go chart release renders what -f <Go values> renders, with our image (values-defaults.yaml, packaged too)", go_release_reuse_values)
    check("the webhook's rollout keeps a serving pod (maxUnavailable 0, minReadySeconds); Service, PDB, affinity, NetworkPolicy select its pods; fresh install: our Secret and entries", webhook_rollout_never_empty)
    check("docs/migration.md: moving a Go release in place and back (commands, Secrets, rollout, scrape jobs, what not to do)", migration_documents_the_move)
    check("schema rejects an unknown top-level key", rejects("replicas=2"))
    check("schema rejects a wrong type", rejects("webhook.replicaCount=two"))
    check("schema rejects an unknown failurePolicy", rejects("webhook.failurePolicy=Maybe"))
    check("schema rejects keeping the tenant's env", rejects("webhook.tenantEnv=keep"))
    check("schema rejects an opt-out label that is no key=value", rejects("webhook.optOutNamespaceLabel=allow-opt-out"))
    check("schema rejects a body limit under 1 MiB", rejects("webhook.limits.maxBodyBytes=1024"))
    check("schema rejects an unknown key under webhook.limits", rejects("webhook.limits.maxBody=1"))
    check("schema rejects a relative containerVgpuMount", rejects("paths.containerVgpuMount=usr/local/vgpu"))
    check("schema rejects an unknown key under monitor", rejects("monitor.enable=true"))
    check("schema rejects a DRA class without its memory capacity", rejects_json("dra.deviceClasses", '[{"name":"gpu.nvidia.com"}]'))
    check("schema rejects a DRA class that is no Kubernetes name", rejects_json("dra.deviceClasses", '[{"name":"GPU","memoryCapacity":"memory"}]'))
    check("schema rejects an unknown monitor.isolation.enforce mode", rejects("monitor.isolation.enforce=kill"))
    check("schema rejects a near-cap percent over 100", rejects("monitor.isolation.nearCapPercent=150"))
    check("NOTES warn when Go's unread hostInstallBase default would put libsync on /usr/local", go_gke_paths_warn)
    check("schema rejects an unknown key under librarySync", rejects("librarySync.nodeSelectr.a=b"))
    check("schema rejects an unknown key under monitor.service", rejects("monitor.service.prt=1"))
    check("schema rejects an unknown key under tls.patch", rejects("tls.patch.enable=true"))
    check("schema rejects a relative hostInstallBase", rejects("paths.hostInstallBase=home/kubernetes"))
    check("schema rejects an updateInterval that is no duration", rejects("monitor.updateInterval=often"))
    check("schema rejects a watch-stream limit of 0", rejects("monitor.agent.limits.maxWatchStreams=0"))
    check("schema rejects an unknown key under monitor.aggregator.limits", rejects("monitor.aggregator.limits.maxStreams=1"))
    check("schema rejects an unknown libraryDelivery", rejects("libraryDelivery=emptyDir"))
    check("schema rejects libraryDelivery spelled otherwise than the webhook's flag", rejects("libraryDelivery=hostpath"))
    check("schema rejects a relative csi.kubeletDir", rejects("csi.kubeletDir=var/lib/kubelet"))
    check("schema rejects an unknown key under csi", rejects("csi.kubeletdir=/var/lib/kubelet"))
    check("schema rejects an unknown auth mode", rejects("monitor.aggregator.auth.mode=oidc"))
    check("schema rejects an unknown aggregator metrics auth", rejects("monitor.aggregator.auth.metrics=open"))
    check("schema rejects an unknown agent metrics auth", rejects("monitor.agent.auth.metrics=anonymous"))
    check("schema rejects an unknown key under monitor.aggregator.auth", rejects("monitor.aggregator.auth.ttl=5"))
    check("schema rejects a cache of 0 entries", rejects("monitor.aggregator.auth.cacheEntries=0"))
    check("schema rejects a cache TTL over an hour", rejects("monitor.aggregator.auth.cacheTTLSeconds=3601"))
    check("schema rejects an audience with a comma (the flag's separator)", rejects("monitor.aggregator.auth.audiences[0]=a\\,b"))
    check("schema rejects a ServiceAccount metrics reader without a namespace", rejects("monitor.metricsReaders[0].kind=ServiceAccount", "monitor.metricsReaders[0].name=prometheus"))
    check("schema rejects a metrics reader of an unknown kind", rejects("monitor.metricsReaders[0].kind=Robot", "monitor.metricsReaders[0].name=r2"))
    check("schema rejects an empty networkPolicy.prometheus.from (every source: [{namespaceSelector: {}}])", rejects_json("networkPolicy.prometheus.from", "[]"))
    check("schema rejects an unknown key under networkPolicy", rejects("networkPolicy.enable=true"))
    check("schema rejects a NetworkPolicy peer that is none", rejects("networkPolicy.webhook.from[0].pods.a=b"))


pytest_generate_tests = generate(cases)


def test(case):
    case()
