"""See it, tested with the real things (docs/aggregator.md, "Grafana dashboard and alerts").

The chart's alerts under promtool; then the demo stack (kai-demo: webhook,
node agent, aggregator) with the fake NVML, so the node has GPUs and an
escaped process, and:

  1. the web view in headless Chromium (kaitest.devtools): containers,
     states and bars in the DOM; regions changed on disk show up without a
     reload; filter; a screenshot in the output dir; behind a path prefix;
     the same page at 1000 nodes x 100 containers (a synthetic model) keeps
     only the visible rows in the DOM and updates them in place;
  2. kubectl-vgpu against the aggregator: table, JSON, YAML, exit codes;
  3. a real Prometheus on loopback scraping the aggregator and the node
     agent: every dashboard and alert expression evaluated through its HTTP
     API; the rules load healthy; the alerts whose condition the test set up
     return series, the liveness ones only once the stack is stopped.

Each test asks for what it needs (`demo`, `browser`, `changed`,
`prometheus`), so any one runs alone: `pytest -c kind-tests/pytest.ini -m see -k why`.
Output (screenshots, logs) goes to $KAI_SEE_OUT, else target/see. Needs the
built kai-demo, kubectl-vgpu and libkai_fake_nvml.so (built when missing)
and Debian's prometheus and chromium (installed when missing and root).
"""
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import urllib.parse
import urllib.request

import pytest
import yaml

from kaitest.chart import CHART
from kaitest.checks import named
from kaitest.devtools import DevTools
from kaitest.net import free_port, get, get_json
from kaitest.poll import poll
from kaitest.region import Layout, replace_u64, read_u64, write

pytestmark = pytest.mark.see
OUT = ("KAI_SEE_OUT", "see")  # out_dir (conftest.py): $KAI_SEE_OUT, else target/see

MIB = 1 << 20
GIB = 1 << 30
WAIT = 60  # seconds any awaited condition may take on a loaded machine
GPU0 = "GPU-f00dcafe-0000-4000-8000-000000000000"
GPU1 = "GPU-0ddba11-0000-4000-8000-000000000001"
PREFIX = "/api/v1/namespaces/kai-system/services/kai-aggregator:http-metrics/proxy"
NODES, PER_NODE = 1000, 100

ROWS = """[...document.querySelectorAll('#containers .row[data-key]')].map(r => ({
    key: r.dataset.key, state: r.dataset.state,
    stateText: r.querySelector('.state').textContent,
    reason: r.querySelector('.state').title,
    bar: r.querySelector('.bar').className, fill: parseFloat(r.querySelector('.bar .fill').style.width),
    stale: parseFloat(r.querySelector('.bar .stale').style.width),
    text: r.textContent}))"""


def wait_for(what, fn, timeout=WAIT):
    return poll(what, fn, timeout, (OSError, ValueError, KeyError))


def stop_process(p):
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


# --- the demo stack, with a fake NVML -----------------------------------------

class Demo:
    """kai-demo on free loopback ports; this test's PID stands in for a GPU
    process that no region accounts for (an escaped process)."""

    def __init__(self, bin_dir, out):
        self.bin, self.out = bin_dir, out
        self.ports = {k: free_port() for k in ("webhook", "agent_grpc", "agent_metrics", "agg", "agg_grpc")}
        self.agg = f"http://127.0.0.1:{self.ports['agg']}"
        self.agent_metrics = f"127.0.0.1:{self.ports['agent_metrics']}"
        self.layout = Layout("v1")
        self.regions_changed = False
        nvml_dir = os.path.join(out, "nvml")
        os.makedirs(nvml_dir, exist_ok=True)
        lib = os.path.join(nvml_dir, "libnvidia-ml.so.1")
        if os.path.lexists(lib):
            os.remove(lib)
        os.symlink(os.path.join(bin_dir, "libkai_fake_nvml.so"), lib)
        nvml_config = os.path.join(out, "fake-nvml.json")
        with open(nvml_config, "w") as f:
            json.dump({"driver": "550.54.15", "devices": [
                {"uuid": GPU0, "name": "NVIDIA H100 80GB HBM3", "total": 80 * GIB, "used": 20 * GIB,
                 "gpu_util": 40, "memory_util": 25, "processes": [{"pid": os.getpid(), "used": 512 * MIB}]},
                {"uuid": GPU1, "name": "NVIDIA L4", "total": 24 * GIB, "used": 3 * GIB, "gpu_util": 5,
                 "memory_util": 10, "processes": []},
            ]}, f)
        self.log = open(os.path.join(out, "demo.log"), "w")
        self.lines = []
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "kai-demo"),
             "--webhook-listen", f"127.0.0.1:{self.ports['webhook']}",
             "--agent-grpc-listen", f"127.0.0.1:{self.ports['agent_grpc']}",
             "--agent-metrics-listen", self.agent_metrics,
             "--aggregator-listen", f"127.0.0.1:{self.ports['agg']}",
             "--aggregator-grpc-listen", f"127.0.0.1:{self.ports['agg_grpc']}",
             "--log-level", "warn"],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=dict(os.environ, LD_LIBRARY_PATH=nvml_dir, FAKE_NVML_CONFIG=nvml_config))
        threading.Thread(target=self._pump, daemon=True).start()
        self.work = wait_for("the demo to print where its files are", self._work_dir)
        self.containers_dir = os.path.join(self.work, "host", "usr", "local", "vgpu", "containers")

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self.log.write(line)
            self.log.flush()

    def _work_dir(self):
        found = next((m.group(1) for l in self.lines if (m := re.search(r"Files are under (\S+)", l))), None)
        if not found and self.proc.poll() is not None:
            pytest.fail(f"kai-demo exited: see {self.out}/demo.log")
        return found

    def stop(self):
        stop_process(self.proc)
        self.log.close()

    def containers(self):
        return get_json(f"{self.agg}/api/v1/containers")

    def region(self, uid_suffix, container):
        uid = "9a1b7c1e-0000-4000-8000-0000000000" + uid_suffix
        return os.path.join(self.containers_dir, f"{uid}_{container}", "usage.cache")

    def change_regions(self):
        """Once: notebook to 97.7 % of its cap (near cap), inference past its
        cap + 10 % (over cap), the uncapped job's process gone (its usage
        becomes stale charge)."""
        if self.regions_changed:
            return
        self.regions_changed = True
        header = self.layout.procs()
        replace_u64(self.region("c3", "jupyter"), 612 * MIB, 2000 * MIB, header)
        replace_u64(self.region("b2", "model"), 6456 * MIB, 9500 * MIB, header)
        write(self.region("d4", "main"), self.layout.slot_pid(0), "i", 0)

    def vgpu(self, *args, aggregator=None):
        return subprocess.run([os.path.join(self.bin, "kubectl-vgpu"), "--aggregator", aggregator or self.agg, *args],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, KUBECONFIG=os.path.join(self.out, "no-kubeconfig")))


@pytest.fixture(scope="module")
def demo(built, out_dir):
    bin_dir = built(["kai-demo", "kubectl-vgpu", "kai-fake-nvml"], ["kai-demo", "kubectl-vgpu", "libkai_fake_nvml.so"])
    d = Demo(bin_dir, out_dir)
    try:
        wait_for("the aggregator to report the demo's four containers with host GPUs and the escaped process",
                 lambda: len(d.containers()["containers"]) == 4 and d.containers()["escapedProcesses"]
                 and get_json(f"{d.agg}/api/v1/devices")["devices"][0]["memoryTotalBytes"] > 0)
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def changed(demo):
    """The demo after change_regions(), once the aggregator serves the change."""
    demo.change_regions()

    def served():
        r = demo.vgpu("top", "-A", "-o", "json")
        by = {x["pod"]: x for x in json.loads(r.stdout)} if r.returncode == 0 else {}
        return (by.get("inference-7d9f5c8b6-x2x4p", {}).get("state") == "over_cap"
                and by.get("notebook-0", {}).get("nearCap") is True
                and (by.get("uncapped-job-0", {}).get("staleBytes") or 0) > 0)

    wait_for("the aggregator to serve the changed regions", served)
    return demo


class Page:
    """The web view in headless Chromium."""

    def __init__(self, url, out):
        self.tools = DevTools(os.path.join(out, "chromium-profile"), os.path.join(out, "chromium.log"),
                              window="1280,1100")
        self.tools.navigate(url)

    def js(self, expression):
        return self.tools.js(expression)

    def rows(self):
        return self.js(ROWS) or []

    def by_pod(self):
        return {r["key"].split("/")[1]: r for r in self.rows()}


@pytest.fixture(scope="module")
def browser(demo, debian_tools, out_dir):
    debian_tools({"chromium": "chromium"})
    page = Page(demo.agg + "/", out_dir)
    yield page
    page.tools.close()


# --- the chart's alert rules under promtool ----------------------------------

@named("promtool: the alert rules check and their unit tests (files/alerts_test.yaml) pass")
def test_promtool(check, debian_tools):
    tools = debian_tools({"promtool": "prometheus"})
    files = os.path.join(CHART, "files")
    r = subprocess.run([tools["promtool"], "check", "rules", "alerts.yaml"], cwd=files, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([tools["promtool"], "test", "rules", "alerts_test.yaml"], cwd=files, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# --- 1. the web view in headless Chromium --------------------------------------

@named("the demo prints how to open the web view")
def test_demo_prints_web_view(check, demo):
    web_line = next((l for l in demo.lines if "web view" in l), "")
    assert demo.agg in web_line, f"no web view URL in: {''.join(demo.lines)[-800:]}"


@named("web view: containers, isolation states and bars in the DOM, GPUs and the escaped process")
def test_initial_view(check, demo, browser):
    assert not demo.regions_changed, "runs before the regions change (file order)"
    rs = wait_for("the page to draw four containers", lambda: len(browser.rows()) == 4 and browser.rows())
    by = {r["key"].split("/")[1]: r for r in rs}
    assert set(by) == {"trainer-0", "inference-7d9f5c8b6-x2x4p", "notebook-0", "uncapped-job-0"}, by.keys()
    assert by["uncapped-job-0"]["state"] == "uncapped_no_limit" and "uncapped" in by["uncapped-job-0"]["bar"], by
    assert by["uncapped-job-0"]["reason"], "the state carries its reason"
    assert by["notebook-0"]["state"] == "capped"
    # The demo's notebook holds its GPU through a DRA claim (docs/dra.md):
    # its row names the claim, the share and the grant; the others none.
    assert "claim team-b/notebook-gpu, share 5c0f…" in by["notebook-0"]["text"], by["notebook-0"]["text"]
    assert "granted 2.0 GiB" in by["notebook-0"]["text"], by["notebook-0"]["text"]
    assert not [k for k, r in by.items() if k != "notebook-0" and "claim " in r["text"]], by
    api = {c["pod"]: c["devices"][0] for c in demo.containers()["containers"]}
    inf = api["inference-7d9f5c8b6-x2x4p"]
    want = 100 * inf["usedBytes"] / inf["limitBytes"]
    assert abs(by["inference-7d9f5c8b6-x2x4p"]["fill"] - want) < 0.2, (by["inference-7d9f5c8b6-x2x4p"], want)
    gpus = browser.js("[...document.querySelectorAll('#gpus .row[data-key]')].map(r => r.textContent)")
    assert len(gpus) == 2 and any("80 GiB" in g for g in gpus), gpus
    escaped = browser.js("document.querySelector('#escaped').textContent")
    assert str(os.getpid()) in escaped, escaped
    order = [r["key"].split("/")[1] for r in rs]
    assert order[0] == "inference-7d9f5c8b6-x2x4p", f"sorted by use: {order}"


@named("web view: regions changed on disk show up without a reload (near cap, over cap, stale charge)")
def test_updates_live(check, demo, browser):
    wait_for("the page to draw four containers", lambda: len(browser.rows()) == 4)
    browser.js("window.__sameDocument = 'yes'")
    before = int(browser.js("document.body.dataset.updates"))
    demo.change_regions()

    def changed_view():
        by = browser.by_pod()
        nb, inf, unc = by.get("notebook-0"), by.get("inference-7d9f5c8b6-x2x4p"), by.get("uncapped-job-0")
        return (nb and "near cap" in nb["text"] and "near" in nb["bar"] and nb["fill"] > 95
                and inf and inf["state"] == "over_cap" and "over" in inf["bar"]
                and unc and unc["stale"] > 0 and by)

    by = wait_for("the page to show the changed regions", changed_view)
    assert browser.js("window.__sameDocument") == "yes", "the page was reloaded"
    assert browser.js("performance.getEntriesByType('navigation').length") == 1
    assert int(browser.js("document.body.dataset.updates")) > before
    assert by["inference-7d9f5c8b6-x2x4p"]["stateText"] == "over cap"


def set_input(browser, element, value):
    browser.js("(() => { const i = document.getElementById(%s); i.value = %s;"
               " i.dispatchEvent(new Event('input')); })()" % (json.dumps(element), json.dumps(value)))


@named("web view: filter by namespace and by node, sort by headroom")
def test_filters(check, changed, browser):
    wait_for("the page to show inference over cap",
             lambda: browser.by_pod().get("inference-7d9f5c8b6-x2x4p", {}).get("state") == "over_cap")
    set_input(browser, "f-namespace", "team-b")
    keys = [r["key"] for r in browser.rows()]
    assert keys and all(k.startswith("team-b/") for k in keys), keys
    set_input(browser, "sort", "headroom")
    first = browser.rows()[0]["key"]
    assert first.startswith("team-b/inference"), f"least headroom first: {first}"
    set_input(browser, "f-namespace", "")
    assert len(browser.rows()) == 4

    def by_node(value):
        set_input(browser, "f-node", value)
        gpu_keys = browser.js("[...document.querySelectorAll('#gpus .row[data-key]')].map(r => r.dataset.key)")
        return [r["key"] for r in browser.rows()], gpu_keys

    node = changed.containers()["containers"][0]["node"]
    keys, gpu_keys = by_node(node)
    assert len(keys) == 4 and len(gpu_keys) == 2 and all(k.startswith(node + "/") for k in gpu_keys), (keys, gpu_keys)
    assert by_node("no-such-node") == ([], []), "another node shows neither containers nor GPUs"
    keys, gpu_keys = by_node("")
    assert len(keys) == 4 and len(gpu_keys) == 2


@named("web view: screenshot saved")
def test_screenshot(check, browser, out_dir):
    wait_for("the page to draw four containers", lambda: len(browser.rows()) == 4)
    shot = os.path.join(out_dir, "web-view.png")
    browser.tools.screenshot(shot)
    assert os.path.getsize(shot) > 10_000, f"{shot} is {os.path.getsize(shot)} bytes"


class PrefixProxy(http.server.BaseHTTPRequestHandler):
    """Forwards PREFIX/<path> to the aggregator's /<path> (server.upstream),
    streaming the body, as the API server's service proxy serves it."""
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if not self.path.startswith(PREFIX):
            self.send_error(404)
            return
        upstream = self.path[len(PREFIX):] or "/"
        try:
            with urllib.request.urlopen(self.server.upstream + upstream, timeout=30) as r:
                self.send_response(r.status)
                self.send_header("Content-Type", r.headers.get("Content-Type", ""))
                self.end_headers()
                while not self.server.stopping.is_set():
                    line = r.readline()
                    if not line:
                        break
                    self.wfile.write(line)
                    self.wfile.flush()
        except OSError:
            pass


def serve(handler, **attrs):
    """A threading HTTP server on a free loopback port with `attrs` on it and
    a `stopping` event; stop it with stop_serving."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.stopping = threading.Event()
    for k, v in attrs.items():
        setattr(server, k, v)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_serving(server):
    server.stopping.set()
    server.shutdown()


@pytest.fixture
def prefix_proxy(demo):
    server = serve(PrefixProxy, upstream=demo.agg)
    yield f"http://127.0.0.1:{server.server_port}{PREFIX}"
    stop_serving(server)


@named("web view and kubectl-vgpu behind a path prefix (as through the service proxy), live")
def test_behind_prefix(check, demo, browser, prefix_proxy):
    # Without the trailing slash, as a user types it.
    browser.tools.navigate(prefix_proxy)
    wait_for("the page behind the prefix to draw four containers", lambda: len(browser.rows()) == 4)
    assert browser.js("location.pathname") == PREFIX + "/"
    updates = int(browser.js("document.body.dataset.updates"))
    # The trainer's region changes every 2 s: a change event through the proxy.
    wait_for("a live update through the prefix", lambda: int(browser.js("document.body.dataset.updates")) > updates)
    r = demo.vgpu("top", "-A", "-o", "json", aggregator=prefix_proxy)
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 4, (r.returncode, r.stdout, r.stderr)


class Synthetic(http.server.BaseHTTPRequestHandler):
    """The page's own assets (server.assets, from the aggregator) with a
    synthetic model of NODES x PER_NODE containers and its change stream
    (server.model, server.changed), so the size does not need 1000 agents."""
    protocol_version = "HTTP/1.1"
    TYPES = {"/": "text/html", "/ui/app.js": "text/javascript", "/ui/app.css": "text/css"}

    def log_message(self, *a):
        pass

    def view(self):
        model = self.server.model

        def row(n, j):
            used = (n * PER_NODE + j + 1) * MIB + (model["bump"] if (n, j) == (0, 1) else 0)
            limit = (n * PER_NODE + j + 1) * 2 * MIB
            return [f"ns-{(n * PER_NODE + j) % 50}", f"pod-{n}-{j}", "main", f"node-{n:04}", f"GPU-{n}-{j % 8}",
                    used, limit, 0, "capped", "", False, max(0, limit - used)]
        rows = [row(n, j) for n in range(NODES) for j in range(PER_NODE)]
        nodes = [{"node": f"node-{n:04}", "state": "connected", "lastUpdateUnixMs": 0,
                  "gpus": [{"uuid": f"GPU-{n}-{g}", "name": "NVIDIA H100", "capacity": 80 * GIB, "allocated": GIB,
                            "used": GIB, "stale": 0, "headroom": 79 * GIB, "containers": 12, "uncapped": 0}
                           for g in range(8)]} for n in range(NODES)]
        return json.dumps({"revision": model["revision"], "generatedUnixMs": 0, "nodes": nodes,
                           "columns": ["namespace", "pod", "container", "node", "gpu", "used", "limit", "stale",
                                       "state", "reason", "nearCap", "headroom"],
                           "containers": rows, "escaped": []}).encode()

    def send_body(self, content_type, body):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        server = self.server
        if self.path in server.assets:
            self.send_body(self.TYPES[self.path], server.assets[self.path].encode())
        elif self.path == "/api/v1/view":
            self.send_body("application/json", self.view())
        elif self.path == "/api/v1/view/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            sent = 0
            try:
                while not server.stopping.is_set():
                    with server.changed:
                        server.changed.wait_for(lambda: server.model["revision"] != sent or server.stopping.is_set(), 1)
                        rev = server.model["revision"]
                    if rev != sent:
                        self.wfile.write(f"event: change\ndata: {rev}\n\n".encode())
                        self.wfile.flush()
                        sent = rev
            except OSError:
                pass
        else:
            self.send_error(404)


@pytest.fixture
def synthetic(demo):
    server = serve(Synthetic, assets={path: get(demo.agg + path) for path in Synthetic.TYPES},
                   model={"revision": 1, "bump": 0}, changed=threading.Condition())
    yield server
    server.stopping.set()
    with server.changed:
        server.changed.notify_all()
    server.shutdown()


@named("web view at 1000 nodes x 100 containers: only visible rows in the DOM, updated in place, scrolls to the end")
def test_at_scale(check, browser, synthetic, out_dir):
    browser.tools.navigate(f"http://127.0.0.1:{synthetic.server_port}/")
    wait_for("the page to draw 100000 containers",
             lambda: browser.js("document.getElementById('container-count')?.textContent") == str(NODES * PER_NODE))
    count = browser.js("document.querySelectorAll('#containers .row').length")
    gpu_rows = browser.js("document.querySelectorAll('#gpus .row').length")
    assert 0 < count <= 40 and 0 < gpu_rows <= 20, f"{count} container / {gpu_rows} GPU rows in the DOM"
    took = browser.js("(() => { const t = performance.now();"
                      " document.getElementById('sort').value = 'headroom';"
                      " document.getElementById('sort').dispatchEvent(new Event('input'));"
                      " return performance.now() - t; })()")
    print(f"     (re-sort of {NODES * PER_NODE} rows drew in {took:.0f} ms; not asserted)")
    browser.js("(() => { const s = document.getElementById('sort'); s.value = 'used';"
               " s.dispatchEvent(new Event('input')); document.querySelector('#containers .row').__kept = 1; })()")
    first = browser.js("document.querySelector('#containers .row').dataset.key")
    assert first == f"ns-{(NODES * PER_NODE - 1) % 50}/pod-{NODES - 1}-{PER_NODE - 1}/main/GPU-{NODES - 1}-{(PER_NODE - 1) % 8}", first
    # An update: pod-0-1 becomes the most used; the rows in sight are
    # rewritten in place (the same elements), not rebuilt.
    updates = int(browser.js("document.body.dataset.updates"))
    with synthetic.changed:
        synthetic.model["bump"] = NODES * PER_NODE * 10 * MIB
        synthetic.model["revision"] += 1
        synthetic.changed.notify_all()
    wait_for("the update to arrive", lambda: int(browser.js("document.body.dataset.updates")) > updates)
    top = browser.js("(() => { const r = document.querySelector('#containers .row');"
                     " return [r.dataset.key, r.__kept === 1]; })()")
    assert top[0].startswith("ns-1/pod-0-1/"), top
    assert top[1], "the row element was replaced: the list was rebuilt"
    assert browser.js("document.querySelectorAll('#containers .row').length") == count
    # Scrolled to the end, the least used container is drawn.
    browser.js("(() => { const l = document.getElementById('containers'); l.scrollTop = l.scrollHeight; })()")
    wait_for("the last row to be drawn", lambda: browser.js(
        "[...document.querySelectorAll('#containers .row[data-key]')].some(r => r.dataset.key.startsWith('ns-0/pod-0-0/'))"))
    browser.tools.screenshot(os.path.join(out_dir, "web-view-100k.png"))


# --- 2. kubectl-vgpu -------------------------------------------------------------

@named("kubectl vgpu top: table sorted by use, with states")
def test_top_table(check, changed):
    r = changed.vgpu("top", "-A")
    assert r.returncode == 0, r.stderr
    lines_ = r.stdout.splitlines()
    assert lines_[0].split() == ["NAMESPACE", "POD", "CONTAINER", "GPU", "USED", "LIMIT", "%", "STATE"], lines_[0]
    assert len(lines_) == 5, r.stdout
    assert lines_[1].split()[1] == "inference-7d9f5c8b6-x2x4p" and "over_cap" in lines_[1], r.stdout
    unc = next(l for l in lines_ if "uncapped-job-0" in l)
    assert "none" in unc.split() and "uncapped_no_limit" in unc, unc
    r = changed.vgpu("top", "-n", "team-b")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stdout


@named("kubectl vgpu top -o json/yaml: rows with percent, stale charge and headroom")
def test_top_json(check, changed):
    r = changed.vgpu("top", "-A", "-o", "json")
    assert r.returncode == 0, r.stderr
    rows_ = json.loads(r.stdout)
    by = {x["pod"]: x for x in rows_}
    assert by["notebook-0"]["nearCap"] is True and by["notebook-0"]["percent"] > 95, by["notebook-0"]
    assert by["uncapped-job-0"]["limitBytes"] == 0 and by["uncapped-job-0"]["headroomBytes"] is None
    assert by["uncapped-job-0"]["staleBytes"] > 0, by["uncapped-job-0"]
    nb = by["notebook-0"]
    assert nb["headroomBytes"] == nb["limitBytes"] - nb["usedBytes"] - nb["staleBytes"]
    assert [x["usedBytes"] for x in rows_] == sorted((x["usedBytes"] for x in rows_), reverse=True)
    r = changed.vgpu("top", "-A", "-o", "yaml")
    assert r.returncode == 0 and "pod: notebook-0" in r.stdout, r.stdout[:400]


@named("kubectl vgpu nodes: capacity, allocated, used, stale, headroom per GPU")
def test_nodes(check, changed):
    r = changed.vgpu("nodes", "-o", "json")
    assert r.returncode == 0, r.stderr
    gpus = {g["gpu"]: g for g in json.loads(r.stdout)}
    assert gpus[GPU0]["capacityBytes"] == 80 * GIB and gpus[GPU0]["allocatedBytes"] == 12 * GIB, gpus[GPU0]
    assert gpus[GPU0]["headroomBytes"] == 68 * GIB
    assert gpus[GPU1]["staleBytes"] > 0, gpus[GPU1]
    r = changed.vgpu("nodes")
    assert r.returncode == 0 and r.stdout.split()[:7] == ["NODE", "GPU", "CAPACITY", "ALLOCATED", "USED", "STALE", "HEADROOM"], r.stdout
    assert "80Gi" in r.stdout and "68Gi" in r.stdout, r.stdout


@named("kubectl vgpu -o wide (node, stale, headroom, reason; name, containers, uncapped, agent) and --node")
def test_wide_and_node_filter(check, changed):
    vgpu = changed.vgpu
    node = json.loads(vgpu("nodes", "-o", "json").stdout)[0]["node"]
    r = vgpu("top", "-A", "-o", "wide")
    assert r.returncode == 0, r.stderr
    lines_ = r.stdout.splitlines()
    assert lines_[0].split()[-4:] == ["NODE", "STALE", "HEADROOM", "REASON"], lines_[0]
    assert GPU0 in r.stdout, "wide shows whole GPU UUIDs"
    # NAMESPACE POD CONTAINER GPU USED LIMIT % STATE NODE STALE HEADROOM REASON (words)
    unc = next(l for l in lines_ if "uncapped-job-0" in l).split()
    assert unc[8] == node and unc[10] == "-" and "CUDA_DEVICE_MEMORY_LIMIT" in " ".join(unc[11:]), unc
    r = vgpu("nodes", "-o", "wide")
    assert r.returncode == 0, r.stderr
    lines_ = r.stdout.splitlines()
    assert lines_[0].split()[-4:] == ["NAME", "CONTAINERS", "UNCAPPED", "AGENT"], lines_[0]
    gpu1 = next(l for l in lines_ if GPU1 in l).split()
    assert gpu1[-3:-1] == ["2", "1"], gpu1
    # --node keeps that node's rows, another node has none.
    pods = lambda out: sorted(l.split()[1] for l in out.splitlines()[1:])
    assert pods(vgpu("top", "-A", "--node", node).stdout) == pods(vgpu("top", "-A").stdout)
    r = vgpu("top", "-A", "--node", "no-such-node")
    assert r.returncode == 0 and r.stdout == "No GPU-sharing containers found.\n", (r.returncode, r.stdout)
    assert len(vgpu("nodes", "--node", node).stdout.splitlines()) == 3
    r = vgpu("nodes", "--node", "no-such-node")
    assert r.returncode == 0 and r.stdout == "No GPUs reported.\n", (r.returncode, r.stdout)


@named("kubectl vgpu why: state, reason, what to do; exit codes 0/1/2/3/4; --help everywhere")
def test_why(check, changed):
    vgpu = changed.vgpu
    r = vgpu("why", "uncapped-job-0", "-n", "team-c")
    assert r.returncode == 4, (r.returncode, r.stdout, r.stderr)
    assert "uncapped_no_limit" in r.stdout and "nvidia.com/gpu.memory" in r.stdout and "stale charge" in r.stdout, r.stdout
    assert "Events:" in r.stdout and "unavailable" in r.stdout, r.stdout
    r = vgpu("why", "trainer-0", "-n", "team-a", "-o", "json")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert json.loads(r.stdout)["containers"][0]["state"] == "capped"
    r = vgpu("why", "no-such-pod", "-n", "team-a")
    assert r.returncode == 3, (r.returncode, r.stdout)
    r = vgpu("top", "--bogus")
    assert r.returncode == 2, r.returncode
    r = vgpu("top", "-A", aggregator="http://127.0.0.1:1")
    assert r.returncode == 1 and "error:" in r.stderr, (r.returncode, r.stderr)
    for sub in ([], ["top"], ["nodes"], ["why"]):
        h = subprocess.run([os.path.join(changed.bin, "kubectl-vgpu"), *sub, "--help"], capture_output=True, text=True)
        assert h.returncode == 0 and "Usage:" in h.stdout, (sub, h.stdout[:200])


# --- 3. a real Prometheus ------------------------------------------------------------

FIRING = {"KaiGpuContainerUncapped", "KaiGpuProcessEscaped", "KaiGpuContainerOverCap", "KaiGpuContainerNearCap"}
LIVENESS = {"KaiNodeAgentDown", "KaiNodeAgentStreamStale", "KaiNodePreloadPathBroken", "KaiAggregatorDown"}
# A tenant raising its own cap: set up by writing a region's limit above the
# pod's grant (the demo's pods carry KAI's gpu-memory).
TENANT = {"KaiGpuContainerAboveGrant"}
# A region naming a process of another pod needs that process to sit in
# another pod's cgroup on the host, which this stack cannot make: here the
# expression must evaluate and stay silent on the honest stack;
# alerts_test.yaml (promtool) and the agent's trust tests make it fire. A
# region file the agent refuses (KaiGpuRegionUnreadable) needs a sharing pod
# past its grace with a broken file: the agent's assessment and store tests
# and alerts_test.yaml cover it; here it stays silent.
NOT_HERE = {"KaiGpuRegionForged", "KaiGpuRegionUnreadable"}


def alerts():
    """alert name -> expression, from the chart's files/alerts.yaml."""
    with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
        return {r["alert"]: r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}


class Prometheus:
    """A real Prometheus on loopback scraping the demo's aggregator and node
    agent every second, with the chart's alert rules."""

    def __init__(self, binary, demo, out):
        self.url = f"http://127.0.0.1:{free_port()}"
        prom_dir = os.path.join(out, "prometheus")
        shutil.rmtree(prom_dir, ignore_errors=True)
        os.makedirs(prom_dir)
        with open(os.path.join(prom_dir, "prometheus.yml"), "w") as f:
            json.dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [os.path.join(CHART, "files", "alerts.yaml")],
                "scrape_configs": [
                    {"job_name": "kai-aggregator", "static_configs": [{"targets": [demo.agg.removeprefix("http://")]}]},
                    {"job_name": "kai-node-agent", "static_configs": [{"targets": [demo.agent_metrics]}]},
                ]}, f)
        self.log = open(os.path.join(out, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={prom_dir}/prometheus.yml", f"--storage.tsdb.path={prom_dir}/data",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=subprocess.DEVNULL, stderr=self.log)

    def get(self, path):
        return get_json(self.url + path)

    def query(self, expr):
        r = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert r["status"] == "success", r
        return r["data"]["result"]

    def up(self):
        targets = self.get("/api/v1/targets")["data"]["activeTargets"]
        return len(targets) == 2 and all(t["health"] == "up" for t in targets)

    def stop(self):
        stop_process(self.proc)
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(changed, debian_tools, out_dir):
    tools = debian_tools({"prometheus": "prometheus"})
    prom = Prometheus(tools["prometheus"], changed, out_dir)
    try:
        wait_for("Prometheus to scrape both targets", prom.up)
        # rate() over the dashboards' interval needs a few samples.
        wait_for("five scrapes of the aggregator", lambda: prom.query('count_over_time(up{job="kai-aggregator"}[1m]) >= 5'))
        yield prom
    finally:
        prom.stop()


def substitute(expr):
    return (expr.replace("$job", "kai-aggregator").replace("$node", ".*").replace("$namespace", ".*")
            .replace("$__rate_interval", "15s"))


@named("Prometheus: every dashboard expression returns series")
def test_dashboard(check, prometheus):
    with open(os.path.join(CHART, "files", "dashboard.json")) as f:
        dash = json.load(f)
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+), *(\w+)\)", v["definition"])
            assert inner, v["definition"]
            exprs.append((f"variable {v['name']}", f"count by ({inner.group(2)}) ({inner.group(1)})"))
    assert len(exprs) >= 20, len(exprs)
    empty = [(title, e) for title, e in exprs if not prometheus.query(substitute(e))]
    assert not empty, f"{len(empty)} of {len(exprs)} return no series: {empty}"


def selectors(expr):
    """The vector selectors of an expression (metric name and matchers)."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    found = []
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?", bare):
        name = m.group(1)
        after = bare[m.end():].lstrip()
        if name in ("and", "or", "unless", "bool", "offset", "sum", "count", "rate") or after.startswith("("):
            continue
        if re.fullmatch(r"\d.*", name):
            continue
        start = m.start()
        matchers = ""
        if m.group(2):
            # Take the original text's matchers (strings restored).
            orig = re.search(re.escape(name) + r"\s*(\{[^}]*\})", expr[start:])
            matchers = orig.group(1) if orig else ""
        found.append(name + matchers)
    return found


@named("Prometheus: every alert expression evaluates; its series exist; the set-up conditions fire")
def test_alert_exprs(check, changed, prometheus):
    query, rules = prometheus.query, alerts()
    assert set(rules) == FIRING | LIVENESS | TENANT | NOT_HERE, set(rules)
    for a in NOT_HERE:
        assert not query(rules[a]), f"{a} fires on an honest stack: {query(rules[a])}"
        print(f"     ({a}: expression evaluates and is silent; firing is promtool's alerts_test.yaml)")

    def series_exist(names):
        for name in names:
            sels = selectors(rules[name])
            assert sels, f"{name}: no selector in {rules[name]}"
            for s in sels:
                assert query(s), f"{name}: {s} has no series"

    wait_for("the firing alerts' expressions to return series", lambda: all(query(rules[a]) for a in FIRING))
    series_exist(FIRING | LIVENESS)
    for a in LIVENESS | TENANT:
        assert not query(rules[a]), f"{a} fires on a healthy stack: {query(rules[a])}"
    # The notebook's tenant writes a 4 GiB cap into its region; KAI granted
    # it 2048 MiB.
    notebook, limit = changed.region("c3", "jupyter"), changed.layout.limit(0)
    assert read_u64(notebook, limit) == 2 * GIB, "notebook's cap is where the v1 layout puts it"
    write(notebook, limit, "Q", 4 * GIB)
    wait_for("the above-grant alert's expression to return the notebook",
             lambda: [r for r in query(rules["KaiGpuContainerAboveGrant"]) if r["metric"]["pod"] == "notebook-0"])
    series_exist(TENANT)


@named("Prometheus: the rule file loads healthy and its alerts go pending")
def test_rules_loaded(check, prometheus):
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(alerts()), len(rules)
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    pending = wait_for("Prometheus to hold the escaped-process alert pending",
                       lambda: [a for a in prometheus.get("/api/v1/alerts")["data"]["alerts"]
                                if a["labels"]["alertname"] == "KaiGpuProcessEscaped"])
    assert pending[0]["labels"]["pid"] == str(os.getpid()), pending


@named("the stack stops with a web view open; Prometheus: KaiAggregatorDown's expression then fires")
def test_aggregator_down(check, demo, prometheus):
    # Last: it stops the demo. A page left open (its event stream) must not
    # hold up a graceful stop.
    stream = urllib.request.urlopen(f"{demo.agg}/api/v1/view/events", timeout=30)
    first = stream.readline().decode()
    assert re.match(r"event: ?change", first), f"the stream opens with a change event: {first!r}"
    demo.proc.send_signal(signal.SIGINT)
    try:
        demo.proc.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError("kai-demo did not stop with an event stream open")
    stream.close()
    wait_for("the aggregator-down expression to return series", lambda: prometheus.query(alerts()["KaiAggregatorDown"]))
