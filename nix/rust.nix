# The Rust workspace with crane: dependencies built once, one package per
# binary, and the workspace checks (clippy, fmt, nextest).
{ pkgs, crane, src }:
let
  craneLib = crane.mkLib pkgs;
  lib = pkgs.lib;
  # Only what cargo needs: proto/ is read by services/proto/build.rs.
  source = lib.fileset.toSource {
    root = src;
    fileset = lib.fileset.unions [
      (src + "/Cargo.toml")
      (src + "/Cargo.lock")
      (src + "/services")
      (src + "/proto")
    ];
  };
  common = {
    src = source;
    pname = "kai-resource-isolator";
    version = "0.1.0";
    strictDeps = true;
    # protox compiles the protos in pure Rust: no protoc needed.
    nativeBuildInputs = [ pkgs.pkg-config ];
  };
  cargoArtifacts = craneLib.buildDepsOnly common;
  binary = name: craneLib.buildPackage (common // {
    inherit cargoArtifacts;
    pname = name;
    cargoExtraArgs = "--locked --bin ${name}";
    doCheck = false;
  });
in
{
  kai-webhook = binary "kai-webhook";
  kai-node = binary "kai-node";
  kai-csi = binary "kai-csi";
  kai-aggregator = binary "kai-aggregator";
  kai-demo = binary "kai-demo";
  kubectl-vgpu = binary "kubectl-vgpu";
  checks = {
    clippy = craneLib.cargoClippy (common // {
      inherit cargoArtifacts;
      cargoClippyExtraArgs = "--workspace --all-targets -- -D warnings";
    });
    fmt = craneLib.cargoFmt { src = source; inherit (common) pname version; };
    nextest = craneLib.cargoNextest (common // {
      inherit cargoArtifacts;
      cargoNextestExtraArgs = "--workspace";
    });
  };
}
