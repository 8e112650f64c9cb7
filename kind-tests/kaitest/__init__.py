"""What the real-cluster suites and the chart's tests share (issue 42).

One small library, imported by the pytest suites (`pytest.ini` puts
kind-tests/ on the path):

- `poll`: waiting on a condition, never on time alone;
- `net`: a free loopback port, a plain HTTP GET;
- `chart`: helm (`$HELM`, else the one .ci/run caches) and `helm template`;
- `devtools`: headless Chromium over the DevTools protocol on a pipe;
- `region`: where libvgpu's region fields lie, read from the description
  the Rust layout checks (services/region/layout.json);
- `checks`: pytest ids that are the checks' old `ok NAME` lines, the
  hook that turns a module's table of checks into tests, and `uncaptured`
  (a failure's logs on the terminal, past pytest's capture);
- `kube`: a cluster.sh cluster (kubectl, helm, objects, ServiceAccount
  kubeconfigs, the chart's components read back, Prometheus' token) and
  the processes a suite starts (test_apiserver.py, test_node.py);
- `node`: node.sh's real node, up for a suite and down after it
  (test_node.py, test_kai.py).

The fixtures (built binaries, Debian tools) are kind-tests/conftest.py's.

Nothing here does work at import or keeps state between calls.
"""
