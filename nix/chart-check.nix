# The chart tests (lint, render, assertions) under pytest with nixpkgs' helm,
# kind-tests/kaitest (what the suites share) and kind-tests/pytest.ini.
# Offline schema validation needs PyPI's kubernetes-validate, which nixpkgs
# lacks, so it is left to .ci/run here.
{ pkgs, src }:
pkgs.runCommand "chart-check" {
  nativeBuildInputs = [ pkgs.kubernetes-helm (pkgs.python3.withPackages (p: [ p.pyyaml p.pytest ])) ];
  CHART_TEST_SKIP_SCHEMA_VALIDATION = "1";
  HELM = "helm";
} ''
  cp -r ${src + "/chart"} chart && chmod -R u+w chart
  mkdir kind-tests && cp -r ${src + "/kind-tests/kaitest"} kind-tests/kaitest
  cp ${src + "/kind-tests/pytest.ini"} kind-tests/pytest.ini
  python3 -m pytest -c kind-tests/pytest.ini chart/kai-resource-isolator/tests/chart_test.py
  touch $out
''
