#!/usr/bin/env bash
# Checks a libvgpu.so is fit to be preloaded into arbitrary workload images
# (DESIGN.md §9). Usage: check-libvgpu.sh LIB [GLIBC_CEILING]
# Fails when:
# - any GLIBC_x.y symbol version it needs is newer than the ceiling;
# - it has a NEEDED entry other than libc, libdl, libpthread, librt (or the
#   loader): driver libraries must be dlopen'ed, not linked;
# - it has a RUNPATH or RPATH (least of all into /nix/store);
# - it is the Release flavour: the CUDA entry points (cuMemAlloc_v2) must be
#   exported, not only dlsym.
set -euo pipefail
lib="$1"
ceiling="${2:-2.17}"
fail=0
say() { printf '%s\n' "$*"; }

[ -f "$lib" ] || { say "no such file: $lib"; exit 2; }

newer_than() { # newer_than A B: A > B as versions
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n1)" = "$1" ]
}

versions=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV || true)
for v in $versions; do
  if newer_than "$v" "$ceiling"; then
    say "FAIL: needs GLIBC_$v, above the ceiling GLIBC_$ceiling"
    fail=1
  fi
done

dynamic=$(readelf -d "$lib")
needed=$(printf '%s\n' "$dynamic" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
for n in $needed; do
  case "$n" in
    libc.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*.so.*) ;;
    *) say "FAIL: NEEDED $n (only libc/libdl/libpthread/librt are allowed)"; fail=1 ;;
  esac
done
if printf '%s\n' "$dynamic" | grep -Eq '\((RUNPATH|RPATH)\)'; then
  say "FAIL: has $(printf '%s\n' "$dynamic" | grep -E '\((RUNPATH|RPATH)\)' | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')as RUNPATH/RPATH"
  fail=1
fi
if [ -n "${REQUIRE_CUDA_EXPORTS:-1}" ] && [ "${REQUIRE_CUDA_EXPORTS:-1}" != 0 ]; then
  if ! objdump -T "$lib" | grep -Eq '\.text.*[[:space:]]cuMemAlloc_v2$'; then
    say "FAIL: cuMemAlloc_v2 is not exported (Release flavour? build with CMAKE_BUILD_TYPE=Debug)"
    fail=1
  fi
fi

if [ "$fail" = 0 ]; then
  say "ok: $lib needs glibc <= $ceiling (max ${versions##*$'\n'}), NEEDED: $(echo $needed), no RUNPATH"
fi
exit "$fail"
