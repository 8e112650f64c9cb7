# HAMi-core's libvgpu.so, built the way it must be to work when preloaded
# into arbitrary images:
# - CMAKE_BUILD_TYPE=Debug: the Release flavour hides every symbol but
#   dlsym and strips them, so programs linking libcuda directly bypass it;
# - compiled with `zig cc` against glibc ${glibcCeiling} for this system's
#   CPU (x86_64 or aarch64), so it loads in images with old glibc
#   (nixpkgs' glibc is far newer);
# - not linked against libcuda/libnvidia-ml: libvgpu finds the real driver
#   with dlopen/dlsym at run time, so no NEEDED entry and no RUNPATH may
#   point at /nix/store. ./check-libvgpu.sh enforces all of it.
{ pkgs, src, glibcCeiling ? "2.17" }:
let
  cuda = pkgs.cudaPackages;
  # Headers only (cuda.h, nvml.h and what they include). Each CUDA package
  # puts them in its `include` output; lib.getInclude falls back to the
  # package itself where there is none.
  cudaHome = pkgs.symlinkJoin {
    name = "cuda-headers";
    paths = map pkgs.lib.getInclude [ cuda.cuda_cudart cuda.cuda_nvml_dev (cuda.cccl or cuda.cuda_cccl) ];
  };
  cpu = pkgs.stdenv.hostPlatform.parsed.cpu.name; # x86_64 or aarch64
  target = "${cpu}-linux-gnu.${glibcCeiling}";
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
    # upstream's test/ runs find_package(CUDA REQUIRED) at configure time,
    # which needs nvcc; its programs need a GPU anyway.
    substituteInPlace CMakeLists.txt --replace-fail "add_subdirectory(test)" ""
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
    # upstream asks for CMake 2.8.11, which CMake 4 refuses.
    "-DCMAKE_POLICY_VERSION_MINIMUM=3.5"
  ];

  # Only the library.
  buildFlags = [ "vgpu" ];
  dontStrip = true;
  dontPatchELF = true;

  installPhase = ''
    runHook preInstall
    install -Dm755 libvgpu.so $out/lib/libvgpu.so
    runHook postInstall
  '';

  # What the ELF check (here and in the flake's checks) holds it to.
  passthru = { inherit glibcCeiling cpu; };

  doInstallCheck = true;
  installCheckPhase = ''
    bash ${./check-libvgpu.sh} $out/lib/libvgpu.so ${glibcCeiling} ${cpu}
  '';
}
