"""What node.py and apiserver.py share: the output lines, the processes they
start, kubectl/helm against the test cluster and the chart's components read
back from the API server.

Each suite calls `setup` once, with its cluster and work directory, before
anything else here; it reads the count of passed lines as `harness.passed`
(`failed` and `procs` are shared objects: importing them is enough).
"""
import base64
import http.client
import json
import os
import re
import signal
import subprocess

from kaitest.poll import poll

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHART = os.path.join(ROOT, "chart", "kai-resource-isolator")
RELEASE, NS = "kai", "kai-system"
FULL = f"{RELEASE}-kai-resource-isolator"
TENANT = "team-a"

passed, failed = 0, []
procs = {}

# Set by setup().
TARGET = HELM = BIN = ADMIN = PKI = WORK = None
ENV = {}
LOG_TAIL_LINES = 40
EVENTUALLY_ERRORS = (subprocess.CalledProcessError, AssertionError, KeyError, OSError, ValueError)


def setup(*, target, helm, env, admin, pki, work, log_tail_lines=40, eventually_errors=()):
    """The suite's cluster (`env`: its env file(s), `admin`: the admin
    kubeconfig, `pki`: its CA), the built binaries (`target`), helm and the
    directory for logs and files (`work`). `eventually_errors` adds to the
    exception types `eventually` counts as "not yet"."""
    global TARGET, HELM, BIN, ADMIN, PKI, WORK, ENV, LOG_TAIL_LINES, EVENTUALLY_ERRORS
    TARGET, HELM, ENV, ADMIN, PKI, WORK = target, helm, env, admin, pki, work
    BIN = env["BIN"]
    LOG_TAIL_LINES = log_tail_lines
    EVENTUALLY_ERRORS = EVENTUALLY_ERRORS + tuple(eventually_errors)


def load_env(path):
    env = {}
    for line in open(path):
        line = line.strip().removeprefix("export ")
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = v.strip('"')
    return env


# --- the output: one line per assertion ----------------------------------------

def ok(name):
    global passed
    passed += 1
    print(f"ok   {name}", flush=True)


def bad(name, why):
    failed.append(name)
    print(f"FAIL {name}: {why}", flush=True)


def check(name, fn):
    try:
        fn()
        ok(name)
        return True
    except AssertionError as e:
        bad(name, e)
    except subprocess.CalledProcessError as e:
        bad(name, f"{' '.join(map(str, e.cmd[:6]))}…: rc {e.returncode}: {(e.stderr or '')[-600:]}")
    except Exception as e:  # a broken step fails its line, not the suite
        bad(name, f"{type(e).__name__}: {e}")
    return False


def eventually(what, fn, timeout=90, show=None):
    """Polls fn until it returns something truthy (kaitest/poll.py): waits on an
    event, never on time alone."""
    return poll(what, fn, timeout, EVENTUALLY_ERRORS, show=show)


# --- commands ---------------------------------------------------------------------

def run(*args, check=True, input=None, env=None, timeout=120):
    return subprocess.run(args, check=check, input=input, env=env, capture_output=True, text=True, timeout=timeout)


def kubectl(*args, kubeconfig=None, check=True, input=None, timeout=120):
    return run(os.path.join(BIN, "kubectl"), "--kubeconfig", kubeconfig or ADMIN, *args, check=check, input=input,
               timeout=timeout)


def kjson(*args, **kw):
    return json.loads(kubectl(*args, "-o", "json", **kw).stdout)


def apply(obj, *args):
    return kubectl("apply", "-f", "-", *args, input=json.dumps(obj))


def new_namespace(name, *labels, exist_ok=True):
    """Namespace `name` with `labels` (`key=value`), once its default
    ServiceAccount exists: until then the ServiceAccount admission plugin
    refuses every pod (403)."""
    kubectl("create", "namespace", name, check=not exist_ok)
    if labels:
        kubectl("label", "namespace", name, *labels, "--overwrite")
    eventually(f"the default ServiceAccount of {name}",
               lambda: kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
               timeout=60)


def create(obj, ns=TENANT, dry_run=False, check=True):
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["namespace"] = ns
    args = ["create", "-f", "-", "-o", "json"] + (["--dry-run=server"] if dry_run else [])
    r = kubectl(*args, input=json.dumps(obj), check=check)
    return json.loads(r.stdout) if r.returncode == 0 else r


def helm(*args, check=True):
    return run(HELM, "--kubeconfig", ADMIN, *args, check=check, timeout=300)


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


# --- processes of ours --------------------------------------------------------------

def start(name, argv, env=None):
    """A process of ours, logged to WORK/name.log."""
    log = open(os.path.join(WORK, f"{name}.log"), "ab")
    procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return procs[name]


def stop(name):
    p = procs.pop(name, None)
    if p and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_all():
    for name in list(procs):
        stop(name)


def log_tail(name, n=None):
    try:
        return "\n".join(open(os.path.join(WORK, f"{name}.log"), errors="replace").read()
                         .splitlines()[-(n or LOG_TAIL_LINES):])
    except OSError:
        return ""


def built_library(name, crate, exc=SystemExit, hint=""):
    """TARGET's (or its deps/') `name`, built by `crate`; else `exc`."""
    for d in (TARGET, os.path.join(TARGET, "deps")):
        lib = os.path.join(d, name)
        if os.path.isfile(lib):
            return lib
    raise exc(f"{name} not in {TARGET} or its deps/ (cargo build -p {crate}{hint})")


# --- the chart's components as processes --------------------------------------------

def container_of(kind, name, container):
    obj = kjson("get", kind, name, "-n", NS)
    spec = obj["spec"]["template"]["spec"]
    (c,) = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == container]
    return c


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


def grpc_tls_files(side):
    """The chart's gRPC TLS Secret of `side` ("node" or "aggregator") as the
    kubelet would mount it; None when the release has none."""
    r = kubectl("get", "secret", f"{FULL}-{side}-grpc-tls", "-n", NS, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    d = os.path.join(WORK, f"grpc-tls-{side}")
    os.makedirs(d, exist_ok=True)
    for k, v in json.loads(r.stdout)["data"].items():
        with open(os.path.join(d, k), "wb") as f:
            f.write(base64.b64decode(v))
    return d


# --- tokens: each component as its own ServiceAccount ------------------------------

def write_kubeconfig(path, name, user, namespace):
    """A kubeconfig at `path` for this cluster: user `name` whose
    credentials are `user` (a YAML flow mapping: a token, an exec plugin)."""
    with open(path, "w") as f:
        f.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{ENV['API_PORT']}", certificate-authority: "{PKI}/ca.crt"}}}}]
users: [{{name: {name}, user: {user}}}]
contexts: [{{name: c, context: {{cluster: c, user: {name}, namespace: {namespace}}}}}]
current-context: c
""")
    return path


def sa_kubeconfig(sa, ns=NS, pod=None):
    """A kubeconfig holding a TokenRequest token of the ServiceAccount: bound
    to `pod` (a pod object) as the kubelet binds a pod's projected token, so
    the API server knows its node; else bound to nothing else."""
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
             "--bound-object-uid", pod["metadata"]["uid"]] if pod else []
    token = kubectl("create", "token", sa, "-n", ns, "--duration=2h", *bound).stdout.strip()
    path = os.path.join(WORK, f"{sa}{'-' + pod['metadata']['name'] if pod else ''}.kubeconfig")
    return write_kubeconfig(path, sa, f'{{token: "{token}"}}', ns)


# --- scraping as Prometheus does ------------------------------------------------

_PROMETHEUS = {}


def prometheus_token():
    """A token of Prometheus' ServiceAccount, bound as kube-prometheus binds
    it (its ClusterRole grants get on the non-resource URL /metrics): what
    a ServiceMonitor's bearerTokenFile sends."""
    if "token" not in _PROMETHEUS:
        kubectl("create", "namespace", "monitoring", check=False)
        kubectl("create", "serviceaccount", "prometheus-k8s", "-n", "monitoring", check=False)
        apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "prometheus-k8s"},
               "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
                         {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]})
        kubectl("create", "clusterrolebinding", "prometheus-k8s", "--clusterrole=prometheus-k8s",
                "--serviceaccount=monitoring:prometheus-k8s", check=False)
        _PROMETHEUS["token"] = kubectl("create", "token", "prometheus-k8s", "-n", "monitoring",
                                       "--duration=2h").stdout.strip()
    return _PROMETHEUS["token"]


def series(url, name):
    status, text = http_get(url, token=prometheus_token())
    assert status == 200, f"{url}: {status} {text[:200]}"
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            out[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out
