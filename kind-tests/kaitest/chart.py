"""helm and the chart: the binary (`$HELM`, else the one .ci/run caches
under ~/.cache/kai-tools) and `helm template` of the chart as YAML objects."""
import os
import subprocess

import yaml

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
    """The objects `helm template` renders (empty documents dropped); asserts it succeeds."""
    r = helm("template", release, chart, "-n", ns, *args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]
