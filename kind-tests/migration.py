"""Moving a Go chart release to this chart in place, and back (issue 43).

What the migration tests share: test_apiserver.py's (`-k migration`, on a
real API server alone) and test_node.py's (`-m node -k migration`, on
node.sh's node). The
steps and the stand-in kubelet of the API-server-only run (`Pods`) are
test_apiserver.py's; this module has the prober and what it asserts with.

On the API server alone: The Go chart (Project-HAMi/KAI-resource-isolator 1.1.0-chart,
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
import http.client
import json
import os
import ssl
import threading
import time

import pod_checks
from kaitest.kube import ROOT

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

# --- the API server, directly (the prober and the fake kubelet poll it) -----------

class Api:
    """Requests as the cluster's admin (the cluster's `pki` directory, its
    API server on 127.0.0.1:`api_port`), one connection per thread."""

    def __init__(self, pki, api_port):
        self.api_port = int(api_port)
        self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
        self.local = threading.local()

    def request(self, method, path, body=None, content_type="application/json"):
        for attempt in (0, 1):
            if not hasattr(self.local, "conn"):
                self.local.conn = http.client.HTTPSConnection("127.0.0.1", self.api_port, context=self.ctx, timeout=30)
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


# --- what the probes and helm say ----------------------------------------------------

def all_patched(name, seen):
    """The prober's record: every GPU-sharing pod patched (csi or hostPath)."""
    bad = [(round(t - seen[0][0], 2), ns, o) for t, ns, o in seen if o not in ("csi", "hostPath")]
    counts = {}
    for _, _, o in seen:
        counts[o if o in ("csi", "hostPath") else "failed"] = counts.get(o if o in ("csi", "hostPath") else "failed", 0) + 1
    assert len(seen) >= 10, f"only {len(seen)} probes"
    assert not bad, f"{len(bad)} of {len(seen)} GPU-sharing pods not patched during the change: {bad[:5]}"
    print(f"     {name}: {len(seen)} GPU-sharing pods admitted during the change, patched {counts}", flush=True)


def history(helm):
    return json.loads(helm("history", RELEASE, "-n", NS, "-o", "json", "--max", "256").stdout)


def go_revision(helm):
    """The newest revision of the Go chart: what `helm rollback` goes back
    to (helm keeps 10 revisions, so the first one does not last)."""
    return str(max(r["revision"] for r in history(helm) if r["chart"] == "kai-resource-isolator-1.1.0-chart"))
