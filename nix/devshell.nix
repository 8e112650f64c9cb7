# `nix develop`: everything to build, test and try the project.
{ pkgs }:
pkgs.mkShell {
  packages = with pkgs; [
    cargo rustc clippy rustfmt cargo-nextest
    protobuf # protoc is optional (protox compiles the protos), handy for debugging
    kubernetes-helm kind kubectl grpcurl
    python3 python3Packages.pyyaml
    zig cmake binutils
  ];
}
