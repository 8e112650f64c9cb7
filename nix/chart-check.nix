# The chart tests (lint, render, assertions) with nixpkgs' helm. Offline
# schema validation needs PyPI's kubernetes-validate, which nixpkgs lacks,
# so it is left to .ci/run here.
{ pkgs, src }:
pkgs.runCommand "chart-check" {
  nativeBuildInputs = [ pkgs.kubernetes-helm (pkgs.python3.withPackages (p: [ p.pyyaml ])) ];
  CHART_TEST_SKIP_SCHEMA_VALIDATION = "1";
} ''
  cp -r ${src + "/chart"} chart && chmod -R u+w chart
  python3 chart/kai-resource-isolator/tests/chart_test.py helm
  touch $out
''
