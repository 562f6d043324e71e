#!/usr/bin/env bash
# The main job: build liborbite and run the two-process demo on loopback.
# Its own build directory (build-demo/) never touches a build/ of yours; the
# Rust build goes to target/, shared with scripts/test.sh and cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-tools.sh
unset CUDARC_CUDA_VERSION
cmake -S . -B build-demo -DORBITE_CARGO_TARGET_DIR="$PWD/target" >/dev/null
cmake --build build-demo -j"$(nproc)" --target transfer_demo
exec build-demo/examples_c/transfer_demo "${1:-256}"
