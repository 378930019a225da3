#!/usr/bin/env bash
# Builds and runs the standalone kernel tests (csrc/tests/kernel_test.cpp) with one compiler.
#
#   csrc/tests/run_kernel_tests.sh CXX OUTDIR [RUNNER ...]
#
# CXX: g++, clang++, aarch64-linux-gnu-g++, ...; RUNNER: how to run a binary of that target
# (e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`). Each kernel file gets the flags setup.py gives it
# (kernel_base.cpp: the explicit baseline). On x86-64 a second binary runs the AVX-512 variant on
# scalar stand-ins of its intrinsics, so it is tested on CPUs without AVX-512. On aarch64 the object
# is checked for the NEON Philox (vector 32x32->64 multiplies, the interleaving store).
set -euo pipefail
cxx=$1
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
csrc=$(dirname "$here")
mkdir -p "$out"
target=$($cxx -dumpmachine)
flags=(-std=c++17 -O2 -ffp-contract=off -fno-trapping-math -fno-math-errno -Wall -Wextra -Wno-psabi -I"$csrc")
case $target in
  x86_64*) base_flags=(-march=x86-64 -mtune=generic) ;;
  aarch64*) base_flags=(-march=armv8-a) ;;
  *) base_flags=() ;;
esac
echo "== kernel tests: $cxx ($target) -> $out"
$cxx "${flags[@]}" "${base_flags[@]}" -c "$csrc/kernel_base.cpp" -o "$out/kernel_base.o" &
$cxx "${flags[@]}" -c "$csrc/kernel_avx2.cpp" -o "$out/kernel_avx2.o" &
$cxx "${flags[@]}" -c "$csrc/kernel_avx512.cpp" -o "$out/kernel_avx512.o" &
$cxx "${flags[@]}" "${base_flags[@]}" -c "$here/kernel_test.cpp" -o "$out/kernel_test.o" &
wait
$cxx -o "$out/kernel_test" "$out"/kernel_test.o "$out"/kernel_base.o "$out"/kernel_avx2.o "$out"/kernel_avx512.o -lm
"$@" "$out/kernel_test"
case $target in
  x86_64*)
    $cxx "${flags[@]}" -O1 -DSPECDEC_EMULATE_AVX512 -c "$csrc/kernel_avx512.cpp" -o "$out/kernel_avx512_emulated.o"
    $cxx "${flags[@]}" "${base_flags[@]}" -DSPECDEC_EMULATE_AVX512 -c "$here/kernel_test.cpp" -o "$out/kernel_test_emulated.o"
    $cxx -o "$out/kernel_test_emulated" "$out"/kernel_test_emulated.o "$out"/kernel_base.o "$out"/kernel_avx2.o "$out"/kernel_avx512_emulated.o -lm
    "$@" "$out/kernel_test_emulated"
    ;;
  aarch64*)
    objdump=${cxx%g++}objdump
    [[ $cxx == *clang* ]] && objdump=llvm-objdump
    listing=$("$objdump" -d "$out/kernel_base.o")
    multiplies=$(grep -cE 'umull2?[[:space:]]+v[0-9]+\.2d' <<<"$listing" || true)
    stores=$(grep -cE 'st4[[:space:]]+\{v' <<<"$listing" || true)
    floats=$(grep -cE 'f(add|mul|max|cmge|cmgt)[[:space:]]+v[0-9]+\.4s' <<<"$listing" || true)
    echo "aarch64 kernel: $multiplies vector umull, $stores st4, $floats 4-lane float ops"
    if (( multiplies < 20 || stores < 1 || floats < 50 )); then
      echo "FAIL: the aarch64 kernel is not vectorised (expected the NEON Philox and vector float loops)"
      exit 1
    fi
    ;;
esac
echo "== kernel tests passed ($cxx)"
