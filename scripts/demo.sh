#!/usr/bin/env bash
# The main job: build liborbite and run the two-process demo on loopback.
# Its own build directory (build-demo/) never touches a build/ of yours; the
# Rust build goes to target/, shared with scripts/test.sh and cargo.
# Usage: scripts/demo.sh [MiB] [--stats]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
step "checking the tools (installs what is missing with apt-get)"
scripts/ensure-tools.sh
unset CUDARC_CUDA_VERSION
step "configuring the build (cmake, build-demo/)"
cmake -S . -B build-demo -DORBITE_CARGO_TARGET_DIR="$PWD/target" >/dev/null
step "building liborbite and the demo (cargo build --release: the first build downloads and compiles every crate, a few minutes; later ones take seconds)"
cmake --build build-demo -j"$(nproc)" --target transfer_demo
step "running the demo: two processes, TCP then SHM"
[ $# -gt 0 ] || set -- 256
build-demo/examples_c/transfer_demo "$@"
step "done"
