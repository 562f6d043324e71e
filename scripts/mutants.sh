#!/usr/bin/env bash
# Mutation checks: each mutant is a one-line change of the code; a test
# must fail for it.
#
#   scripts/mutants.sh curated [PATTERN]
#                                the guards that must be caught, one line
#                                each in scripts/mutants-curated.txt: the
#                                subtle edit (a deleted clause, a widened
#                                bound, a wrong key) and the test that
#                                kills it, applied by
#                                scripts/mutants-curated.sh (every
#                                .ci/run); exits 1 naming any that
#                                survives, does not build or names nothing
#   scripts/mutants.sh full      every cargo-mutants (https://mutants.rs)
#                                mutant of the keyed channel, the
#                                remote-request validation and the
#                                admission modules (about 2 hours on 2
#                                cores; a developer's run): prints the
#                                numbers
#   scripts/mutants.sh protocol  every cargo-mutants mutant of the protocol
#                                cores and their messages (about 1200;
#                                many hours)
#
# cargo-mutants applies its mutants in place, one at a time (restoring
# each file), built with the dev profile.
# Results: target/mutants/mutants.out/{caught,missed,unviable,timeout}.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-curated}"
if [ "$mode" = curated ]; then
  shift || true
  exec scripts/mutants-curated.sh "$@"
fi

if ! command -v cargo-mutants >/dev/null 2>&1; then
  echo "installing cargo-mutants"
  cargo install --locked --quiet cargo-mutants@27.1.0
fi

# The modules the full run covers: what a peer without the key, or with
# a stale view, must not get past.
FULL_FILES=(src/control/seal.rs src/control/auth.rs src/sync/admission.rs src/memory/region.rs)
# The protocol run's.
PROTOCOL_FILES=(
  src/control/frame.rs src/control/message.rs 'src/transport/ipc/proto/*.rs' 'src/transport/tcp/proto/**/*.rs'
  src/transport/ipc/messages.rs src/transport/ipc/source.rs
)

out=target/mutants
mkdir -p "$out"
# The lib's tests take a few seconds: a mutant that makes them run 40 s
# has hung them (a timeout is reported apart from caught and missed).
common=(--in-place --no-shuffle --baseline skip --timeout 40 --build-timeout 900 -o "$out")

case "$mode" in
  full | protocol)
    args=()
    if [ "$mode" = full ]; then files=("${FULL_FILES[@]}"); else files=("${PROTOCOL_FILES[@]}"); fi
    for f in "${files[@]}"; do args+=(-f "$f"); done
    set +e
    cargo mutants "${common[@]}" "${args[@]}" -- --lib
    rc=$?
    set -e
    ;;
  *)
    echo "usage: scripts/mutants.sh [curated [PATTERN]|full|protocol]"
    exit 2
    ;;
esac

count() { [ -f "$out/mutants.out/$1.txt" ] && wc -l <"$out/mutants.out/$1.txt" || echo 0; }
echo "mutants ($mode): caught $(count caught), missed $(count missed), unviable $(count unviable), timeout $(count timeout)"
if [ "$(count missed)" -gt 0 ]; then
  echo "mutants that no test caught:"
  cat "$out/mutants.out/missed.txt"
fi
if [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ] && [ "$rc" -ne 3 ]; then
  echo "mutants: cargo-mutants failed (rc $rc)"
  exit 1
fi
exit 0
