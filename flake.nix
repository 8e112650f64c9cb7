{
  description = "kai-resource-isolator: hard per-container GPU memory caps for KAI-Scheduler GPU sharing (HAMi-core libvgpu)";

  inputs = {
    # crane's master needs nixpkgs >= 26.05; both are pinned in flake.lock.
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";
    crane.url = "github:ipetkov/crane";
    # HAMi-core at the commit the libvgpu/ submodule pins: the build never
    # needs the submodule checked out.
    hami-core = {
      url = "github:Project-HAMi/HAMi-core/02279deb82cc24d0ba7883907d94604dba505dbb";
      flake = false;
    };
  };

  outputs = { self, nixpkgs, crane, hami-core }:
    let
      # arm64 GPU nodes (Grace Hopper, GB10) get the same services,
      # libvgpu.so and image.
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAll = f: nixpkgs.lib.genAttrs systems (system:
        f (import ./nix/project.nix {
          pkgs = import ./nix/pkgs.nix { inherit nixpkgs system; };
          inherit crane;
          src = ./.;
          hamiCoreSrc = hami-core;
        }));
    in
    {
      packages = forAll (p: p.packages);
      checks = forAll (p: p.checks);
      devShells = forAll (p: { default = p.devShell; });
    };
}
