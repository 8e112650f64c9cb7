"""helm and the chart: the binary (`$HELM`, else the one .ci/run caches
under ~/.cache/kai-tools) and `helm template` of the chart as YAML objects."""
import functools
import hashlib
import os
import subprocess

import yaml

# libyaml's loader where PyYAML has it (ten times faster on a rendered chart;
# the same safe subset), else the pure-Python one.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "chart", "kai-resource-isolator")
RELEASE, NS = "kai", "kai-system"


def helm_binary():
    """`$HELM`, else ~/.cache/kai-tools/helm/helm (.ci/run installs it), else `helm` on PATH."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    cached = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kai-tools", "helm", "helm")
    return cached if os.access(cached, os.X_OK) else "helm"


def helm(*args):
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True)


def template(*args, release=RELEASE, ns=NS, chart=CHART):
    """The objects `helm template` renders (empty documents dropped), fresh
    objects on every call; asserts it succeeds."""
    files = tuple(_digest(a) for a in args)
    return [d for d in yaml.load_all(_rendered(args, files, release, ns, chart), Loader=LOADER) if d]


@functools.lru_cache(maxsize=128)
def _rendered(args, files, release, ns, chart):
    """`helm template`'s output for `args`: one helm run per distinct call
    (the chart suite renders the defaults alone some thirty times). `files`
    keys the contents of the files `args` name, so a values file rewritten
    between two calls is rendered again; a failure is not kept."""
    del files  # only the cache's key
    r = helm("template", release, chart, "-n", ns, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _digest(arg):
    """The digest of the file `arg` names (or `--set-file`'s `key=path`), else None."""
    path = arg.split("=", 1)[1] if "=" in arg and not os.path.isfile(arg) else arg
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
