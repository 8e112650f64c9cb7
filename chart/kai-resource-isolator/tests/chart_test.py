#!/usr/bin/env python3
"""Renders the chart for every scenario in ci/, validates each object
against the Kubernetes OpenAPI schemas offline (kubernetes-validate), and
asserts on the rendered objects. Prints 'N passed, N failed'.

Usage: chart_test.py HELM_BINARY
"""
import os
import subprocess
import sys
import tempfile

import yaml

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELM = sys.argv[1] if len(sys.argv) > 1 else "helm"
NS = "kai-system"
RELEASE = "kai"
K8S = "1.33.0"
CRDS = {"ServiceMonitor", "Issuer", "Certificate"}

passed, failed = 0, []


def check(name, fn):
    global passed
    try:
        fn()
        passed += 1
        print(f"ok   {name}")
    except AssertionError as e:
        failed.append(name)
        print(f"FAIL {name}: {e}")


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True)


def render(values_file=None, extra=()):
    args = ["template", RELEASE, CHART, "-n", NS, *extra]
    if values_file:
        args += ["-f", os.path.join(CHART, "ci", values_file)]
    r = helm(*args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


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


SCENARIOS = sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith("-values.yaml"))


# --- lint, render and validate every scenario ----------------------------

def lint(scenario):
    def t():
        r = helm("lint", "--strict", CHART, "-f", os.path.join(CHART, "ci", scenario))
        assert r.returncode == 0, r.stdout + r.stderr
    return t


def validates(scenario):
    def t():
        docs = [d for d in render(scenario) if d["kind"] not in CRDS]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(docs, f)
        r = subprocess.run(["kubernetes-validate", "--strict", "-k", K8S, "--quiet", f.name], capture_output=True, text=True)
        os.unlink(f.name)
        assert r.returncode == 0, (r.stdout + r.stderr)[:2000]
    return t


SKIP_SCHEMA = os.environ.get("CHART_TEST_SKIP_SCHEMA_VALIDATION") == "1"
for s in SCENARIOS:
    check(f"lint --strict {s}", lint(s))
    if not SKIP_SCHEMA:  # the Nix check has no kubernetes-validate
        check(f"objects valid against Kubernetes {K8S} ({s})", validates(s))


# --- the webhook selects what it should ----------------------------------

def webhook_selection():
    docs = render()
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["name"] == f"{RELEASE}-kai-resource-isolator-mutating"
    (w,) = mwc["webhooks"]
    assert w["name"] == "vgpu.lib.kai-resource-isolator.io"
    assert w["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]
    assert (w["failurePolicy"], w["sideEffects"], w["reinvocationPolicy"], w["timeoutSeconds"]) == ("Ignore", "None", "IfNeeded", 10)
    assert w["admissionReviewVersions"] == ["v1"]
    assert {"key": "kai-resource-isolator.io/webhook", "operator": "NotIn", "values": ["ignore"]} in w["objectSelector"]["matchExpressions"]
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
    for kind, suffix in [("Deployment", "-webhook"), ("DaemonSet", "-node"), ("Deployment", "-aggregator")]:
        labels = one(docs, kind, suffix)["spec"]["template"]["metadata"]["labels"]
        assert labels.get("kai-resource-isolator.io/webhook") == "ignore", f"{kind}{suffix}"


def ca_bundle_matches_secret():
    docs = render()
    secret = one(docs, "Secret", "-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    (w,) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    vol = {v["name"]: v for v in pod_spec(one(docs, "Deployment", "-webhook"))["volumes"]}["tls"]
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]


def cert_manager_injects_the_ca():
    docs = render("certmanager-values.yaml")
    assert "Secret" not in kinds(docs), "cert-manager owns the Secret"
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


check("webhook selects GPU pods' CREATE, never kube-system, the release namespace or our pods", webhook_selection)
check("default TLS: caBundle is the CA of the mounted Secret", ca_bundle_matches_secret)
check("cert-manager: Certificate, Issuer and CA injection", cert_manager_injects_the_ca)


# --- paths agree across webhook, libsync and agent -------------------------

def c_libsync_mounts(ds):
    return containers(ds)["libsync"]["volumeMounts"]


def paths_agree(scenario, mount):
    def t():
        docs = render(scenario)
        webhook = containers(one(docs, "Deployment", "-webhook"))["webhook"]
        env = {e["name"]: e.get("value") for e in webhook["env"]}
        assert env["CONTAINER_VGPU_MOUNT"] == mount
        ds = one(docs, "DaemonSet", "-node")
        vols = {v["name"]: v for v in pod_spec(ds)["volumes"]}
        assert vols["host-vgpu"]["hostPath"] == {"path": mount, "type": "DirectoryOrCreate"}
        assert vols["host-vgpulock"]["hostPath"] == {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"}
        host_paths = sorted(v["hostPath"]["path"] for v in vols.values() if "hostPath" in v)
        # The two vgpu paths, and the host's /proc (read-only, agent only) for isolation checks.
        assert host_paths == sorted([mount, "/tmp/vgpulock", "/proc"]), f"only these host paths: {host_paths}"
        assert "host-proc" not in {m["name"] for m in c_libsync_mounts(ds)}, "libsync does not see /proc"
        c = containers(ds)
        libsync = c["libsync"]
        assert arg(libsync, "--host-vgpu-dir") == "/host" + mount
        assert arg(libsync, "--container-vgpu-mount") == mount
        mounts = {m["name"]: m["mountPath"] for m in libsync["volumeMounts"]}
        assert mounts["host-vgpu"] == "/host" + mount and mounts["host-vgpulock"] == "/host/tmp/vgpulock"
        cm = one(docs, "ConfigMap", "-preload")
        assert cm["data"]["ld.so.preload"].strip() == mount + "/libvgpu.so"
        assert vols["preload"]["configMap"]["name"] == cm["metadata"]["name"]
        if "agent" in c:
            agent = c["agent"]
            assert arg(agent, "--containers-dir") == "/host" + mount + "/containers"
            assert {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}["host-vgpu"] == "/host" + mount
    return t


check("paths agree: default mount", paths_agree(None, "/usr/local/vgpu"))
check("paths agree: paths.containerVgpuMount=/opt/hami/vgpu", paths_agree("custom-mount-values.yaml", "/opt/hami/vgpu"))


# --- RBAC grants nothing beyond what each binary uses ----------------------

def rbac_least_privilege():
    docs = render()
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert sorted((r["kind"], r["metadata"]["name"]) for r in roles) == [
        ("ClusterRole", f"{RELEASE}-kai-resource-isolator-node"),
        ("Role", f"{RELEASE}-kai-resource-isolator-aggregator"),
    ]
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
    events = {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
    assert one(docs, "ClusterRole", "-node")["rules"] == [pods, events]
    role = one(docs, "Role", "-aggregator")
    assert role["rules"] == [pods], role["rules"]
    assert role["metadata"]["namespace"] == NS
    bindings = {b["roleRef"]["name"]: b["subjects"] for b in docs if b["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert bindings[f"{RELEASE}-kai-resource-isolator-node"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-kai-resource-isolator-node", "namespace": NS}]
    assert bindings[f"{RELEASE}-kai-resource-isolator-aggregator"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-kai-resource-isolator-aggregator", "namespace": NS}]
    # The webhook has no API access at all.
    assert pod_spec(one(docs, "Deployment", "-webhook"))["automountServiceAccountToken"] is False
    assert one(docs, "ServiceAccount", "-webhook")["automountServiceAccountToken"] is False


check("RBAC: pods list/watch (+ Events create/patch for the agent) only", rbac_least_privilege)


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


for s in SCENARIOS:
    check(f"containers hardened ({s})", hardened(s))


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
    (w,) = one(docs, "MutatingWebhookConfiguration")["webhooks"]
    assert (w["failurePolicy"], w["timeoutSeconds"]) == ("Fail", 5)
    single = render()
    assert "PodDisruptionBudget" not in kinds(single)
    assert "affinity" not in pod_spec(one(single, "Deployment", "-webhook"))


def monitor_disabled():
    docs = render("monitor-disabled-values.yaml")
    names = [d["metadata"]["name"] for d in docs]
    assert not any(n.endswith("-aggregator") for n in names), names
    assert "ClusterRole" not in kinds(docs)
    ds = one(docs, "DaemonSet", "-node")
    assert list(containers(ds)) == ["libsync"]
    assert pod_spec(ds)["automountServiceAccountToken"] is False
    assert "nodeSelector" not in pod_spec(ds), "nodeSelector {} puts libsync on every node"


def service_monitor_and_flags():
    docs = render("servicemonitor-values.yaml")
    sm = one(docs, "ServiceMonitor")
    svc = one(docs, "Service", "-aggregator")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "http-metrics"
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


check("aggregator: glibc malloc tuned so scrape buffers are returned (soak-measured)", aggregator_malloc_tuned)


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
            assert c["image"] == "registry.example.com/ghcr.io/kai-resource-isolator/kai-resource-isolator:0.1.0-rc1", c["image"]
        assert pod_spec(w)["imagePullSecrets"] == [{"name": "regcred"}]
    default = one(render(), "Deployment", "-webhook")
    assert containers(default)["webhook"]["image"].endswith(":0.1.0"), "tag defaults to appVersion"


check("replicaCount > 1: PDB and anti-affinity; failurePolicy/timeout from values", ha_webhook)
check("monitor.enabled=false: libsync only, no RBAC, every node", monitor_disabled)
check("ServiceMonitor, runtimeClassName and --legacy-metrics", service_monitor_and_flags)
check("aggregator discovers the DaemonSet's agent pods on their port", aggregator_finds_agents)
check("global.imageRegistry, image.tag and pullSecrets", images)


def grpc_mutual_tls():
    docs = render("grpc-tls-values.yaml")
    secret = one(docs, "Secret", "-grpc-tls")
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    ds = one(docs, "DaemonSet", "-node")
    agent = containers(ds)["agent"]
    dep = one(docs, "Deployment", "-aggregator")
    agg = containers(dep)["aggregator"]
    for spec, c in ((pod_spec(ds), agent), (pod_spec(dep), agg)):
        vols = {v["name"]: v for v in spec["volumes"]}
        assert vols["grpc-tls"]["secret"]["secretName"] == secret["metadata"]["name"]
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["grpc-tls"]["mountPath"] == "/etc/kai/grpc-tls" and mounts["grpc-tls"]["readOnly"] is True
    assert arg(agent, "--grpc-tls-cert-file") == "/etc/kai/grpc-tls/tls.crt"
    assert arg(agent, "--grpc-tls-client-ca-file") == "/etc/kai/grpc-tls/ca.crt", "agents require client certificates"
    assert arg(agg, "--agent-tls-ca-file") == "/etc/kai/grpc-tls/ca.crt"
    assert arg(agg, "--agent-tls-cert-file") == "/etc/kai/grpc-tls/tls.crt"
    assert arg(agg, "--agent-tls-server-name") == "kai-node-agent"
    assert "httpGet" in agent["livenessProbe"], "kubelet gRPC probes cannot speak TLS"
    plain = render()
    assert not [d for d in plain if d["metadata"]["name"].endswith("-grpc-tls")]
    assert arg(containers(one(plain, "DaemonSet", "-node"))["agent"], "--grpc-tls-cert-file") is None


check("monitor.grpcTls: agents serve mTLS, the aggregator presents the same CA's certificate", grpc_mutual_tls)


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


check("monitor.isolation: host /proc read-only, Events RBAC and thresholds follow the values", isolation_settings)


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


check("monitor.isolation.enforce: flag follows the value, eviction RBAC only with evict", enforcement)


# --- the schema rejects bad values ------------------------------------------

def rejects(*sets):
    def t():
        r = helm("template", RELEASE, CHART, *[x for s in sets for x in ("--set", s)])
        assert r.returncode != 0, f"accepted {sets}"
        assert "schema" in r.stderr.lower() or "values don't meet" in r.stderr.lower(), r.stderr[:400]
    return t


check("schema rejects an unknown top-level key", rejects("replicas=2"))
check("schema rejects a wrong type", rejects("webhook.replicaCount=two"))
check("schema rejects an unknown failurePolicy", rejects("webhook.failurePolicy=Maybe"))
check("schema rejects a relative containerVgpuMount", rejects("paths.containerVgpuMount=usr/local/vgpu"))
check("schema rejects an unknown key under monitor", rejects("monitor.enable=true"))
check("schema rejects an unknown monitor.isolation.enforce mode", rejects("monitor.isolation.enforce=kill"))
check("schema rejects a near-cap percent over 100", rejects("monitor.isolation.nearCapPercent=150"))

print(f"\n{passed} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
