# HAMi-core's libvgpu.so, built the way it must be to work when preloaded
# into arbitrary images (DESIGN.md §9):
# - CMAKE_BUILD_TYPE=Debug: the Release flavour hides every symbol but
#   dlsym and strips them, so programs linking libcuda directly bypass it;
# - compiled with `zig cc` against glibc ${glibcCeiling}, so it loads in
#   images with old glibc (nixpkgs' glibc is far newer);
# - not linked against libcuda/libnvidia-ml: libvgpu finds the real driver
#   with dlopen/dlsym at run time, so no NEEDED entry and no RUNPATH may
#   point at /nix/store. ./check-libvgpu.sh enforces all of it.
{ pkgs, src, glibcCeiling ? "2.17" }:
let
  cuda = pkgs.cudaPackages;
  cudaHome = pkgs.symlinkJoin {
    name = "cuda-headers";
    paths = [ cuda.cuda_cudart.dev cuda.cuda_nvml_dev cuda.cuda_cccl ];
  };
  target = "x86_64-linux-gnu.${glibcCeiling}";
  zigCc = pkgs.writeShellScriptBin "cc" ''
    export ZIG_GLOBAL_CACHE_DIR="$TMPDIR/zig-cache" ZIG_LOCAL_CACHE_DIR="$TMPDIR/zig-cache"
    exec ${pkgs.zig}/bin/zig cc -target ${target} "$@"
  '';
in
pkgs.stdenv.mkDerivation {
  pname = "hami-core";
  version = "1.2-02279de";
  inherit src;

  nativeBuildInputs = [ pkgs.cmake pkgs.binutils pkgs.gnugrep ];
  CUDA_HOME = cudaHome;

  postPatch = ''
    # Driver libraries are resolved at run time (dlopen), never linked.
    substituteInPlace src/CMakeLists.txt \
      --replace-fail "target_link_libraries(\''${LIBVGPU} PUBLIC -lcuda -lnvidia-ml)" \
                     "target_link_libraries(\''${LIBVGPU} PUBLIC -ldl -lpthread -lrt)"
  '';

  cmakeFlags = [
    "-DCMAKE_BUILD_TYPE=Debug"
    "-DDLSYM_HOOK_ENABLE=1"
    "-DMULTIPROCESS_LIMIT_ENABLE=1"
    "-DHOOK_MEMINFO_ENABLE=1"
    "-DHOOK_NVML_ENABLE=1"
    "-DCMAKE_C_COMPILER=${zigCc}/bin/cc"
    "-DCMAKE_SKIP_RPATH=ON"
  ];

  # Only the library; upstream's test/ programs need a GPU.
  buildFlags = [ "vgpu" ];
  dontStrip = true;
  dontPatchELF = true;

  installPhase = ''
    runHook preInstall
    install -Dm755 libvgpu.so $out/lib/libvgpu.so
    runHook postInstall
  '';

  doInstallCheck = true;
  installCheckPhase = ''
    bash ${./check-libvgpu.sh} $out/lib/libvgpu.so ${glibcCeiling}
  '';
}
