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
# The targets run as many at a time as there are cores.
#   scripts/fuzz.sh [RUNS] [SECONDS]   (defaults: 300000 runs, 150 s per target)
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-300000}"
seconds="${2:-150}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The sealed-record targets first: they take their whole SECONDS while the
# others end well before (so the two run beside each other, not last).
targets=(seal session frame_header messages config ipc_messages auth)
# Built once up front, so that the runs below only start binaries.
echo "== fuzz: building ${#targets[@]} targets =="
if ! cargo fuzz build -s none >"$work/build.log" 2>&1; then
  echo "fuzz: the targets do not build; the end of the build's output:"
  tail -n 60 "$work/build.log"
  exit 1
fi
# Each libFuzzer run is one thread: the targets run as many at a time as
# there are cores (the same runs and seconds each, in less wall time).
lanes="$(nproc)"
run_target() {
  local t=$1
  mkdir -p "$work/$t"
  cp fuzz/corpus/$t/* "$work/$t/"
  local rc=0
  cargo fuzz run -s none "$t" "$work/$t" -- -runs="$runs" -max_total_time="$seconds" -max_len=4096 >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n || true; done
  echo "== fuzz $t ($runs runs, at most $seconds s) =="
  run_target "$t" &
done
wait
# Each target's outcome, in the list's order.
failed=0
for t in "${targets[@]}"; do
  log="$work/$t.log"
  rc="$(cat "$work/$t.rc" 2>/dev/null || echo lost)"
  echo "-- $t: $(grep -E "^#[0-9]+.*DONE|Done [0-9]+ runs" "$log" | tail -n 2 | tr '\n' ' ')"
  if [ "$rc" != 0 ]; then
    echo "fuzz: target $t FAILED (exit status $rc); the end of its output:"
    tail -n 60 "$log"
    reproducer="$(sed -n 's/.*Test unit written to \([^ ]*\).*/\1/p' "$log" | tail -n 1)"
    if [ -n "$reproducer" ]; then
      case "$reproducer" in /*) ;; *) reproducer="$PWD/fuzz/${reproducer#./}" ;; esac
      echo "fuzz: reproducer: $reproducer"
      echo "fuzz: replay it with: cargo fuzz run -s none $t $reproducer"
    else
      echo "fuzz: no reproducer was written (an error before fuzzing)"
    fi
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1
echo "fuzz: ${#targets[@]} targets, each $runs runs or $seconds s ($lanes at a time): no crash"
