#!/usr/bin/env bash
# Builds small shared libraries with this machine's gcc and checks that
# nix/check-libvgpu.sh accepts the good one and rejects each fault.
# Prints 'N passed, N failed'.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
check="$here/../check-libvgpu.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

build() { # build NAME SOURCE [gcc args...]
  local name="$1" src="$2"; shift 2
  printf '%s\n' "$src" > "$work/$name.c"
  gcc -shared -fPIC -o "$work/$name.so" "$work/$name.c" "$@"
}
expect() { # expect ok|fail LIB CEILING WHY [CPU]
  local want="$1" lib="$2" ceiling="$3" why="$4" cpu="${5:-}" out rc
  out=$(bash "$check" "$work/$lib.so" "$ceiling" ${cpu:+"$cpu"} 2>&1); rc=$?
  if { [ "$want" = ok ] && [ $rc = 0 ]; } || { [ "$want" = fail ] && [ $rc != 0 ]; }; then
    passed=$((passed + 1)); echo "ok   $why"
  else
    failed=$((failed + 1)); echo "FAIL $why: rc=$rc"; echo "$out"
  fi
}

hook='#include <stddef.h>
int cuMemAlloc_v2(void **p, size_t n) { (void)p; (void)n; return 0; }'
build good "$hook"
build new_glibc "$hook
#include <stdlib.h>
unsigned int r(void) { return arc4random(); }"
build needs_m "$hook
#include <math.h>
double f(double x) { return cos(x); }" -lm
build rpath "$hook" -Wl,-rpath,/nix/store/00000000000000000000000000000000-cuda/lib
build release '#include <stddef.h>
__attribute__((visibility("hidden"))) int cuMemAlloc_v2(void **p, size_t n) { (void)p; (void)n; return 0; }
void *dlsym_hook(void) { return 0; }'

expect ok   good      2.17 "a plain hook library passes"
host_cpu=$(uname -m)
case "$host_cpu" in x86_64) other_cpu=aarch64 ;; *) other_cpu=x86_64 ;; esac
expect ok   good      2.17 "it passes as a library for this machine ($host_cpu)" "$host_cpu"
expect fail good      2.17 "it is refused where a $other_cpu library is wanted" "$other_cpu"
printf 'not an ELF file\n' > "$work/text.so"
expect fail text      2.17 "a file that is not ELF is refused" "$host_cpu"
gcc -no-pie -o "$work/exe.so" -x c - <<'C'
int main(void) { return 0; }
C
expect fail exe       2.17 "an executable is not a shared object" "$host_cpu"
expect fail new_glibc 2.17 "arc4random needs GLIBC_2.36: above the 2.17 ceiling"
expect ok   new_glibc 2.36 "the same library passes with a 2.36 ceiling"
expect fail needs_m   2.17 "NEEDED libm is refused"
expect fail rpath     2.17 "an RPATH into /nix/store is refused"
expect fail release   2.17 "a library that does not export cuMemAlloc_v2 is refused"

echo; echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
