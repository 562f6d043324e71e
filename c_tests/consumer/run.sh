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
test -f "$prefix/lib/cmake/orbite/orbiteConfig.cmake"
test -f "$prefix/lib/cmake/orbite/orbiteConfigVersion.cmake"
test -f "$prefix/lib/pkgconfig/orbite.pc"
# Relocatable: move the whole prefix, then consume it from the new place.
mv "$prefix" "$work/moved"; prefix="$work/moved"
cmake -S "$src/c_tests/consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
"$work/cmake-build/consumer_shared"
"$work/cmake-build/consumer_static"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -Wall -Wextra -Werror -o "$work/pc_shared" "$src/c_tests/consumer/consumer.c" \
   $(pkg-config --cflags --libs orbite) -Wl,-rpath,"$prefix/lib"
"$work/pc_shared"
cc -Wall -Wextra -Werror -o "$work/pc_static" "$src/c_tests/consumer/consumer.c" \
   $(pkg-config --cflags orbite) "$prefix/lib/liborbite.a" $(pkg-config --libs-only-l --static orbite | sed 's/-lorbite//')
"$work/pc_static"
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
