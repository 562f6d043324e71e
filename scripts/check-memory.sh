#!/usr/bin/env bash
# The C and C++ tests (c_tests/, the examples, orbite.hpp's test_cpp_api and
# the two-process KV example) under ASan + UBSan (ORBITE_SANITIZE=ON), then
# under valgrind memcheck (`ctest -T memcheck`; the tests that are shell
# scripts driving other programs are left to the sanitizers). Any sanitizer
# report, valgrind error or definite leak fails a test and so this script.
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
cmake -S . -B build-test -DORBITE_CARGO_TARGET_DIR="$PWD/target" >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test -T memcheck -E 'install_consumer|docs_test|example_kv_|tent_orbite_|nixl_' --output-on-failure
