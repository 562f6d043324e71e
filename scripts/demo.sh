#!/usr/bin/env bash
# The main job: build liborbite and run the two-process demo on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-tools.sh
unset CUDARC_CUDA_VERSION
cmake -S . -B build -DORBITE_CARGO_TARGET_DIR="$PWD/target" >/dev/null
cmake --build build -j"$(nproc)" --target transfer_demo
exec build/examples_c/transfer_demo "${1:-256}"
