# Everything the flake exposes, assembled from one file per concern.
{ pkgs, crane, src, hamiCoreSrc }:
let
  rust = import ./rust.nix { inherit pkgs crane src; };
  hami-core = import ./hami-core.nix { inherit pkgs; src = hamiCoreSrc; };
  image = import ./image.nix { inherit pkgs hami-core; inherit (rust) kai-webhook kai-node kai-csi kai-aggregator kubectl-vgpu; };
in
{
  packages = {
    inherit (rust) kai-webhook kai-node kai-csi kai-aggregator kai-demo kubectl-vgpu;
    inherit hami-core image;
    default = image;
  };
  checks = rust.checks // {
    inherit hami-core; # its install check already refuses a bad library
    # The ELF check on the library the image ships, as a check of its own:
    # machine for this system, glibc ceiling, NEEDED set, no RUNPATH,
    # exported CUDA hooks.
    libvgpu-elf = pkgs.runCommand "libvgpu-elf-check" { nativeBuildInputs = [ pkgs.binutils ]; } ''
      bash ${./check-libvgpu.sh} ${hami-core}/lib/libvgpu.so ${hami-core.glibcCeiling} ${hami-core.cpu}
      touch $out
    '';
    chart = import ./chart-check.nix { inherit pkgs src; };
  };
  devShell = import ./devshell.nix { inherit pkgs; };
}
