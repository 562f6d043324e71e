#!/usr/bin/env bash
# Mutation check with cargo-mutants (https://mutants.rs): each mutant is a
# one-line change of the code (a function returning a constant, an operator
# flipped, a condition deleted); a test must fail for it.
#
#   scripts/mutants.sh curated   the guards that must be caught, listed
#                                below (every .ci/run; a few minutes):
#                                exits 1 naming any that survives
#   scripts/mutants.sh full      every mutant of the keyed channel, the
#                                remote-request validation and the
#                                admission modules (about 2 hours on 2
#                                cores; a developer's run): prints the
#                                numbers
#   scripts/mutants.sh protocol  every mutant of the protocol cores and
#                                their messages (about 1200; many hours)
#
# Mutants are applied in place, one at a time (cargo-mutants restores each
# file), and built with the dev profile: the first 12 curated ones took 3 min
# here once the dev build existed (15 min with the release profile).
# Results: target/mutants/mutants.out/{caught,missed,unviable,timeout}.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-curated}"

if ! command -v cargo-mutants >/dev/null 2>&1; then
  echo "installing cargo-mutants"
  cargo install --locked --quiet cargo-mutants@27.1.0
fi

# The guards that must be caught: a regex over cargo-mutants' names
# (`cargo mutants --list`), by function, not by line, so edits elsewhere do
# not move them. One line each: regex, then what it guards.
CURATED=(
  'src/control/auth.rs:.*replace AuthKey::verify -> bool with true$'                 # the HMAC verify
  'src/control/auth.rs:.*replace AuthKey::check -> bool with true$'                  # the proof's check
  'src/control/auth.rs:.*replace \|\| with && in accept$'                            # the server checks every proof
  'src/control/seal.rs:.*replace Opener::open -> Result<bool> with Ok\(true\)$'      # a sealed record's check
  'src/control/seal.rs:.*replace == with != in Opener::open$'                        # its tag comparison
  'src/transport/ipc/channel.rs:.*replace admits_uid -> bool with true$'           # the uid check
  'src/transport/ipc/proto/exports.rs:.*replace match guard e.grant.token == r.token && e.grant.conn == conn with true in ExportsCore<R>::entry$' # the export token
  'src/transport/ipc/proto/exports.rs:.*replace != with == in ExportsCore<R>::check_revalidate$' # revalidation: state, epoch, ops
  'src/memory/region.rs:.*replace != with == in RegionTable::lease_for_remote$'     # the region epoch
  'src/memory/region.rs:.*replace Access::can_write -> bool with true$'             # WRITE permission
  'src/transfer.rs:.*replace BatchShared::requests_ended -> bool with true$'         # a notification's wait for its batches
  'src/memory/owners.rs:.*replace fence_pinned_at -> Result<Vec<Fence>> with Ok\(vec!\[\]\)$' # pinned fences, GPU groups vs TCP
  'src/sync/admission.rs:.*replace match guard self.hold.is_some\(\) \|\| self.mutations.run_unentered with true in SubbatchAdmission::admit$' # a subbatch after the close
  'src/transport/ipc/executor.rs:.*replace may_fall_through -> bool with (true|false)$'      # which unposted refusals move to TCP under AUTO
  'src/cuda/vmm.rs:.* devices_reaching( |$)'                                        # VMM access only for GPUs with a path (P2P)
)

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
  curated)
    args=()
    for re in "${CURATED[@]}"; do args+=(--re "$re" -f "${re%%:*}"); done
    # Each regex must name at least one mutant: a renamed function would
    # otherwise drop its guard silently.
    cargo mutants --list "${args[@]}" >"$out/curated-list.txt"
    for re in "${CURATED[@]}"; do
      grep -Eq "$re" "$out/curated-list.txt" || { echo "mutants: no mutant matches '$re' (renamed?)"; exit 1; }
    done
    echo "mutants: $(wc -l <"$out/curated-list.txt") curated mutants"
    # Each curated guard has a unit test: the lib's tests decide.
    set +e
    cargo mutants "${common[@]}" "${args[@]}" -- --lib
    rc=$?
    set -e
    ;;
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
    echo "usage: scripts/mutants.sh [curated|full|protocol]"
    exit 2
    ;;
esac

count() { [ -f "$out/mutants.out/$1.txt" ] && wc -l <"$out/mutants.out/$1.txt" || echo 0; }
echo "mutants ($mode): caught $(count caught), missed $(count missed), unviable $(count unviable), timeout $(count timeout)"
if [ "$(count missed)" -gt 0 ]; then
  echo "mutants that no test caught:"
  cat "$out/mutants.out/missed.txt"
fi
if [ "$mode" = curated ]; then
  # cargo-mutants 27 adds its struct-field deletions of the files named
  # whatever the regexes say; only the curated names decide.
  survived=0
  for re in "${CURATED[@]}"; do
    while IFS= read -r m; do
      if ! grep -qxF "$m" "$out/mutants.out/caught.txt" 2>/dev/null; then
        echo "mutants: curated guard not caught: $m"
        survived=1
      fi
    done < <(grep -E "$re" "$out/curated-list.txt")
  done
  [ "$survived" -eq 0 ] || exit 1
  echo "mutants: every curated guard was caught"
elif [ "$rc" -ne 0 ] && [ "$rc" -ne 2 ] && [ "$rc" -ne 3 ]; then
  echo "mutants: cargo-mutants failed (rc $rc)"
  exit 1
fi
exit 0
