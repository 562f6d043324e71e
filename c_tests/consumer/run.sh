#!/bin/sh
# Installs the build tree into a fresh prefix, then builds and runs an
# independent consumer with find_package(orbite) and with pkg-config.
set -eu
build="$1"; src="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
test -L "$prefix/lib/liborbite.so"
test -f "$prefix/lib/liborbite.so.1"
test -f "$prefix/lib/liborbite.a"
test -f "$prefix/include/orbite.h"
test -f "$prefix/include/orbite.hpp"
test -f "$prefix/lib/cmake/orbite/orbiteConfig.cmake"
test -f "$prefix/lib/cmake/orbite/orbiteConfigVersion.cmake"
test -f "$prefix/lib/pkgconfig/orbite.pc"
test -x "$prefix/bin/orbite-bench"
test -x "$prefix/bin/orbite-doctor"
# The doctor runs from the package: without a transport asked it exits 0
# whatever this machine has, and its first line is the driver's.
"$prefix/bin/orbite-doctor" >"$work/doctor.out"
head -n 1 "$work/doctor.out" | grep -Eq '^(ok  |FAIL) driver: '
# Installed artifacts are stripped (the shared library at most 5 MB); their
# debug information is the separate `debug` component, found through
# .gnu_debuglink.
size=$(wc -c <"$prefix/lib/liborbite.so.1")
if [ "$size" -gt 5000000 ]; then echo "the installed liborbite.so.1 has $size bytes (more than 5 MB)"; exit 1; fi
test ! -e "$prefix/lib/.debug"
cmake --install "$build" --prefix "$prefix" --component debug >/dev/null
test -f "$prefix/lib/.debug/liborbite.so.1.debug"
test -f "$prefix/bin/.debug/orbite-bench.debug"
test -f "$prefix/bin/.debug/orbite-doctor.debug"
readelf -p .gnu_debuglink "$prefix/lib/liborbite.so.1" | grep -q 'liborbite.so.1.debug'
readelf -p .gnu_debuglink "$prefix/bin/orbite-bench" | grep -q 'orbite-bench.debug'
readelf -p .gnu_debuglink "$prefix/bin/orbite-doctor" | grep -q 'orbite-doctor.debug'
# The package's version rule (docs/versioning.md): before 1.0 a consumer
# asking for the previous minor release is refused, one asking for this
# minor release is served.
version="$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' "$src/Cargo.toml" | head -n 1)"
major="${version%%.*}"; rest="${version#*.}"; minor="${rest%%.*}"
if [ "$major" -eq 0 ] && [ "$minor" -gt 0 ]; then
  mkdir -p "$work/old-consumer"
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(old NONE)\nfind_package(orbite 0.%s REQUIRED)\n' \
    "$((minor - 1))" >"$work/old-consumer/CMakeLists.txt"
  if cmake -S "$work/old-consumer" -B "$work/old-consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
       >"$work/old-consumer.log" 2>&1; then
    echo "find_package(orbite 0.$((minor - 1))) accepted $version"; exit 1
  fi
  grep -q "$version" "$work/old-consumer.log" || { cat "$work/old-consumer.log"; exit 1; }
fi
# Relocatable: move the whole prefix, then consume it from the new place.
mv "$prefix" "$work/moved"; prefix="$work/moved"
cmake -S "$src/c_tests/consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer_shared"
"$work/cmake-build/consumer_static"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# The README's pkg-config line: with the rpath pkg-config gives, the program
# starts without LD_LIBRARY_PATH. The same for C++ with orbite.hpp.
cc -Wall -Wextra -Werror -o "$work/pc_shared" "$src/c_tests/consumer/consumer.c" \
   $(pkg-config --cflags --libs orbite) -Wl,-rpath,"$(pkg-config --variable=libdir orbite)"
env -u LD_LIBRARY_PATH "$work/pc_shared"
c++ -std=c++17 -Wall -Wextra -Werror -o "$work/pc_kv_decode" "$src/examples_cpp/kv_decode.cpp" \
   $(pkg-config --cflags --libs orbite) -Wl,-rpath,"$(pkg-config --variable=libdir orbite)"
rc=0
env -u LD_LIBRARY_PATH "$work/pc_kv_decode" >"$work/pc_kv_decode.log" 2>&1 || rc=$?
if [ "$rc" -ne 1 ] || ! grep -q -- '--endpoint IP:PORT is required' "$work/pc_kv_decode.log"; then
  echo "pc_kv_decode did not start ($rc):"; cat "$work/pc_kv_decode.log"; exit 1
fi
cc -Wall -Wextra -Werror -o "$work/pc_static" "$src/c_tests/consumer/consumer.c" \
   $(pkg-config --cflags orbite) "$prefix/lib/liborbite.a" $(pkg-config --libs-only-l --static orbite | sed 's/-lorbite//')
"$work/pc_static"
# The C++ layer: the two-process KV-cache example (examples_cpp) built as an
# independent project against the installed package, with orbite.hpp only:
# no C call, no cast, no JSON text read by hand. Then run over TCP and SHM,
# and with each side killed once.
if grep -nE '\borbite_[a-z_]+\(|_cast<|\((u?int[0-9]+_t|uintptr_t|char|void) *\*? *\)|json' \
     "$src"/examples_cpp/kv_*.cpp "$src"/examples_cpp/kv_pool.hpp; then
  echo "the KV example must use orbite.hpp only (no C calls, casts or JSON reading)"; exit 1
fi
cmake -S "$src/examples_cpp" -B "$work/kv-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/kv-build" >/dev/null
for mode in tcp shm killed-prefill killed-decode; do
  sh "$src/examples_cpp/run_kv.sh" "$work/kv-build/kv_prefill" "$work/kv-build/kv_decode" "$mode" >"$work/kv-$mode.log" 2>&1 \
    || { cat "$work/kv-$mode.log"; exit 1; }
  tail -n 1 "$work/kv-$mode.log"
done
# The CUDA side of the C ABI from the installed package, with the driver
# loaded at run time: here the CPU stand-in for the driver (built by the
# tests, never installed; on a GPU machine the real libcuda.so.1 serves).
cc -Wall -Wextra -Werror -o "$work/pc_nvlink" "$src/c_tests/consumer/consumer_nvlink.c" \
   $(pkg-config --cflags --libs orbite) -ldl -Wl,-rpath,"$prefix/lib"
mkdir -p "$work/fakecuda"
cc -shared -fPIC -O2 -pthread -fvisibility=hidden -o "$work/fakecuda/libcuda.so.1" "$src/tests/fakecuda/fakecuda.c"
# Exit 77 (skipped) passes only where this build was configured without
# CUDA (-DORBITE_CUDA=OFF) and the program says liborbite has no CUDA; in a
# CUDA build every other outcome than 0 fails.
cuda="$(sed -n 's/^ORBITE_CUDA:BOOL=//p' "$build/CMakeCache.txt")"
rc=0
LD_LIBRARY_PATH="$work/fakecuda" "$work/pc_nvlink" >"$work/pc_nvlink.out" 2>&1 || rc=$?
cat "$work/pc_nvlink.out"
if [ "$rc" -eq 77 ]; then
  if [ "$cuda" != "OFF" ] || ! grep -q "skipped: this build of liborbite has no CUDA support" "$work/pc_nvlink.out"; then
    echo "consumer_nvlink skipped (77) in a build configured with ORBITE_CUDA=$cuda: a skip is not a pass here"
    exit 1
  fi
  echo "consumer_nvlink: skipped, as it must in a build without CUDA"
elif [ "$rc" -ne 0 ]; then
  echo "consumer_nvlink failed with $rc"; exit 1
fi
echo "installed-package consumers: ok"
