#!/usr/bin/env bash
# Builds Mooncake's TENT at the pinned commit with OrbiTE as a transport and
# runs, against real TENT: the format check of TENT's CI on the adapter, the
# adapter's life-cycle tests (tent_orbite_transport_test: TENT's engine
# through its public API, two processes) and tebench over TENT's TCP,
# TENT's SHM, OrbiTE and OrbiTE held to TCP (scripts/tent-bench.sh),
# optionally with CPU hogs running. OrbiTE's own CI does not run this (it
# has no TENT tree); it runs the shim tests (ctest tent_orbite_*).
#
#   scripts/tent-check.sh MOONCAKE_DIR [options]
#     --work DIR       builds, installs and logs (default /tmp/tent-check); reused: a
#                      rerun rebuilds only what changed
#     --prefix DIR     where OrbiTE (and yalantinglibs) are installed (default WORK/prefix)
#     --tent-build DIR TENT's build directory (default WORK/tent)
#     --hogs N         run N `yes > /dev/null` during tebench (default 0)
#     --duration S     seconds per tebench point (default 2)
#     --rounds R       tebench rounds, alternated, medians printed (default 1)
#     --sizes "S ..."  tebench only at these sizes in bytes (default 4096 65536 1048576 8388608)
#     --ops "OP ..."   tebench only these operations, of read write (default both)
#     --xports "X ..." tebench only these transports, of tcp shm orbite orbite-tcp
#                      (default all four)
#     --no-check       no checked (mix) tebench runs before the timed ones
#     --skip-tests | --skip-bench | --skip-format
#
# MOONCAKE_DIR is a Mooncake source tree (a clone or an export) at commit
# 3b5a594 with its submodules populated (extern/yalantinglibs,
# extern/pybind11). The script copies the adapter's files in
# (integrations/tent: include/, src/, tests/orbite_transport_test.cpp) and
# applies integrations/tent/tent.patch (TENT's own files; applied once, a
# tree that has it already is left as is). Needs: cmake, a C++20 compiler,
# cargo, protoc, python3 (for the pinned clang-format), glog, gflags,
# libnuma, jsoncpp, libcurl, liburing, hiredis, yaml-cpp, libibverbs
# headers, and googletest sources (Debian: googletest, at
# /usr/src/googletest; TENT's CMake would download them).
#
# The figures: lines "orbite-lifecycle: ..." of the life-cycle tests and
# tebench's table, with the load average before and after, all in
# WORK/summary.txt.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
mooncake="$(cd "${1:?usage: scripts/tent-check.sh MOONCAKE_DIR [options]}" && pwd)"
shift
work=/tmp/tent-check hogs=0 duration=2 rounds=1 tests=1 bench=1 format=1 prefix="" tent_build=""
bench_env=()
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work="$2"; shift ;;
    --prefix) prefix="$2"; shift ;;
    --tent-build) tent_build="$2"; shift ;;
    --hogs) hogs="$2"; shift ;;
    --duration) duration="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --sizes) bench_env+=("TENT_BENCH_SIZES=$2"); shift ;;
    --ops) bench_env+=("TENT_BENCH_OPS=$2"); shift ;;
    --xports) bench_env+=("TENT_BENCH_XPORTS=$2"); shift ;;
    --no-check) bench_env+=(TENT_BENCH_CHECK=0) ;;
    --skip-tests) tests=0 ;;
    --skip-bench) bench=0 ;;
    --skip-format) format=0 ;;
    *) echo "tent-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$work"
work="$(cd "$work" && pwd)"
prefix="${prefix:-$work/prefix}"
tent_build="${tent_build:-$work/tent}"
summary="$work/summary.txt"
jobs="${TENT_CHECK_JOBS:-$(nproc)}"
say() { echo "== $* ==" | tee -a "$summary"; }
: > "$summary"

# ---- the pinned tree -------------------------------------------------------
# Blobs of 3b5a594 the adapter is written against (unchanged by the patch).
tent="$mooncake/mooncake-transfer-engine/tent"
declare -A pinned=(
  [mooncake-transfer-engine/tent/include/tent/runtime/transport.h]=93bf585a9ccc928d241714aac48768a92f0e93ef
  [mooncake-transfer-engine/tent/include/tent/runtime/segment_manager.h]=26fccd234bfe47aa3034b96f179ccd8be1392a75
  [mooncake-transfer-engine/tent/src/runtime/segment_manager.cpp]=618117190015fbd89916688cc4fda23dd2e3bc9d
)
for f in "${!pinned[@]}"; do
  got="$(git hash-object "$mooncake/$f" 2>/dev/null || echo missing)"
  if [ "$got" != "${pinned[$f]}" ]; then
    echo "tent-check: $f is not Mooncake 3b5a594's (blob $got); check out commit 3b5a594" >&2
    exit 1
  fi
done
for sub in yalantinglibs pybind11; do
  if [ ! -f "$mooncake/extern/$sub/CMakeLists.txt" ]; then
    echo "tent-check: extern/$sub is empty: populate Mooncake's submodules (git submodule update --init)" >&2
    exit 1
  fi
done

# ---- the edits -------------------------------------------------------------
say "the adapter copied into TENT's tree, integrations/tent/tent.patch applied"
mkdir -p "$tent/include/tent/transport/orbite" "$tent/src/transport/orbite"
cp "$here/integrations/tent/include/tent/transport/orbite/orbite_transport.h" "$tent/include/tent/transport/orbite/"
cp "$here/integrations/tent/src/transport/orbite/"{orbite_transport.cpp,orbite_workers.h,orbite_workers.cpp,CMakeLists.txt} \
  "$tent/src/transport/orbite/"
cp "$here/integrations/tent/tests/orbite_transport_test.cpp" "$tent/tests/"
patch_file="$here/integrations/tent/tent.patch"
if (cd "$mooncake" && git apply --reverse --check "$patch_file" 2>/dev/null); then
  echo "tent.patch: applied already" | tee -a "$summary"
else
  (cd "$mooncake" && git apply "$patch_file")
  echo "tent.patch: applied" | tee -a "$summary"
fi

if [ "$format" = 1 ]; then
  say "clang-format 20 (PyPI wheel, pinned) with Mooncake's own .clang-format"
  "$here/integrations/tent/format.sh" "$work/clang-format-venv" | tee -a "$summary"
  (cd "$tent" && "$work/clang-format-venv/bin/clang-format" --dry-run --Werror --style="file:$mooncake/.clang-format" \
    include/tent/transport/orbite/orbite_transport.h src/transport/orbite/*.h src/transport/orbite/*.cpp \
    tests/orbite_transport_test.cpp)
  echo "the adapter is clean under $mooncake/.clang-format" | tee -a "$summary"
fi

# ---- builds (each reused by a rerun) -----------------------------------------
say "OrbiTE installed into $prefix"
orbite_cargo="${ORBITE_CARGO_TARGET_DIR:-$work/orbite/cargo}"
# OrbiTE's build folder is reused between runs; one configured from another
# checkout (a moved or deleted clone) would make CMake refuse it, so it is
# configured afresh when its cache names another source folder.
if [ -f "$work/orbite/CMakeCache.txt" ] &&
  ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$here" "$work/orbite/CMakeCache.txt"; then
  rm -rf "$work/orbite/CMakeCache.txt" "$work/orbite/CMakeFiles"
fi
cmake -S "$here" -B "$work/orbite" -DCMAKE_BUILD_TYPE=Release -DORBITE_BUILD_TESTS=OFF -DORBITE_BUILD_EXAMPLES=OFF \
  -DORBITE_ETCD=OFF -DORBITE_CARGO_TARGET_DIR="$orbite_cargo" > "$work/orbite-configure.log"
cmake --build "$work/orbite" -j"$jobs" > "$work/orbite-build.log"
cmake --install "$work/orbite" --prefix "$prefix" > /dev/null
if [ ! -d "$prefix/lib/cmake/yalantinglibs" ] && [ ! -d "$prefix/share/yalantinglibs" ]; then
  say "yalantinglibs (Mooncake's submodule) installed into $prefix"
  cmake -S "$mooncake/extern/yalantinglibs" -B "$work/ylt" -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF \
    -DBUILD_UNIT_TESTS=OFF > "$work/ylt.log"
  cmake --install "$work/ylt" --prefix "$prefix" >> "$work/ylt.log"
fi
say "TENT (USE_TENT, USE_ORBITE, CPU only): tebench and tent_orbite_transport_test"
gtest_src=()
[ -d /usr/src/googletest ] && gtest_src=(-DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest)
cmake -S "$mooncake/mooncake-transfer-engine" -B "$tent_build" -DUSE_TENT=ON -DUSE_ORBITE=ON \
  -DBUILD_UNIT_TESTS=ON -DBUILD_EXAMPLES=OFF -DWITH_METRICS=OFF -DCMAKE_BUILD_TYPE=Release \
  "${gtest_src[@]}" "-DCMAKE_PREFIX_PATH=$prefix" -DPYTHON_EXECUTABLE="$(command -v python3)" \
  > "$work/tent-configure.log"
cmake --build "$tent_build" -j"$jobs" --target tebench tent_orbite_transport_test > "$work/tent-build.log"
# The adapter compiles without a warning in TENT's build.
if grep -n "orbite.*warning" "$work/tent-build.log"; then
  echo "tent-check: the adapter compiled with warnings (above)" >&2
  exit 1
fi
export LD_LIBRARY_PATH="$prefix/lib:$tent_build/mooncake-common${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

load() { cut -d' ' -f1-3 /proc/loadavg; }

# ---- life cycle ------------------------------------------------------------
status=0
if [ "$tests" = 1 ]; then
  say "life cycle against real TENT (load average $(load))"
  test_bin="$(find "$tent_build" -name tent_orbite_transport_test -type f -perm -u+x | head -n 1)"
  if "$test_bin" > "$work/lifecycle.log" 2>&1; then
    echo "tent_orbite_transport_test: passed" | tee -a "$summary"
  else
    echo "tent_orbite_transport_test: FAILED (see $work/lifecycle.log)" | tee -a "$summary"
    status=1
  fi
  grep -h "orbite-lifecycle:" "$work/lifecycle.log" | tee -a "$summary" || true
  echo "load average after: $(load)" | tee -a "$summary"
fi

# ---- tebench ---------------------------------------------------------------
if [ "$bench" = 1 ]; then
  hog_pids=()
  stop_hogs() {
    for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${hog_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    hog_pids=()
  }
  trap stop_hogs EXIT
  for _ in $(seq 1 "$hogs"); do
    yes > /dev/null &
    hog_pids+=($!)
  done
  say "tebench, $hogs CPU hogs, $rounds round(s) of ${duration} s points (load average $(load))"
  tebench="$(find "$tent_build" -name tebench -type f -perm -u+x | head -n 1)"
  env "${bench_env[@]}" TENT_BENCH_LOG="$work/tebench.log" TENT_BENCH_ROUNDS="$rounds" \
    "$here/scripts/tent-bench.sh" "$tebench" "$duration" \
    | tee -a "$summary" || status=1
  echo "load average after: $(load)" | tee -a "$summary"
  stop_hogs
fi
echo "tent-check: summary in $summary"
exit "$status"
