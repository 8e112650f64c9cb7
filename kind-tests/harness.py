"""What node.py (and node_migration.py) share: the output lines, and
module-level access to one `kaitest.kube.Cluster` (kubectl/helm against the
test cluster, the chart's components read back from the API server) and its
`kaitest.kube.Processes` (the processes the suite starts).

The suite calls `setup` once, with its cluster and work directory, before
anything else here; it reads the count of passed lines as `harness.passed`
(`failed` and `procs` are shared objects: importing them is enough).
test_apiserver.py uses kaitest.kube directly, through its fixtures.
"""
import os
import subprocess

from kaitest import kube
from kaitest.kube import CHART, FULL, NS, RELEASE, ROOT, TENANT, chart_env, http_get, load_env, rewrite, run  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))

passed, failed = 0, []
procs = {}

# Set by setup().
TARGET = HELM = BIN = ADMIN = PKI = WORK = None
ENV = {}
_cluster = _processes = None


def setup(*, target, helm, env, admin, pki, work, log_tail_lines=40, eventually_errors=()):
    """The suite's cluster (`env`: its env file(s), `admin`: the admin
    kubeconfig, `pki`: its CA), the built binaries (`target`), helm and the
    directory for logs and files (`work`). `eventually_errors` adds to the
    exception types `eventually` counts as "not yet"."""
    global TARGET, HELM, BIN, ADMIN, PKI, WORK, ENV, _cluster, _processes
    TARGET, HELM, ENV, ADMIN, PKI, WORK = target, helm, env, admin, pki, work
    BIN = env["BIN"]
    _cluster = kube.Cluster(env=env, admin=admin, pki=pki, work=work, helm_binary=helm, errors=eventually_errors)
    _processes = kube.Processes(work, tail_lines=log_tail_lines, procs=procs)


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
    return _cluster.eventually(what, fn, timeout, show)


# --- the cluster (kaitest.kube.Cluster) ------------------------------------------------

def kubectl(*args, **kw):
    return _cluster.kubectl(*args, **kw)


def kjson(*args, **kw):
    return _cluster.kjson(*args, **kw)


def apply(obj, *args):
    return _cluster.apply(obj, *args)


def new_namespace(name, *labels, exist_ok=True):
    return _cluster.new_namespace(name, *labels, exist_ok=exist_ok)


def create(obj, ns=TENANT, dry_run=False, check=True):
    return _cluster.create(obj, ns=ns, dry_run=dry_run, check=check)


def helm(*args, check=True):
    return _cluster.helm(*args, check=check)


def container_of(kind, name, container):
    return _cluster.container_of(kind, name, container)


def grpc_tls_files(side):
    return _cluster.grpc_tls_files(side)


def write_kubeconfig(path, name, user, namespace):
    return _cluster.write_kubeconfig(path, name, user, namespace)


def sa_kubeconfig(sa, ns=NS, pod=None):
    return _cluster.sa_kubeconfig(sa, ns=ns, pod=pod)


def prometheus_token():
    return _cluster.prometheus_token()


def series(url, name):
    return _cluster.series(url, name)


# --- processes of ours (kaitest.kube.Processes) --------------------------------------

def start(name, argv, env=None):
    """A process of ours, logged to WORK/name.log."""
    return _processes.start(name, argv, env=env)


def stop(name):
    _processes.stop(name)


def stop_all():
    _processes.stop_all()


def log_tail(name, n=None):
    return _processes.log_tail(name, n)


def built_library(name, crate, exc=SystemExit, hint=""):
    """TARGET's (or its deps/') `name`, built by `crate`; else `exc`."""
    for d in (TARGET, os.path.join(TARGET, "deps")):
        lib = os.path.join(d, name)
        if os.path.isfile(lib):
            return lib
    raise exc(f"{name} not in {TARGET} or its deps/ (cargo build -p {crate}{hint})")
