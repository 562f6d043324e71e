#!/usr/bin/env bash
# Runs a protocol simulator over many seeds, with faults:
# `scripts/sim.sh` (TCP, seeds 1-2000), `scripts/sim.sh tcp A-B`, or
# `scripts/sim.sh ipc A-B` (tests/sim_ipc.rs, seeds 1-20000 by default: the
# runs with faults, then the same seeds ending in the source's close). A
# failing seed prints itself and the command that replays it. Built with
# the `sim` feature: the cores' bug switches the simulators set.
set -euo pipefail
cd "$(dirname "$0")/.."
which=tcp
case "${1:-}" in
tcp | ipc)
    which=$1
    shift
    ;;
esac
default=1-2000
[ "$which" = ipc ] && default=1-20000
SIM_SEEDS="${1:-$default}" cargo test --release --locked --features sim --test "sim_$which" seeded_runs_with_faults -- --nocapture
if [ "$which" = ipc ]; then
    SIM_SEEDS="${1:-$default}" cargo test --release --locked --features sim --test sim_ipc seeded_source_closes -- --nocapture
fi
