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
rc=0
LD_LIBRARY_PATH="$work/fakecuda" "$work/pc_nvlink" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
  echo "consumer_nvlink failed with $rc"; exit 1
fi
echo "installed-package consumers: ok"
