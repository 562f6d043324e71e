#!/usr/bin/env bash
# Every test: the cargo tests, then the C tests (and examples, and the
# installed-package consumers, and the docs test) under ctest, in its own
# build directory build-test/ (the Rust build in target/). Exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
step "checking the tools (installs what is missing with apt-get)"
scripts/ensure-tools.sh
unset CUDARC_CUDA_VERSION
# What the tests (and the processes they start) leave in the temporary
# directory (key files, traces, reports) goes with this run, pass or fail.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/orbite-test.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch"
jobs="$(nproc)"
step "cargo test (release): builds the library and every test program, then runs them"
cargo test --release --locked
# The simulators set the cores' bug switches, compiled only with the sim
# feature (never in liborbite.so): every tests/sim_*.rs, so that a new one
# cannot be left out.
sim_tests=()
for f in tests/sim_*.rs; do sim_tests+=(--test "$(basename "$f" .rs)"); done
step "protocol simulators (release, sim feature: ${sim_tests[*]})"
cargo test --release --locked --features sim "${sim_tests[@]}"
step "concurrency models (shuttle)"
cargo test --release --locked --features model-check --test models
# Every integration test compiled only with the cuda feature (driver probing,
# and NVLink/MNNVL through the CPU stand-in for the driver), found by its
# crate-level cfg so that a new one cannot be left out; built in one go with
# the etcd feature's discovery test (the crate built once for both).
cuda_tests=()
for f in tests/*.rs; do
  if grep -q '^#!\[cfg(feature = "cuda")\]' "$f"; then cuda_tests+=(--test "$(basename "$f" .rs)"); fi
done
step "cargo test (release, cuda and etcd features: every unit test, including the cuda-gated ones; ${cuda_tests[*]}; discovery against a real etcd the tests start)"
cargo test --release --locked --features cuda,etcd --lib "${cuda_tests[@]}" --test discovery
step "NIXL test venv (the pinned nixl wheels; reused when its pins match)"
integrations/nixl/tests/venv.sh "$PWD/build-test/nixl-venv"
step "C tests (ctest): configures and builds build-test/, then runs the C, C++, example, package, NIXL and docs tests"
cmake -S . -B build-test -DORBITE_CARGO_TARGET_DIR="$PWD/target" \
  -DORBITE_NIXL=ON -DORBITE_NIXL_VENV="$PWD/build-test/nixl-venv" >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs"
