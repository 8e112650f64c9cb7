"""Moving a Go chart release to this chart in place, and back (issue 43).

The `migration` part of apiserver.py (`--only migration`), on its real API
server. The Go chart (Project-HAMi/KAI-resource-isolator 1.1.0-chart,
reconstructed in ../shared/go-chart-1.1.0, used from there; KAI_GO_CHART
names another copy) is installed as KAI-Scheduler's docs install it
(release and namespace `kai-resource-isolator`), its certgen hook Jobs
played by that directory's certgen-sim.sh. Then every way of moving the
release to this chart, each followed by `helm rollback` to the Go revision:

  helm upgrade (no values), -f <the Go chart's values.yaml>, --reuse-values,
  --reset-then-reuse-values; each twice (the second after the rollout: the
  opt-out entry); helm rollback to revision 1 after each; an upgrade again;
  helm uninstall of the Go release then helm install of this chart; and the
  first two again on a Go release installed client-side (Helm 3's way; the
  rest run server-side, helm 4's default).

What each step promises is asserted on the objects the API server holds and
through admission: a GPU-sharing pod and a plain pod, created with a
server-side dry run (no node runs them) in a tenant namespace and in one an
administrator labelled for opting out.

No kubelet runs here, so this module plays the part of the kubelet and of
the EndpointSlice controller for the webhook Deployment's pods (`Pods`): a
pod of a ReplicaSet is made Ready once a process serves for it, with the
Secret its pod template mounts, and its endpoint is ready while the pod is
Ready, not being deleted and selected by the Service; a pod being deleted is
taken out of the endpoints and then removed. The Deployment controller does
the rest (rollout order, minReadySeconds). Pods of this chart's Deployment
run kai-webhook with their own arguments and environment. The Go chart's
webhook image cannot run here: its pods run a stand-in, kai-webhook with
LIBRARY_DELIVERY=hostPath (the Go chart's hostPath volumes and env; our
binary's layout of them) and the Go Deployment's arguments and env, serving
the certificate of the Secret the Go pod mounts. So on a Go revision what is
proven is what its configuration promises: its MutatingWebhookConfiguration
(entry, path, caBundle), Service and Secret route a GPU-sharing pod to a
webhook that verifies and patches it.

During every upgrade and rollback a prober creates a GPU-sharing pod (dry
run) about every 0.2 s in both namespaces, from before helm starts until
the Deployment's rollout is complete; none may be rejected nor admitted
unpatched ("no window").
"""
import base64
import http.client
import json
import os
import ssl
import threading
import time

import yaml

import harness
import pod_checks
from harness import (CHART, ROOT, apply, chart_env, check, eventually, helm, kjson, kubectl, new_namespace,
                     sa_kubeconfig, start, stop)
from kaitest.net import free_port

GO_CHART_DIR = os.environ.get("KAI_GO_CHART") or os.path.join(os.path.dirname(ROOT), "shared", "go-chart-1.1.0")
GO_CHART = os.path.join(GO_CHART_DIR, "kai-resource-isolator")
GO_VALUES = os.path.join(GO_CHART, "values.yaml")
RELEASE = NS = FULL = "kai-resource-isolator"
TENANT, OPT_OUT = "mig-tenant", "mig-opt-out"
OPT_OUT_LABEL = "kai-resource-isolator.io/allow-opt-out=true"
GO_ENTRY = "mutate.kai-resource-isolator.io"
CERTGEN_SECRET = f"{FULL}-webhook-tls"
OUR_SECRET = f"{FULL}-webhook-cert"
MOUNT = "/usr/local/vgpu"
GO_SELECTORS = {"DaemonSet": "kai-libsync", "Deployment": "kai-webhook"}

S = {}  # the run's state: node IP, API port, PKI, the certgen Secret's uid


# --- the API server, directly (the prober and the fake kubelet poll it) -----------

class Api:
    """Requests as the cluster's admin, one connection per thread."""

    def __init__(self):
        self.ctx = ssl.create_default_context(cafile=os.path.join(S["pki"], "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(S["pki"], "admin.crt"), os.path.join(S["pki"], "admin.key"))
        self.local = threading.local()

    def request(self, method, path, body=None, content_type="application/json"):
        for attempt in (0, 1):
            if not hasattr(self.local, "conn"):
                self.local.conn = http.client.HTTPSConnection("127.0.0.1", S["api_port"], context=self.ctx, timeout=30)
            try:
                self.local.conn.request(method, path, json.dumps(body) if body is not None else None,
                                        {"Content-Type": content_type} if body is not None else {})
                r = self.local.conn.getresponse()
                data = r.read()
                return r.status, (json.loads(data) if data else {})
            except (http.client.HTTPException, OSError):
                del self.local.conn
                if attempt:
                    raise

    def get(self, path):
        status, obj = self.request("GET", path)
        return obj if status == 200 else None


def gpu_pod(name, opt_out=False):
    annotations = {"gpu-memory": "1024"}
    if opt_out:
        annotations["kai-resource-isolator.io/inject"] = "false"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                     "terminationGracePeriodSeconds": 0}}


def plain_pod(name):
    pod = gpu_pod(name)
    pod["metadata"]["annotations"] = {}
    return pod


def dry_run(api, pod, ns):
    """(status, the pod as admission left it, or the API server's message)."""
    status, obj = api.request("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", pod)
    return status, obj if status == 201 else obj.get("message", obj)


def outcome(api, ns, opt_out=False, mount=MOUNT):
    """What admission did to a GPU-sharing pod: csi / hostPath (patched that
    way at `mount`, as pod_checks.py wants it), untouched, or rejected: <why>."""
    status, got = dry_run(api, gpu_pod("probe", opt_out), ns)
    if status != 201:
        return f"rejected ({status}): {str(got)[:300]}"
    delivery = pod_checks.delivery_of(got)
    if delivery is None:
        return "untouched" if not pod_checks.untouched(got) else f"partly patched: {pod_checks.untouched(got)}"
    problems = pod_checks.injected(got, "main", mount, delivery)
    return delivery if not problems else f"{delivery}, wrongly: {problems}"


# --- the kubelet and EndpointSlice controller of the webhook Deployment's pods ---

class Pods(threading.Thread):
    """See the module's docstring. One webhook process per pod-template-hash
    (the ReplicaSet), one EndpointSlice per process, on this host."""

    def __init__(self, api):
        super().__init__(daemon=True)
        self.api = api
        self.halt = threading.Event()
        self.backends = {}  # hash -> {"port", "kind", "proc"}
        self.slices = {}    # hash -> ready as last written
        self.errors = []
        self.lock = threading.Lock()

    def run(self):
        while not self.halt.is_set():
            try:
                self.step()
            except Exception as e:  # reported by the step that waits on it
                self.errors.append(f"{type(e).__name__}: {e}")
            self.halt.wait(0.2)

    def stop(self):
        self.halt.set()
        self.join(30)
        for h in list(self.backends):
            self.retire(h)

    def step(self):
        pods = (self.api.get(f"/api/v1/namespaces/{NS}/pods") or {}).get("items", [])
        svc = self.api.get(f"/api/v1/namespaces/{NS}/services/{FULL}-webhook")
        selector = (svc or {}).get("spec", {}).get("selector") or {}
        serving, leaving = {}, []
        for p in pods:
            meta = p["metadata"]
            if meta.get("deletionTimestamp"):
                leaving.append(meta["name"])
            webhook = [c for c in p["spec"]["containers"] if c["name"] == "webhook"]
            if not webhook or not p["spec"].get("nodeName"):
                continue
            h = meta["labels"].get("pod-template-hash")
            serving.setdefault(h, False)
            if meta.get("deletionTimestamp"):
                continue  # the endpoint controller drops a terminating pod
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
            if not ready:
                if self.ensure_backend(h, p, webhook[0]):
                    self.report_ready(meta["name"])  # its endpoint follows at the next step
                continue
            matches = bool(selector) and all(meta.get("labels", {}).get(k) == v for k, v in selector.items())
            serving[h] = serving[h] or (matches and h in self.backends)
        self.sync_slices(serving)
        # The kubelet confirms that pods being deleted stopped, once their
        # endpoints are gone (above).
        for name in leaving:
            self.api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}",
                             {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        for h in list(self.backends):
            if h not in serving:
                self.retire(h)

    def ensure_backend(self, h, pod, c):
        if h in self.backends:
            return self.backends[h]["proc"].poll() is None
        vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        secret_name = vols.get("tls", {}).get("secret", {}).get("secretName")
        secret = self.api.get(f"/api/v1/namespaces/{NS}/secrets/{secret_name}") if secret_name else None
        if not secret or "tls.crt" not in secret.get("data", {}):
            return False  # the kubelet could not mount it: the pod does not start
        tls = os.path.join(harness.WORK, f"mig-tls-{h}")
        os.makedirs(tls, exist_ok=True)
        for k in ("tls.crt", "tls.key"):
            with open(os.path.join(tls, k), "wb") as f:
                f.write(base64.b64decode(secret["data"][k]))
        port = free_port(S["node_ip"])
        ours = (c.get("command") or [""])[0].endswith("kai-webhook")
        listen = [f"--listen={S['node_ip']}:{port}", f"--tls-cert-file={tls}/tls.crt",
                  f"--tls-private-key-file={tls}/tls.key", "--log-format=plain"]
        # No delay after SIGTERM: `retire` removes the endpoint before it
        # stops the process, the order the delay stands in for on a real
        # node (node_migration.py runs the chart's delay).
        env = {**chart_env(c), "SHUTDOWN_DELAY_SECONDS": "0"}
        if env.get("NODE_GUARD") == "true":
            # The node guard looks pods up with the webhook's own ServiceAccount.
            env["KUBECONFIG"] = sa_kubeconfig(f"{FULL}-webhook", ns=NS)
        if ours:
            args = [a for a in c.get("args", []) if not a.startswith(("--listen=", "--tls-", "--log-format="))] + listen
        else:
            # The Go webhook's stand-in (module docstring).
            args = listen
            env["LIBRARY_DELIVERY"] = "hostPath"
        name = f"mig-webhook-{h}"
        proc = start(name, [os.path.join(harness.TARGET, "kai-webhook"), *args], env=env)
        self.backends[h] = {"port": port, "kind": "ours" if ours else "go stand-in", "proc": proc,
                            "secret": secret_name, "name": name}
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                conn = http.client.HTTPSConnection(S["node_ip"], port, context=ctx, timeout=2)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        kind = self.backends[h]["kind"]
        self.retire(h)
        raise RuntimeError(f"webhook for {h} ({kind}) not serving: {harness.log_tail(name, 10)}")

    def report_ready(self, name):
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # Ready, without a pod IP: the EndpointSlice controller leaves it
        # out, the slices below route to the process on this host.
        status = {"phase": "Running", "startTime": now,
                  "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                                 for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
        self.api.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": status},
                         content_type="application/merge-patch+json")

    def sync_slices(self, serving):
        # Endpoints that became ready first: the EndpointSlice controller
        # adds a pod's on its Ready event, before the Deployment controller
        # (reacting to the same event) has an old pod deleted; this loop
        # sees both at once.
        with self.lock:
            for h, ready in sorted(serving.items(), key=lambda kv: not kv[1]):
                if h not in self.backends or self.slices.get(h) == ready:
                    continue
                apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                       "metadata": {"name": f"{FULL}-webhook-{h}", "namespace": NS,
                                    "labels": {"kubernetes.io/service-name": f"{FULL}-webhook",
                                               "endpointslice.kubernetes.io/managed-by": "kai-test"}},
                       "addressType": "IPv4",
                       "endpoints": [{"addresses": [S["node_ip"]], "conditions": {"ready": ready}}],
                       "ports": [{"name": "https", "port": self.backends[h]["port"], "protocol": "TCP"}]})
                self.slices[h] = ready

    def retire(self, h):
        with self.lock:
            kubectl("delete", "endpointslice", f"{FULL}-webhook-{h}", "-n", NS, "--ignore-not-found", check=False)
            self.slices.pop(h, None)
            b = self.backends.pop(h, None)
        if b:
            stop(b["name"])

    def serving(self):
        """{pod-template-hash: kind} of the processes whose endpoint is ready."""
        with self.lock:
            return {h: self.backends[h]["kind"] for h, ready in self.slices.items() if ready and h in self.backends}


class Prober(threading.Thread):
    """GPU-sharing pods, dry run, in both namespaces, until stopped."""

    def __init__(self, api, namespaces=(TENANT, OPT_OUT), mount=MOUNT):
        super().__init__(daemon=True)
        self.api, self.halt, self.seen = api, threading.Event(), []
        self.namespaces, self.mount = namespaces, mount

    def run(self):
        while not self.halt.is_set():
            for ns in self.namespaces:
                try:
                    self.seen.append((time.monotonic(), ns, outcome(self.api, ns, mount=self.mount)))
                except Exception as e:
                    self.seen.append((time.monotonic(), ns, f"error: {type(e).__name__}: {e}"))
            self.halt.wait(0.2)

    def stop(self):
        self.halt.set()
        self.join(60)
        return self.seen


# --- what the cluster holds ---------------------------------------------------------

NAMESPACED = "configmap,secret,serviceaccount,service,deployment,daemonset,role,rolebinding,poddisruptionbudget," \
             "resourcequota,networkpolicy,job"
CLUSTER_SCOPED = "clusterrole,clusterrolebinding,mutatingwebhookconfiguration,validatingwebhookconfiguration,csidriver"


def manifest_objects():
    text = helm("get", "manifest", RELEASE, "-n", NS).stdout
    return {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(text) if d}


def live_objects():
    """Objects of either release, or of nobody, where they would be."""
    out = set()
    for item in kjson("get", NAMESPACED, "-n", NS)["items"]:
        name = item["metadata"]["name"]
        if (item["kind"], name) in (("ConfigMap", "kube-root-ca.crt"), ("ServiceAccount", "default")) \
                or name.startswith("sh.helm.release.v1."):
            continue
        out.add((item["kind"], name))
    for item in kjson("get", CLUSTER_SCOPED)["items"]:
        meta = item["metadata"]
        if meta["name"].startswith(FULL) or (meta.get("labels") or {}).get("app.kubernetes.io/instance") == RELEASE:
            out.add((item["kind"], meta["name"]))
    return out


def nothing_unowned():
    """Every object is the deployed revision's, but for the certgen Secret
    (the Go release's, made by its hook Job; kept for `helm rollback`)."""
    want = {o for o in manifest_objects() if o[0] not in ("PrometheusRule", "ServiceMonitor")}
    live = live_objects()
    missing = want - live
    extra = live - want - {("Secret", CERTGEN_SECRET)}
    assert not missing and not extra, f"missing {sorted(missing)}, owned by no release {sorted(extra)}"
    return True


def certgen_secret():
    s = kjson("get", "secret", CERTGEN_SECRET, "-n", NS)
    assert s["metadata"]["uid"] == S["certgen_uid"], "the certgen Secret was replaced"
    assert s.get("type", "Opaque") == "Opaque" and sorted(s["data"]) == ["ca", "tls.crt", "tls.key"], (s.get("type"), sorted(s["data"]))
    assert not (s["metadata"].get("annotations") or {}).get("meta.helm.sh/release-name"), "adopted by Helm"
    assert s["data"] == S["certgen_data"], "the certgen Secret's data changed"
    return s


def configuration():
    return kjson("get", "mutatingwebhookconfiguration", f"{FULL}-mutating")


def workload(kind):
    return kjson("get", kind.lower(), f"{FULL}-{'libsync' if kind == 'DaemonSet' else 'webhook'}", "-n", NS)


def rollout_done():
    """The webhook Deployment's newest ReplicaSet has all the pods, available,
    and only its process serves."""
    d = workload("Deployment")
    st, want = d.get("status", {}), d["spec"]["replicas"]
    if not (st.get("observedGeneration") == d["metadata"]["generation"] and st.get("updatedReplicas") == want
            and st.get("replicas") == want and st.get("availableReplicas") == want):
        return False
    revision = d["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
    newest = [r["metadata"]["labels"]["pod-template-hash"] for r in kjson("get", "replicaset", "-n", NS)["items"]
              if r["metadata"]["annotations"].get("deployment.kubernetes.io/revision") == revision
              and any(o["name"] == d["metadata"]["name"] for o in r["metadata"].get("ownerReferences", []))]
    pods = [p for p in kjson("get", "pod", "-n", NS)["items"] if any(c["name"] == "webhook" for c in p["spec"]["containers"])]
    return len(pods) == want and list(S["pods"].serving()) == newest


# --- the steps ------------------------------------------------------------------

def transition(name, *helm_args):
    """helm_args run while the prober admits pods, until the rollout is done:
    no pod rejected, none let through unpatched."""
    prober = Prober(S["api"])
    prober.start()
    try:
        r = helm(*helm_args, check=False)
        assert r.returncode == 0, r.stderr[-1500:]
        eventually(f"{name}: the webhook Deployment rolled out", rollout_done, timeout=120,
                   show=lambda: (S["pods"].serving(), S["pods"].errors[-3:], workload("Deployment").get("status")))
        time.sleep(0.5)  # a few probes against the final state
    finally:
        seen = prober.stop()
    all_patched(name, seen)
    return r


def all_patched(name, seen):
    """The prober's record: every GPU-sharing pod patched (csi or hostPath)."""
    bad = [(round(t - seen[0][0], 2), ns, o) for t, ns, o in seen if o not in ("csi", "hostPath")]
    counts = {}
    for _, _, o in seen:
        counts[o if o in ("csi", "hostPath") else "failed"] = counts.get(o if o in ("csi", "hostPath") else "failed", 0) + 1
    assert len(seen) >= 10, f"only {len(seen)} probes"
    assert not bad, f"{len(bad)} of {len(seen)} GPU-sharing pods not patched during the change: {bad[:5]}"
    print(f"     {name}: {len(seen)} GPU-sharing pods admitted during the change, patched {counts}", flush=True)


def admits(ns, want, opt_out=False):
    got = outcome(S["api"], ns, opt_out)
    assert got == want, f"a GPU-sharing pod{' that opted out' if opt_out else ''} in {ns}: {got}, want {want}"
    status, plain = dry_run(S["api"], plain_pod("plain"), ns)
    assert status == 201 and not pod_checks.untouched(plain), f"a plain pod in {ns}: {status} {str(plain)[:300]}"


def history():
    return json.loads(helm("history", RELEASE, "-n", NS, "-o", "json", "--max", "256").stdout)


def deployed_chart():
    (r,) = [r for r in history() if r["status"] == "deployed"]
    return r["chart"]


def go_revision():
    """The newest revision of the Go chart: what `helm rollback` goes back
    to (helm keeps 10 revisions, so the first one does not last)."""
    return str(max(r["revision"] for r in history() if r["chart"] == "kai-resource-isolator-1.1.0-chart"))


def go_revision_promises():
    """The Go revision: its objects as the Go chart makes them, routing
    GPU-sharing pods to its webhook (the stand-in) with certgen's CA."""
    assert deployed_chart() == "kai-resource-isolator-1.1.0-chart", deployed_chart()
    certgen = certgen_secret()
    mwc = configuration()
    (entry,) = mwc["webhooks"]
    assert entry["name"] == GO_ENTRY and entry["failurePolicy"] == "Ignore", (entry["name"], entry["failurePolicy"])
    assert entry["clientConfig"]["service"] == {"name": f"{FULL}-webhook", "namespace": NS, "path": "/mutate", "port": 443}
    assert entry["clientConfig"].get("caBundle") == certgen["data"]["ca"], "caBundle is not certgen's CA"
    assert "matchConditions" not in entry
    for kind, component in GO_SELECTORS.items():
        w = workload(kind)
        assert w["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert all(c["image"].startswith("docker.io/projecthami/") for c in w["spec"]["template"]["spec"]["containers"])
    vols = workload("Deployment")["spec"]["template"]["spec"]["volumes"]
    assert [v["secret"]["secretName"] for v in vols if "secret" in v] == [CERTGEN_SECRET]
    for ns in (TENANT, OPT_OUT):
        admits(ns, "hostPath")
    eventually("nothing left that neither release owns", nothing_unowned, timeout=60)


def our_revision_promises(policy, full):
    """This chart's revision over the Go release's objects: kept selectors,
    certgen's Secret untouched and its certificate served, the Go entry's
    name and caBundle, our webhook patching (csi)."""
    ours = yaml.safe_load(open(os.path.join(CHART, "Chart.yaml")))["version"]
    assert deployed_chart() == f"kai-resource-isolator-{ours}", deployed_chart()
    certgen = certgen_secret()
    mine = kjson("get", "secret", OUR_SECRET, "-n", NS)
    assert mine["type"] == "kubernetes.io/tls"
    assert mine["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert [mine["data"][k] for k in ("tls.crt", "tls.key", "ca.crt")] == \
        [certgen["data"][k] for k in ("tls.crt", "tls.key", "ca")], "not certgen's certificate"
    mwc = configuration()
    names = [w["name"] for w in mwc["webhooks"]]
    assert names == ([GO_ENTRY, "opt-out.vgpu.lib.kai-resource-isolator.io"] if full else [GO_ENTRY]), names
    first = mwc["webhooks"][0]
    assert first["clientConfig"]["service"]["path"] == "/mutate" and first["clientConfig"]["caBundle"] == certgen["data"]["ca"]
    assert all(w["clientConfig"]["caBundle"] == certgen["data"]["ca"] for w in mwc["webhooks"])
    assert all(w["failurePolicy"] == policy for w in mwc["webhooks"]), [w["failurePolicy"] for w in mwc["webhooks"]]
    assert first.get("matchConditions"), "no matchConditions"
    for kind, component in GO_SELECTORS.items():
        w = workload(kind)
        sel = w["spec"]["selector"]["matchLabels"]
        assert sel["app.kubernetes.io/component"] == component, sel
        assert sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        assert all(c["image"].startswith("ghcr.io/kai-resource-isolator/") for c in w["spec"]["template"]["spec"]["containers"])
    dep = workload("Deployment")
    assert kjson("get", "service", f"{FULL}-webhook", "-n", NS)["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert [v["secret"]["secretName"] for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v] == [OUR_SECRET]
    assert kubectl("get", "configmap", f"{FULL}-ldpreload", "-n", NS, check=False).returncode != 0, "the Go ConfigMap is left"
    admits(TENANT, "csi")
    admits(OPT_OUT, "csi")
    # Transitional: the Go pods served /mutate only, so every namespace went
    # there and an opted-out pod was capped; with the opt-out entry it is not.
    admits(OPT_OUT, "untouched" if full else "csi", opt_out=True)
    admits(TENANT, "csi", opt_out=True)
    eventually("nothing left that neither release owns", nothing_unowned, timeout=60)


def upgrade_cycle(form, args, policy_first, policy_second):
    """One form of upgrade, twice (the second after the rollout adds the
    opt-out entry), then helm rollback to the Go revision."""
    def first():
        transition(f"helm upgrade {form}", "upgrade", RELEASE, CHART, "-n", NS, *args)
        our_revision_promises(policy_first, full=False)
    check(f"migration: helm upgrade {form} from the Go release: no pod refused or let through uncapped while it rolls out; "
          "Go selectors kept, certgen's Secret untouched and its certificate served, the Go entry's caBundle kept, pods patched (csi)", first)

    def second():
        transition(f"helm upgrade {form} (again)", "upgrade", RELEASE, CHART, "-n", NS, *args)
        our_revision_promises(policy_second, full=True)
    check(f"migration: helm upgrade {form} again after the rollout: the opt-out entry, opt-outs honoured where allowed, still no gap", second)

    def back():
        transition(f"helm rollback after {form}", "rollback", RELEASE, go_revision(), "-n", NS)
        go_revision_promises()
    check(f"migration: helm rollback to the Go revision (after {form}): no gap; the Go webhook's Secret and caBundle are there "
          "and route pods to it (stand-in: patched hostPath)", back)


def install_go(*extra):
    # helm waits for the hook Jobs (certgen-sim.sh completes them).
    r = helm("install", RELEASE, GO_CHART, "-n", NS, "--create-namespace", *extra, check=False)
    assert r.returncode == 0, r.stderr[-1500:]
    s = kjson("get", "secret", CERTGEN_SECRET, "-n", NS)
    S["certgen_uid"], S["certgen_data"] = s["metadata"]["uid"], s["data"]
    eventually("the Go webhook's pod serving (stand-in)", rollout_done, timeout=120,
               show=lambda: (S["pods"].serving(), S["pods"].errors[-3:]))
    go_revision_promises()


def uninstall_all():
    helm("uninstall", RELEASE, "-n", NS, "--wait", check=False)
    kubectl("delete", "pod", "--all", "-n", NS, "--force", "--grace-period=0", "--wait=false", check=False)


def run():
    env = harness.ENV
    S.update(node_ip=env["NODE_IP"], api_port=int(env["API_PORT"]), pki=harness.PKI)
    if not os.path.isfile(os.path.join(GO_CHART, "Chart.yaml")):
        raise RuntimeError(f"the Go chart is not at {GO_CHART} (../shared/go-chart-1.1.0 beside the checkout, or KAI_GO_CHART)")
    S["api"] = Api()
    new_namespace(TENANT)
    new_namespace(OPT_OUT, OPT_OUT_LABEL)
    kubectl("create", "namespace", NS, check=False)
    sim_env = {**os.environ, "KUBECONFIG": harness.ADMIN, "KUBECTL": os.path.join(harness.BIN, "kubectl"),
               "PKI_DIR": os.path.join(harness.WORK, "certgen")}
    start("certgen-sim", ["bash", os.path.join(GO_CHART_DIR, "certgen-sim.sh")], env=sim_env)
    S["pods"] = Pods(S["api"])
    S["pods"].start()
    try:
        # --- server-side apply (helm 4's default) ---
        check("migration: the Go chart installed (certgen Jobs played by certgen-sim.sh): its webhook configuration, "
              "Secret and Service route GPU-sharing pods to its webhook (stand-in: patched hostPath)", lambda: install_go())
        upgrade_cycle("(no values)", [], "Fail", "Fail")
        upgrade_cycle("-f <Go values.yaml>", ["-f", GO_VALUES], "Ignore", "Ignore")
        # The reused values are the Go chart's defaults (failurePolicy
        # Ignore), and stay so: helm stores them as the new revision's
        # chart defaults, which the next --reuse-values reuses.
        upgrade_cycle("--reuse-values", ["--reuse-values"], "Ignore", "Ignore")
        upgrade_cycle("--reset-then-reuse-values", ["--reset-then-reuse-values"], "Fail", "Fail")

        def again():
            transition("helm upgrade (after the rollbacks)", "upgrade", RELEASE, CHART, "-n", NS)
            our_revision_promises("Fail", full=False)
            transition("helm upgrade (after the rollbacks, again)", "upgrade", RELEASE, CHART, "-n", NS)
            our_revision_promises("Fail", full=True)
        check("migration: upgraded again after four rollbacks: the same, no gap", again)

        def uninstall_then_install():
            transition("helm rollback (before uninstalling)", "rollback", RELEASE, go_revision(), "-n", NS)
            r = helm("uninstall", RELEASE, "-n", NS, "--wait", check=False)
            assert r.returncode == 0, r.stderr
            eventually("the Go release's objects gone, certgen's Secret left (the Go chart leaves it)",
                       lambda: live_objects() == {("Secret", CERTGEN_SECRET)}, timeout=90, show=live_objects)
            r = helm("install", RELEASE, CHART, "-n", NS, check=False)
            assert r.returncode == 0, r.stderr[-1500:]
            eventually("this chart's webhook serving", rollout_done, timeout=120, show=lambda: S["pods"].errors[-3:])
            certgen = certgen_secret()
            mwc = configuration()
            assert [w["name"] for w in mwc["webhooks"]] == ["vgpu.lib.kai-resource-isolator.io", "opt-out.vgpu.lib.kai-resource-isolator.io"]
            assert all(w["clientConfig"]["caBundle"] == certgen["data"]["ca"] for w in mwc["webhooks"])
            assert workload("Deployment")["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
            for ns in (TENANT, OPT_OUT):
                admits(ns, "csi")
            admits(OPT_OUT, "untouched", opt_out=True)
            eventually("nothing left that neither release owns", nothing_unowned, timeout=60)
            r = helm("uninstall", RELEASE, "-n", NS, "--wait", check=False)
            assert r.returncode == 0, r.stderr
            eventually("only certgen's Secret left", lambda: live_objects() == {("Secret", CERTGEN_SECRET)},
                       timeout=90, show=live_objects)
        check("migration: helm uninstall of the Go release, then helm install of this chart: installs beside the certgen "
              "Secret it leaves (this chart's own Secret, our selectors), patches pods; uninstalled, only that Secret is left", uninstall_then_install)
        # A clean start, whatever the steps above left.
        uninstall_all()
        kubectl("delete", "secret", CERTGEN_SECRET, "-n", NS, "--ignore-not-found")
        eventually("nothing of either release left", lambda: live_objects() == set(), timeout=90, show=live_objects)

        # --- client-side apply (a Go release installed with Helm 3) ---
        check("migration: the Go chart installed client-side (as Helm 3 did)", lambda: install_go("--server-side=false"))

        def client_side():
            meta = helm("get", "metadata", RELEASE, "-n", NS, "-o", "json").stdout
            assert json.loads(meta)["applyMethod"] == "csa", meta
        check("migration: the client-side Go release is recorded as such (upgrades follow it: three-way merge)", client_side)
        upgrade_cycle("(no values, client-side)", [], "Fail", "Fail")
        upgrade_cycle("--reuse-values (client-side)", ["--reuse-values"], "Ignore", "Ignore")
        check("migration: helm uninstall leaves only certgen's Secret", lambda: (
            helm("uninstall", RELEASE, "-n", NS, "--wait"),
            eventually("only certgen's Secret left", lambda: live_objects() == {("Secret", CERTGEN_SECRET)},
                       timeout=90, show=live_objects)))
        kubectl("delete", "secret", CERTGEN_SECRET, "-n", NS, "--ignore-not-found")

        # --- done with the Go chart: its Secret deleted (server-side) ---
        check("migration: the Go chart installed again (server-side)", lambda: install_go())

        def done_with_go():
            transition("helm upgrade (to stay)", "upgrade", RELEASE, CHART, "-n", NS)
            transition("helm upgrade (to stay, again)", "upgrade", RELEASE, CHART, "-n", NS)
            our_revision_promises("Fail", full=True)
            ca = S["certgen_data"]["ca"]
            kubectl("delete", "secret", CERTGEN_SECRET, "-n", NS)
            # certgen's field manager owns the Go entry's caBundle: a new
            # value there would be an apply conflict; the renamed entries are not.
            transition("helm upgrade (certgen's Secret deleted)", "upgrade", RELEASE, CHART, "-n", NS)
            mwc = configuration()
            assert [w["name"] for w in mwc["webhooks"]] == ["vgpu.lib.kai-resource-isolator.io",
                                                            "opt-out.vgpu.lib.kai-resource-isolator.io"], mwc["webhooks"]
            assert all(w["clientConfig"]["caBundle"] == ca for w in mwc["webhooks"]), "the CA changed"
            assert kjson("get", "secret", OUR_SECRET, "-n", NS)["data"]["ca.crt"] == ca
            managers = {m["manager"] for m in kjson("get", "mutatingwebhookconfiguration", f"{FULL}-mutating",
                                                    "--show-managed-fields")["metadata"]["managedFields"]}
            assert "kube-webhook-certgen" not in managers, managers
            admits(TENANT, "csi")
            admits(OPT_OUT, "untouched", opt_out=True)
            eventually("nothing left that neither release owns", nothing_unowned, timeout=60)
            r = helm("uninstall", RELEASE, "-n", NS, "--wait", check=False)
            assert r.returncode == 0, r.stderr
            eventually("nothing left", lambda: live_objects() == set(), timeout=90, show=live_objects)
        check("migration: done with the Go chart (its certgen Secret deleted), helm upgrade: this chart's entry names and "
              "caBundle (same CA, no apply conflict with certgen's field manager), no gap; uninstalled, nothing left", done_with_go)
    finally:
        S["pods"].stop()
        stop("certgen-sim")
        uninstall_all()
        for ns in (TENANT, OPT_OUT, NS):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
