#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded number of iterations on stable
# (no sanitizer: `-s none`), starting from the committed corpus (copied, so
# the run does not modify the repository). Any crash fails the script.
#   scripts/fuzz.sh [RUNS]     (default 300000 per target)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-300000}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in frame_header messages config ipc_messages auth; do
  mkdir -p "$work/$t"
  cp fuzz/corpus/$t/* "$work/$t/"
  echo "== fuzz $t ($runs runs) =="
  cargo fuzz run -s none "$t" "$work/$t" -- -runs="$runs" -max_len=4096 2>&1 | grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs|ERROR|panicked" || true
  test "${PIPESTATUS[0]}" -eq 0
done
echo "fuzz: 5 targets x $runs runs: no crash"
