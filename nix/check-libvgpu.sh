#!/usr/bin/env bash
# Checks a libvgpu.so is fit to be preloaded into arbitrary workload images.
# Usage: check-libvgpu.sh LIB [GLIBC_CEILING [CPU]]
#   CPU: x86_64 or aarch64, the machine the library must be built for.
# Fails when:
# - it is not a 64-bit ELF shared object for CPU (when given): a library for
#   the wrong machine is silently skipped by the loader, so nothing is capped;
# - any GLIBC_x.y symbol version it needs is newer than the ceiling;
# - it has a NEEDED entry other than libc, libdl, libpthread, librt (or the
#   loader): driver libraries must be dlopen'ed, not linked;
# - it has a RUNPATH or RPATH (least of all into /nix/store);
# - it is the Release flavour: the CUDA entry points (cuMemAlloc_v2) must be
#   exported, not only dlsym.
set -euo pipefail
lib="$1"
ceiling="${2:-2.17}"
cpu="${3:-}"
fail=0
say() { printf '%s\n' "$*"; }

[ -f "$lib" ] || { say "no such file: $lib"; exit 2; }

newer_than() { # newer_than A B: A > B as versions
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n1)" = "$1" ]
}

if [ -n "$cpu" ]; then
  case "$cpu" in
    x86_64) want_machine='Advanced Micro Devices X86-64' ;;
    aarch64) want_machine='AArch64' ;;
    *) say "unknown CPU '$cpu' (x86_64 or aarch64)"; exit 2 ;;
  esac
  header=$(readelf -h "$lib" 2>/dev/null) || { say "FAIL: $lib is not an ELF file"; exit 1; }
  machine=$(printf '%s\n' "$header" | sed -n 's/^ *Machine: *//p')
  class=$(printf '%s\n' "$header" | sed -n 's/^ *Class: *//p')
  type=$(printf '%s\n' "$header" | sed -n 's/^ *Type: *\([A-Z]*\).*/\1/p')
  if [ "$machine" != "$want_machine" ] || [ "$class" != ELF64 ] || [ "$type" != DYN ]; then
    say "FAIL: $class $type for '$machine', not an ELF64 shared object for $cpu ('$want_machine')"
    fail=1
  fi
fi

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
  say "ok: $lib${cpu:+ ($cpu)} needs glibc <= $ceiling (max ${versions##*$'\n'}), NEEDED: $(echo $needed), no RUNPATH"
fi
exit "$fail"
