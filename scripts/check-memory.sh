#!/usr/bin/env bash
# The C tests under ASan + UBSan (ORBITE_SANITIZE=ON), then under valgrind
# memcheck (`ctest -T memcheck`). Any sanitizer report, valgrind error or
# definite leak fails a test and so this script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-tools.sh
jobs="$(nproc)"
echo "== C tests under ASan + UBSan =="
cmake -S . -B build-asan -DORBITE_SANITIZE=ON -DORBITE_CARGO_TARGET_DIR="$PWD/target" >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
echo "== C tests under valgrind memcheck =="
cmake -S . -B build -DORBITE_CARGO_TARGET_DIR="$PWD/target" >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build -T memcheck -E install_consumer --output-on-failure
