#!/usr/bin/env bash
# Runs the TCP protocol simulator (tests/sim_tcp.rs) over many seeds, with
# faults: `scripts/sim.sh` (seeds 1-2000) or `scripts/sim.sh A-B`. A failing
# seed prints itself and the command that replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
SIM_SEEDS="${1:-1-2000}" cargo test --release --locked --test sim_tcp seeded_runs_with_faults -- --nocapture
