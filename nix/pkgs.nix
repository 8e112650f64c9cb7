# nixpkgs for one system. Unfree is allowed for the CUDA packages only
# (headers and stubs needed to compile HAMi-core), nothing else.
{ nixpkgs, system }:
import nixpkgs {
  inherit system;
  config.allowUnfreePredicate = pkg:
    let name = nixpkgs.lib.getName pkg;
    in nixpkgs.lib.hasPrefix "cuda" name || nixpkgs.lib.hasPrefix "libcu" name || name == "cuda_nvml_dev";
}
