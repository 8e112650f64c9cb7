"""A cluster.sh cluster as the suites drive it: kubectl and helm against it,
objects created and read back, ServiceAccount kubeconfigs, the chart's
components read back from the API server, Prometheus' token and a series
reader; and the processes a suite starts on this host (`Processes`).

One `Cluster` per cluster, made by the suite (test_apiserver.py's and
test_node.py's fixtures): nothing here is module state.
"""
import base64
import http.client
import json
import os
import re
import signal
import subprocess

from kaitest.poll import poll

KIND_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(KIND_TESTS)
CHART = os.path.join(ROOT, "chart", "kai-resource-isolator")
RELEASE, NS = "kai", "kai-system"
FULL = f"{RELEASE}-kai-resource-isolator"
TENANT = "team-a"
EVENTUALLY_ERRORS = (subprocess.CalledProcessError, AssertionError, KeyError, OSError, ValueError)


def load_env(path):
    """cluster.sh's env file (`export K=V` lines) as a dict."""
    env = {}
    for line in open(path):
        line = line.strip().removeprefix("export ")
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = v.strip('"')
    return env


def run(*args, check=True, input=None, env=None, timeout=120):
    return subprocess.run(args, check=check, input=input, env=env, capture_output=True, text=True, timeout=timeout)


def eventually(what, fn, timeout=90, show=None, errors=EVENTUALLY_ERRORS):
    """Polls fn until it returns something truthy (kaitest.poll): waits on an
    event, never on time alone."""
    return poll(what, fn, timeout, errors, show=show)


def http_get(url, timeout=5, token=None, header="Authorization", stream=False):
    """GET with a bearer token in `header`; with `stream`, only the status
    (an event stream never ends)."""
    host, _, rest = url.removeprefix("http://").partition("/")
    h, p = host.rsplit(":", 1)
    c = http.client.HTTPConnection(h, int(p), timeout=timeout)
    c.request("GET", "/" + rest, headers={header: f"Bearer {token}"} if token else {})
    r = c.getresponse()
    if stream:
        c.close()
        return r.status, ""
    return r.status, r.read().decode()


def chart_env(c, **fields):
    """The container's env as the kubelet would give it: literal values and
    the downward-API fields the test supplies."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1"}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["name"] in fields:
            env[e["name"]] = fields[e["name"]]
    return env


def rewrite(args, subst):
    out = []
    for a in args:
        for pat, rep in subst:
            a = re.sub(pat, rep, a)
        out.append(a)
    return out


class Processes:
    """Processes of ours, each logged to `work`/NAME.log; `procs` maps names
    to the running ones."""

    def __init__(self, work, tail_lines=40, procs=None):
        self.work, self.tail_lines = work, tail_lines
        self.procs = {} if procs is None else procs

    def start(self, name, argv, env=None):
        with open(os.path.join(self.work, f"{name}.log"), "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                start_new_session=True)
        return self.procs[name]

    def stop(self, name):
        p = self.procs.pop(name, None)
        if p and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self):
        for name in list(self.procs):
            self.stop(name)

    def running(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def log_tail(self, name, n=None):
        try:
            return "\n".join(open(os.path.join(self.work, f"{name}.log"), errors="replace").read()
                             .splitlines()[-(n or self.tail_lines):])
        except OSError:
            return ""


class Cluster:
    """kubectl, helm and the chart's objects on one cluster: `env` its
    cluster.sh env (BIN, API_PORT, NODE_IP, ...), `admin` the admin
    kubeconfig, `pki` its CA directory, `work` where files go, `helm_binary`
    helm; `dir` the cluster.sh directory (for its restart commands)."""

    def __init__(self, *, env, admin, pki, work, helm_binary, dir=None, errors=()):
        self.env, self.admin, self.pki, self.work, self.helm_binary, self.dir = env, admin, pki, work, helm_binary, dir
        self.bin = env["BIN"]
        self.errors = EVENTUALLY_ERRORS + tuple(errors)
        self._prometheus_token = None

    def eventually(self, what, fn, timeout=90, show=None):
        return eventually(what, fn, timeout, show, self.errors)

    def cluster_sh(self, *args):
        """cluster.sh ARGS DIR (restart-apiserver, stop-etcd, ...)."""
        return run("bash", os.path.join(KIND_TESTS, "cluster.sh"), *args, self.dir, timeout=300)

    def kubectl(self, *args, kubeconfig=None, check=True, input=None, timeout=120):
        return run(os.path.join(self.bin, "kubectl"), "--kubeconfig", kubeconfig or self.admin, *args, check=check,
                   input=input, timeout=timeout)

    def kjson(self, *args, **kw):
        return json.loads(self.kubectl(*args, "-o", "json", **kw).stdout)

    def apply(self, obj, *args):
        return self.kubectl("apply", "-f", "-", *args, input=json.dumps(obj))

    def new_namespace(self, name, *labels, exist_ok=True):
        """Namespace `name` with `labels` (`key=value`), once its default
        ServiceAccount exists: until then the ServiceAccount admission plugin
        refuses every pod (403)."""
        self.kubectl("create", "namespace", name, check=not exist_ok)
        if labels:
            self.kubectl("label", "namespace", name, *labels, "--overwrite")
        self.eventually(f"the default ServiceAccount of {name}",
                        lambda: self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
                        timeout=60)

    def create(self, obj, ns=TENANT, dry_run=False, check=True):
        """The object as the API server stored it (or returned it, dry run);
        with check=False, the failed kubectl run when it was refused."""
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["namespace"] = ns
        args = ["create", "-f", "-", "-o", "json"] + (["--dry-run=server"] if dry_run else [])
        r = self.kubectl(*args, input=json.dumps(obj), check=check)
        return json.loads(r.stdout) if r.returncode == 0 else r

    def helm(self, *args, check=True):
        return run(self.helm_binary, "--kubeconfig", self.admin, *args, check=check, timeout=300)

    def write_kubeconfig(self, path, name, user, namespace):
        """A kubeconfig at `path` for this cluster: user `name` whose
        credentials are `user` (a YAML flow mapping: a token, an exec plugin)."""
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{self.env['API_PORT']}", certificate-authority: "{self.pki}/ca.crt"}}}}]
users: [{{name: {name}, user: {user}}}]
contexts: [{{name: c, context: {{cluster: c, user: {name}, namespace: {namespace}}}}}]
current-context: c
""")
        return path

    def sa_kubeconfig(self, sa, ns=NS, pod=None):
        """A kubeconfig holding a TokenRequest token of the ServiceAccount: bound
        to `pod` (a pod object) as the kubelet binds a pod's projected token, so
        the API server knows its node; else bound to nothing else."""
        bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
                 "--bound-object-uid", pod["metadata"]["uid"]] if pod else []
        token = self.kubectl("create", "token", sa, "-n", ns, "--duration=2h", *bound).stdout.strip()
        path = os.path.join(self.work, f"{sa}{'-' + pod['metadata']['name'] if pod else ''}.kubeconfig")
        return self.write_kubeconfig(path, sa, f'{{token: "{token}"}}', ns)

    def container_of(self, kind, name, container, ns=NS):
        obj = self.kjson("get", kind, name, "-n", ns)
        spec = obj["spec"]["template"]["spec"]
        (c,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == container]
        return c

    def grpc_tls_files(self, side, full=FULL, ns=NS):
        """The chart's gRPC TLS Secret of `side` ("node" or "aggregator") as the
        kubelet would mount it; None when the release has none."""
        r = self.kubectl("get", "secret", f"{full}-{side}-grpc-tls", "-n", ns, "-o", "json", check=False)
        if r.returncode != 0:
            return None
        d = os.path.join(self.work, f"grpc-tls-{side}")
        os.makedirs(d, exist_ok=True)
        for k, v in json.loads(r.stdout)["data"].items():
            with open(os.path.join(d, k), "wb") as f:
                f.write(base64.b64decode(v))
        return d

    def prometheus_token(self):
        """A token of Prometheus' ServiceAccount, bound as kube-prometheus binds
        it (its ClusterRole grants get on the non-resource URL /metrics): what
        a ServiceMonitor's bearerTokenFile sends."""
        if self._prometheus_token is None:
            self.kubectl("create", "namespace", "monitoring", check=False)
            self.kubectl("create", "serviceaccount", "prometheus-k8s", "-n", "monitoring", check=False)
            self.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": "prometheus-k8s"},
                        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
                                  {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]})
            self.kubectl("create", "clusterrolebinding", "prometheus-k8s", "--clusterrole=prometheus-k8s",
                         "--serviceaccount=monitoring:prometheus-k8s", check=False)
            self._prometheus_token = self.kubectl("create", "token", "prometheus-k8s", "-n", "monitoring",
                                                  "--duration=2h").stdout.strip()
        return self._prometheus_token

    def series(self, url, name):
        """Series `name` of the /metrics page at `url`, scraped as Prometheus
        does: {series without value: value}."""
        status, text = http_get(url, token=self.prometheus_token())
        assert status == 200, f"{url}: {status} {text[:200]}"
        out = {}
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
        return out
