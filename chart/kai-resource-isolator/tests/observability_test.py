"""The chart's Grafana dashboard ConfigMap and PrometheusRule: rendered only
when asked (dashboard) or when the cluster serves the CRD (rule), carrying
files/dashboard.json and files/alerts.yaml unchanged; every alert has a
summary, a description and a runbook anchor that docs/isolation.md has.

Usage: pytest -c kind-tests/pytest.ini chart/kai-resource-isolator/tests/observability_test.py [-k WORDS]
(helm: $HELM, else the one .ci/run caches; see kind-tests/kaitest/chart.py)
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest
import yaml

from kaitest.chart import helm_binary, template as render
from kaitest.checks import generate

pytestmark = pytest.mark.chart

CHART = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(CHART, "..", "..", "docs", "isolation.md")
RULE_API = "monitoring.coreos.com/v1/PrometheusRule"
MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"


def named(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def off_by_default():
    docs = render()
    assert not [d for d in named(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert not named(docs, "PrometheusRule"), "no PrometheusRule without the CRD"


def dashboard_configmap():
    docs = render("--set", "observability.grafanaDashboard.enabled=true",
                  "--set", "observability.grafanaDashboard.namespace=monitoring")
    cms = [d for d in named(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert len(cms) == 1, cms
    cm = cms[0]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    with open(os.path.join(CHART, "files", "dashboard.json")) as f:
        assert json.loads(cm["data"]["kai-resource-isolator.json"]) == json.load(f)
    off = render("--set", "observability.grafanaDashboard.enabled=true", "--set", "monitor.enabled=false")
    assert not [d for d in named(off, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")], "no aggregator, no dashboard"


def rule_with_crd():
    docs = render("--api-versions", RULE_API, "--set", "observability.prometheusRule.labels.release=prometheus")
    rules = named(docs, "PrometheusRule")
    assert len(rules) == 1, rules
    rule = rules[0]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
        assert rule["spec"] == yaml.safe_load(f), "the rule carries files/alerts.yaml unchanged"
    assert not named(render("--api-versions", RULE_API, "--set", "observability.prometheusRule.enabled=false"), "PrometheusRule")


def alerts_documented():
    with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
        groups = yaml.safe_load(f)["groups"]
    with open(DOCS) as f:
        anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
                   for h in re.findall(r"^#+ (.+)$", f.read(), re.M)}
    names = []
    for g in groups:
        for r in g["rules"]:
            a = r["annotations"]
            names.append(r["alert"])
            assert a.get("summary") and a.get("description"), r["alert"]
            assert "$labels" in a["summary"] + a["description"] or r["alert"] == "KaiNodeAgentStreamStale", r["alert"]
            anchor = a["runbook_url"].split("#", 1)[1]
            assert anchor in anchors, f"{r['alert']}: docs/isolation.md has no #{anchor}"
    want = {"KaiGpuContainerUncapped", "KaiGpuProcessEscaped", "KaiGpuContainerOverCap", "KaiGpuContainerNearCap",
            "KaiNodeAgentDown", "KaiNodeAgentStreamStale", "KaiNodePreloadPathBroken", "KaiAggregatorDown"}
    assert want <= set(names), want - set(names)


def doc_anchors():
    with open(DOCS) as f:
        return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", f.read(), re.M)}


def target_missing_rule():
    """With the aggregator's ServiceMonitor the rule gains
    KaiAggregatorTargetMissing on that very target; without it, not."""
    docs = render("--api-versions", RULE_API, "--api-versions", MONITOR_API,
                  "--set", "monitor.serviceMonitor.enabled=true")
    with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
        static = yaml.safe_load(f)["groups"]
    groups = named(docs, "PrometheusRule")[0]["spec"]["groups"]
    assert groups[:-1] == static, "files/alerts.yaml first, unchanged"
    assert groups[-1]["name"] == "kai-resource-isolator.scrape", groups[-1]
    [rule] = groups[-1]["rules"]
    assert rule["alert"] == "KaiAggregatorTargetMissing"
    [svc] = [d for d in named(docs, "Service") if d["metadata"]["name"].endswith("-aggregator")]
    [sm] = [d for d in named(docs, "ServiceMonitor") if d["metadata"]["name"].endswith("-aggregator")]
    ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
    assert rule["expr"] == f'absent(up{{namespace="{ns}",service="{name}"}})', rule["expr"]
    selector = sm["spec"]["selector"]["matchLabels"]
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in selector.items()), "the ServiceMonitor selects that Service"
    assert rule["annotations"]["runbook_url"].split("#", 1)[1] in doc_anchors()
    for off in (("--set", "monitor.serviceMonitor.enabled=false"),
                ("--set", "monitor.serviceMonitor.enabled=true", "--set", "monitor.serviceMonitor.targets.aggregator=false",
                 "--set", "monitor.serviceMonitor.targets.nodeAgents=true")):
        spec = named(render("--api-versions", RULE_API, "--api-versions", MONITOR_API, *off), "PrometheusRule")[0]["spec"]
        assert spec["groups"] == static, off

    # It fires once the target has been gone for 10 minutes, not while it is
    # there, down or not (KaiAggregatorDown's case). promtool comes with
    # Debian's prometheus (kind-tests/test_see.py installs it; .ci/run runs it first).
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (Debian package prometheus)"
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "rules.yaml"), "w") as f:
            yaml.safe_dump({"groups": [groups[-1]]}, f)
        up = f'up{{job="{name}",namespace="{ns}",service="{name}",instance="10.0.0.9:9394"}}'
        labels = {"severity": "warning", "namespace": ns, "service": name}
        test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [
            {"interval": "1m", "input_series": [{"series": up, "values": "1x5 0x20"}],
             "alert_rule_test": [{"eval_time": "20m", "alertname": rule["alert"], "exp_alerts": []}]},
            {"interval": "1m", "input_series": [{"series": up, "values": "1x2"}],
             "alert_rule_test": [
                 {"eval_time": "9m", "alertname": rule["alert"], "exp_alerts": []},
                 {"eval_time": "20m", "alertname": rule["alert"],
                  "exp_alerts": [{"exp_labels": labels, "exp_annotations": rule["annotations"]}]}]},
        ]}
        with open(os.path.join(tmp, "test.yaml"), "w") as f:
            yaml.safe_dump(test, f)
        r = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def units_match_the_series():
    # HAMi's utilization series are percent 0-100 (not a 0-1 fraction):
    # Grafana's `percentunit` would show them 100 times too large.
    with open(os.path.join(CHART, "files", "dashboard.json")) as f:
        dashboard = json.load(f)

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    seen = 0
    for p in panels(dashboard["panels"]):
        exprs = [t.get("expr", "") for t in p.get("targets", [])]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if any("_utilization_ratio" in e for e in exprs):
            seen += 1
            assert unit == "percent", f"panel {p.get('title')!r}: unit {unit!r} for a 0-100 series"
    assert seen, "the dashboard shows a utilization series"


def schema_rejects_unknown():
    r = subprocess.run([helm_binary(), "template", "kai", CHART, "--set", "observability.grafanaDashbord.enabled=true"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "schema" in r.stderr.lower(), r.stderr[:300]


# --- the cases, in the order they ran as a script --------------------------

def cases(check):
    """check(name, function) of every check, in the order they ran as a script."""
    check("observability: nothing rendered by default", off_by_default)
    check("observability: dashboard ConfigMap for the Grafana sidecar, files/dashboard.json verbatim", dashboard_configmap)
    check("observability: PrometheusRule only with the CRD, files/alerts.yaml verbatim", rule_with_crd)
    check("observability: with the aggregator's ServiceMonitor, KaiAggregatorTargetMissing on its target (promtool)",
          target_missing_rule)
    check("observability: every alert has a summary, description and runbook anchor in docs/isolation.md", alerts_documented)
    check("observability: dashboard units match the series (utilization in percent 0-100)", units_match_the_series)
    check("observability: schema rejects a misspelt key", schema_rejects_unknown)


pytest_generate_tests = generate(cases)


def test(case):
    case()
