#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded number of iterations on stable
# (no sanitizer: `-s none`), starting from the committed corpus (copied, so
# the run does not modify the repository). Any crash, panic, timeout or
# build failure fails the script, which then prints the end of the fuzzer's
# output and the reproducer libFuzzer wrote (and how to replay it).
# Each target stops at RUNS iterations or after SECONDS, whichever comes
# first: the sealed-record targets run AES-GCM and key derivation on every
# input, about 0.4 ms each on a 2-core VM, so 2 000 000 runs of them alone
# took 12 minutes of CI each.
#   scripts/fuzz.sh [RUNS] [SECONDS]   (defaults: 300000 runs, 150 s per target)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-300000}"
seconds="${2:-150}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in frame_header messages config ipc_messages auth seal session; do
  mkdir -p "$work/$t"
  cp fuzz/corpus/$t/* "$work/$t/"
  echo "== fuzz $t ($runs runs, at most $seconds s) =="
  log="$work/$t.log"
  rc=0
  cargo fuzz run -s none "$t" "$work/$t" -- -runs="$runs" -max_total_time="$seconds" -max_len=4096 >"$log" 2>&1 || rc=$?
  grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs" "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: target $t FAILED (exit status $rc); the end of its output:"
    tail -n 60 "$log"
    reproducer="$(sed -n 's/.*Test unit written to \([^ ]*\).*/\1/p' "$log" | tail -n 1)"
    if [ -n "$reproducer" ]; then
      case "$reproducer" in /*) ;; *) reproducer="$PWD/fuzz/${reproducer#./}" ;; esac
      echo "fuzz: reproducer: $reproducer"
      echo "fuzz: replay it with: cargo fuzz run -s none $t $reproducer"
    else
      echo "fuzz: no reproducer was written (a build failure or an error before fuzzing)"
    fi
    exit 1
  fi
done
echo "fuzz: 7 targets, each $runs runs or $seconds s: no crash"
